"""M_AP on SmolLM2-135M-Instruct: a trimmed quick preset (DPO, M_AP vs random and implicit-only).

Asserted: the cached-trunk scores equal the full model's (mechanism); M_AP keeps larger explicit margins than
random and implicit-only smaller implicit margins (how the metrics are built, on real log-probs); DPO on the M_AP
and random subsets beats chance on held-out pairs. The paper's direction (M_AP > random > implicit-only) is a
documented proxy here: at 50 pairs its CI is wide, so only "M_AP is not below implicit-only by > 0.05" is asserted.
"""

from __future__ import annotations

import numpy as np
import pytest

from lmlab.runner import run_method

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_map_selection_and_dpo_on_smollm2(smollm2):
    import torch

    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.preference import seq_logprobs
    from lmlab.methods.alignment.alignment_potential import method as M

    model, tok = smollm2
    prompts = ["What is the capital of Norway? Answer in one sentence.", "On which continent is Peru located?"]
    chosen, rejected = ["The capital of Norway is Oslo.", "Peru is in South America."], ["Bergen.", "Asia."]
    trunk = FrozenTrunk(model, 2)
    sc = M.score_pairs(trunk.reference, M.encode_pairs(trunk, tok, prompts, chosen, rejected))
    ps, cs, rs = M.format_pairs(tok, prompts, chosen, rejected)
    with torch.no_grad():
        full = seq_logprobs(model, tok, ps + ps, cs + rs, chat=False)
    np.testing.assert_allclose(np.r_[sc.chosen_mean, sc.rejected_mean], full.mean.double().numpy(), atol=1e-3)

    result = run_method(
        "alignment_potential",
        preset="quick",
        write=False,
        show_progress=False,
        raise_errors=True,
        threads=2,
        pool_size=50,
        test_size=30,
        selections=["random", "implicit_only", "map"],
    )
    sel = {r["system"]: r for r in result.tables["selections"]}
    assert sel["map"]["mean_rm_margin"] > sel["random"]["mean_rm_margin"]
    assert sel["implicit_only"]["mean_abs_implicit"] < sel["random"]["mean_abs_implicit"]
    acc = {s: result.metric(f"{s}@dpo", "pref_acc").value for s in ("random", "implicit_only", "map")}
    assert acc["map"] > 0.5 and acc["random"] > 0.5, acc
    assert acc["map"] >= acc["implicit_only"] - 0.05, acc
