"""Reproduction: FedICU-style (reconstructed) vs FedAvg and FedProx on non-IID domain clients (LoRA on SmolLM2).

Paper claim (Liao et al., ICML 2025, abstract): splitting client updates into consensus and divergence parts,
balancing them by their contribution to global performance, and uploading only important changes beats existing
federated approaches on both generalization (less forgetting of general capability) and domain adaptation.

Design. One client per task-bank family of `client_families` (non-IID: a domain each). Every system trains the same
LoRA on the top `train_layers` blocks over a frozen trunk cached once (`lmlab.core.training.partial`), from the same
initial adapter per seed, with the same local optimiser, steps and data order; the engine is
`lmlab.core.federated.engine.simulate` (the Flower apps call the very same functions; `flower_setup` builds this
experiment for them). Systems: FedAvg (`lmlab.core.federated.engine.FedProx` with μ = 0: FedAvg's server rule with the
shared local optimiser), FedProx (μ searched from `mu_grid`), FedICU (ρ searched from `rho_grid`), optional
``fedicu_cosine`` (the no-server-data fallback, at FedICU's ρ) and ``split_only`` (ρ = 1). The server probe is
dev-split items of the *client* families only: the general families are what the general-probe metric scores, and a
probe that held them would let FedICU (which consults it every round for λ and the divergence weights) tune on the
scored families while FedAvg never sees them.

Knob searches (issue 34: a choice on a grid edge extends the grid, for every system), equal budget for both: on the
first seed, each grid value is a full run scored by its final server-probe loss (lower wins); a choice on an edge of
what was tried runs one more value past that edge at the grid's own ratio there, up to `knob_max_extensions` runs.
μ uses the shared `lmlab.core.training.lr_search.search_lr` (a bottom-edge μ steps down towards μ = 0, which is FedAvg,
itself run and compared); ρ uses the same rule on (0, 1] (`search_rho`: the step up is capped at ρ = 1, the dense
upload without the mask, so a chosen ρ = 1 means the mask does not help on the probe). The other seeds run at the
chosen values. A choice still on an edge after the cap prefixes the claims comparing its system with another trained
system with "FRAGILE" (flags ``knob_still_on_edge``, ``fragile_claims``). λ_t is not searched this way: it is part of
the method, picked by the server every round from `lambda_grid` ⊂ [0, 1], whose bound 1 is the definition's (see the
config); the rounds it sits at the grid's top are counted (flag ``lambda_at_grid_top``).
The base model (LoRA B = 0, recorded as ``round0``) is scored on every metric and is the first row of every table.
After the last round: on held-out items of each client's family (test split), the gold answer's NLL (`domain_nll`,
the domain-learning metric) and the 4-option log-likelihood argmax accuracy; on the general probe (families no client
trains on, items the base model gets right), the accuracy drop and the gold-answer NLL change from the base model.

Claims (computed from this run), in order. (1) Gated training gate: FedICU's held-out domain NLL below the base
model's (clusters: seed x client); without it a method that moves less than FedAvg could win the general-probe check
by learning nothing. (2) Gated: FedICU's general-probe NLL below FedAvg's and below tuned FedProx's (positive
transfer: the drift is negative for every system, so this is not "less forgetting"; paired by probe item, both
seeds' values of an item form one cluster). Reported: every other system's domain NLL vs the base model, FedICU's
domain NLL vs FedAvg's, domain accuracy (non-inferiority within `domain_tol`; above FedAvg / FedProx / round 0),
forgetting (accuracy) vs FedAvg / FedProx, the cosine fallback and the ρ = 1 ablation. Mechanism: FedICU uploads
fewer floats than FedAvg (counted on the received payloads).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed
from lmlab.core.training.lr_search import LrSearch, search_lr
from lmlab.results import Claim

DACC, DNLL, FORGET, DRIFT, PROBE = ("domain_acc", "domain_nll", "general_forgetting", "general_nll_drift",
                                    "server_probe_loss")  # fmt: skip
BASE = "round0"  # the base model (LoRA B = 0): every system's round-0 state


@dataclass
class Bank:
    """The run's items: per split, encoded (ids, n_prompt) sequences with their family / item bookkeeping."""

    train: list[tuple[list[int], int]]
    train_client: list[int]
    eval_opts: list[tuple[list[int], int]]
    eval_opt_item: list[int]
    eval_gold: list[int]
    eval_family: list[str]
    eval_ids: list[str]
    gen_opts: list[tuple[list[int], int]]
    gen_opt_item: list[int]
    gen_gold: list[int]
    gen_family: list[str]
    gen_ids: list[str]
    probe: list[tuple[list[int], int]]
    probe_ids: list[str] = field(default_factory=list)
    probe_family: list[str] = field(default_factory=list)


