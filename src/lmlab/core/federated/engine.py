"""The federated engine of the adaptation area: client / server logic written once, run in-process or on Flower.

A federated method (`FedMethod`) is two plain functions and no engine code:

- ``client_update(global_state, client_data, cfg, *, client_id, round_idx) -> Payload``: what one client computes
  from the global trainable tensors it was sent and its own data. It reads its hyperparameters from `cfg` only (the
  per-round config the server sends; a Flower ``ConfigRecord``), keeps no state across rounds, and draws every random
  number from a generator seeded by ``(cfg["seed"], client_id, round_idx)`` (`client_rng`).
- ``server_aggregate(global_state, payloads, cfg, *, round_idx) -> (new_global_state, stats)``: the server's update
  from the payloads of one round, **in client-id order** (float sums depend on the order; Flower returns replies in
  arrival order, so the Flower strategy sorts them first). Cross-round state (Ferret's seeds, a server momentum)
  lives in the method object on the server side only.

A `Payload` is plain named tensors plus scalar metrics. One codec maps it to the wire: in-process it is a copy
through numpy (`wire_payload`), on Flower a reply ``RecordDict`` with the record names Flower's built-in strategies
read: the arrays as the ``ArrayRecord`` "arrays", the metrics as the ``MetricRecord`` "metrics", whose
``num_examples`` travels under Flower's weighting key "num-examples" (`payload_to_record`, `record_to_payload`). The
train messages carry "arrays" (the global state) and "config" (the round config, with Flower's "server-round"), as
Flower's strategies send them. Communication is counted on the payload the server receives, so both engines count the
same numbers: `payload_floats` (floating-point entries of the arrays: the "floats uploaded") and `payload_bytes` (every
array's raw bytes plus 8 bytes per scalar metric).

Engines:

1. `simulate` (all CPU experiments, the CLI, CI): one model in memory, clients run sequentially and
   deterministically, the global state is copied to each client.
2. Flower (``pip install flwr``, the ``federated`` extra): `make_client_app` / `make_server_app` wrap the very same
   functions as a ``ClientApp`` (``@app.train()`` decodes the message, calls ``client_update``, encodes the payload;
   ``@app.query()`` answers the node's client id, its node-config ``partition-id``) and a ``ServerApp`` whose main
   runs `FederatedStrategy` (a ``flwr.serverapp.strategy.Strategy``: ``configure_train`` samples clients with
   `sample_clients`, ``aggregate_train`` sorts the replies by client id and calls ``server_aggregate``). The app
   bundle for ``flwr run`` is the folder `FLOWER_APP_DIR`; `LocalGrid` runs the apps in this process (tests).

Flower's own ``flwr.serverapp.strategy.FedAvg`` / ``FedProx`` can drive lmlab's ClientApp too, for `FedAvg` /
`FedProx` with ``upload="model"`` (the client uploads its local model, which Flower's strategies average, weighted by
"num-examples"): with ``equal_weight=False`` and η_s = 1 that is lmlab's server rule (tested against Flower's
aggregation, one round and two rounds driven by Flower's strategies). The client reads the round from Flower's
"server-round" and FedProx's μ from Flower's "proximal-mu" when the config has them.

What a deployment needs: both sides build a `FedSetup` from the run config (``setup = "module:function"``, called
with the run config; `build_setup`): the method, the clients' data, the initial trainable state, the server's
evaluation. Each ``ClientApp`` loads the base model itself. The server needs only the client ids: a run config's
``server-setup`` (another ``"module:function"``; `build_server_setup`) may build the ServerApp's setup with
``clients={}`` and ``client_ids=[...]``, so no party but a client's own node needs that client's data.

Baseline here: `FedAvg` (McMahan et al. 2017): local SGD, upload Δ = w_global - w_local, server
``w <- w - η_s Σ_i p_i Δ_i`` (η_s = 1: the average of the client models).
"""

from __future__ import annotations

import json
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed

FLOWER_APP_DIR = Path(__file__).parent / "flower_app"

# ---------------------------------------------------------------------------------------------------------------
# payloads and the codec


@dataclass
class Payload:
    """What a client uploads: named tensors (any dtype) and scalar metrics."""

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def payload_floats(p: Payload) -> int:
    """Floating-point entries in the payload's arrays (the "floats uploaded"; index arrays are not floats)."""
    return int(sum(t.numel() for t in p.arrays.values() if t.is_floating_point()))


def payload_bytes(p: Payload) -> int:
    """Raw bytes of the payload: every array's ``numel * element_size`` plus 8 per scalar metric."""
    return int(sum(t.numel() * t.element_size() for t in p.arrays.values()) + 8 * len(p.metrics))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy().copy()


