"""FedICU-style (reconstructed) on SmolLM2-135M (the quick preset): the claim's direction.

With the top-rho importance mask FedICU moves the base model less on the general probe (lower answer-NLL drift than
FedAvg), keeps domain accuracy near FedAvg's, and uploads about 1/rho fewer floats. Expected ~40-60 s.
"""

from __future__ import annotations

import math

import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_fedicu_forgets_less_than_fedavg_at_a_fraction_of_the_upload(smollm2):
    result = run_method("fedicu", preset="default", write=False, show_progress=False, raise_errors=True, threads=2)
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert m[("fedicu", "general_nll_drift")] < m[("fedavg", "general_nll_drift")]
    assert m[("fedicu", "domain_acc")] >= m[("fedavg", "domain_acc")] - 0.15
    assert result.flags["upload_ratio_fedavg_over_fedicu"] >= 1.9  # rho in {0.3, 0.5}: >= 2x fewer floats
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
    assert result.flags["faithful_label"] == "FedICU-style (reconstructed)"