def _split(fam: str) -> tuple[str, str]:
    domain, task = fam.split("/")
    return domain, task


def load_bank(load: Callable[..., list[Any]], tok: Any, cfg: Any) -> Bank:
    """The task-bank items of the run through `load(n, split=, domain=, task=, n_choices=)` (`ctx.data` in a run)."""
    from lmlab.core.training.sft import encode_sequences
    from lmlab.data.taskbank import answer_request, choice_requests

    def enc(pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], int]]:
        return encode_sequences(tok, [p for p, _ in pairs], [a for _, a in pairs]) if pairs else []

    def options(items: list[Any], fam: str, out: dict[str, list[Any]]) -> None:
        for e in items:
            reqs = choice_requests(e)
            out["item"] += [len(out["gold"])] * len(reqs)
            out["opts"] += reqs
            out["gold"].append(int(e.meta["answer_index"]))
            out["family"].append(fam)
            out["ids"].append(e.id)

    train, train_client = [], []
    ev: dict[str, list[Any]] = defaultdict(list)
    gen: dict[str, list[Any]] = defaultdict(list)
    probe, probe_ids, probe_family = [], [], []
    # the server probe holds the client families only: the general families are scored by the general-probe metric,
    # and FedICU reads the probe every round (λ, divergence weights) while FedAvg never does
    probe_fams = list(cfg.clients)
    per_probe = math.ceil(cfg.probe_size / len(probe_fams))
    for c, fam in enumerate(cfg.clients):
        domain, task = _split(fam)
        tr = load(cfg.train_per_client, split="train", domain=domain, task=task, n_choices=0)
        train += [answer_request(e) for e in tr]
        train_client += [c] * len(tr)
        options(load(cfg.eval_per_client, split="test", domain=domain, task=task, n_choices=cfg.n_choices), fam, ev)
    for fam in cfg.general_families:
        domain, task = _split(fam)
        options(load(cfg.general_pool, split="test", domain=domain, task=task, n_choices=cfg.n_choices), fam, gen)
    for fam in probe_fams:
        domain, task = _split(fam)
        for e in load(per_probe, split="dev", domain=domain, task=task, n_choices=0):
            probe.append(answer_request(e))
            probe_ids.append(e.id)
            probe_family.append(fam)
    probe, probe_ids, probe_family = (probe[: cfg.probe_size], probe_ids[: cfg.probe_size],
                                      probe_family[: cfg.probe_size])  # fmt: skip
    missing = [c for c in range(len(cfg.clients)) if c not in train_client]
    if missing or not ev["ids"] or not gen["ids"] or not probe:
        raise ValueError(f"the task bank gave {len(train)} training items (clients without any: {missing}), "
                         f"{len(ev['ids'])} domain, {len(gen['ids'])} general-probe and {len(probe)} server-probe "
                         "items; expected at least one of each per client (check the families, --limit)")  # fmt: skip
    return Bank(enc(train), train_client, enc(ev["opts"]), ev["item"], ev["gold"], ev["family"], ev["ids"],
                enc(gen["opts"]), gen["item"], gen["gold"], gen["family"], gen["ids"], enc(probe),
                probe_ids, probe_family)  # fmt: skip


def lora_init(task: Any, seed: int) -> OrderedDict[str, torch.Tensor]:
    """peft's default LoRA init drawn from `seed`: A ~ kaiming-uniform(a=√5) = U(±1/√fan_in), B = 0."""
    g = torch.Generator().manual_seed(int(seed))
    out = OrderedDict()
    for name, p in task.named:
        if ".lora_A." in name:
            bound = 1.0 / math.sqrt(p.shape[1])
            out[name] = (torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1).mul(bound).to(p.dtype)
        else:
            out[name] = torch.zeros_like(p.detach())
    return out


