"""Invariants of the fractal-text estimators (synthetic series with a known answer) and of the scoring pipeline
(tiny random llama)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmlab.methods.analysis.fractal_text import method as ft
from lmlab.methods.analysis.fractal_text.config import FractalTextConfig, parse_condition

NOTEBOOK_SCALES = (25, 50, 75, 100, 200, 300)  # the official notebook's DEFAULT_SCALES


def _fgn(hurst: float, docs: int = 100, n: int = 1024, seed: int = 0) -> list[np.ndarray]:
    return list(ft.fractional_gaussian_noise(n, hurst, size=docs, seed=seed))


def _gamma(k: np.ndarray, h: float) -> np.ndarray:
    return 0.5 * (np.abs(k + 1) ** (2 * h) - 2 * np.abs(k) ** (2 * h) + np.abs(k - 1) ** (2 * h))


# ----------------------------------------------------------------------------------------------------------------
# the synthetic reference: exact fGn


@pytest.mark.parametrize("hurst", [0.3, 0.8])
def test_davies_harte_fgn_has_the_fgn_autocovariance(hurst):
    x = ft.fractional_gaussian_noise(512, hurst, size=400, seed=1)  # (400, 512)
    lags = np.arange(4)
    emp = np.array([np.mean(x[:, : 512 - k] * x[:, k:]) for k in lags])
    np.testing.assert_allclose(emp, _gamma(lags, hurst), atol=0.02)


# ----------------------------------------------------------------------------------------------------------------
# Hurst exponent (rescaled range), the invariant


def test_hurst_is_about_half_on_white_noise_and_point_eight_on_fgn_08():
    white = ft.hurst_rs(_fgn(0.5, seed=2), scales=NOTEBOOK_SCALES, seed=0)
    persistent = ft.hurst_rs(_fgn(0.8, seed=3), scales=NOTEBOOK_SCALES, seed=0)
    assert abs(white.hurst - 0.5) < 0.07, white
    assert abs(persistent.hurst - 0.8) < 0.07, persistent
    # and the estimate tracks the truth monotonically between them
    mid = ft.hurst_rs(_fgn(0.65, seed=4), scales=NOTEBOOK_SCALES, seed=0).hurst
    assert white.hurst < mid < persistent.hurst


def test_hurst_destroyed_by_shuffling_and_input_convention_is_explicit():
    docs = _fgn(0.8, docs=60, seed=5)
    rng = np.random.default_rng(0)
    shuffled = ft.hurst_rs([rng.permutation(d) for d in docs], scales=NOTEBOOK_SCALES).hurst
    assert shuffled < 0.62  # long-range dependence lives in the order of the tokens
    levels = [np.cumsum(d) for d in docs]
    as_levels = ft.hurst_rs(levels, scales=NOTEBOOK_SCALES, kind="levels").hurst
    as_increments = ft.hurst_rs(docs, scales=NOTEBOOK_SCALES).hurst
    assert abs(as_levels - as_increments) < 0.03
    # the pitfall: R/S of the integral process passed as increments reads ~1 whatever the truth
    assert ft.hurst_rs(levels, scales=NOTEBOOK_SCALES).hurst > 0.95


def test_rescaled_range_and_peak_probability_of_a_hand_computed_window():
    # length 5 and largest scale / lag 4: the only window offset is 0, so both statistics are exact
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    t = ft.fractal_table([x], scales=(2, 4), taus=(2, 4), samples_per_doc=7, eps=2.0, seed=0)
    # y = [1,2,3,4] - 2.5 -> cumsum [-1.5, -2, -1.5, 0] -> R = 2; S = sqrt(1.25)
    assert t.rescaled_range()[0, 1] == pytest.approx(2.0 / math.sqrt(1.25))
    assert t.rs_count[0, 1] == 7
    # X = cumsum of the z-scored series; |X_4 - X_0| = |z_1 + ... + z_4| = 2 / sqrt(2) < eps = 2: the one offset hits
    assert t.peak_probability()[0, 1] == pytest.approx(1.0)
    tight = ft.fractal_table([x], scales=(2, 4), taus=(2, 4), samples_per_doc=7, eps=1.0, seed=0)
    # |dX| = 1.41 > eps = 1: no hit at all, which counts as 0.5 hits (a finite log for the fit)
    assert tight.peak_probability()[0, 1] == pytest.approx(0.5 / 1)
    # the notebook's draw: samples_per_doc random offsets, here all at the only offset 0
    drawn = ft.fractal_table([x], scales=(2, 4), taus=(2, 4), samples_per_doc=7, eps=1.0, seed=0,
                             selfsim_offsets="random")  # fmt: skip
    assert drawn.hit_count[0, 1] == 7 and drawn.peak_probability()[0, 1] == pytest.approx(0.5 / 7)


def test_self_similarity_counts_every_offset_of_every_document():
    # z-scored [1..5] = [-2, -1, 0, 1, 2] / sqrt(2); X = [-1.41, -2.12, -2.12, -1.41, 0]
    # tau = 2: X_2 - X_0 = -0.71, X_3 - X_1 = +0.71, X_4 - X_2 = +2.12 -> 2 hits of 3 offsets at eps = 1
    x = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    t = ft.fractal_table([x, x[::-1].copy()], scales=(2, 4), taus=(2, 4), samples_per_doc=50, eps=1.0, seed=0)
    np.testing.assert_array_equal(t.hit_count, [[3, 1], [3, 1]])  # T_d - tau offsets per document, not 50 draws
    np.testing.assert_array_equal(t.hit_sum[:, 0], [2, 2])
    assert t.peak_probability()[0, 0] == pytest.approx(4 / 6)  # pooled over the offsets of both documents
    # nothing random is left in S: the window seed moves H's windows only
    docs = _fgn(0.7, docs=12, n=224, seed=11)
    s0, s1 = (ft.fractal_table(docs, seed=k).selfsim()[0] for k in (0, 1))
    assert s0 == s1
    r0, r1 = (ft.fractal_table(docs, seed=k, selfsim_offsets="random").selfsim()[0] for k in (0, 1))
    assert r0 != r1


def test_self_similarity_noise_at_the_default_collection_size():
    """S of one collection the size of the default's (12 documents x 224 positions), redrawn 40 times.

    Measured with 200 draws: white noise S = 0.48 (SD 0.080) over every offset, 0.50 (SD 0.127) from 100 random
    offsets per lag (the notebook's draw, this method's estimator before issue 35); fGn H = 0.8: SD 0.116 vs 0.162."""
    taus = (1, 2, 4, 8, 16, 32, 64)
    every, drawn = [], []
    for r in range(40):
        docs = _fgn(0.5, docs=12, n=224, seed=100 + r)
        for mode, out in (("all", every), ("random", drawn)):
            out.append(ft.fractal_table(docs, scales=(16, 128), taus=taus, seed=r, selfsim_offsets=mode).selfsim()[0])
    assert abs(np.mean(every) - 0.5) < 0.06
    assert np.std(every, ddof=1) < 0.1
    assert np.std(every, ddof=1) < 0.8 * np.std(drawn, ddof=1)


def test_constant_windows_are_skipped_and_counted():
    x = np.concatenate([np.zeros(60), np.random.default_rng(0).standard_normal(60)])
    t = ft.fractal_table([x], scales=(4, 8), taus=(1, 2), samples_per_doc=200, normalize=False, seed=0)
    assert t.skipped.sum() > 0
    assert np.all(t.rs_count + t.skipped[None, :] == 200)
    assert np.isfinite(t.hurst()[0])


# ----------------------------------------------------------------------------------------------------------------
# self-similarity and DFA


def test_self_similarity_is_about_half_on_iid_noise():
    res = ft.self_similarity(_fgn(0.5, docs=200, seed=6), taus=(1, 2, 4, 8, 16, 32, 64), seed=0)
    assert abs(res.selfsim - 0.5) < 0.07, res
    assert res.fractal_dimension == pytest.approx(2.0 - res.selfsim)
    # persistence makes the integral process spread faster: p_eps falls faster with tau
    persistent = ft.self_similarity(_fgn(0.8, docs=200, seed=7), taus=(1, 2, 4, 8, 16, 32, 64), seed=0)
    assert persistent.selfsim > res.selfsim + 0.1


@pytest.mark.parametrize("hurst", [0.5, 0.8])
def test_dfa_recovers_the_hurst_exponent_of_fgn(hurst):
    assert abs(ft.dfa(_fgn(hurst, docs=60, seed=8), NOTEBOOK_SCALES).alpha - hurst) < 0.07


# ----------------------------------------------------------------------------------------------------------------
# uncertainty over documents (clusters), never over windows


def test_jackknife_pseudovalues_center_on_the_pooled_estimate():
    t = ft.fractal_table(_fgn(0.7, docs=40, n=400, seed=9), samples_per_doc=50, seed=0)
    ids, pv = ft.jackknife_pseudovalues(t, "hurst")
    assert len(ids) == 40 and np.all(np.isfinite(pv))
    assert abs(pv.mean() - t.hurst()[0]) < 0.02
    # one cluster holding every document: a single value, the pooled estimate itself
    ids1, pv1 = ft.jackknife_pseudovalues(t, "hurst", ["all"] * 40)
    assert ids1 == ["all"] and pv1[0] == pytest.approx(t.hurst()[0])


def test_bootstrap_resamples_clusters_not_copies():
    docs = _fgn(0.7, docs=12, n=400, seed=10)
    t = ft.fractal_table(docs, samples_per_doc=50, seed=0)
    # every document present twice, with the same windows: the data of `t` counted twice
    twice = ft.FractalTable(t.scales, t.taus, np.vstack([t.rs_sum] * 2), np.vstack([t.rs_count] * 2),
                            np.vstack([t.hit_sum] * 2), np.vstack([t.hit_count] * 2), 2 * t.skipped, t.eps,
                            np.concatenate([t.lengths] * 2))  # fmt: skip
    one = ft.bootstrap_ci(t, "hurst", n_boot=400, seed=1)
    paired = ft.bootstrap_ci(twice, "hurst", list(range(12)) * 2, n_boot=400, seed=1)
    naive = ft.bootstrap_ci(twice, "hurst", n_boot=400, seed=1)
    assert paired == pytest.approx(one)  # a document and its copy are one unit: same CI
    assert naive[2] - naive[1] < 0.85 * (one[2] - one[1])  # counting copies as independent fakes precision
    assert one[1] <= one[0] <= one[2]


# ----------------------------------------------------------------------------------------------------------------
# detection


def test_placement_values_average_to_the_auroc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    y = np.array([0] * 30 + [1] * 20)
    s = rng.normal(size=50) + y
    s[3] = s[40]  # a tie counts one half
    pv = ft.placement_values(s, y)
    assert pv.mean() == pytest.approx(roc_auc_score(y, s))
    assert pv[y == 1].mean() == pytest.approx(pv[y == 0].mean())


def test_detection_finds_signal_and_not_noise():
    rng = np.random.default_rng(1)
    y = np.array([0] * 40 + [1] * 40)
    groups = [f"g{i % 40}" for i in range(80)]  # a human document and its continuation share a group
    informative = np.column_stack([y + 0.3 * rng.normal(size=80), rng.normal(size=80)])
    assert ft.detect(informative, y, groups, folds=5).auroc > 0.95
    noise = rng.normal(size=(80, 2))
    assert abs(ft.detect(noise, y, groups, folds=5).auroc - 0.5) < 0.2
    with pytest.raises(ValueError, match="needs >= 2 groups in each class"):
        ft.detect(noise[:2], y[[0, 40]], ["a", "b"], folds=5)


# ----------------------------------------------------------------------------------------------------------------
# scoring on the tiny model


def test_token_bits_are_the_model_log_probs_and_windows_score_every_token_once(tiny_llama):
    from lmlab.core.inference.scoring import token_logprobs

    ids = list(np.random.default_rng(0).integers(3, 250, size=90))
    ctx = [1]
    full = ft.token_bits(tiny_llama, [ctx], [ids], window=256)[0]
    ref = -token_logprobs(tiny_llama, torch.tensor([ctx + ids]))[0].numpy() / math.log(2)
    np.testing.assert_allclose(full, ref, atol=1e-4)
    windowed = ft.token_bits(tiny_llama, [ctx], [ids], window=40)[0]
    assert windowed.shape == full.shape
    np.testing.assert_allclose(windowed[:39], full[:39], atol=1e-4)  # the first window has the whole context
    assert not np.allclose(windowed[60:], full[60:], atol=1e-4)  # later tokens lost their far context


def test_bits_series_drops_prompt_and_warm_up_tokens(tiny_llama, tiny_tokenizer):
    text = "the quick brown fox jumps over the lazy dog " * 3
    n = len(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    (plain,) = ft.bits_series(tiny_llama, tiny_tokenizer, [text], drop_first=10)
    assert plain.size == n - 10
    (prompted,) = ft.bits_series(tiny_llama, tiny_tokenizer, [text], prompts=["a prompt of 20 chars"], drop_first=10)
    assert prompted.size == n  # a 20-token prompt already covers the warm-up: every text token is kept
    (short,) = ft.bits_series(tiny_llama, tiny_tokenizer, [text], prompts=["abc"], drop_first=10)
    assert short.size == n - 7


def test_decoder_log_probs_are_the_scorer_bits_of_its_own_generation(tiny_llama, tiny_tokenizer):
    """For the same tokens and context the decoder's log-probs are the scorer's bits, so what the experiment's one
    scoring procedure changes for the scorer's own text is its re-tokenisation and its context, nothing else."""
    from lmlab.core.inference.generation import decode_batch

    prompts = [[1] + list(tiny_tokenizer("abc def", add_special_tokens=False)["input_ids"]), [1, 70, 71]]
    outs = decode_batch(tiny_llama, tiny_tokenizer, prompts, max_new_tokens=24, do_sample=True, temperature=1.5,
                        seed=3, eos_token_id=[], batch_size=2)  # fmt: skip
    rescored = ft.token_bits(tiny_llama, prompts, [o.token_ids for o in outs], window=512)
    for o, b in zip(outs, rescored):
        np.testing.assert_allclose(-np.asarray(o.token_logprobs) / math.log(2), b, atol=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# bad input: one line naming the value


def test_bad_series_and_grids_are_refused():
    with pytest.raises(ValueError, match="no series given"):
        ft.fractal_table([])
    with pytest.raises(ValueError, match="series 0 has 50 values; every series needs > max"):
        ft.fractal_table([np.random.default_rng(0).normal(size=50)])
    with pytest.raises(ValueError, match="scales must be >= 2 increasing"):
        ft.hurst_rs(_fgn(0.5, docs=2), scales=(64, 32))
    with pytest.raises(ValueError, match="kind must be one of increments, levels"):
        ft.hurst_rs(_fgn(0.5, docs=2), kind="walk")
    with pytest.raises(ValueError, match="constant"):
        ft.increments(np.ones(10))
    assert ft.usable([np.ones(200), np.arange(200.0), np.arange(10.0)], (8, 16), (1, 2)) == [False, True, False]
    with pytest.raises(ValueError, match="hurst must be in"):
        ft.fractional_gaussian_noise(64, 1.0)
    with pytest.raises(ValueError, match="selfsim_offsets must be one of all, random"):
        ft.fractal_table(_fgn(0.5, docs=2, n=200), selfsim_offsets="some")


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"conditions": ["prefix@0"]}, "conditions entries must be 'STYLE@TEMPERATURE'"),
        ({"conditions": ["story@1.0"]}, "conditions entries must be"),
        ({"conditions": ["prefix@1.0", "prefix@1"]}, "conditions must not repeat"),
        ({"b_conditions": ["prefix"]}, "b_conditions entries must be"),
        ({"conditions": []}, "conditions must list at least one"),
        ({"human_domains": ["licenses"]}, "human_domains must include 'stdlib'"),
        ({"human_domains": ["gutenberg"]}, "human_domains must be a non-empty subset"),
        ({"scales": [32, 16]}, "scales must be >= 2 increasing"),
        ({"human_tokens": 100}, "human_tokens must be in"),
        ({"max_new_tokens": 64}, "max_new_tokens must be in"),
        ({"eps": 0.0}, "eps must be in"),
        ({"folds": 1}, "folds must be in"),
        ({"selfsim_offsets": "every"}, "selfsim_offsets must be one of all, random"),
        ({"calibration_draws": 1}, "calibration_draws must be in"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(override, message):
    with pytest.raises(ValueError, match=message):
        FractalTextConfig(**override)


def test_parse_condition():
    assert parse_condition("instruction@1.5") == ("instruction", 1.5)


# ----------------------------------------------------------------------------------------------------------------
# the experiment's scoring and claims


def test_every_generator_is_scored_by_one_procedure(tiny_llama, tiny_tokenizer):
    """The scorer's own generation and another model's identical generation get identical bits.

    Before issue 35 the scorer's own text was scored by the decoder's log-probs in its chat-template context, any
    other generator's by re-tokenising it with the plain request as context: two regimes inside one gated check."""
    from types import SimpleNamespace

    from lmlab.core.inference.tiny import make_tiny_llama
    from lmlab.methods.analysis.fractal_text.experiment import Doc, _generate

    twin = make_tiny_llama(seed=0)  # the scorer's weights in another model object: "another generator"
    cfg = FractalTextConfig(scales=[4, 8], taus=[1, 2], max_new_tokens=24, drop_first=4, window=128, batch_size=2,
                            score_batch_size=2)  # fmt: skip
    ctx = SimpleNamespace(meter=None)
    text = "the quick brown fox jumps over the lazy dog"
    ids = list(tiny_tokenizer(text, add_special_tokens=False)["input_ids"])
    prompts = [(Doc("human_stdlib", f"d{i}", f"stdlib:mod{i}", text, np.zeros(0)), ids) for i in range(2)]
    for style in ("instruction", "prefix"):
        own = _generate(cfg, ctx, ("a", tiny_llama, tiny_tokenizer), (tiny_llama, tiny_tokenizer), prompts, style,
                        1.5, "sys")  # fmt: skip
        other = _generate(cfg, ctx, ("b", twin, tiny_tokenizer), (tiny_llama, tiny_tokenizer), prompts, style, 1.5,
                          "sys")  # fmt: skip
        for a, b in zip(own, other):
            assert a.text == b.text  # same weights, same seed: the same sample
            np.testing.assert_allclose(a.bits, b.bits, atol=1e-6)


def test_the_detection_ablation_against_mean_and_std_is_gated():
    """[mean, std, H, S] must beat [mean, std] too: the check against [mean bits] alone cannot tell H and S's gain
    from the std's (the measured 0.768 vs 0.768)."""
    from types import SimpleNamespace

    from lmlab.methods.analysis.fractal_text.experiment import _claims

    metrics = {(fs, "auroc") for fs in ("mean_bits_only", "first_order", "fractal_features")}

    def values(system, metric):
        if (system, metric) not in metrics:
            raise KeyError((system, metric))
        return [0.5]

    ctx = SimpleNamespace(values=values, note=lambda text: None)
    claims = _claims(FractalTextConfig(), ctx, {}, "smollm2")
    gated = {c.baseline for c in claims if c.metric == "auroc" and c.method == "fractal_features" and c.gate}
    assert gated == {"mean_bits_only", "first_order"}