def wire_state(state: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    """The global state as a client receives it (a copy through numpy, as an ``ArrayRecord`` carries it)."""
    return OrderedDict((k, torch.from_numpy(_to_numpy(v))) for k, v in state.items())


def wire_payload(p: Payload) -> Payload:
    """The payload as the server receives it (numpy copies, float metrics): the in-process stand-in of the codec."""
    return Payload({k: torch.from_numpy(_to_numpy(v)) for k, v in p.arrays.items()},
                   {k: float(v) for k, v in p.metrics.items()})  # fmt: skip


def config_value(v: Any) -> Any:
    """A value a Flower ``ConfigRecord`` accepts (python int / float / str / bool or a list of one of them)."""
    if isinstance(v, bool | str | bytes):
        return v
    if isinstance(v, np.integer | int):
        return int(v)
    if isinstance(v, np.floating | float):
        return float(v)
    if isinstance(v, list | tuple | np.ndarray):
        return [config_value(x) for x in v]
    raise TypeError(f"config values must be int, float, str, bool or lists of them, got {type(v).__name__}")


# ---------------------------------------------------------------------------------------------------------------
# engine-neutral helpers


def sample_clients(client_ids: Sequence[int], per_round: int, seed: int, round_idx: int) -> list[int]:
    """The clients of round `round_idx` (sorted), drawn without replacement from `client_ids` by a seeded sampler."""
    ids = sorted(int(c) for c in client_ids)
    if not 1 <= per_round <= len(ids):
        raise ValueError(f"per_round must be in [1, {len(ids)}] (the number of clients), got {per_round}")
    rng = np.random.default_rng(derive_seed(seed, "fed-sample", round_idx))
    return sorted(ids[i] for i in rng.choice(len(ids), size=per_round, replace=False))


def client_rng(seed: int, client_id: int, round_idx: int, *names: str) -> np.random.Generator:
    """A client's generator for one round: data order, sampling, seed picks (never the global RNG)."""
    return np.random.default_rng(derive_seed(int(seed), "fed-client", int(client_id), int(round_idx), *names))


def local_batches(rows: Sequence[int], steps: int, batch: int, rng: np.random.Generator) -> list[list[int]]:
    """`steps` batches of `batch` rows: seeded epochs of permutations of `rows`, cut into batches."""
    if not rows:
        raise ValueError("a client has no training rows; every client needs at least one example")
    rows = list(rows)
    b = min(batch, len(rows))
    order: list[int] = []
    while len(order) < steps * b:
        order += [rows[i] for i in rng.permutation(len(rows))]
    return [order[i * b : (i + 1) * b] for i in range(steps)]


class FedTask:
    """What the federated functions need from a model: its trainable tensors and a loss on rows of data.

    Args:
        module (`torch.nn.Module`): holds the trainable parameters (those with ``requires_grad``); their names are
            the keys of the state.
        loss_fn (`Callable[[Module, list[int]], Tensor]`): mean loss of the module on a batch of row ids
            (differentiable).
    """

    def __init__(self, module: torch.nn.Module, loss_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]):
        self.module = module
        self.loss_fn = loss_fn
        self.named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not self.named:
            raise ValueError(f"{type(module).__name__} has no trainable parameters")

    def state(self) -> OrderedDict[str, torch.Tensor]:
        return OrderedDict((n, p.detach().clone()) for n, p in self.named)

    def set_state(self, state: Mapping[str, torch.Tensor]) -> None:
        names = [n for n, _ in self.named]
        if list(state) != names:
            raise ValueError(f"the state has keys {list(state)[:3]}..., expected the module's trainable parameters "
                             f"{names[:3]}... in order")  # fmt: skip
        with torch.no_grad():
            for (_, p), v in zip(self.named, state.values()):
                p.copy_(v)

    def loss(self, rows: list[int]) -> torch.Tensor:
        return self.loss_fn(self.module, rows)


@dataclass
class ClientData:
    """One client's share: the task (model + data access) and the row ids of its training examples."""

    task: FedTask
    rows: list[int]


def local_sgd(task: FedTask, batches: Sequence[list[int]], lr: float, grad_clip: float = 0.0) -> list[float]:
    """Plain SGD (momentum 0, weight decay 0) over `batches` on the task's module, in place; the loss per step.

    `grad_clip` > 0 clips the global gradient norm (the official Ferret / FedKSeed scripts leave it off). The SGD case
    of `local_train`.
    """
    return local_train(task, batches, lr, grad_clip=grad_clip)[0]


def first_order_delta(
    global_state: Mapping[str, torch.Tensor],
    client: ClientData,
    cfg: Mapping[str, Any],
    *,
    client_id: int,
    round_idx: int,
) -> tuple[OrderedDict[str, torch.Tensor], list[float]]:
    """Local first-order training from `global_state`: Δ = old - new per tensor and the step losses.

    Reads ``lr``, ``local_steps``, ``local_batch``, ``grad_clip`` (optional) and ``seed`` from `cfg`.
    """  # fmt: skip
    task = client.task
    task.set_state(global_state)
    rng = client_rng(cfg["seed"], client_id, round_idx, "order")
    batches = local_batches(client.rows, int(cfg["local_steps"]), int(cfg["local_batch"]), rng)
    losses = local_sgd(task, batches, float(cfg["lr"]), float(cfg.get("grad_clip", 0.0)))
    new = task.state()
    delta = OrderedDict((k, global_state[k].to(new[k].dtype) - new[k]) for k in new)
    return delta, losses


