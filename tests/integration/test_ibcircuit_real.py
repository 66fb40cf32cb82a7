"""IBCircuit on SmolLM2-135M (IOI, trimmed): the prompt set is aligned and solved by the model, and IBCircuit's
top-k circuits, mean-ablated like every baseline's, keep more of the IO − S logit difference than random heads
(raw metric, the paper's axis, and the normalised faithfulness (m(C) − m(∅)) / (m̄(M) − m̄(∅))) and a lower KL.

The gated claim of the full run (IBCircuit beats EAP and HAP too) is not asserted here: with 8 fit prompts and 20
steps it is not stable at this size. The documented proxies are beating random heads on recovery and KL, and the
full model solving the prompts.
"""

from __future__ import annotations

import pytest
import torch

from lmlab.methods.analysis.ibcircuit import method as M
from lmlab.methods.analysis.ibcircuit import task as T

pytestmark = [pytest.mark.slow, pytest.mark.real_model]


def test_ibcircuit_beats_random_heads_on_smollm2_ioi(smollm2):
    torch.set_num_threads(2)
    model, tok = smollm2
    v = model.get_output_embeddings().weight.shape[0]
    fit = T.ioi_dataset(tok, 8, 0, "fit", vocab=v)
    held = T.ioi_dataset(tok, 8, 0, "eval", vocab=v)
    assert fit.input_ids.shape[1] == 14  # single-token names, places and objects
    full = M.metric_values(M.answer_logits(model, held.input_ids, held.answer_pos), held)
    assert float(full.mean()) > 1.0  # SmolLM2 solves IOI (the IO name ahead of S)
    ib = M.IBCircuit(model, steps=20, lr=0.2)
    lam = ib.fit(fit)
    assert lam.shape == (30, 9)
    assert ib.history[-1]["loss"] < ib.history[0]["loss"]
    ref = M.head_means(model, fit)
    ks = [20, 40]
    ibc = M.faithfulness_curve(model, lam, held, ks, reference=ref)
    rnd = [M.faithfulness_curve(model, M.random_scores(30, 9, s), held, ks, reference=ref) for s in range(2)]
    assert ibc[ks[0]].gap > 0  # the heads carry the logit difference: the normalised scale is defined
    for k in ks:
        r_metric = sum(float(c[k].metric.mean()) for c in rnd) / len(rnd)
        r_faith = sum(float(c[k].faithfulness.mean()) for c in rnd) / len(rnd)
        r_kl = sum(float(c[k].kl.mean()) for c in rnd) / len(rnd)
        assert float(ibc[k].metric.mean()) > r_metric, k
        assert float(ibc[k].faithfulness.mean()) > r_faith, k
        assert float(ibc[k].kl.mean()) < r_kl, k
