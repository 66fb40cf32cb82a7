"""lmlab's federated engine against Flower's own built-in strategies (flwr.serverapp.strategy.FedAvg / FedProx).

The replies of lmlab's ClientApp carry the records Flower's strategies read ("arrays", "metrics" with the weighting
key "num-examples"), so Flower's FedAvg aggregates them exactly as lmlab's `FedAvg.server_aggregate` does, and with
``upload="model"`` Flower's FedAvg / FedProx drive lmlab's ClientApp round after round. The server may know the
clients by id only (no client data on the server). In-process (`LocalGrid`), a toy regression: fast.
"""

from __future__ import annotations

import importlib.util
from collections import OrderedDict

import pytest
import torch

from lmlab.core.federated.engine import (
    ClientData,
    FedAvg,
    FedProx,
    FedSetup,
    FedTask,
    LocalGrid,
    config_value,
    make_client_app,
    record_to_payload,
    run_server,
    simulate,
    state_from_record,
    state_to_record,
)

HAVE_FLWR = importlib.util.find_spec("flwr") is not None
pytestmark = pytest.mark.skipif(not HAVE_FLWR, reason="flwr is not installed (pip install 'lmlab[federated]')")

HP = {"lr": 0.05, "local_steps": 3, "local_batch": 4}
SIZES = (4, 8, 12)  # unequal client sizes: weighting by examples and equal weighting give different averages


def _toy(method, *, rounds=2, per_round=3):
    """Linear regression over 3 clients of 4 / 8 / 12 rows (fresh module each call: setups do not share state)."""
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    x = torch.randn(sum(SIZES), 4)
    y = x @ torch.randn(4, 3) + 0.1

    def loss_fn(m, rows):
        idx = torch.tensor(rows)
        return torch.nn.functional.mse_loss(m(x[idx]), y[idx])

    task = FedTask(module, loss_fn)
    starts = [sum(SIZES[:c]) for c in range(len(SIZES))]
    clients = {c: ClientData(task, list(range(s, s + n))) for c, (s, n) in enumerate(zip(starts, SIZES))}
    return FedSetup(method, clients, task.state(), rounds, per_round, 0)


def _train_replies(setup, round_idx=1):
    """lmlab's ClientApp's replies to one train message per client (the content Flower's FedAvg would send)."""
    import flwr.app as app

    grid = LocalGrid(make_client_app(lambda rc: setup), {}, sorted(setup.clients))
    cfg = {**setup.method.round_config(round_idx), "server-round": round_idx}
    content = app.RecordDict({"arrays": state_to_record(setup.init_state),
                              "config": app.ConfigRecord({k: config_value(v) for k, v in cfg.items()})})  # fmt: skip
    msgs = [app.Message(content, dst_node_id=n, message_type=app.MessageType.TRAIN) for n in grid.get_node_ids()]
    return grid.send_and_receive(msgs)


@pytest.mark.parametrize("upload", ["model", "delta"])
def test_flowers_fedavg_aggregates_lmlabs_replies_as_lmlabs_fedavg_does(upload):
    """One round, the same client replies: Flower's FedAvg.aggregate_train (weights = "num-examples") equals lmlab's
    server_aggregate with equal_weight=False. With upload="model" Flower's result is the new global model; with the
    default upload="delta" it is the weighted mean update, so the new model is w - mean."""
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

    torch.set_num_threads(1)
    setup = _toy(FedAvg(**HP, equal_weight=False, upload=upload))
    replies = _train_replies(setup)
    for rep in replies:  # Flower's default record names: one ArrayRecord "arrays", one MetricRecord "metrics"
        assert not rep.has_error(), rep.error
        assert list(rep.content.array_records) == ["arrays"] and list(rep.content.metric_records) == ["metrics"]
        assert rep.content["metrics"]["num-examples"] == SIZES[int(rep.content["metrics"]["client-id"])]

    flower_arrays, flower_metrics = FlowerFedAvg().aggregate_train(1, replies)
    flower = state_from_record(flower_arrays)
    payloads = [p for _, p in sorted((record_to_payload(r.content) for r in replies), key=lambda t: t[0])]
    cfg = setup.method.round_config(1)
    ours, _ = setup.method.server_aggregate(setup.init_state, payloads, cfg, round_idx=1)
    unweighted, _ = FedAvg(**HP, equal_weight=True, upload=upload).server_aggregate(
        setup.init_state, payloads, {**cfg, "equal_weight": True}, round_idx=1)  # fmt: skip
    for k, w0 in setup.init_state.items():
        expected = flower[k] if upload == "model" else w0 - flower[k]
        torch.testing.assert_close(ours[k], expected, atol=1e-6, rtol=1e-5)
        assert not torch.allclose(unweighted[k], expected, atol=1e-4)  # the weighting is visible at these sizes
    assert "num-examples" not in flower_metrics and "train_loss" in flower_metrics