# ---------------------------------------------------------------------------------------------------------------
# methods


class FedMethod:
    """Base of a federated method: hyperparameters in, the two functions out (see the module docstring).

    Subclasses set `name`, override `client_update` and `server_aggregate`, and may override `setup` (server-side
    state drawn once, e.g. Ferret's seeds) and `round_config` (what each train message carries).
    """

    name = "base"

    def __init__(self, **hparams: Any) -> None:
        self.hparams = {k: config_value(v) for k, v in hparams.items()}
        self.seed = 0

    def setup(self, global_state: Mapping[str, torch.Tensor], seed: int) -> None:
        """Server side, once before round 1."""
        self.seed = int(seed)

    def round_config(self, round_idx: int) -> dict[str, Any]:
        """The config of round `round_idx`, sent to every sampled client (a ``ConfigRecord``)."""
        return {"method": self.name, "seed": self.seed, "round": int(round_idx), **self.hparams}

    def client_update(self, global_state: Mapping[str, torch.Tensor], client: ClientData, cfg: Mapping[str, Any], *,
                      client_id: int, round_idx: int) -> Payload:  # fmt: skip
        raise NotImplementedError

    def server_aggregate(
        self,
        global_state: Mapping[str, torch.Tensor],
        payloads: Sequence[Payload],
        cfg: Mapping[str, Any],
        *,
        round_idx: int,
    ) -> tuple[OrderedDict[str, torch.Tensor], dict]:
        raise NotImplementedError


def client_weights(payloads: Sequence[Payload], equal: bool = True) -> list[float]:
    """p_i: 1/M (``--equal_weight``), else proportional to the payloads' ``num_examples`` metric."""
    if not payloads:
        raise ValueError("server_aggregate got no payloads; a round needs at least one client reply")
    if equal:
        return [1.0 / len(payloads)] * len(payloads)
    n = [float(p.metrics.get("num_examples", 1.0)) for p in payloads]
    return [x / sum(n) for x in n]


# what a FedAvg / FedProx client uploads: its update Δ_i = w - w_i, or its local model w_i (Flower's convention)
UPLOADS = ("delta", "model")


class FedAvg(FedMethod):
    """FedAvg: local SGD, upload the full Δ (d floats), server ``w <- w - η_s Σ p_i Δ_i`` (η_s = 1: model average).

    Hyperparameters: ``lr``, ``local_steps``, ``local_batch``, ``server_lr`` (1.0), ``equal_weight`` (True),
    ``upload`` (``delta``: Δ_i; ``model``: the local model w_i, d floats as well, from which the server takes
    Δ_i = w - w_i. Flower's built-in FedAvg / FedProx average what clients upload, so ``model`` is what lets them drive
    this client; with ``equal_weight=False`` and η_s = 1 their average Σ p_i w_i is this server's result).
    """

    name = "fedavg"

    def __init__(self, **hparams: Any) -> None:
        if hparams.get("upload", "delta") not in UPLOADS:
            raise ValueError(f"upload must be one of {', '.join(UPLOADS)}, got {hparams['upload']!r}")
        super().__init__(**hparams)

    def client_update(self, global_state, client, cfg, *, client_id, round_idx):  # noqa: D102 - see the class
        delta, losses = first_order_delta(global_state, client, cfg, client_id=client_id, round_idx=round_idx)
        return self._payload(global_state, delta, losses, client, cfg)

    @staticmethod
    def _payload(global_state, delta, losses, client, cfg) -> Payload:
        """Δ or w_i = w - Δ (``cfg["upload"]``), the mean step loss and the client's example count."""
        if cfg.get("upload", "delta") == "model":
            delta = OrderedDict((k, global_state[k].to(d.dtype) - d) for k, d in delta.items())
        return Payload(dict(delta), {"train_loss": float(np.mean(losses)), "num_examples": float(len(client.rows))})

    def server_aggregate(self, global_state, payloads, cfg, *, round_idx):  # noqa: D102
        w = client_weights(payloads, bool(cfg.get("equal_weight", True)))
        eta = float(cfg.get("server_lr", 1.0))
        model = cfg.get("upload", "delta") == "model"
        new = OrderedDict()
        for k, v in global_state.items():
            deltas = [v - p.arrays[k].to(v.dtype) if model else p.arrays[k].to(v.dtype) for p in payloads]
            agg = sum(wi * d for wi, d in zip(w, deltas))
            new[k] = v - eta * agg
        return new, {"train_loss": float(np.mean([p.metrics.get("train_loss", math.nan) for p in payloads]))}


# name -> "module:Class" of the core's baselines; a method's module may add its own entry (the core names no method)
FED_METHODS: dict[str, str] = {
    "fedavg": "lmlab.core.federated.engine:FedAvg",
}


def fed_method_class(name: str) -> type:
    """The `FedMethod` class registered as `name` in `FED_METHODS` (lazy import)."""
    from lmlab.registry import load_attr

    if name not in FED_METHODS:
        raise ValueError(f"unknown federated method {name!r}; expected one of {', '.join(FED_METHODS)}")
    return load_attr(FED_METHODS[name])


