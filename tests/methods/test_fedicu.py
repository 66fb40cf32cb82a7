"""FedICU (reconstructed) and the FedProx baseline: invariants that fail when the algorithm is broken."""

from __future__ import annotations

import importlib.util
import math
from collections import OrderedDict

import pytest
import torch

from lmlab.core.federated.engine import (
    ClientData,
    FedAvg,
    FedProx,
    FedSetup,
    FedTask,
    Payload,
    payload_bytes,
    payload_floats,
    simulate,
    wire_payload,
)
from lmlab.methods.adaptation.fedicu.method import (
    FedICU,
    cosine_weights,
    decode_sparse,
    encode_sparse,
    fedicu_combine,
    importance,
    importance_mask,
    kept_count,
    softmax_weights,
    split_consensus_divergence,
    topk_mask,
)

HAVE_FLWR = importlib.util.find_spec("flwr") is not None
HP = {"lr": 0.05, "local_steps": 3, "local_batch": 4}


def _state(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return OrderedDict((f"t{i}", torch.randn(*s, generator=g)) for i, s in enumerate(shapes))


def _toy(method, *, rows=None, rounds=2, seed=0, n_clients=3):
    """Linear regression over clients (each its own rows unless `rows` gives every client the same)."""
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    x = torch.randn(24, 4)
    y = x @ torch.randn(4, 3) + 0.1

    def loss_fn(m, r):
        idx = torch.tensor(r)
        return torch.nn.functional.mse_loss(m(x[idx]), y[idx])

    task = FedTask(module, loss_fn)
    clients = {c: ClientData(task, list(rows) if rows is not None else list(range(c * 8, c * 8 + 8)))
               for c in range(n_clients)}  # fmt: skip
    return FedSetup(method, clients, task.state(), rounds, n_clients, seed, None)


# ---------------------------------------------------------------------------------------------------------------
# the split, the mask, the codec


def test_split_is_exact_and_the_divergence_is_orthogonal_to_the_consensus():
    g = torch.Generator().manual_seed(1)
    deltas = [torch.randn(5, 7, generator=g) for _ in range(4)]
    w = [0.1, 0.2, 0.3, 0.4]
    c, alphas, rs = split_consensus_divergence(deltas, w)
    torch.testing.assert_close(c, sum(wi * d for wi, d in zip(w, deltas)))
    for d, a, r in zip(deltas, alphas, rs):
        torch.testing.assert_close(a * c + r, d, atol=1e-6, rtol=1e-6)  # consensus projection + divergence = Δ̂_k
        assert abs(float((r.double() * c.double()).sum())) < 1e-5 * float(c.norm() * r.norm())
        assert a == pytest.approx(float((d * c).sum() / (c * c).sum()), rel=1e-5)
    # Σ p_k r_k = 0: the weighted divergences cancel (Σ p_k α_k = 1 because c = Σ p_k Δ̂_k)
    torch.testing.assert_close(sum(wi * r for wi, r in zip(w, rs)), torch.zeros(5, 7), atol=1e-5, rtol=0)
    assert sum(wi * a for wi, a in zip(w, alphas)) == pytest.approx(1.0, abs=1e-6)


def test_zero_consensus_leaves_the_whole_update_as_divergence():
    d = torch.ones(3)
    c, alphas, rs = split_consensus_divergence([d, -d], [0.5, 0.5])
    assert torch.equal(c, torch.zeros(3)) and alphas == [0.0, 0.0]
    torch.testing.assert_close(rs[0], d)


@pytest.mark.parametrize("rho", [0.1, 0.3, 0.5, 1.0])
def test_topk_mask_keeps_the_requested_fraction_of_the_largest_entries(rho):
    scores = torch.randn(10, 13, generator=torch.Generator().manual_seed(2)).abs()
    mask = topk_mask(scores, rho)
    k = math.ceil(rho * scores.numel())
    assert int(mask.sum()) == k == kept_count(scores.numel(), rho)
    assert float(scores[mask].min()) >= float(scores[~mask].max()) if k < scores.numel() else True


def test_importance_is_taylor_or_magnitude():
    d, g = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([3.0, 1.0, 0.0])
    torch.testing.assert_close(importance(d, g, "taylor"), torch.tensor([3.0, 2.0, 0.0]))
    torch.testing.assert_close(importance(d, g, "magnitude"), torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(importance(d, None, "taylor"), d.abs())  # no gradient: the magnitude fallback
    m = importance_mask({"a": d}, {"a": g}, 1 / 3)
    assert m["a"].tolist() == [True, False, False]


def test_sparse_payload_round_trips_and_counts_only_the_kept_floats():
    state = _state((6, 5), (4,), seed=3)
    delta = _state((6, 5), (4,), seed=4)
    masks = importance_mask(delta, None, 0.3, "magnitude")
    arrays = encode_sparse(delta, masks)
    p = wire_payload(Payload(arrays, {"num_examples": 1.0}))
    dense = decode_sparse(p.arrays, state)
    for k in state:
        torch.testing.assert_close(dense[k], torch.where(masks[k], delta[k], torch.zeros_like(delta[k])))
    kept = sum(int(m.sum()) for m in masks.values())
    assert payload_floats(p) == kept == kept_count(30, 0.3) + kept_count(4, 0.3)
    assert payload_bytes(p) == kept * 4 + kept * 4 + 8  # float32 values + int32 indices + one metric
    full = encode_sparse(delta, None)
    assert payload_floats(Payload(full)) == 34 and set(full) == {"delta.t0", "delta.t1"}
    with pytest.raises(ValueError, match="no update for tensor"):
        decode_sparse({}, state)


def test_masked_out_entries_keep_the_global_value():
    state = _state((8,), seed=5)
    d1 = torch.zeros(8)
    d1[:2] = 1.0
    d2 = torch.zeros(8)
    d2[1:3] = 2.0
    new, _ = fedicu_combine(state, [{"t0": d1}, {"t0": d2}], [0.5, 0.5], balancing="cosine")
    assert torch.equal(new["t0"][3:], state["t0"][3:])


# ---------------------------------------------------------------------------------------------------------------
# balancing


def test_softmax_and_cosine_weights():
    w = softmax_weights([1.0, 2.0, 3.0], 1.0)
    assert sum(w) == pytest.approx(1.0) and w[0] > w[1] > w[2]
    assert softmax_weights([1.0, 2.0], 0.01)[0] == pytest.approx(1.0)
    d = [{"a": torch.tensor([1.0, 0.0])}, {"a": torch.tensor([0.0, 1.0])}, {"a": torch.tensor([-1.0, -1.0])}]
    w = cosine_weights(d)
    # d_0 vs mean(d_1, d_2) = (-0.5, 0): cos < 0; d_1 vs (0, -0.5): < 0; d_2 vs (0.5, 0.5): cos = -1 -> all clip to 0
    assert w == [0.0, 0.0, 0.0]
    d[2] = {"a": torch.tensor([1.0, 1.0])}
    w = cosine_weights(d)  # d_2 agrees with both others (cos 1), d_0 and d_1 with (0.5, 1) / (1, 0.5)
    assert sum(w) == pytest.approx(1.0) and w[2] > w[0] == pytest.approx(w[1])
    assert cosine_weights(d[:1]) == [1.0]


def test_the_specs_cosine_of_the_divergence_is_never_positive():
    """Why the fallback weighs by the update, not by r_k: cos(r_k, mean_{j!=k} Δ_j) <= 0 for equal weights."""
    g = torch.Generator().manual_seed(8)
    deltas = [torch.randn(20, generator=g) for _ in range(4)]
    c, _, rs = split_consensus_divergence(deltas, [0.25] * 4)
    for k, r in enumerate(rs):
        other = (sum(deltas) - deltas[k]) / 3
        assert float(r @ other) == pytest.approx(-float(r @ r) / 3, rel=1e-4) and float(r @ other) < 0


def test_probe_balancing_picks_the_lambda_the_probe_prefers():
    state = OrderedDict(t0=torch.zeros(2))
    deltas = [{"t0": torch.tensor([1.0, 0.0])}, {"t0": torch.tensor([0.0, 1.0])}]
    target = torch.tensor([-1.0, -0.5])  # the probe likes moving along client 0's divergence

    def probe(s):
        return float(((s["t0"] - target) ** 2).sum())

    new, st = fedicu_combine(state, deltas, [0.5, 0.5], probe_fn=probe, lambda_grid=[0.0, 0.25, 0.5, 1.0])
    assert st["weights"][0] > st["weights"][1]
    w0, w1 = st["weights"]
    div = w0 * torch.tensor([0.5, -0.5]) + w1 * torch.tensor([-0.5, 0.5])  # r_0 = (0.5, -0.5), r_1 = -r_0
    cand = [probe(OrderedDict(t0=-(torch.tensor([0.5, 0.5]) + lam * div))) for lam in [0.0, 0.25, 0.5, 1.0]]
    assert st["lambda"] == [0.0, 0.25, 0.5, 1.0][min(range(4), key=lambda i: cand[i])]
    assert st["probe_loss"] == pytest.approx(min(cand), rel=1e-5)
    assert probe(new) == pytest.approx(min(cand), rel=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# reductions: FedICU -> FedAvg, FedProx -> FedAvg


@pytest.mark.parametrize("balancing", ["probe", "cosine"])
def test_identical_client_updates_give_fedavgs_aggregate(balancing):
    state = _state((6, 5), (4,), seed=6)
    delta = _state((6, 5), (4,), seed=7)
    payloads = [wire_payload(Payload(encode_sparse(delta, None), {"num_examples": 8.0})) for _ in range(3)]
    probe = (lambda s: float(sum((v**2).sum() for v in s.values()))) if balancing == "probe" else None
    icu = FedICU(probe_fn=probe, rho=1.0, balancing=balancing)
    new, stats = icu.server_aggregate(state, payloads, icu.round_config(1), round_idx=1)
    avg, _ = FedAvg().server_aggregate(state, [Payload(dict(delta))] * 3, {}, round_idx=1)
    for k in state:
        torch.testing.assert_close(new[k], avg[k], atol=1e-6, rtol=1e-6)
    assert stats["divergence_norm"] < 1e-5


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_fedicu_with_identical_clients_equals_fedavg_end_to_end(optimizer):
    """Identical clients (same rows, full batch, so every client takes the same steps) and rho = 1: FedICU's rounds
    are FedAvg's (FedAvg = FedProx with mu = 0 under the same local optimiser)."""
    hp = {**HP, "local_batch": 24, "optimizer": optimizer}
    rows = list(range(24))
    icu = simulate(_toy(FedICU(rho=1.0, balancing="cosine", **hp), rows=rows))
    avg = simulate(_toy(FedProx(mu=0.0, **hp), rows=rows))
    for k in avg.final_state:
        torch.testing.assert_close(icu.final_state[k], avg.final_state[k], atol=1e-6, rtol=1e-5)
    assert any(not torch.equal(avg.final_state[k], v) for k, v in _toy(FedAvg(**HP)).init_state.items())


def test_one_client_with_rho_one_is_fedavg():
    icu = simulate(_toy(FedICU(rho=1.0, optimizer="sgd", **HP), n_clients=1))
    avg = simulate(_toy(FedAvg(**HP), n_clients=1))
    for k in avg.final_state:
        torch.testing.assert_close(icu.final_state[k], avg.final_state[k], atol=1e-6, rtol=1e-5)


def test_fedprox_with_zero_mu_and_sgd_is_core_fedavg_exactly():
    a = simulate(_toy(FedProx(mu=0.0, **HP)))
    b = simulate(_toy(FedAvg(**HP)))
    for k in a.final_state:
        assert torch.equal(a.final_state[k], b.final_state[k])


def test_fedprox_term_pulls_the_client_towards_the_global_model():
    def norm(mu):
        setup = _toy(FedProx(mu=mu, **{**HP, "local_steps": 8, "lr": 0.1}))
        p = setup.method.client_update(setup.init_state, setup.clients[0], setup.method.round_config(1),
                                       client_id=0, round_idx=1)  # fmt: skip
        return math.sqrt(sum(float((v**2).sum()) for v in p.arrays.values()))

    assert norm(5.0) < norm(0.5) < norm(0.0)


def test_fedicu_uploads_rho_of_the_floats_and_masked_clients_change_less():
    setup = _toy(FedICU(rho=0.3, balancing="cosine", **HP))
    hist = simulate(setup)
    d = sum(v.numel() for v in setup.init_state.values())
    expected = sum(kept_count(v.numel(), 0.3) for v in setup.init_state.values())
    assert all(f == expected for r in hist.rounds for f in r.uploaded_floats) and expected < d
    assert all(r.stats["max_abs_cos_r_c"] < 1e-4 for r in hist.rounds)


def test_simulation_is_deterministic():
    a = simulate(_toy(FedICU(rho=0.5, balancing="cosine", **HP)))
    b = simulate(_toy(FedICU(rho=0.5, balancing="cosine", **HP)))
    for k in a.final_state:
        assert torch.equal(a.final_state[k], b.final_state[k])


# ---------------------------------------------------------------------------------------------------------------
# bad input


def test_bad_values_raise_one_line_errors():
    from lmlab.config import build_config
    from lmlab.methods.adaptation.fedicu.config import FedICUConfig

    cases = [
        ({"rho": 0.0}, "rho must be in"),
        ({"rho_grid": [1.5]}, "rho_grid entries must be in"),
        ({"mu_grid": [0.01]}, "mu_grid must have as many values as rho_grid"),
        ({"mu_grid": [0.0, 0.1]}, r"mu_grid entries must be in \(0"),  # μ = 0 is FedAvg; the search is geometric
        ({"rho_grid": [0.3, 0.3]}, "rho_grid must hold distinct values"),
        ({"knob_max_extensions": -1}, "knob_max_extensions must be in"),
        ({"systems": ["fedicu"]}, "systems must include"),
        ({"systems": ["fedavg", "fedicu", "scaffold"]}, "systems entries must be among"),
        ({"general_families": ["arithmetic/add"]}, "must not overlap"),
        ({"client_families": ["arithmetic/add"]}, "at least 2 families"),
        ({"probe_size": 64}, "probe_size must be in"),
        ({"lambda_grid": [2.0]}, "lambda_grid entries must be in"),
        ({"temperature": 0.0}, "temperature must be in"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"n_clients": 1}, "n_clients must be 0"),
        ({"n_clients": 9}, "n_clients must be in"),
    ]
    for override, msg in cases:
        with pytest.raises(ValueError, match=msg) as e:
            build_config(FedICUConfig, override)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="rho must be in"):
        FedICU(rho=1.5)
    with pytest.raises(ValueError, match="importance must be one of"):
        FedICU(importance="fisher")
    with pytest.raises(ValueError, match="one weight per delta"):
        split_consensus_divergence([torch.ones(2)], [0.5, 0.5])
    with pytest.raises(ValueError, match="optimizer must be one of"):
        simulate(_toy(FedProx(mu=0.0, optimizer="lion", **HP)))
    with pytest.raises(ValueError, match="prox_mu must be"):
        simulate(_toy(FedProx(mu=-1.0, **HP)))


def test_wrong_architecture_is_refused():
    from lmlab.core.training.partial import FrozenTrunk

    with pytest.raises(ValueError, match="decoder-only"):
        FrozenTrunk(torch.nn.Linear(2, 2), 1)


# ---------------------------------------------------------------------------------------------------------------
# the experiment's pieces on the tiny llama, and the two engines


def _run_config(method):
    return {"setup": "lmlab.methods.adaptation.fedicu.experiment:flower_setup", "method": method, "preset": "smoke",
            "model": "tiny-llama", "rounds": 2, "limit": 3, "output": ""}  # fmt: skip


def test_lora_init_is_peft_default_and_the_base_function_at_start():
    from lmlab.methods.adaptation.fedicu.experiment import flower_setup

    setup = flower_setup(_run_config("fedicu"))
    names = list(setup.init_state)
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    assert all(torch.equal(v, torch.zeros_like(v)) for n, v in setup.init_state.items() if ".lora_B." in n)
    assert all(float(v.abs().max()) <= 1 / math.sqrt(v.shape[1]) for n, v in setup.init_state.items()
               if ".lora_A." in n)  # fmt: skip
    assert sorted(setup.clients) == [0, 1, 2, 3] and setup.per_round == 4
    two = flower_setup({**_run_config("fedicu"), "n_clients": 2})  # the loopback test's two SuperNodes
    assert sorted(two.clients) == [0, 1] and two.per_round == 2


@pytest.mark.skipif(not HAVE_FLWR, reason="flwr is not installed (pip install 'lmlab[federated]')")
@pytest.mark.parametrize("method", ["fedicu", "fedprox"])
def test_inprocess_loop_and_flower_apps_give_the_same_result(method):
    from lmlab.core.federated.engine import run_flower_local
    from lmlab.methods.adaptation.fedicu.experiment import flower_setup

    torch.set_num_threads(1)
    sim = simulate(flower_setup(_run_config(method)))
    flw = run_flower_local(_run_config(method))
    assert [r.clients for r in flw.rounds] == [r.clients for r in sim.rounds]
    assert [r.uploaded_floats for r in flw.rounds] == [r.uploaded_floats for r in sim.rounds]
    assert [r.uploaded_bytes for r in flw.rounds] == [r.uploaded_bytes for r in sim.rounds]
    for k in sim.final_state:
        torch.testing.assert_close(flw.final_state[k], sim.final_state[k], atol=1e-6, rtol=1e-5)


def _smoke(**overrides):
    from lmlab.runner import run_method

    return run_method("fedicu", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1,
                      limit=3, rho_grid=[0.3, 0.5], mu_grid=[0.01, 0.1], n_seeds=1, **overrides)  # fmt: skip


def test_an_edge_choice_of_rho_or_mu_extends_its_grid_and_the_choice_is_the_probe_argmin():
    """Issue 34: a knob chosen at the edge of its grid is searched past that edge, the same way for FedICU's ρ and
    FedProx's μ. A 2-point grid always has its choice on an edge, so each search must try a value outside the grid
    (the old code only ever ran the grid: no such value, no ``knob_search`` table)."""
    result = _smoke()
    table = result.tables["knob_search"]
    m = {(r.system, r.metric): r.value for r in result.metrics}
    for system, key, grid in (("fedicu", "rho", [0.3, 0.5]), ("fedprox", "mu", [0.01, 0.1])):
        rows = [r for r in table if r["system"] == system]
        tried = [r["value"] for r in rows]
        assert tried[:2] == grid and not any(r["extension"] for r in rows[:2])
        assert len(tried) > 2 and all(r["extension"] for r in rows[2:]), tried  # searched past the edge
        assert all(v not in grid for v in tried[2:])
        # every extension is one step past the edge the choice sat on, at the grid's ratio there (rho capped at 1)
        ratio = grid[1] / grid[0]
        for j in range(2, len(tried)):
            before = tried[:j]
            lo, hi = min(before), max(before)
            step_up = min(1.0, hi * ratio) if key == "rho" else hi * ratio
            assert tried[j] == pytest.approx(lo / ratio) or tried[j] == pytest.approx(step_up)
        assert all(v > 0 for v in tried) and (key == "mu" or all(v <= 1.0 for v in tried))
        losses = [r["server_probe_loss"] for r in rows]
        pick = [r for r in rows if r["chosen"]]
        assert len(pick) == 1 and pick[0]["server_probe_loss"] == min(losses)
        assert result.flags[f"picked_{key}"] == pick[0]["value"]
        assert m[(system, "server_probe_loss")] == pytest.approx(pick[0]["server_probe_loss"])
        summary = result.flags["knob_search"][system]
        edge_value = pick[0]["value"] in (min(tried), max(tried)) and not (key == "rho" and pick[0]["value"] == 1.0)
        assert summary["edge"] == (("bottom" if pick[0]["value"] == min(tried) else "top") if edge_value else None)
        if summary["edge"] is None and len(tried) < 2 + result.config["knob_max_extensions"]:
            assert not edge_value  # the search stopped early only because the choice became interior (or ρ = 1)
    assert "mu0_is_fedavg_probe_loss" in result.flags["knob_search"]["fedprox"]  # μ -> 0 is FedAvg, also run
    assert bool(result.flags["fragile_claims"]) == bool(result.flags["knob_still_on_edge"])
    assert result.flags["upload_ratio_fedavg_over_fedicu"] >= 1.0
    assert any(c.mechanism for c in result.claims)


def test_a_choice_still_on_an_edge_marks_the_claims_comparing_its_system_fragile():
    """No extension allowed: both 2-point searches end on an edge, so every check comparing FedICU with FedAvg or
    FedProx (and the reported FedProx rows) is FRAGILE, while the checks against the base model are not."""
    result = _smoke(knob_max_extensions=0)
    assert set(result.flags["knob_still_on_edge"]) == {"fedicu", "fedprox"}
    assert len(result.tables["knob_search"]) == 4
    for c in result.claims:
        trained = "round0" not in (c.method, c.baseline) and not c.mechanism
        assert c.text.startswith("FRAGILE") == trained, c.text
    assert result.flags["fragile_claims"] == [c.text for c in result.claims if c.text.startswith("FRAGILE")]


def _search(dev_score, grid, **kw):
    from lmlab.methods.adaptation.fedicu.experiment import search_rho

    return search_rho(dev_score, grid, **kw)


def test_rho_search_steps_up_at_the_grids_ratio_and_stops_at_the_dense_upload():
    mask_hurts = _search(lambda r: -r, [0.3, 0.5], max_extensions=5)  # the probe always prefers more entries
    assert [r for r, _, _ in mask_hurts.tried] == [0.3, 0.5, pytest.approx(0.5 * 5 / 3), 1.0]
    assert mask_hurts.chosen == 1.0 and mask_hurts.edge is None  # ρ = 1 is the bound, not an edge to widen
    small = _search(lambda r: r, [0.3, 0.5], max_extensions=2)  # the sparsest upload keeps winning
    assert [r for r, _, _ in small.tried] == [0.3, 0.5, pytest.approx(0.18), pytest.approx(0.108)]
    assert small.edge == "bottom" and small.chosen == pytest.approx(0.108) and small.extensions == 2
    valley = _search(lambda r: (r - 0.6) ** 2, [0.3, 0.5])
    assert valley.chosen == 0.5 and valley.edge is None and valley.extensions == 1
    assert _search(lambda r: -r, [0.5, 1.0]).extensions == 0  # already at ρ = 1
    for bad in ([0.5, 1.5], [0.0, 0.5], [0.5, 0.5], []):
        with pytest.raises(ValueError, match="grid must hold distinct upload fractions"):
            _search(lambda r: r, bad)


def test_lambda_moves_the_divergence_weights_from_p_to_the_probes_w_so_its_range_ends_at_one():
    """Why λ's grid is not extended past 1: Σ_k p_k r_k = 0, so c + λ Σ w_k r_k = c + Σ_k (p_k + λ (w_k - p_k)) r_k;
    λ ∈ [0, 1] mixes p (λ = 0: the average c of the masked updates) and the probe's softmax w (λ = 1), and λ > 1
    extrapolates past w until some client's weight turns negative (its domain change subtracted)."""
    g = torch.Generator().manual_seed(9)
    deltas = [torch.randn(12, generator=g) for _ in range(4)]
    p, w = [0.25] * 4, softmax_weights([1.0, 1.2, 2.0, 2.5], 1.0)
    c, _, rs = split_consensus_divergence(deltas, p)
    for lam in (0.0, 0.5, 1.0, 3.0):
        eff = [pk + lam * (wk - pk) for pk, wk in zip(p, w)]
        torch.testing.assert_close(c + lam * sum(wk * r for wk, r in zip(w, rs)),
                                   c + sum(e * r for e, r in zip(eff, rs)), atol=1e-5, rtol=1e-5)  # fmt: skip
        assert sum(eff) == pytest.approx(1.0)
        assert (min(eff) >= 0) == (lam <= 1.0 or lam * (p[3] - w[3]) <= p[3])
    assert min(pk + 3.0 * (wk - pk) for pk, wk in zip(p, w)) < 0  # λ = 3 weighs a client negatively


# ---------------------------------------------------------------------------------------------------------------
# the experiment's design (issue 34): a probe free of the scored families, a domain-learning gate, the base row


def test_server_probe_holds_no_general_probe_family(tiny_tokenizer):
    """The probe FedICU reads every round (λ, divergence weights; FedProx's μ pick) must not contain the families
    the gated general-probe NLL is scored on (the old 24-item probe over all 7 families reached the general ones)."""
    from lmlab import data as lmdata
    from lmlab.config import build_config
    from lmlab.methods.adaptation.fedicu.config import FedICUConfig
    from lmlab.methods.adaptation.fedicu.experiment import load_bank

    cfg = build_config(FedICUConfig, {"train_per_client": 2, "eval_per_client": 2, "general_pool": 2})
    bank = load_bank(lambda n, **kw: lmdata.load("taskbank", n, seed=cfg.seed, **kw), tiny_tokenizer, cfg)
    # taskbank ids are "taskbank/<domain>/<task>/<key>": the family is read off the item, not off the bank's label
    probe_fams = {"/".join(i.split("/")[1:3]) for i in bank.probe_ids}
    assert len(bank.probe) == len(bank.probe_ids) == cfg.probe_size
    assert not probe_fams & set(cfg.general_families), probe_fams
    assert probe_fams == set(cfg.clients)  # every client domain is represented
    assert set(bank.probe_family) == probe_fams
    gen_fams = {"/".join(i.split("/")[1:3]) for i in bank.gen_ids}
    assert gen_fams == set(cfg.general_families)  # the general probe itself is unchanged


def test_the_domain_learning_gate_comes_first_and_the_drift_claim_says_what_it_measures():
    from lmlab.config import build_config
    from lmlab.methods.adaptation.fedicu.config import FedICUConfig
    from lmlab.methods.adaptation.fedicu.experiment import claims

    BASE, DNLL, DRIFT = "round0", "domain_nll", "general_nll_drift"  # literals: the recorded names are the contract
    cfg = build_config(FedICUConfig, {"systems": ["fedavg", "fedprox", "fedicu", "split_only"]})
    out = claims(cfg, cfg.systems)
    first = out[0]
    assert (first.metric, first.method, first.baseline, first.direction, first.gate) == (DNLL, "fedicu", BASE, "<",
                                                                                         True)  # fmt: skip
    gated = [c for c in out if c.gate]
    assert [c.metric for c in gated] == [DNLL, DRIFT, DRIFT]
    assert all("positive transfer" in c.text and "forgetting" not in c.text for c in gated if c.metric == DRIFT)
    assert not any("less forgetting" in c.text for c in out)
    # every other system's domain learning is reported against the base model too
    assert {c.method for c in out if c.metric == DNLL and c.baseline == BASE} == set(cfg.systems)


def test_a_run_that_does_not_move_fails_the_domain_gate_and_the_base_row_comes_first():
    """lr ~ 0: every system stays at the base model. The old gated check (drift below FedAvg's) could be won by a
    method that moves less; the domain-learning gate must then fail, so the verdict cannot be "supported"."""
    from lmlab.runner import run_method

    BASE, DNLL, DACC = "round0", "domain_nll", "domain_acc"
    FORGET, DRIFT, PROBE = "general_forgetting", "general_nll_drift", "server_probe_loss"

    result = run_method("fedicu", preset="smoke", write=False, show_progress=False, raise_errors=True, threads=1,
                        limit=3, n_seeds=1, lr=1e-12)  # fmt: skip
    gate = result.claims[0]
    assert (gate.metric, gate.method, gate.baseline, gate.gate) == (DNLL, "fedicu", BASE, True)
    assert gate.status != "supported" and result.status != "supported"
    assert abs(gate.observed_effect) < 1e-4  # nothing moved
    # the base model (round 0) is the first row of the metrics and of the rounds table, on every scored metric
    assert result.metrics[0].system == BASE and result.tables["rounds"][0]["system"] == BASE
    assert {r.metric for r in result.metrics if r.system == BASE} == {DNLL, DACC, FORGET, DRIFT, PROBE}
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert all((s, DNLL) in m for s in ("fedavg", "fedprox", "fedicu"))