@pytest.mark.parametrize("strategy", ["fedavg", "fedprox"])
def test_flowers_own_strategy_drives_lmlabs_client_app(strategy):
    """Flower's FedAvg / FedProx (all clients each round, train config = lmlab's round config) run lmlab's ClientApp
    for 2 rounds and end where lmlab's own in-process loop ends (upload="model", weights by examples)."""
    import flwr.app as app
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
    from flwr.serverapp.strategy import FedProx as FlowerFedProx

    torch.set_num_threads(1)
    mu = 0.5
    make = (lambda: FedAvg(**HP, equal_weight=False, upload="model")) if strategy == "fedavg" else \
        (lambda: FedProx(**HP, mu=mu, equal_weight=False, upload="model"))  # fmt: skip
    sim = simulate(_toy(make()))
    setup = _toy(make())
    grid = LocalGrid(make_client_app(lambda rc: setup), {}, sorted(setup.clients))
    kw = {"min_train_nodes": 3, "min_available_nodes": 3, "fraction_evaluate": 0.0}
    flower = FlowerFedAvg(**kw) if strategy == "fedavg" else FlowerFedProx(**kw, proximal_mu=mu)
    train_config = app.ConfigRecord({k: config_value(v) for k, v in setup.method.round_config(1).items()})
    result = flower.start(grid=grid, initial_arrays=state_to_record(setup.init_state), num_rounds=2,
                          train_config=train_config)  # fmt: skip
    final = state_from_record(result.arrays)
    for k, v in sim.final_state.items():
        torch.testing.assert_close(final[k], v, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(v, setup.init_state[k])  # training moved the model


def test_fedprox_refuses_two_different_proximal_weights():
    """Flower's FedProx ships μ as "proximal-mu"; a different "mu" in the same config is an error (no silent pick)."""
    setup = _toy(FedProx(**HP, mu=0.1))
    cfg = {**setup.method.round_config(1), "proximal-mu": 0.3}
    with pytest.raises(ValueError, match="proximal-mu"):
        setup.method.client_update(setup.init_state, setup.clients[0], cfg, client_id=0, round_idx=1)


def test_upload_must_be_delta_or_model():
    with pytest.raises(ValueError, match="upload"):
        FedAvg(**HP, upload="weights")


def test_server_needs_client_ids_only():
    """Defect 10: the ServerApp's setup lists the client ids, holds no client data, and runs as the simulator does."""
    torch.set_num_threads(1)
    sim = simulate(_toy(FedAvg(**HP), per_round=2))
    full = _toy(FedAvg(**HP), per_round=2)
    server_only = FedSetup(FedAvg(**HP), {}, OrderedDict(full.init_state), full.rounds, full.per_round, full.seed,
                           client_ids=[0, 1, 2])  # fmt: skip
    grid = LocalGrid(make_client_app(lambda rc: full), {}, [0, 1, 2])
    hist = run_server(grid, {"output": ""}, lambda rc: server_only)
    assert [r.clients for r in hist.rounds] == [r.clients for r in sim.rounds]
    for k, v in sim.final_state.items():
        torch.testing.assert_close(hist.final_state[k], v, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="client data"):
        simulate(server_only)  # the in-process loop trains every client itself
    with pytest.raises(ValueError, match="client_ids"):
        FedSetup(FedAvg(**HP), full.clients, full.init_state, 1, 1, 0, client_ids=[0, 1])