# ---------------------------------------------------------------------------------------------------------------
# the in-process engine


@dataclass
class RoundLog:
    """One round: sampled clients, per-client uploaded floats / bytes (counted on the received payloads), stats."""

    round: int
    clients: list[int]
    uploaded_floats: list[int]
    uploaded_bytes: list[int]
    stats: dict[str, float]
    eval: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class FedHistory:
    method: str
    rounds: list[RoundLog]
    final_state: OrderedDict[str, torch.Tensor]
    eval0: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "eval0": self.eval0, "rounds": [r.__dict__ for r in self.rounds]}


@dataclass
class FedSetup:
    """Everything both engines build from one run config: method, clients, initial state, server evaluation.

    `client_ids` (default: the keys of `clients`) are the run's clients. The server samples from them and needs no
    client data, so a ServerApp's setup may give ``clients={}`` with the ids; a ClientApp's setup needs the data of
    the clients its node serves; `simulate` needs every client's.
    """

    method: FedMethod
    clients: dict[int, ClientData]
    init_state: OrderedDict[str, torch.Tensor]
    rounds: int
    per_round: int
    seed: int
    evaluate: Callable[[Mapping[str, torch.Tensor]], dict[str, float]] | None = None
    client_ids: list[int] | None = None

    def __post_init__(self) -> None:
        ids = sorted(self.clients) if self.client_ids is None else sorted(int(c) for c in self.client_ids)
        if len(set(ids)) != len(ids):
            raise ValueError(f"client_ids must be distinct, got {self.client_ids}")
        unknown = sorted(set(self.clients) - set(ids))
        if unknown:
            raise ValueError(f"clients {unknown} have data but are not among client_ids {ids}")
        self.client_ids = ids


def simulate(setup: FedSetup, *, on_round: Callable[[RoundLog], None] | None = None) -> FedHistory:
    """Run `setup` with the deterministic in-process loop: the same functions, sampler and codec as Flower."""
    method, ids = setup.method, list(setup.client_ids or [])
    missing = [c for c in ids if c not in setup.clients]
    if missing:
        raise ValueError(f"simulate trains every client in this process, but the setup has no client data for "
                         f"clients {missing} (a server-only setup runs on Flower)")  # fmt: skip
    state = OrderedDict((k, v.detach().clone()) for k, v in setup.init_state.items())
    method.setup(state, setup.seed)
    eval0 = setup.evaluate(state) if setup.evaluate else {}
    logs = []
    for r in range(1, setup.rounds + 1):
        t0 = time.perf_counter()
        cfg = method.round_config(r)
        chosen = sample_clients(ids, setup.per_round, setup.seed, r)
        received = []
        for cid in chosen:
            p = method.client_update(wire_state(state), setup.clients[cid], cfg, client_id=cid, round_idx=r)
            received.append(wire_payload(p))
        state, stats = method.server_aggregate(state, received, cfg, round_idx=r)
        log = RoundLog(r, chosen, [payload_floats(p) for p in received], [payload_bytes(p) for p in received],
                       {k: float(v) for k, v in stats.items()})  # fmt: skip
        log.eval = setup.evaluate(state) if setup.evaluate else {}
        log.seconds = time.perf_counter() - t0
        logs.append(log)
        if on_round is not None:
            on_round(log)
    return FedHistory(method.name, logs, state, eval0)


# ---------------------------------------------------------------------------------------------------------------
# Flower: codec, ClientApp, Strategy, ServerApp (flwr imported inside, an optional dependency)


def _flwr() -> Any:
    try:
        import flwr  # noqa: F401
    except ImportError:
        raise ImportError(
            "the Flower engine needs flwr: pip install 'lmlab[federated]' (or pip install flwr)"
        ) from None
    import flwr.app as app

    return app


# the record names and weighting key of Flower's built-in strategies (flwr.serverapp.strategy.FedAvg's defaults
# arrayrecord_key, configrecord_key, weighted_by_key; its replies' MetricRecord is read whatever its name, "metrics"
# in Flower's examples); a payload's "num_examples" metric travels under WEIGHT_KEY
ARRAYS_KEY, CONFIG_KEY, METRICS_KEY, WEIGHT_KEY = "arrays", "config", "metrics", "num-examples"


def payload_to_record(p: Payload, client_id: int) -> Any:
    """A payload as a Flower reply ``RecordDict``: arrays -> ``ArrayRecord`` "arrays", metrics -> ``MetricRecord``
    "metrics" (``num_examples`` as "num-examples", plus the sender's "client-id"): the records Flower's FedAvg
    reads."""
    app = _flwr()
    arrays = app.ArrayRecord(OrderedDict((k, v.detach().cpu().contiguous()) for k, v in p.arrays.items())) \
        if p.arrays else app.ArrayRecord()  # fmt: skip
    metrics = {WEIGHT_KEY if k == "num_examples" else k: float(v) for k, v in p.metrics.items()}
    if len(metrics) != len(p.metrics) or "client-id" in metrics:
        raise ValueError(f"payload metrics {sorted(p.metrics)} clash with the wire names {WEIGHT_KEY!r} / 'client-id'")
    metrics["client-id"] = int(client_id)
    return app.RecordDict({ARRAYS_KEY: arrays, METRICS_KEY: app.MetricRecord(metrics)})


