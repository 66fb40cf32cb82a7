"""Ferret and the federated engine: invariants that fail when the algorithm or the engine is broken."""

from __future__ import annotations

import importlib.util
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch

from lmlab.core.federated.engine import (
    ClientData,
    FedAvg,
    FedSetup,
    FedTask,
    payload_floats,
    sample_clients,
    simulate,
    wire_payload,
)
from lmlab.methods.adaptation.ferret.method import (
    FedKSeed,
    Ferret,
    adaptive_n_seeds,
    basis,
    block_layout,
    candidate_seeds,
    coordinate_matrix,
    ferret_project,
    ferret_reconstruct,
    project_block,
    reconstruct_block,
    server_lr,
)

HAVE_FLWR = importlib.util.find_spec("flwr") is not None


def _state(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((f"t{i}", torch.randn(*s, generator=g)) for i, s in enumerate(shapes))


def _toy_setup(method, *, n_clients=3, per_round=2, rounds=2, seed=0):
    """A linear regression split over clients: fast, deterministic, engine-agnostic."""
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    x = torch.randn(24, 4)
    y = x @ torch.randn(4, 3) + 0.1

    def loss_fn(m, rows):
        idx = torch.tensor(rows)
        return torch.nn.functional.mse_loss(m(x[idx]), y[idx])

    task = FedTask(module, loss_fn)
    clients = {c: ClientData(task, list(range(c * 8, c * 8 + 8))) for c in range(n_clients)}
    return FedSetup(method, clients, task.state(), rounds, per_round, seed)


HP = {"lr": 0.05, "local_steps": 3, "local_batch": 4}


# ---------------------------------------------------------------------------------------------------------------
# bases, blocks, seeds


def test_basis_is_regenerated_bit_identically_and_bounded():
    a, b = basis(123456789, 1000), basis(123456789, 1000)
    assert torch.equal(a, b)
    assert not torch.equal(a, basis(123456790, 1000))
    assert float(a.abs().max()) <= 1000**-0.5 + 1e-7
    # essentially U(-1/sqrt(d), 1/sqrt(d)): E[v_i^2] = 1/(3d)
    v = basis(7, 200_000)
    assert abs(float((v * v).mean()) * 3 * 200_000 - 1) < 0.02
    assert torch.equal(basis(5, 64, "uniform"), basis(5, 64, "uniform"))


def test_block_layout_closes_groups_at_nine_tenths_of_the_median():
    state = OrderedDict((n, torch.zeros(k)) for n, k in zip("abcdefg", [100, 100, 100, 100, 10, 10, 10]))
    layout = block_layout(state)
    assert layout.groups == (("a",), ("b",), ("c",), ("d",), ("e", "f", "g"))
    assert layout.sizes == (100, 100, 100, 100, 30)
    back = layout.unflatten(layout.flatten(state))
    assert list(back) == list(state)


def test_adaptive_seed_counts():
    assert adaptive_n_seeds([1.0, 0.5, 0.0, float("nan")], 10) == [10, 5, 2, 2]
    assert adaptive_n_seeds([0.0, 0.0], 8) == [2, 2]


def test_candidate_seeds_are_fixed_by_the_run_seed():
    s = candidate_seeds(64, 3)
    assert s == candidate_seeds(64, 3) and s != candidate_seeds(64, 4)
    assert len(s) == 64 and all(1 <= x < 10**11 for x in s)


# ---------------------------------------------------------------------------------------------------------------
# projection and reconstruction


def test_lstsq_reconstruction_is_exact_when_the_seeds_reach_the_block_size():
    delta = _state((6,), (5,), seed=1)
    delta["t1"] = delta["t1"] / delta["t1"].norm() * delta["t0"].norm() * 0.8  # n = int(16 * 0.8) = 12 >= 5
    seeds = candidate_seeds(16, 0)
    arrays = ferret_project(delta, seeds, np.random.default_rng(0), coordinates="lstsq")
    layout = block_layout(delta)
    assert [int(arrays[f"gamma.{g}"].numel()) for g in range(2)] == [16, 12]  # n_g >= d_g for both blocks
    gamma = coordinate_matrix(arrays, 16, 2)
    rec, _ = ferret_reconstruct(gamma, seeds, layout, max_norm=None)
    for got, want in zip(rec, layout.flatten(delta)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # with fewer seeds than parameters the projection loses part of the update
    d = torch.randn(12)
    few = candidate_seeds(4, 1)
    g4 = project_block(d, few, coordinates="lstsq")
    r4, _ = reconstruct_block(dict(enumerate(g4.tolist())), few, 12, max_norm=None)
    assert float((r4 - d).norm()) > 0.1 * float(d.norm())


def test_code_estimator_is_one_third_of_the_update_in_expectation():
    """E[(d/n) Σ v vᵀ Δ] = Δ/3 for the official bases: the factor η_s = 10 absorbs."""
    d, k = 30, 30
    delta = torch.randn(d, generator=torch.Generator().manual_seed(0))
    acc = torch.zeros(d)
    trials = 300
    for t in range(trials):
        seeds = candidate_seeds(k, 1000 + t)
        g = project_block(delta, seeds)
        r, _ = reconstruct_block(dict(enumerate(g.tolist())), seeds, d, max_norm=None)
        acc += r
    mean = acc / trials
    assert float((3 * mean - delta).norm() / delta.norm()) < 0.15
    # one draw with n = K >> d already points the right way
    seeds = candidate_seeds(64, 9)
    small = delta[:16]
    g = project_block(small, seeds)
    r, _ = reconstruct_block(dict(enumerate(g.tolist())), seeds, 16, max_norm=None)
    assert float(torch.nn.functional.cosine_similarity(r, small, dim=0)) > 0.5


def test_reconstruction_is_linear_in_the_coordinates():
    seeds = candidate_seeds(8, 0)
    a = {0: 0.3, 2: -1.0, 5: 0.7}
    b = {1: 0.2, 2: 0.5, 7: -0.4}
    ra, _ = reconstruct_block(a, seeds, 40, max_norm=None)
    rb, _ = reconstruct_block(b, seeds, 40, max_norm=None)
    mix = {k: 0.25 * a.get(k, 0.0) + 0.75 * b.get(k, 0.0) for k in set(a) | set(b)}
    rm, _ = reconstruct_block(mix, seeds, 40, max_norm=None)
    torch.testing.assert_close(rm, 0.25 * ra + 0.75 * rb, atol=1e-6, rtol=1e-5)


def test_per_seed_terms_are_clipped_to_max_norm():
    seeds = candidate_seeds(4, 0)
    r, clipped = reconstruct_block({0: 1e6}, seeds, 50, max_norm=10.0)
    assert clipped == 1 and abs(float(r.norm()) - 10.0) < 1e-3
    r2, c2 = reconstruct_block({0: 1e-3}, seeds, 50, max_norm=10.0)
    assert c2 == 0 and float(r2.norm()) < 10.0


def test_server_lr_schedules():
    assert server_lr(1, 10, 10.0) == 10.0
    assert server_lr(1, 10, 10.0, anneal="linear") == 10.0 and server_lr(6, 10, 10.0, anneal="linear") == 5.0
    assert math.isclose(server_lr(6, 10, 10.0, anneal="cosine"), 5.0)


# ---------------------------------------------------------------------------------------------------------------
# the federated methods and the engine


def test_uploaded_floats_are_counted_from_the_messages():
    fer = simulate(_toy_setup(Ferret(**HP, K=8, server_lr=1.0)))
    avg = simulate(_toy_setup(FedAvg(**HP)))
    ks = simulate(_toy_setup(FedKSeed(lr=1e-3, local_steps=3, local_batch=4, K=16)))
    d = 4 * 3 + 3
    assert all(f == d for log in avg.rounds for f in log.uploaded_floats)
    layout = block_layout(_toy_setup(FedAvg(**HP)).init_state)  # blocks: weight (12), bias (3)
    for log in fer.rounds:
        assert all(2 * len(layout.sizes) <= f <= 8 * len(layout.sizes) for f in log.uploaded_floats)
    assert all(1 <= f <= 3 for log in ks.rounds for f in log.uploaded_floats)  # one scalar per distinct seed used
    # the count is the payload's floating entries (indices are not floats) and Ferret reports the same
    setup = _toy_setup(Ferret(**HP, K=8, server_lr=1.0))
    setup.method.setup(setup.init_state, 0)
    p = setup.method.client_update(setup.init_state, setup.clients[0], setup.method.round_config(1), client_id=0,
                                   round_idx=1)  # fmt: skip
    assert payload_floats(wire_payload(p)) == int(p.metrics["n_coords"]) == sum(
        int(t.numel()) for k, t in p.arrays.items() if k.startswith("gamma."))  # fmt: skip


def test_fedavg_with_one_client_is_that_clients_local_training():
    setup = _toy_setup(FedAvg(**HP), n_clients=1, per_round=1, rounds=1)
    hist = simulate(setup)
    task = setup.clients[0].task
    task.set_state(setup.init_state)
    from lmlab.core.federated.engine import client_rng, local_batches, local_sgd

    local_sgd(task, local_batches(setup.clients[0].rows, 3, 4, client_rng(0, 0, 1, "order")), 0.05)
    for k, v in task.state().items():
        torch.testing.assert_close(hist.final_state[k], v, atol=1e-6, rtol=1e-6)


def test_ferret_with_exact_projection_and_unit_server_lr_is_fedavg():
    """lstsq coordinates, K >= every block, no clip, η_s = 1: the reconstruction is exact, so Ferret = FedAvg."""
    hp = {**HP, "coordinates": "lstsq", "max_norm": 0.0, "server_lr": 1.0, "K": 64}
    fer = simulate(_toy_setup(Ferret(**hp)))
    avg = simulate(_toy_setup(FedAvg(**HP)))
    for k in avg.final_state:
        torch.testing.assert_close(fer.final_state[k], avg.final_state[k], atol=1e-4, rtol=1e-4)


def test_simulation_is_deterministic():
    a = simulate(_toy_setup(Ferret(**HP, K=8)))
    b = simulate(_toy_setup(Ferret(**HP, K=8)))
    for k in a.final_state:
        assert torch.equal(a.final_state[k], b.final_state[k])
    assert [r.clients for r in a.rounds] == [r.clients for r in b.rounds]


def test_sample_clients():
    assert sample_clients([3, 1, 2, 0], 2, 0, 1) == sample_clients([0, 1, 2, 3], 2, 0, 1)
    got = sample_clients(range(6), 3, 0, 2)
    assert got == sorted(got) and len(set(got)) == 3
    with pytest.raises(ValueError, match="per_round"):
        sample_clients(range(3), 4, 0, 1)


def test_partition_covers_every_row_and_leaves_no_client_empty():
    from lmlab.methods.adaptation.ferret.experiment import partition

    fams = [f"f{i % 4}" for i in range(40)]
    parts = partition(fams, 6, 0.5, 0)
    assert sorted(r for rows in parts.values() for r in rows) == list(range(40))
    assert all(parts[c] for c in range(6))
    assert parts == partition(fams, 6, 0.5, 0)
    with pytest.raises(ValueError, match="n_clients"):
        partition(fams[:3], 6, 0.5, 0)


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_config_values_raise_one_line_errors():
    from lmlab.methods.adaptation.ferret.config import FerretConfig

    for kw, word in [
        ({"K": 1}, "K"),
        ({"heldout": "x/y"}, "heldout"),
        ({"systems": ["fedavg"]}, "ferret"),
        ({"clients_per_round": 9}, "clients_per_round"),
        ({"basis": "gauss"}, "basis"),
        ({"families": ["capital"]}, "domain/task"),
        ({"systems": ["ferret", "sgd"]}, "systems"),
        ({"n_seeds": 0}, "n_seeds"),
        ({"lr_max_extensions": -1}, "lr_max_extensions"),
        ({"lr_grid": [1.0, 1.0]}, "distinct"),
    ]:
        with pytest.raises(ValueError, match=word) as e:
            FerretConfig(**kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="basis kind"):
        basis(1, 4, "gauss")
    with pytest.raises(ValueError, match="empty"):
        block_layout(OrderedDict())
    with pytest.raises(ValueError, match="K"):
        candidate_seeds(1, 0)
    with pytest.raises(ValueError, match="coordinates"):
        project_block(torch.ones(3), [1, 2], coordinates="svd")


def test_wrong_architecture_is_refused():
    from lmlab.core.training.partial import FrozenTrunk

    with pytest.raises(ValueError, match="decoder-only"):
        FrozenTrunk(torch.nn.Linear(2, 2), 1)


# ---------------------------------------------------------------------------------------------------------------
# the two engines agree


def _run_config(method):
    return {"setup": "lmlab.methods.adaptation.ferret.experiment:flower_setup", "method": method, "preset": "smoke",
            "model": "tiny-llama", "rounds": 2, "output": ""}  # fmt: skip


@pytest.mark.skipif(not HAVE_FLWR, reason="flwr is not installed (pip install 'lmlab[federated]')")
@pytest.mark.parametrize("method", ["ferret", "fedavg", "fedkseed"])
def test_inprocess_loop_and_flower_apps_give_the_same_result(method):
    from lmlab.core.federated.engine import run_flower_local
    from lmlab.methods.adaptation.ferret.experiment import flower_setup

    torch.set_num_threads(1)
    sim = simulate(flower_setup(_run_config(method)))
    flw = run_flower_local(_run_config(method))
    assert [r.clients for r in flw.rounds] == [r.clients for r in sim.rounds]
    assert [r.uploaded_floats for r in flw.rounds] == [r.uploaded_floats for r in sim.rounds]
    assert [r.uploaded_bytes for r in flw.rounds] == [r.uploaded_bytes for r in sim.rounds]
    for k in sim.final_state:
        torch.testing.assert_close(flw.final_state[k], sim.final_state[k], atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(sim.final_state[k], v) for k, v in flower_setup(_run_config(method)).init_state.items())


@pytest.mark.skipif(not HAVE_FLWR, reason="flwr is not installed (pip install 'lmlab[federated]')")
def test_flower_app_bundle_passes_flowers_own_validation():
    import tomllib
    from flwr.common.config import validate_config

    from lmlab.core.federated.engine import FLOWER_APP_DIR

    cfg = tomllib.loads((FLOWER_APP_DIR / "pyproject.toml").read_text())
    ok, errors, _ = validate_config(cfg, check_module=True, project_dir=FLOWER_APP_DIR)
    assert ok, errors


@pytest.fixture(scope="module")
def smoke_result():
    from lmlab.runner import run_method

    return run_method("ferret", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1)


def test_every_system_gets_the_same_lr_search_and_keeps_its_dev_argmin(smoke_result):
    """Equal tuning budget: each system runs every multiplier of lr_grid times its own lr (FedKSeed: its η), extends
    the grid one step past an edge choice (the same rule for every system), and the reported run is the one with the
    lowest dev NLL of all it tried. On the old code the smoke run's FedAvg kept 3x, the top of [1, 3], unextended."""
    from lmlab.registry import get_method

    result = smoke_result
    grid = [1.0, 3.0]
    cap = result.config["lr_max_extensions"]
    assert get_method("ferret").presets["smoke"]["lr_grid"] == grid and cap >= 1
    rows = result.tables["lr_search"]
    chosen = result.flags["lr_chosen_on_dev"]
    for system in ("fedavg", "ferret", "fedkseed"):
        mine = [r for r in rows if r["system"] == system]
        assert [r["lr_scale"] for r in mine[: len(grid)]] == grid and not any(r["extension"] for r in mine[:2])
        base = 1e-5 if system == "fedkseed" else 2e-3
        assert [r["lr"] for r in mine] == pytest.approx([base * r["lr_scale"] for r in mine])
        # every extension follows an edge choice of the runs before it, one grid step (x3) beyond that edge
        for j in range(len(grid), len(mine)):
            before = mine[:j]
            best = min(before, key=lambda r: r["dev_nll"])["lr_scale"]
            scales = [r["lr_scale"] for r in before]
            assert mine[j]["extension"] and best in (min(scales), max(scales))
            want = min(scales) / 3 if best == min(scales) else max(scales) * 3
            assert mine[j]["lr_scale"] == pytest.approx(want)
        best = min(mine, key=lambda r: r["dev_nll"])
        scales = [r["lr_scale"] for r in mine]
        assert chosen[system]["lr_scale"] == best["lr_scale"] and [r["chosen"] for r in mine].count(True) == 1
        assert chosen[system]["runs"] == len(mine) and chosen[system]["extensions"] == len(mine) - len(grid)
        on_edge = best["lr_scale"] in (min(scales), max(scales))
        # an edge choice is kept only when the cap is spent, and then it is flagged
        assert not on_edge or chosen[system]["extensions"] == cap
        assert (chosen[system]["edge"] is not None) == on_edge == (system in result.flags["lr_still_on_edge"])
    fragile = [c for c in result.claims if c.text.startswith("FRAGILE")]
    for c in result.claims:
        if c.metric == "eval_nll":  # the lr-dependent checks
            assert (c in fragile) == (c.baseline.split("/")[0] in result.flags["lr_still_on_edge"])


def _quadratic_in_log10(centre):
    calls = []

    def dev(m):
        calls.append(m)
        return (math.log10(m) - centre) ** 2

    return dev, calls


def test_lr_search_extends_an_edge_argmin_until_it_is_interior():
    """A dev curve whose argmin lies past the grid's edge: the search walks one grid step at a time towards it and
    stops once the choice is interior; a curve still falling at the cap keeps the edge and reports it."""
    from lmlab.core.training.lr_search import search_lr

    dev, calls = _quadratic_in_log10(2.0)  # best lr multiplier 100, above the grid's top 10
    found = search_lr(dev, [1.0, 0.1, 10.0], max_extensions=3)
    assert calls == pytest.approx([0.1, 1.0, 10.0, 100.0, 1000.0])
    assert found.chosen == pytest.approx(100.0) and found.edge is None and found.extensions == 2
    assert [ext for *_, ext in found.tried] == [False, False, False, True, True]

    dev, calls = _quadratic_in_log10(-1.8)  # best near 0.016, below the bottom 0.1
    found = search_lr(dev, [0.1, 1.0, 10.0])
    assert calls == pytest.approx([0.1, 1.0, 10.0, 0.01, 0.001])
    assert found.chosen == pytest.approx(0.01) and found.edge is None

    dev, calls = _quadratic_in_log10(1.0)  # uneven grid: the step is the ratio at the edge (x3 at the top)
    found = search_lr(dev, [0.1, 1.0, 3.0], max_extensions=5)
    assert calls[3:] == pytest.approx([9.0, 27.0]) and found.chosen == pytest.approx(9.0)

    dev, calls = _quadratic_in_log10(6.0)  # still falling at the cap: the edge is kept and reported
    found = search_lr(dev, [0.1, 1.0, 10.0], max_extensions=2)
    assert calls[3:] == pytest.approx([100.0, 1000.0]) and found.chosen == pytest.approx(1000.0)
    assert found.edge == "top"
    found = search_lr(lambda m: -math.log(m), [0.1, 1.0, 10.0], max_extensions=0)
    assert found.chosen == 10.0 and found.edge == "top" and found.extensions == 0

    # a diverged run never wins and is no edge to extend past; a tie goes to the centre; one point: no search
    found = search_lr(lambda m: {0.1: 2.0, 1.0: 1.0, 10.0: float("nan")}[m], [0.1, 1.0, 10.0])
    assert found.chosen == 1.0 and found.extensions == 0 and found.edge is None
    assert search_lr(lambda m: 1.0, [0.1, 1.0, 10.0]).chosen == 1.0
    dev, calls = _quadratic_in_log10(3.0)
    found = search_lr(dev, [1.0])
    assert calls == [1.0] and found.chosen == 1.0 and found.edge is None
    with pytest.raises(ValueError, match="distinct"):
        search_lr(dev, [1.0, 1.0])


def test_one_seed_against_the_claim_fails_the_every_seed_check():
    """Three training seeds, two with Ferret far below FedKSeed and one slightly above: the pooled item-level check
    holds, the every-seed check picks the dissenting seed and does not."""
    from lmlab.methods.adaptation.ferret.experiment import seed_effects, seed_sign_claim
    from lmlab.results import Claim, evaluate_claim

    rng = np.random.default_rng(0)
    n = 40
    base = [rng.normal(4.0, 0.3, n) for _ in range(3)]
    shift = [-0.6, -0.5, +0.15]
    ferret = [b + s + rng.normal(0, 0.05, n) for b, s in zip(base, shift)]
    ids = [f"item{i}" for i in range(n)]
    pooled = evaluate_claim(Claim("eval_nll", "ferret", "fedkseed", "<"), np.concatenate(ferret),
                            np.concatenate(base), clusters=ids * 3)  # fmt: skip
    assert pooled.status == "supported"
    eff = seed_effects(ferret, base)
    assert [e < 0 for e in eff] == [True, True, False]
    every = seed_sign_claim("eval_nll", "ferret", "fedkseed", "<", eff, "Ferret below FedKSeed")
    assert (every.method, every.baseline, every.gate) == ("ferret/seed2", "fedkseed/seed2", True)
    assert "2 of 3" in every.text
    assert evaluate_claim(every, ferret[2], base[2], clusters=ids).status != "supported"
    # with the third seed on the claim's side as well, the every-seed check holds
    ferret[2] = base[2] - 0.3 + rng.normal(0, 0.05, n)
    every = seed_sign_claim("eval_nll", "ferret", "fedkseed", "<", seed_effects(ferret, base), "x")
    w = int(every.method.rsplit("seed", 1)[1])
    assert evaluate_claim(every, ferret[w], base[w], clusters=ids).status == "supported"


def test_default_runs_three_training_seeds_and_gates_each_claim_in_every_seed(smoke_result):
    """>= 3 training seeds by default (one is not a replicate); the run records every seed's values clustered by item
    and gates, next to each pooled claim, its least favourable seed's own check."""
    from lmlab.methods.adaptation.ferret.config import FerretConfig

    assert FerretConfig().n_seeds >= 3
    result = smoke_result
    k = result.config["n_seeds"]
    assert k >= 3 and len(set(result.flags["train_seeds"])) == k
    rows = {(m.system, m.metric): m for m in result.metrics}
    for system in ("ferret", "fedkseed", "fedavg", "round0"):
        per_seed = [rows[(f"{system}/seed{j}", "eval_nll")] for j in range(k)]
        assert rows[(system, "eval_nll")].value == pytest.approx(np.mean([r.value for r in per_seed]))
    # the seeds change the training (client sampling, order, Ferret's bases), not just a label
    assert len({round(rows[(f"ferret/seed{j}", "eval_nll")].value, 9) for j in range(k)}) == k
    effects = {r["seed"]: r["effect"] for r in result.tables["per_seed_effects"] if r["baseline"] == "fedkseed"}
    assert len(effects) == k
    gated = {(c.method, c.baseline) for c in result.claims if c.gate}
    for baseline in ("fedkseed", "round0"):
        assert ("ferret", baseline) in gated
        eff = [r["effect"] for r in result.tables["per_seed_effects"] if r["baseline"] == baseline]
        w = max(range(k), key=lambda j: (eff[j], j))
        assert (f"ferret/seed{w}", f"{baseline}/seed{w}") in gated
