"""Steering vectors and LoReFT interventions at named hook points."""

from __future__ import annotations

import pytest
import torch

from lmlab.core.inference.hooks import run_with_cache, run_with_hooks
from lmlab.core.inference.interventions import (
    LoReFTIntervention,
    SteeringVector,
    attach_intervention,
    intervention_hook,
)

IDS = torch.tensor([[1, 72, 101, 108, 108, 111, 44, 32, 119, 111]])  # (1, 10)


@pytest.fixture(params=["llama", "gemma3"])
def model(request, tiny_llama, tiny_gemma):
    return tiny_llama if request.param == "llama" else tiny_gemma


def _logits(model, ids=IDS):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def _no_hooks(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_loreft_rows_orthonormal_and_subspace_edit():
    torch.manual_seed(0)
    reft = LoReFTIntervention(64, 4)
    R = reft.R  # (rank, d)
    assert R.shape == (4, 64)
    torch.testing.assert_close(R @ R.T, torch.eye(4), rtol=0, atol=1e-5)
    h = torch.randn(2, 5, 64)
    with torch.no_grad():
        out = reft(h)
        # The edit sets R's coordinates to W h + b and leaves the orthogonal complement alone.
        torch.testing.assert_close(out @ R.T, reft.learned_source(h), rtol=1e-4, atol=1e-4)
        complement = torch.eye(64) - R.T @ R
        torch.testing.assert_close((out - h) @ complement, torch.zeros_like(h), rtol=0, atol=1e-5)
    # Orthonormality survives an optimiser step (the parametrization keeps R on the Stiefel manifold).
    opt = torch.optim.SGD(reft.parameters(), lr=0.5)
    reft(h).pow(2).sum().backward()
    opt.step()
    torch.testing.assert_close(reft.R @ reft.R.T, torch.eye(4), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="rank"):
        LoReFTIntervention(8, 9)


def test_loreft_identity_when_w_equals_r(model):
    torch.manual_seed(1)
    reft = LoReFTIntervention(model.config.hidden_size, 3).set_identity()
    assert torch.equal(reft.learned_source.weight, reft.R.detach())
    h = torch.randn(3, 7, model.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(reft(h), h)
    with attach_intervention(model, "blocks.0.resid_post", reft, positions=[2, 4]), torch.no_grad():
        assert torch.equal(model(input_ids=IDS).logits, _logits(model))
    assert _no_hooks(model)


def test_loreft_trains_through_hook_at_positions(model):
    torch.manual_seed(2)
    reft = LoReFTIntervention(model.config.hidden_size, 2)
    ref = _logits(model)
    with attach_intervention(model, "blocks.1.hook_resid_pre", reft, positions=[-1]):
        logits = model(input_ids=IDS, use_cache=False).logits
        # autograd.grad, not backward: the shared model's parameters must not accumulate .grad
        grads = torch.autograd.grad(logits[0, -1].logsumexp(-1), list(reft.parameters()))
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(logits[:, :-1].detach(), ref[:, :-1])  # only the last position is edited
    assert not torch.allclose(logits[:, -1].detach(), ref[:, -1])
    assert _no_hooks(model)


def test_steering_vector_zero_and_closed_form(model):
    d = model.config.hidden_size
    ref = _logits(model)
    zero = intervention_hook(SteeringVector(torch.zeros(d), alpha=3.0))
    assert torch.equal(run_with_hooks(model, IDS, fwd=[("blocks.1.resid_post", zero)]), ref)
    v = torch.randn(d, generator=torch.Generator().manual_seed(0))
    sv = SteeringVector(v, alpha=2.0)
    last = f"blocks.{len(model.model.layers) - 1}.hook_resid_post"
    _, cache = run_with_cache(model, IDS, names=[last])
    with sv.attach(model, last, positions=slice(3, None)), torch.no_grad():
        steered = model(input_ids=IDS, use_cache=False).logits
        resid = cache[last].clone()
        resid[:, 3:] += 2.0 * v
        closed = model.lm_head(model.model.norm(resid))
    torch.testing.assert_close(steered, closed, rtol=1e-5, atol=1e-5)
    assert torch.equal(steered[:, :3], ref[:, :3])
    assert _no_hooks(model)


def test_steering_vector_from_contrast_and_cleanup_on_error(tiny_llama):
    pos = torch.ones(4, 3, 8)
    neg = torch.zeros(2, 8)
    sv = SteeringVector.from_contrast(pos, neg, alpha=0.5)
    assert torch.equal(sv.vector, torch.ones(8)) and sv.alpha == 0.5
    unit = SteeringVector.from_contrast(pos, neg, normalize=True)
    torch.testing.assert_close(unit.vector.norm(), torch.tensor(1.0))
    trainable = SteeringVector(torch.zeros(8), trainable=True)
    assert [n for n, _ in trainable.named_parameters()] == ["vector"]
    with pytest.raises(RuntimeError, match="stop"):
        with SteeringVector(torch.ones(64)).attach(tiny_llama, "blocks.0.attn.out"):
            raise RuntimeError("stop")
    assert _no_hooks(tiny_llama)