def record_to_payload(rd: Any) -> tuple[int, Payload]:
    """(client id, payload) from a reply's ``RecordDict`` (inverse of `payload_to_record`)."""
    arrays = {k: torch.from_numpy(v.numpy().copy()) for k, v in rd[ARRAYS_KEY].items()}
    metrics = {"num_examples" if k == WEIGHT_KEY else k: float(v) for k, v in rd[METRICS_KEY].items()
               if k != "client-id"}  # fmt: skip
    return int(rd[METRICS_KEY]["client-id"]), Payload(arrays, metrics)


def state_from_record(arrays: Any) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, torch.from_numpy(v.numpy().copy())) for k, v in arrays.items())


def state_to_record(state: Mapping[str, torch.Tensor]) -> Any:
    return _flwr().ArrayRecord(OrderedDict((k, v.detach().cpu().contiguous()) for k, v in state.items()))


_SETUPS: dict[str, FedSetup] = {}


def build_setup(run_config: Mapping[str, Any]) -> FedSetup:
    """The `FedSetup` of a Flower run config (its ``setup`` key names a ``"module:function"`` taking the run config);
    cached per process and config, so a ClientApp process builds its model once."""
    from lmlab.registry import load_attr

    key = json.dumps({k: run_config[k] for k in sorted(run_config)}, default=str)
    if key not in _SETUPS:
        if "setup" not in run_config:
            raise ValueError("the run config has no 'setup' key (a 'module:function' building the FedSetup)")
        _SETUPS[key] = load_attr(str(run_config["setup"]))(dict(run_config))
    return _SETUPS[key]


def build_server_setup(run_config: Mapping[str, Any]) -> FedSetup:
    """The ServerApp's `FedSetup`: the run config's ``server-setup`` (a ``"module:function"``; it may return a setup
    with ``clients={}`` and the ``client_ids``, so the server holds no client data), else `build_setup`'s."""
    from lmlab.registry import load_attr

    if not run_config.get("server-setup"):
        return build_setup(run_config)
    return load_attr(str(run_config["server-setup"]))(dict(run_config))


def make_client_app(setup_fn: Callable[[Mapping[str, Any]], FedSetup] = build_setup) -> Any:
    """A Flower ``ClientApp``: train = decode, ``client_update``, encode; query = the node's client id."""
    app = _flwr()
    from flwr.clientapp import ClientApp

    client_app = ClientApp()

    def _client_id(context: Any) -> int:
        if "partition-id" not in context.node_config:
            raise ValueError("the SuperNode has no node config 'partition-id' (start it with --node-config "
                             "\"partition-id=0 num-partitions=2\")")  # fmt: skip
        return int(context.node_config["partition-id"])

    @client_app.train()
    def train(msg: Any, context: Any) -> Any:
        setup = setup_fn(context.run_config)
        cid = _client_id(context)
        cfg = dict(msg.content[CONFIG_KEY])
        if int(cfg.get("client-id", cid)) != cid:
            raise ValueError(f"train message for client {cfg['client-id']} reached the node of client {cid}")
        if cid not in setup.clients:
            raise ValueError(f"partition-id {cid} is not a client of this run (clients {sorted(setup.clients)})")
        state = state_from_record(msg.content[ARRAYS_KEY])
        # Flower's strategies put the round in "server-round" (their train config is otherwise the same every round)
        round_idx = int(cfg["server-round"] if "server-round" in cfg else cfg["round"])
        p = setup.method.client_update(state, setup.clients[cid], cfg, client_id=cid, round_idx=round_idx)
        return app.Message(payload_to_record(p, cid), reply_to=msg)

    @client_app.query()
    def query(msg: Any, context: Any) -> Any:
        return app.Message(app.RecordDict({METRICS_KEY: app.MetricRecord({"client-id": _client_id(context)})}),
                           reply_to=msg)  # fmt: skip

    return client_app


def _strategy_base() -> type:
    _flwr()
    from flwr.serverapp.strategy import Strategy

    return Strategy


def make_strategy(method: FedMethod, client_ids: Sequence[int], per_round: int, seed: int, *,
                  node_wait_s: float = 120.0) -> Any:  # fmt: skip
    """A ``flwr.serverapp.strategy.Strategy`` running `method` (see `FederatedStrategy`)."""
    return _make_strategy_class()(method, client_ids, per_round, seed, node_wait_s=node_wait_s)


_STRATEGY_CLASS: type | None = None


