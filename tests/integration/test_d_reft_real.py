"""d_reft on SmolLM2-135M (quick preset, 30 steps): both interventions learn the task (LoReFT above the bare model on
log p(gold), the direction of the run's training gate), D-LoReFT learns a non-zero sigma,
the robustness probes bite, and D-LoReFT is not clearly worse than LoReFT on the robustness conditions.

The paper's effect (D-LoReFT above LoReFT on robustness, 1-2 points at 7B scale) is within the noise of one seed and
24 countries here (measured once at 32 countries: 0.55 vs 0.57), so the claim itself is not asserted; the documented
proxy is a loose non-inferiority margin next to mechanism checks that fail when training or the probes are broken.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_d_reft_learns_and_is_not_less_robust(smollm2):
    result = run_method("d_reft", preset="quick", write=False, show_progress=False, raise_errors=True, threads=2)
    m = {(r.system, r.metric): r.value for r in result.metrics}
    runs = {s["system"]: s for s in result.samples if s.get("seed") == 0}
    for system in ("loreft", "d_loreft"):
        assert runs[system]["loss_last"] < 0.5 * runs[system]["loss_first"], system  # training works
    sigma = runs["d_loreft"]["mean_sigma"]
    assert 0.001 <= sigma <= 0.2 + 1e-6  # the official clamps
    # representation noise of 1 x RMS at layer 0 hurts the bare model: the probe is not a no-op
    assert m[("base", "acc_noise_1_L0")] < m[("base", "acc_clean_L0")]
    # direction of the run's training gate: LoReFT puts more probability on the gold continent than the bare model
    assert m[("loreft", "gold_logp_clean_L0")] > m[("base", "gold_logp_clean_L0")]
    assert result.claims[0].gate and result.claims[0].baseline == "base"  # the training gate is checked first
    # the trained interventions keep (or improve) the bare model's clean accuracy
    assert m[("loreft", "acc_clean_L0")] >= m[("base", "acc_clean_L0")] - 0.1
    assert m[("d_loreft", "acc_clean_L0")] >= m[("base", "acc_clean_L0")] - 0.1
    # documented proxy of the claim's direction: D-LoReFT not more than 10 points below LoReFT on robustness
    assert m[("d_loreft", "robust_acc_L0")] >= m[("loreft", "robust_acc_L0")] - 0.1
    assert all(math.isfinite(r.value) for r in result.metrics)