class Scorer:
    """Server-side scoring of a LoRA state on the cached trunk: MC hits, gold NLLs and the probe loss."""

    def __init__(self, task: Any, caches: Mapping[str, Any], bank: Bank) -> None:
        self.task, self.caches, self.bank = task, caches, bank

    def _mc(self, name: str, items: list[int], gold: list[int]) -> tuple[list[float], list[float]]:
        from lmlab.core.training.lora import answer_scores

        nll, _ = answer_scores(self.task.module, self.caches[name])
        per: dict[int, list[float]] = defaultdict(list)
        for j, i in enumerate(items):
            per[i].append(nll[j])
        hits = [float(int(np.argmin(per[i])) == g) for i, g in enumerate(gold)]
        gold_nll = [per[i][g] for i, g in enumerate(gold)]
        return hits, gold_nll

    def probe_loss(self, state: Mapping[str, torch.Tensor]) -> float:
        from lmlab.core.training.partial import response_token_logps
        from lmlab.core.training.preference import weighted_sft_loss

        self.task.set_state(state)
        cache = self.caches["probe"]
        with torch.no_grad():
            sub, tm = cache.batch(list(range(cache.n)))
            return float(weighted_sft_loss(response_token_logps(self.task.module, sub, tm), tm, reduction="mean"))

    def full(self, state: Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
        self.task.set_state(state)
        self.task.module.eval()
        d_hits, d_nll = self._mc("eval", self.bank.eval_opt_item, self.bank.eval_gold)
        g_hits, g_nll = self._mc("gen", self.bank.gen_opt_item, self.bank.gen_gold)
        return {"domain_hits": d_hits, "domain_nll": d_nll, "gen_hits": g_hits, "gen_nll": g_nll,
                "probe": [self.probe_loss(state)]}  # fmt: skip


@dataclass
class Built:
    task: Any
    clients: dict[int, Any]
    scorer: Scorer
    base: dict[str, list[float]]
    keep: list[int]  # general-probe items the base model answers correctly


def build(cfg: Any, model: Any, tok: Any, bank: Bank) -> Built:
    """The shared trainable LoRA copy of the top blocks, the clients and the scorer (trunk cached once)."""
    from peft import LoraConfig

    from lmlab.core.federated.engine import ClientData, FedTask
    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache
    from lmlab.core.training.partial import FrozenTrunk, response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss

    n_layers = len(model.model.layers)
    if cfg.train_layers > n_layers:
        raise ValueError(f"train_layers must be <= {n_layers} (the blocks of {cfg.model}), got {cfg.train_layers}")
    trunk = FrozenTrunk(model, cfg.train_layers)
    lora = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules), lora_dropout=0.0,
                      bias="none")  # fmt: skip
    try:
        topk = trunk.top_k(train_norm=False, lora=lora)
    except ValueError as e:
        raise ValueError(f"target_modules {cfg.target_modules} match no linear layer of {cfg.model}'s blocks; "
                         f"expected llama-style names (q_proj, v_proj, up_proj, ...): {e}") from None  # fmt: skip
    pad = _pad_id(tok)
    caches = {
        name: PaddedCache(trunk, seqs, pad)
        for name, seqs in (
            ("train", bank.train),
            ("eval", bank.eval_opts),
            ("gen", bank.gen_opts),
            ("probe", bank.probe),
        )
    }
    c_train = caches["train"]

    def loss_fn(module: Any, rows: list[int]) -> torch.Tensor:
        sub, tm = c_train.batch(rows)
        return weighted_sft_loss(response_token_logps(module, sub, tm), tm, reduction="mean")

    task = FedTask(topk, loss_fn)
    rows: dict[int, list[int]] = defaultdict(list)
    for i, c in enumerate(bank.train_client):
        rows[c].append(i)
    clients = {c: ClientData(task, rows[c]) for c in sorted(rows)}
    scorer = Scorer(task, caches, bank)
    base = scorer.full(lora_init(task, 0))  # B = 0: the base model's function
    keep = [i for i, h in enumerate(base["gen_hits"]) if h == 1.0]
    return Built(task, clients, scorer, base, keep)


def make_method(system: str, cfg: Any, *, rho: float | None = None, mu: float | None = None,
                probe_fn: Callable[[Mapping[str, torch.Tensor]], float] | None = None) -> Any:  # fmt: skip
    """The `FedMethod` of a system name with this config's hyperparameters (every system: the same local steps)."""
    from lmlab.core.federated.engine import FedProx
    from lmlab.methods.adaptation.fedicu.method import FedICU

    common = {"lr": cfg.lr, "local_steps": cfg.local_steps, "local_batch": cfg.local_batch, "grad_clip": cfg.grad_clip,
              "optimizer": cfg.optimizer, "equal_weight": cfg.equal_weight}  # fmt: skip
    if system in ("fedavg", "fedprox"):
        m = FedProx(**common, mu=0.0 if system == "fedavg" else float(cfg.mu_grid[0] if mu is None else mu),
                    server_lr=1.0)  # fmt: skip
        m.name = system  # FedAvg = FedProx with μ = 0 (same server rule, the shared local optimiser)
        return m
    if system in ("fedicu", "fedicu_cosine", "split_only"):
        r = 1.0 if system == "split_only" else float(rho if rho is not None else
                                                      (cfg.rho_grid[0] if cfg.rho_grid else cfg.rho))  # fmt: skip
        bal = "cosine" if system == "fedicu_cosine" else cfg.balancing
        m = FedICU(probe_fn=None if bal == "cosine" else probe_fn, **common, rho=r, importance=cfg.importance,
                   balancing=bal, lambda_grid=list(cfg.lambda_grid), temperature=cfg.temperature,
                   fallback_lambda=cfg.fallback_lambda)  # fmt: skip
        m.name = system
        return m
    raise ValueError(f"unknown system {system!r}")