def _make_strategy_class() -> type:
    global _STRATEGY_CLASS
    if _STRATEGY_CLASS is not None:
        return _STRATEGY_CLASS
    app = _flwr()
    base = _strategy_base()

    class FederatedStrategy(base):  # type: ignore[misc, valid-type]
        """lmlab's Flower strategy: ``configure_train`` samples with `sample_clients` and sends the global state and
        the method's round config in Flower's layout ("arrays", "config" with "server-round");
        ``aggregate_train`` decodes the replies, sorts them by client id and calls ``server_aggregate``.
        Node ids are mapped to client ids once, with a query message. No client-side evaluation (the server
        evaluates, through ``Strategy.start(evaluate_fn=...)``)."""

        def __init__(self, method: FedMethod, client_ids: Sequence[int], per_round: int, seed: int, *,
                     node_wait_s: float = 120.0) -> None:  # fmt: skip
            self.method, self.client_ids, self.per_round, self.seed = method, sorted(client_ids), per_round, seed
            self.node_wait_s = node_wait_s
            self.node_of: dict[int, int] = {}
            self.logs: list[RoundLog] = []
            self._state: OrderedDict[str, torch.Tensor] | None = None
            self._cfg: dict[str, Any] = {}
            self._t0 = 0.0
            self._setup_done = False

        def summary(self) -> None:
            pass

        def _map_nodes(self, grid: Any) -> None:
            deadline = time.monotonic() + self.node_wait_s
            while True:
                nodes = list(grid.get_node_ids())
                if len(nodes) >= len(self.client_ids) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            msgs = [app.Message(app.RecordDict({CONFIG_KEY: app.ConfigRecord({})}), dst_node_id=n,
                                message_type=app.MessageType.QUERY) for n in nodes]  # fmt: skip
            for rep in grid.send_and_receive(msgs, timeout=self.node_wait_s):
                if rep.has_error():
                    raise RuntimeError(f"node {rep.metadata.src_node_id} failed the client-id query: {rep.error}")
                self.node_of[int(rep.content[METRICS_KEY]["client-id"])] = int(rep.metadata.src_node_id)
            missing = [c for c in self.client_ids if c not in self.node_of]
            if missing:
                raise RuntimeError(f"no SuperNode holds clients {missing} (nodes answered {sorted(self.node_of)})")

        def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
            if not self.node_of:
                self._map_nodes(grid)
            self._t0 = time.perf_counter()
            self._state = state_from_record(arrays)
            if not self._setup_done:
                self.method.setup(self._state, self.seed)
                self._setup_done = True
            self._cfg = self.method.round_config(server_round)
            chosen = sample_clients(self.client_ids, self.per_round, self.seed, server_round)
            out = []
            for cid in chosen:  # Flower's message layout: "arrays" (global state), "config" (with "server-round")
                sent = {**self._cfg, "server-round": server_round, "client-id": cid}
                rd = app.RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: app.ConfigRecord(
                    {k: config_value(v) for k, v in sent.items()})})  # fmt: skip
                out.append(app.Message(rd, dst_node_id=self.node_of[cid], message_type=app.MessageType.TRAIN))
            return out

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
            replies = list(replies)
            bad = [r for r in replies if r.has_error()]
            if bad:
                raise RuntimeError(f"{len(bad)} client replies failed in round {server_round}: {bad[0].error}")
            got = sorted((record_to_payload(r.content) for r in replies), key=lambda t: t[0])  # client-id order
            payloads = [p for _, p in got]
            assert self._state is not None
            new, stats = self.method.server_aggregate(self._state, payloads, self._cfg, round_idx=server_round)
            self.logs.append(RoundLog(server_round, [c for c, _ in got], [payload_floats(p) for p in payloads],
                                      [payload_bytes(p) for p in payloads], {k: float(v) for k, v in stats.items()},
                                      seconds=time.perf_counter() - self._t0))  # fmt: skip
            self._state = new
            metrics = {k: float(v) for k, v in stats.items() if isinstance(v, int | float) and math.isfinite(v)}
            return state_to_record(new), app.MetricRecord(metrics)

        def configure_evaluate(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
            return []

        def aggregate_evaluate(self, server_round: int, replies: Iterable[Any]) -> Any:
            return None

    _STRATEGY_CLASS = FederatedStrategy
    return FederatedStrategy


def run_server(grid: Any, run_config: Mapping[str, Any],
               setup_fn: Callable[[Mapping[str, Any]], FedSetup] = build_server_setup) -> FedHistory:  # fmt: skip
    """The ServerApp's main: build the setup, run `FederatedStrategy` for its rounds, write the results JSON and the
    final state (safetensors) to ``run_config["output"]`` (a path stem; nothing written when empty)."""
    app = _flwr()
    setup = setup_fn(run_config)
    strategy = make_strategy(setup.method, list(setup.client_ids or []), setup.per_round, setup.seed,
                             node_wait_s=float(run_config.get("node-wait-s", 120.0)))  # fmt: skip
    evals: dict[int, dict[str, float]] = {}

    def evaluate_fn(server_round: int, arrays: Any) -> Any:
        if setup.evaluate is None:
            return None
        evals[server_round] = setup.evaluate(state_from_record(arrays))
        return app.MetricRecord(evals[server_round])

    result = strategy.start(
        grid=grid,
        initial_arrays=state_to_record(setup.init_state),
        num_rounds=setup.rounds,
        timeout=float(run_config.get("round-timeout-s", 3600.0)),
        evaluate_fn=evaluate_fn,
    )
    final = state_from_record(result.arrays) if setup.rounds > 0 else OrderedDict(setup.init_state)
    for log in strategy.logs:
        log.eval = evals.get(log.round, {})
    hist = FedHistory(setup.method.name, strategy.logs, final, evals.get(0, {}))
    out = str(run_config.get("output", "") or "")
    if out:
        from safetensors.torch import save_file

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in final.items()}, out + ".safetensors")
        Path(out + ".json").write_text(json.dumps(hist.to_json(), indent=1))
    return hist


