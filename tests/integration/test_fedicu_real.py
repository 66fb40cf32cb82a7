"""FedICU-style (reconstructed) on SmolLM2-135M (the default preset): the claim's direction.

FedICU learns the client domains (held-out domain NLL below the base model's: the run's first gate), its general-probe
answer NLL falls further than FedAvg's (positive transfer; the server probe holds client families only), it keeps
domain accuracy near FedAvg's and uploads about 1/rho fewer floats. Default preset: ~100-170 s.
"""

from __future__ import annotations

import math

import pytest

from lmlab.methods.adaptation.fedicu.config import GENERAL_FAMILIES
from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_fedicu_learns_the_domains_and_transfers_at_a_fraction_of_the_upload(smollm2):
    result = run_method("fedicu", preset="default", write=False, show_progress=False, raise_errors=True, threads=2)
    m = {(r.system, r.metric): r.value for r in result.metrics}
    assert all(math.isfinite(r.value) for r in result.metrics)
    assert m[("fedicu", "domain_nll")] < m[("round0", "domain_nll")]  # the domain-learning gate's direction
    assert result.claims[0].gate and result.claims[0].baseline == "round0"  # and it is read first
    assert not set(result.flags["server_probe_families"]) & set(GENERAL_FAMILIES)  # the probe scores no gated family
    assert m[("fedicu", "general_nll_drift")] < m[("fedavg", "general_nll_drift")]
    assert m[("fedicu", "domain_acc")] >= m[("fedavg", "domain_acc")] - 0.15
    # about 1/rho fewer floats at the probe's rho (searched past the grid's edge, up to rho = 1: no saving then)
    assert result.flags["upload_ratio_fedavg_over_fedicu"] == pytest.approx(1 / result.flags["picked_rho"], rel=0.01)
    assert {c.status for c in result.claims} <= {"supported", "not_supported", "inconclusive"}
    assert result.flags["faithful_label"] == "FedICU-style (reconstructed)"