def search_rho(dev_score: Callable[[float], float], grid: Sequence[float], *, max_extensions: int = 2) -> LrSearch:
    """`search_lr`'s rule for FedICU's upload fraction ρ ∈ (0, 1]: ``dev_score(ρ)`` (lower is better) at every ρ of
    `grid`; the lowest wins (a non-finite score never beats a finite one; ties go to the ρ nearest the grid's
    geometric centre); while the choice is the smallest (largest) ρ tried, one more run at the next step down (up) by
    the grid's own ratio at that end, `max_extensions` runs in all. The step up is capped at ρ = 1 (the dense upload:
    no mask), and nothing lies past it: a choice of ρ = 1 is on the domain's bound, so its `edge` is None (the caller
    reports that the mask does not help); `edge` is ``"bottom"`` / ``"top"`` only for a choice a wider search could
    still move. Values are rounded to 12 significant digits, as `search_lr` rounds them.
    """
    grid = sorted(float(r) for r in grid)
    if not grid or grid[0] <= 0 or grid[-1] > 1 or len(set(grid)) != len(grid):
        raise ValueError(f"grid must hold distinct upload fractions in (0, 1], got {grid!r}")
    return search_lr(dev_score, grid, max_extensions=max_extensions, upper=1.0)


def train_seed(i: int, cfg: Any) -> int:
    return derive_seed(cfg.seed, "fedicu-train", i)