def make_server_app(setup_fn: Callable[[Mapping[str, Any]], FedSetup] = build_server_setup) -> Any:
    """A Flower ``ServerApp`` whose main is `run_server`."""
    _flwr()
    from flwr.serverapp import ServerApp

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Any, context: Any) -> None:
        run_server(grid, context.run_config, setup_fn)

    return server_app


class LocalGrid:
    """An in-process stand-in for a Flower ``Grid``: each message goes to `client_app` with its node's ``Context``.

    Replies come back in reverse order (as arrival order may differ from client order), so the strategy's sort by
    client id is exercised. For tests and debugging; a deployment uses the SuperLink's grid.
    """

    def __init__(self, client_app: Any, run_config: Mapping[str, Any], partitions: Sequence[int]) -> None:
        app = _flwr()
        try:  # flwr >= 1.4x: messages read the run id of the process's task (set by Flower's runtimes)
            from flwr.supercore.task_identity import TaskIdentity

            for key, value in (("task_id", 1), ("run_id", 1), ("node_id", 0)):
                try:
                    getattr(TaskIdentity, key)
                except RuntimeError:
                    setattr(TaskIdentity, key, value)
        except ImportError:
            pass
        self.client_app = client_app
        self.contexts = {1000 + i: app.Context(run_id=1, node_id=1000 + i,
                                               node_config={"partition-id": int(c), "num-partitions": len(partitions)},
                                               state=app.RecordDict(), run_config=dict(run_config))
                         for i, c in enumerate(partitions)}  # fmt: skip

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        replies = [self.client_app(m, self.contexts[m.metadata.dst_node_id]) for m in messages]
        return replies[::-1]


def run_flower_local(run_config: Mapping[str, Any],
                     setup_fn: Callable[[Mapping[str, Any]], FedSetup] = build_setup) -> FedHistory:  # fmt: skip
    """The Flower apps of `run_config` in this process (`LocalGrid`): the ClientApp and the strategy, no SuperLink."""
    setup = setup_fn(run_config)
    grid = LocalGrid(make_client_app(setup_fn), run_config, list(setup.client_ids or []))
    return run_server(grid, run_config, setup_fn)


def clone_state(state: Mapping[str, torch.Tensor]) -> OrderedDict[str, torch.Tensor]:
    return OrderedDict((k, v.detach().clone()) for k, v in state.items())


__all__ = [
    "ARRAYS_KEY",
    "CONFIG_KEY",
    "FED_METHODS",
    "FLOWER_APP_DIR",
    "METRICS_KEY",
    "UPLOADS",
    "WEIGHT_KEY",
    "ClientData",
    "FedAvg",
    "FedHistory",
    "FedMethod",
    "FedSetup",
    "FedTask",
    "LocalGrid",
    "Payload",
    "RoundLog",
    "build_server_setup",
    "build_setup",
    "client_rng",
    "client_weights",
    "clone_state",
    "fed_method_class",
    "first_order_delta",
    "local_batches",
    "local_sgd",
    "make_client_app",
    "make_server_app",
    "make_strategy",
    "payload_bytes",
    "payload_floats",
    "payload_to_record",
    "record_to_payload",
    "run_flower_local",
    "run_server",
    "sample_clients",
    "simulate",
    "state_from_record",
    "state_to_record",
    "wire_payload",
    "wire_state",
]


# ---------------------------------------------------------------------------------------------------------------
# local training beyond plain SGD (existing functions above are unchanged): a choice of optimiser, an
# optional proximal term and the accumulated gradient; the FedProx baseline

LOCAL_OPTIMIZERS = ("sgd", "adamw")