def make_setup(built: Built, cfg: Any, method: Any, seed_index: int) -> Any:
    from lmlab.core.federated.engine import FedSetup

    s = train_seed(seed_index, cfg)
    n = len(built.clients)
    return FedSetup(method, built.clients, lora_init(built.task, s), cfg.rounds, n, s,
                    lambda st: {PROBE: built.scorer.probe_loss(st)})  # fmt: skip


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.core.federated.engine import simulate

    model, tok = ctx.load_model()
    bank = load_bank(lambda n, **kw: ctx.data("taskbank", n, **kw), tok, cfg)
    built = build(cfg, model, tok, bank)
    keep = built.keep
    if not keep:  # e.g. --limit 1 on a random tiny model: score every item, and say so
        keep = list(range(len(bank.gen_ids)))
        ctx.flag("general_probe_fallback", "the base model answers no general item; forgetting uses all items")
    d = sum(int(t.numel()) for _, t in built.task.named)
    ctx.flag("faithful_label", cfg.faithful_label)
    ctx.flag("trainable_lora_params", d)
    ctx.flag("clients", {c: f"{cfg.clients[c]} ({len(cd.rows)} items)" for c, cd in built.clients.items()})
    ctx.flag("general_probe_kept", f"{len(keep)} of {len(bank.gen_ids)} (base-correct)")

    systems = list(cfg.systems)
    rhos = sorted(float(f"{r:.12g}") for r in (cfg.rho_grid or [cfg.rho]))
    mus = sorted(float(f"{m:.12g}") for m in cfg.mu_grid)
    # the searched systems: (knob, first grid); the same rule and extension cap for both (equal tuning budget)
    knobs = {s: kg for s, kg in (("fedicu", ("rho", rhos)), ("fedprox", ("mu", mus))) if s in systems}
    n_ext = cfg.knob_max_extensions
    n_runs = sum(len(g) + (n_ext if len(g) > 1 else 0) + cfg.n_seeds - 1 for _, g in knobs.values())
    n_runs += cfg.n_seeds * sum(1 for s in systems if s not in knobs)  # an upper bound: extensions may stop early
    bar = iter(ctx.progress(range(n_runs * cfg.rounds), "rounds (run x round; knob searches on seed 0)",
                            total=n_runs * cfg.rounds))  # fmt: skip
    res: dict[tuple[str, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []

    def variant(system: str, value: float) -> str:
        return f"{system}@{knobs[system][0]}={value:g}"

    def train(system: str, label: str, i: int, **kw: float) -> dict[str, Any]:
        """`system`'s run on seed `i` (kept as `res[(label, i)]`, run once), scored by `Scorer.full`."""
        if (label, i) in res:
            return res[(label, i)]
        method = make_method(system, cfg, probe_fn=built.scorer.probe_loss, **kw)
        t0 = time.perf_counter()
        hist = simulate(make_setup(built, cfg, method, i), on_round=lambda _log: next(bar, None))
        out = built.scorer.full(hist.final_state)
        out["seconds"] = time.perf_counter() - t0
        out["floats"] = [f for log in hist.rounds for f in log.uploaded_floats]
        out["bytes"] = [b for log in hist.rounds for b in log.uploaded_bytes]
        res[(label, i)] = out
        for log in hist.rounds:
            rows.append({"seed": i, "system": label, "round": log.round, PROBE: log.eval.get(PROBE),
                         "uploaded_floats": int(sum(log.uploaded_floats)),
                         "uploaded_bytes": int(sum(log.uploaded_bytes)), "seconds": round(log.seconds, 3),
                         **{f"stat_{k}": v for k, v in log.stats.items()}})  # fmt: skip
        return out

    # each knob on the first seed: a grid value's score is its run's final server-probe loss (client families' dev
    # items; the test items never choose); a choice on an edge extends the grid past it (μ: `search_lr`, towards
    # μ -> 0 = FedAvg below; ρ: `search_rho`, capped at ρ = 1 = no mask above)
    searches: dict[str, LrSearch] = {}
    for system, (key, grid) in knobs.items():

        def dev_score(v: float, system: str = system, key: str = key) -> float:
            return float(train(system, variant(system, v), 0, **{key: v})["probe"][0])

        searches[system] = (search_rho if key == "rho" else search_lr)(dev_score, grid, max_extensions=n_ext)
    chosen = {s: {key: searches[s].chosen} for s, (key, _) in knobs.items()}
    for i in range(cfg.n_seeds):
        for s in systems:
            if s in knobs:  # seed 0 reuses its search run at the chosen value
                res[(s, i)] = train(s, variant(s, searches[s].chosen), i, **chosen[s])
            elif s == "fedicu_cosine":  # the fallback at FedICU's chosen ρ
                res[(s, i)] = train(s, s, i, rho=searches["fedicu"].chosen if "fedicu" in knobs else rhos[0])
            else:
                res[(s, i)] = train(s, s, i)
    # the base model's rows first: every system starts each seed from it (round 0, nothing uploaded yet)
    base_rows = [{"seed": i, "system": BASE, "round": 0, PROBE: built.base["probe"][0], "uploaded_floats": 0,
                  "uploaded_bytes": 0, "seconds": 0.0} for i in range(cfg.n_seeds)]  # fmt: skip
    ctx.table("rounds", [*base_rows, *rows])
    b0 = built.base
    edges = _record_searches(ctx, cfg, knobs, searches, res, variant, b0, keep)
    if "fedicu" in knobs and cfg.balancing == "probe":
        top = max(float(x) for x in cfg.lambda_grid)
        lams = [r["stat_lambda"] for r in rows if r["system"] == variant("fedicu", searches["fedicu"].chosen)]
        ctx.flag("lambda_at_grid_top", f"{sum(lam == top for lam in lams)} of {len(lams)} rounds at λ = {top:g} "
                 "(FedICU at its chosen ρ, every seed; [0, 1] is the definition's range, not extended)")  # fmt: skip
    ctx.flag("server_probe_families", sorted(set(bank.probe_family)))

    seeds = range(cfg.n_seeds)
    d_clusters = [f"s{i}/{f}" for i in seeds for f in bank.eval_family]  # seed x client
    g_clusters = [bank.gen_ids[j] for _ in seeds for j in keep]  # probe item (seeds nested)
    names = systems  # the losing knob values ran on the first seed only: table ``knob_search``
    # the base model: the same values for every seed, repeated to pair with the seeds' runs (recorded first, so it is
    # the first row of the metrics table); its drift and forgetting are 0 by definition
    ctx.record(BASE, DNLL, [v for _ in seeds for v in b0["domain_nll"]], clusters=d_clusters, unit="nats",
               note="the base model (LoRA B = 0): held-out domain gold-answer NLL")  # fmt: skip
    ctx.record(BASE, DACC, [h for _ in seeds for h in b0["domain_hits"]], clusters=d_clusters,
               note="the base model (LoRA B = 0)")  # fmt: skip
    ctx.record(BASE, FORGET, [1.0 - b0["gen_hits"][j] for _ in seeds for j in keep], clusters=g_clusters,
               note="the base model: 0 on its base-correct items (unless the fallback kept all)")  # fmt: skip
    ctx.record(BASE, DRIFT, [0.0 for _ in seeds for _ in keep], clusters=g_clusters, unit="nats",
               note="the base model: 0 by definition")  # fmt: skip
    ctx.record(BASE, PROBE, [b0["probe"][0] for _ in seeds], clusters=[f"s{i}" for i in seeds], unit="nats",
               note="the base model's server-probe loss")  # fmt: skip
    for name in names:
        if (name, 0) not in res:
            continue
        per = [res[(name, i)] for i in seeds]
        label = f" [{cfg.faithful_label}]" if name.startswith(("fedicu", "split")) else ""
        note = f"{cfg.rounds} rounds x {len(built.clients)} clients, {cfg.n_seeds} seed(s){label}"
        ctx.record(name, DNLL, [v for r in per for v in r["domain_nll"]], clusters=d_clusters, unit="nats",
                   note=f"held-out domain gold-answer NLL (summed over answer tokens); {note}")  # fmt: skip
        ctx.record(name, DACC, [h for r in per for h in r["domain_hits"]], clusters=d_clusters, note=note)
        ctx.record(name, FORGET, [1.0 - r["gen_hits"][j] for r in per for j in keep], clusters=g_clusters,
                   note="1 - accuracy on base-correct general items")  # fmt: skip
        ctx.record(name, DRIFT, [r["gen_nll"][j] - b0["gen_nll"][j] for r in per for j in keep],
                   clusters=g_clusters, unit="nats",
                   note="gold-answer NLL - base NLL (signed; < 0: positive transfer, > 0: forgetting)")  # fmt: skip
        ctx.record(name, PROBE, [r["probe"][0] for r in per], clusters=[f"s{i}" for i in seeds], unit="nats",
                   note="final server-probe loss (client families' dev items; the selection criterion)")  # fmt: skip
        ctx.record(name, "uploaded_floats", [f for r in per for f in r["floats"]], unit="floats",
                   note="per client and round, counted on the received payloads")  # fmt: skip
        ctx.record(name, "uploaded_bytes", [b for r in per for b in r["bytes"]], unit="bytes",
                   note="per client and round (values + int32 indices)")  # fmt: skip
        ctx.record_value(name, "wall_clock", float(sum(r["seconds"] for r in per)), unit="s",
                         note="all seeds, final evaluation included")  # fmt: skip
    ratio = float(np.mean(ctx.values("fedavg", "uploaded_floats")) / np.mean(ctx.values("fedicu", "uploaded_floats")))
    ctx.flag("upload_ratio_fedavg_over_fedicu", ratio)
    _figure(ctx, cfg, [BASE, *names])
    ctx.note(f"{cfg.faithful_label}: LoRA r={cfg.rank} on {', '.join(cfg.target_modules)} of the top "
             f"{cfg.train_layers} blocks ({d} params); {len(built.clients)} non-IID clients "
             f"({', '.join(cfg.clients)}), {cfg.rounds} rounds x {cfg.local_steps} {cfg.optimizer} steps of "
             f"{cfg.local_batch}; rho from {rhos}, FedProx mu from {mus}, each extended past an edge up to "
             f"{n_ext} runs (chosen on the first seed by the server probe: {len(bank.probe)} dev items of the client "
             f"families); general probe: {len(keep)} base-correct items of "
             f"{', '.join(cfg.general_families)}.")  # fmt: skip
    out = claims(cfg, systems, edges)
    ctx.flag("fragile_claims", [c.text for c in out if c.text.startswith("FRAGILE")])
    return ctx.finish(out)


def _record_searches(ctx: Any, cfg: Any, knobs: Mapping[str, tuple[str, list[float]]],
                     searches: Mapping[str, LrSearch], res: Mapping[tuple[str, int], dict[str, Any]],
                     variant: Callable[[str, float], str], b0: Mapping[str, list[float]],
                     keep: Sequence[int]) -> dict[str, str]:  # fmt: skip
    """The knob searches' table ``knob_search`` (every value tried on the first seed: its probe loss, extension,
    domain NLL, general-probe drift and floats), the flags ``picked_rho`` / ``picked_mu``, ``knob_search``,
    ``knob_still_on_edge`` and ``rho_no_mask_best``, and a note per edge; returns {system: edge} of the choices still
    on an edge after the extensions."""
    table, summary = [], {}
    for system, (key, grid) in knobs.items():
        found = searches[system]
        for v, score, ext in found.tried:
            out = res[(variant(system, v), 0)]
            table.append({"system": system, "knob": key, "value": v, PROBE: score, "extension": ext,
                          "chosen": v == found.chosen, DNLL: float(np.mean(out["domain_nll"])),
                          DRIFT: float(np.mean([out["gen_nll"][j] - b0["gen_nll"][j] for j in keep])),
                          "uploaded_floats": float(np.mean(out["floats"]))})  # fmt: skip
        summary[system] = {"knob": key, "grid": list(grid), "tried": [v for v, _, _ in found.tried],
                           "chosen": found.chosen, "extensions": found.extensions, "edge": found.edge}  # fmt: skip
        ctx.flag(f"picked_{key}", found.chosen)
    if "fedprox" in summary:  # the limit of a bottom-edge μ: FedAvg, run as its own system
        summary["fedprox"]["mu0_is_fedavg_probe_loss"] = float(res[("fedavg", 0)]["probe"][0])
    ctx.table("knob_search", table)
    ctx.flag("knob_search", summary)
    edges = {s: f.edge for s, f in searches.items() if f.edge is not None}
    ctx.flag("knob_still_on_edge", edges)
    for system, edge in edges.items():
        key = knobs[system][0]
        ctx.note(f"{system}: the probe's choice {key} = {searches[system].chosen:g} is still the {edge} of its search "
                 f"after {searches[system].extensions} extension(s) (knob_max_extensions={cfg.knob_max_extensions}); "
                 "the claims comparing it with another trained system are marked FRAGILE.")  # fmt: skip
    if "fedicu" in searches:
        no_mask = searches["fedicu"].chosen >= 1.0
        ctx.flag("rho_no_mask_best", no_mask)
        if no_mask:
            ctx.note("FedICU's probe choice is rho = 1 (the dense upload): the importance mask does not help on "
                     "the server probe; FedICU here is consensus / divergence splitting with probe balancing "
                     "only.")  # fmt: skip
    return edges


def claims(cfg: Any, systems: Sequence[str], edges: Mapping[str, str] | None = None) -> list[Claim]:
    """The run's checks. `edges`: {system: "bottom" | "top"} for a knob choice still on an edge of its search
    (`LrSearch.edge`); every check comparing such a system with another trained system gets the prefix "FRAGILE": a
    wider search could move that system, and the comparison with it (the checks against the base model, which no
    search can reverse, and the by-construction mechanism are not marked)."""
    lab = cfg.faithful_label
    out = [
        # the training gate first: a general-probe check alone can be won by a system that moves (and learns) less
        Claim(DNLL, "fedicu", BASE, "<",
              text=f"{lab} learned the client domains: held-out domain gold-answer NLL below the base model's "
                   "(round 0; clusters seed x client)"),
        Claim(DRIFT, "fedicu", "fedavg", "<",
              text=f"{lab}: general-probe NLL below FedAvg's (positive transfer)"),
        # a non-inferiority guard passes for two identical systems, so it is reported, never gated
        Claim(DACC, "fedicu", "fedavg", ">", min_effect=-cfg.domain_tol, gate=False,
              text=f"{lab}: domain accuracy not below FedAvg's by more than {cfg.domain_tol:g} (non-inferiority; "
                   "reported)"),
    ]  # fmt: skip
    if "fedprox" in systems:
        out.append(Claim(DRIFT, "fedicu", "fedprox", "<",
                         text=f"{lab}: general-probe NLL below tuned FedProx's (positive transfer)"))  # fmt: skip
        out.append(Claim(DACC, "fedicu", "fedprox", ">", gate=False,
                         text=f"{lab}: domain accuracy above tuned FedProx's (reported)"))  # fmt: skip
        out.append(
            Claim(
                FORGET,
                "fedicu",
                "fedprox",
                "<",
                gate=False,
                text=f"{lab}: general-probe forgetting (accuracy drop) below FedProx's (reported)",
            )
        )
    out += [
        Claim(DNLL, "fedicu", "fedavg", "<", gate=False,
              text=f"{lab}: held-out domain NLL below FedAvg's (reported; above it means FedICU learned less)"),
        Claim(DACC, "fedicu", "fedavg", ">", gate=False, text=f"{lab}: domain accuracy above FedAvg's (reported)"),
        Claim(FORGET, "fedicu", "fedavg", "<", min_effect=-cfg.probe_tol, gate=False,
              text=f"{lab}: general-probe forgetting within {cfg.probe_tol:g} of FedAvg's or below (reported)"),
        Claim(FORGET, "fedicu", "fedavg", "<", gate=False,
              text=f"{lab}: general-probe forgetting (accuracy drop) below FedAvg's (reported)"),
        Claim(DACC, "fedicu", BASE, ">", gate=False,
              text=f"{lab}: domain accuracy above the base model's (reported)"),
    ]  # fmt: skip
    # the same domain-learning check for every other system (reported): did each baseline learn the domains?
    for s in systems:
        if s != "fedicu":
            who = f"{lab}, {s}" if s.startswith(("fedicu", "split")) else s
            out.append(Claim(DNLL, s, BASE, "<", gate=False,
                             text=f"{who}: held-out domain NLL below the base model's (reported)"))  # fmt: skip
    if "split_only" in systems:
        out.append(Claim(DRIFT, "fedicu", "split_only", "<", gate=False,
                         text=f"{lab}: the importance mask lowers the general-probe NLL vs splitting alone (rho = 1; "
                              "reported)"))  # fmt: skip
    if "fedicu_cosine" in systems:
        out.append(Claim(DRIFT, "fedicu_cosine", "fedavg", "<", gate=False,
                         text=f"{lab}, no-server-data fallback: general-probe NLL below FedAvg's "
                              "(reported)"))  # fmt: skip
    out.append(Claim("uploaded_floats", "fedicu", "fedavg", "<", paired=False, mechanism=True,
                     text="FedICU uploads fewer floats per client-round than FedAvg (top-rho mask; by "
                          "construction)"))  # fmt: skip
    return [_fragile(c, cfg, edges or {}) for c in out]


def _fragile(claim: Claim, cfg: Any, edges: Mapping[str, str]) -> Claim:
    """`claim` with the "FRAGILE (...)" prefix when it compares two trained systems and either one's knob choice is
    still on an edge of its search (see `claims`)."""
    if claim.mechanism or BASE in (claim.method, claim.baseline):
        return claim
    searched = {"fedicu_cosine": "fedicu"}  # the fallback runs at FedICU's chosen ρ
    why = []
    for s in (searched.get(claim.method, claim.method), searched.get(claim.baseline, claim.baseline)):
        if s in edges:
            knob = "FedProx's mu" if s == "fedprox" else "FedICU's rho"
            limit = "; mu -> 0 is FedAvg, checked on its own" if s == "fedprox" and edges[s] == "bottom" else ""
            why.append(f"{knob} is still the {edges[s]} of its probe search{limit}")
    if not why:
        return claim
    prefix = f"FRAGILE ({'; '.join(why)} after {cfg.knob_max_extensions} extensions): "
    return replace(claim, text=prefix + claim.text)


def _figure(ctx: Any, cfg: Any, names: Sequence[str]) -> None:
    from lmlab.core.report.plotting import bar_with_ci, title_for

    for metric, ylabel in ((DNLL, "held-out domain gold-answer NLL (nats)"), (DACC, "domain accuracy (4 options)"),
                           (DRIFT, "general-probe NLL drift (nats)")):  # fmt: skip
        rows = [r for r in ctx.metrics if r.metric == metric and r.system in names]
        if rows:
            ctx.add_figure(metric, bar_with_ci(rows, title=title_for("fedicu", str(cfg.model), cfg.seed, None, metric),
                                               ylabel=ylabel, highlight=["fedicu"]))  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# the Flower apps' setup (lmlab.core.federated.engine.build_setup calls it with the run config)


def flower_setup(run_config: Mapping[str, Any]) -> Any:
    """The `FedSetup` of one system of this experiment for a Flower run config (first seed, first grid values).

    Keys: ``method`` (a system name, default ``fedicu``), ``preset`` (``smoke`` / ``quick`` / ``default``), and any
    `FedICUConfig` field (empty strings are ignored: "unset"); other keys (``setup``, ``output``, ...) are the
    engine's. Every party (ServerApp, each ClientApp) builds the same setup; only the server calls the probe.
    """
    from lmlab import data as lmdata
    from lmlab.config import build_config, config_fields
    from lmlab.core.inference.models import load_model
    from lmlab.methods.adaptation.fedicu import SPEC
    from lmlab.methods.adaptation.fedicu.config import FedICUConfig

    system = str(run_config.get("method", "fedicu"))
    preset = str(run_config.get("preset", "default"))
    known = config_fields(FedICUConfig)
    overrides = {k: v for k, v in run_config.items() if k in known and v != ""}
    cfg = build_config(FedICUConfig, dict(SPEC.presets.get(preset, {})), overrides)
    if system not in cfg.systems:
        cfg.systems = [*cfg.systems, system]
    model, tok = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)

    def load(n: int | None, **kw: Any) -> list[Any]:
        if cfg.limit is not None:
            n = cfg.limit if n is None else min(n, cfg.limit)
        return lmdata.load("taskbank", n, seed=cfg.seed, **kw)

    bank = load_bank(load, tok, cfg)
    built = build(cfg, model, tok, bank)
    method = make_method(system, cfg, probe_fn=built.scorer.probe_loss)
    return make_setup(built, cfg, method, 0)