def local_train(
    task: FedTask,
    batches: Sequence[list[int]],
    lr: float,
    *,
    optimizer: str = "sgd",
    grad_clip: float = 0.0,
    prox_mu: float = 0.0,
    anchor: Mapping[str, torch.Tensor] | None = None,
    accumulate: bool = False,
) -> tuple[list[float], OrderedDict[str, torch.Tensor] | None]:
    """Local training over `batches`, in place; (loss per step, Σ_t ∇L_t per tensor when `accumulate`, else None).

    ``optimizer="sgd"`` is `local_sgd`'s step (momentum 0, weight decay 0: identical numbers when ``prox_mu=0``);
    ``"adamw"`` is a fresh ``torch.optim.AdamW(lr, weight_decay=0)``, reset on every call (OpenFedLLM resets the
    client optimiser every round; a ClientApp is stateless). ``prox_mu > 0`` adds FedProx's proximal term
    ``μ/2 ||w - w_anchor||²`` (Li et al., MLSys 2020) to every step's loss (`anchor`: the global state received).
    The accumulated gradient is that of the task loss only (before clipping), FedICU's first-order importance.
    """
    if optimizer not in LOCAL_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(LOCAL_OPTIMIZERS)}, got {optimizer!r}")
    if prox_mu < 0 or not math.isfinite(prox_mu):
        raise ValueError(f"prox_mu must be a finite number >= 0, got {prox_mu!r}")
    if prox_mu > 0 and anchor is None:
        raise ValueError("prox_mu > 0 needs the anchor (the global state the client received)")
    names = [n for n, _ in task.named]
    params = [p for _, p in task.named]
    ref = [anchor[n].to(p.dtype).detach() for n, p in task.named] if prox_mu > 0 and anchor is not None else []
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0) if optimizer == "adamw" else None
    gsum = [torch.zeros_like(p) for p in params] if accumulate else []
    losses = []
    task.module.train()
    for batch in batches:
        for p in params:
            p.grad = None
        loss = task.loss(batch)
        if prox_mu > 0:
            loss.backward(retain_graph=False)
            if accumulate:
                for g, p in zip(gsum, params):
                    if p.grad is not None:
                        g.add_(p.grad)
            with torch.no_grad():
                for p, r in zip(params, ref):  # ∇ μ/2 ||w - w0||² = μ (w - w0)
                    p.grad = (p.grad if p.grad is not None else torch.zeros_like(p)) + prox_mu * (p - r)
        else:
            loss.backward()
            if accumulate:
                for g, p in zip(gsum, params):
                    if p.grad is not None:
                        g.add_(p.grad)
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if opt is not None:
            opt.step()
        else:
            with torch.no_grad():
                for p in params:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-lr)
        losses.append(float(loss.detach()))
    for p in params:
        p.grad = None
    task.module.eval()
    return losses, (OrderedDict(zip(names, gsum)) if accumulate else None)


def local_delta(
    global_state: Mapping[str, torch.Tensor],
    client: ClientData,
    cfg: Mapping[str, Any],
    *,
    client_id: int,
    round_idx: int,
    accumulate: bool = False,
) -> tuple[OrderedDict[str, torch.Tensor], list[float], OrderedDict[str, torch.Tensor] | None]:
    """`first_order_delta` with `local_train`: (Δ = old - new, step losses, accumulated gradient or None).

    Reads ``lr``, ``local_steps``, ``local_batch``, ``grad_clip``, ``optimizer`` (default ``sgd``), ``mu`` (FedProx's
    μ, default 0; Flower's FedProx strategy sends it as ``proximal-mu``, which is read when present and must agree
    with ``mu``) and ``seed`` from `cfg`; the batches are `first_order_delta`'s (same generator), so with SGD and
    μ = 0 the delta is `first_order_delta`'s.
    """
    mu = float(cfg.get("mu", 0.0))
    if "proximal-mu" in cfg:
        if "mu" in cfg and float(cfg["proximal-mu"]) != mu:
            raise ValueError(f"the config has mu={cfg['mu']} and Flower's proximal-mu={cfg['proximal-mu']}; "
                             "give one μ")  # fmt: skip
        mu = float(cfg["proximal-mu"])
    task = client.task
    task.set_state(global_state)
    rng = client_rng(cfg["seed"], client_id, round_idx, "order")
    batches = local_batches(client.rows, int(cfg["local_steps"]), int(cfg["local_batch"]), rng)
    losses, gsum = local_train(task, batches, float(cfg["lr"]), optimizer=str(cfg.get("optimizer", "sgd")),
                               grad_clip=float(cfg.get("grad_clip", 0.0)), prox_mu=mu,
                               anchor=global_state, accumulate=accumulate)  # fmt: skip
    new = task.state()
    delta = OrderedDict((k, global_state[k].to(new[k].dtype) - new[k]) for k in new)
    return delta, losses, gsum


class FedProx(FedAvg):
    """FedProx (Li et al., MLSys 2020): FedAvg whose clients minimise ``L_k(w) + μ/2 ||w - w_global||²``.

    The proximal term lives in ``client_update`` (a Flower "FedProx" strategy only ships μ); the server is FedAvg's
    ``w <- w - η_s Σ p_i Δ_i``. Hyperparameters: FedAvg's (``upload`` included) plus ``mu`` (0.01) and ``optimizer``
    (``sgd`` | ``adamw``). With μ = 0 it is FedAvg with that local optimiser (with SGD: `FedAvg` exactly, tested).
    Flower's ``FedProx(proximal_mu=μ)`` drives it with ``upload="model"`` (tested).
    """

    name = "fedprox"

    def client_update(self, global_state, client, cfg, *, client_id, round_idx):  # noqa: D102 - see the class
        delta, losses, _ = local_delta(global_state, client, cfg, client_id=client_id, round_idx=round_idx)
        return self._payload(global_state, delta, losses, client, cfg)


FED_METHODS["fedprox"] = "lmlab.core.federated.engine:FedProx"

__all__ += ["LOCAL_OPTIMIZERS", "FedProx", "local_delta", "local_train"]
