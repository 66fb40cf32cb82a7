"""WikiBigEdit's dedicated knowledge editors: sequential ROME (and R-ROME) and batched MEMIT (locate-then-edit).

Both edit the ``down_proj`` of llama-style MLP blocks (`method.check_editable`). A key is the ``down_proj`` input at
the subject's last token (`subject_last_index`, `mlp_keys`), averaged over context templates (`context_prefixes`,
`context_templates`); a value is optimised at the edited point (`optimise_value`); the closed-form updates are
`rome_update` and `memit_update`, with C from `compute_covariance`.

- `ROMEEditor`: sequential rank-one edits of one ``down_proj`` (Meng et al., 2022; ``rome_main.py``):
  W <- W + (v* - W k)(C^-1 k*)^T / ((C^-1 k*)^T k), k* the mean key over context templates at the subject's last
  token, v* the MLP output that maximises the new answer (`optimise_value`); R-ROME (Gupta et al., 2024) uses k = k*.
- `MEMITEditor`: one batched update per increment over several layers (Meng et al., 2023; ``memit_main.py``):
  z_i at the last edited layer's residual stream, then per layer l (in order)
  dW_l = R_l K_l^T (lambda C_l + K_l K_l^T)^-1 with R_l = (Z - current Z) / (L - l + 1 counted from l).

Everything here is pure (no I/O, no printing): models, tokenizers and records in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.core.inference.hooks import hooks
from lmlab.core.inference.scoring import _pad_id, encode, split_pair
from lmlab.methods.analysis.wikibigedit.method import (
    Editor,
    EditRecord,
    _device,
    _right_pad,
    check_editable,
    check_layers,
    decoder_layers,
    qa_prompt,
)

KL_PROMPT = "{} is a"  # ROME's essence prompt (``compute_v.py``: kl_prompts)
EARLY_STOP_LOSS = 5e-2  # ``compute_v.py``: stop optimising v once the loss is below this


def subject_last_index(tokenizer: Any, text: str, subject: str, start: int = 0) -> int:
    """Index of the subject's last token inside the tokenised `text` (ROME's ``fact_token: subject_last``).

    Found through the character offsets of the tokenisation of the whole text, so BPE merges and a leading space
    are handled as the model sees them. `start` skips a context prefix.
    """
    pos = text.find(subject, start)
    if pos < 0:
        raise ValueError(f"subject {subject!r} does not occur in {text!r}")
    end = pos + len(subject)
    enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    idx = [i for i, (a, b) in enumerate(enc["offset_mapping"]) if b > a and a < end]
    if not idx:
        raise ValueError(f"no token of {text!r} covers the subject {subject!r}")
    return idx[-1]


def _mlp_point(layer: int) -> tuple[str, str]:
    return f"blocks.{layer}.mlp.hook_post", f"blocks.{layer}.mlp.hook_out"


@torch.no_grad()
def mlp_keys(
    model: nn.Module, tokenizer: Any, texts: Sequence[str], subjects: Sequence[str], layer: int
) -> torch.Tensor:
    """(n, m) ``down_proj`` inputs at each text's subject-last token (one right-padded forward)."""
    rows = [encode(tokenizer, t) for t in texts]
    idx = [subject_last_index(tokenizer, t, s, t.rfind("Q: ") if "Q: " in t else 0) for t, s in zip(texts, subjects)]
    ids, mask = _right_pad(rows, _pad_id(tokenizer))
    got: dict[str, torch.Tensor] = {}

    def grab(x: torch.Tensor, *, hook: Any) -> None:
        got["k"] = x.detach()

    with hooks(model, fwd=[(_mlp_point(layer)[0], grab)]):
        model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model)), use_cache=False)
    return torch.stack([got["k"][i, j] for i, j in enumerate(idx)]).double()


def context_prefixes(model: nn.Module, tokenizer: Any, n: int, length: int, *, seed: int = 0) -> list[str]:
    """`n` random text prefixes of `length` tokens sampled (top-5) from the model, as ROME's ``generate_fast``.

    ROME builds its context templates from them (``"{prefix}. {}"``) so that the key k* averages over contexts.
    """
    if n == 0:
        return []
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    ids = torch.full((n, 1), int(start if start is not None else 0), dtype=torch.long)
    with torch.no_grad():
        for _ in range(length):
            logits = model(input_ids=ids.to(_device(model)), use_cache=False).logits[:, -1].float().cpu()
            top = torch.topk(logits, k=min(5, logits.shape[-1]), dim=-1)
            pick = torch.multinomial(F.softmax(top.values, dim=-1), 1, generator=gen)
            ids = torch.cat([ids, top.indices.gather(-1, pick)], dim=1)
    out = []
    for row in ids[:, 1:]:
        text = tokenizer.decode(row.tolist(), skip_special_tokens=True).replace("{", " ").replace("}", " ")
        out.append(" ".join(text.split()) or "Text")
    return out


def context_templates(prefixes: Sequence[str]) -> list[str]:
    """``["{}"] + ["{prefix}. {}" ...]`` (``rome/compute_v.py`` / ``repr_tools``)."""
    return ["{}"] + [f"{p}. {{}}" for p in prefixes]


@dataclass
class ValueResult:
    """The optimised value vector and its trace."""

    target: torch.Tensor  # (d,) target_init + delta
    init: torch.Tensor  # (d,) the module output before the edit at the plain prompt's subject
    delta_norm: float
    losses: list[float] = field(default_factory=list)


def optimise_value(
    model: nn.Module,
    tokenizer: Any,
    request: EditRecord,
    point: str,
    templates: Sequence[str],
    *,
    steps: int = 20,
    lr: float = 0.5,
    weight_decay: float = 1e-3,
    clamp_norm_factor: float = 4.0,
    kl_factor: float = 0.0625,
) -> ValueResult:
    """ROME's v* (``compute_v.py``) / MEMIT's z (``compute_z.py``): a vector delta added at hook `point` at the
    subject's last token of every prompt, minimising

        mean_j -log p(target | template_j(prompt)) / |target| + kl_factor KL(p_delta || p_0)("{subject} is a")
        + weight_decay ||delta|| / ||init||^2,

    Adam(lr), early stop below 0.05, delta clamped to clamp_norm_factor ||init|| after each step. `point` is
    ``blocks.{l}.mlp.hook_out`` for ROME and ``blocks.{L}.hook_resid_post`` for MEMIT. Model weights are frozen.
    """
    device = _device(model)
    base = qa_prompt(request.src)
    _, tgt = split_pair(tokenizer, base, " " + request.alt)
    if not tgt:
        raise ValueError(f"target {request.alt!r} has no tokens")
    rows, lookup, spans = [], [], []
    for tmpl in templates:
        text = tmpl.format(base)
        ctx = encode(tokenizer, text)
        rows.append(ctx + tgt[:-1])
        lookup.append(subject_last_index(tokenizer, text, request.subject, text.rfind("Q: ")))
        spans.append(len(ctx))
    kl_text = KL_PROMPT.format(request.subject)
    rows.append(encode(tokenizer, kl_text))
    lookup.append(subject_last_index(tokenizer, kl_text, request.subject))
    n_rw = len(templates)
    ids, mask = _right_pad(rows, _pad_id(tokenizer))
    ids, mask = ids.to(device), mask.to(device)
    tgt_t = torch.tensor(tgt, device=device)
    was = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    d = model.config.hidden_size
    delta = torch.zeros(d, device=device, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=lr)
    state: dict[str, Any] = {}

    def add_delta(x: torch.Tensor, *, hook: Any) -> torch.Tensor:
        if "init" not in state:
            state["init"] = x[0, lookup[0]].detach().clone()
        x = x.clone()
        rows_i = torch.arange(len(lookup), device=x.device)
        x[rows_i, torch.tensor(lookup, device=x.device)] += delta.to(x.dtype)
        return x

    losses: list[float] = []
    kl_init = None
    try:
        with hooks(model, fwd=[(point, add_delta)]):
            for it in range(steps):
                logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float()
                nll = []
                for j in range(n_rw):
                    c = spans[j]
                    lp = F.log_softmax(logits[j, c - 1 : c - 1 + len(tgt)], dim=-1)
                    nll.append(-lp.gather(-1, tgt_t[:, None]).sum() / len(tgt))
                nll_loss = torch.stack(nll).mean()
                kl_lp = F.log_softmax(logits[n_rw, lookup[n_rw]], dim=-1)
                if kl_init is None:
                    kl_init = kl_lp.detach().clone()
                kl = kl_factor * F.kl_div(kl_init[None], kl_lp[None], log_target=True, reduction="batchmean")
                init = state["init"]
                wd = weight_decay * (delta.norm() / init.norm().clamp_min(1e-12) ** 2)
                loss = nll_loss + kl + wd
                losses.append(float(loss.detach()))
                if losses[-1] < EARLY_STOP_LOSS or it == steps - 1:
                    break
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                with torch.no_grad():
                    max_norm = clamp_norm_factor * init.norm()
                    if delta.norm() > max_norm:
                        delta.mul_(max_norm / delta.norm())
    finally:
        for p, w in zip(model.parameters(), was):
            p.requires_grad_(w)
    init = state["init"].double()
    return ValueResult(init + delta.detach().double(), init, float(delta.detach().norm()), losses)


def rome_update(
    weight: torch.Tensor, k_star: torch.Tensor, v_star: torch.Tensor, *, k: torch.Tensor | None = None,
    cov: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """ROME's rank-one update of a (d, m) linear weight, in float64:

        dW = (v* - W k) (C^-1 k*)^T / ((C^-1 k*)^T k),

    with u = C^-1 k* (``compute_u``; C = I without ``mom2_adjustment``) and k the key the residual is measured at
    (``compute_v``: the plain prompt's key; R-ROME and ``k=None``: k = k*). Afterwards (W + dW) k = v* exactly and
    any key k' with (C^-1 k*)^T k' = 0 keeps its output. Returns dW (d, m).
    """
    w = weight.detach().double()
    ks = k_star.detach().double().reshape(-1)
    kk = ks if k is None else k.detach().double().reshape(-1)
    u = ks if cov is None else torch.linalg.solve(cov.double(), ks)
    denom = float(u @ kk)
    if abs(denom) < 1e-12:
        raise ValueError("the edit key is orthogonal to its C^-1-transformed direction; cannot place a rank-one edit")
    return torch.outer(v_star.detach().double().reshape(-1) - w @ kk, u) / denom


def memit_update(keys: torch.Tensor, resid: torch.Tensor, cov: torch.Tensor, lam: float) -> torch.Tensor:
    """MEMIT's batched least-squares update (``memit_main.py``), float64: dW = R K^T (lam C + K K^T)^-1.

    Args:
        keys: K (m, n), one key per edit; resid: R (d, n), this layer's share of the residuals; cov: C (m, m);
        lam: ``mom2_update_weight`` (15000 in the paper's config).

    For one edit, Sherman-Morrison gives dW = r (C^-1 k)^T / (lam + k^T C^-1 k): ROME's update with C^-1
    scaled so that it tends to ROME's as lam -> 0 (the equality the tests check).
    """
    k, r, c = keys.double(), resid.double(), cov.double()
    adj = torch.linalg.solve(lam * c + k @ k.T, k)  # (m, n)
    return r @ adj.T


class ROMEEditor(Editor):
    """Sequential ROME (and R-ROME) edits of ``down_proj`` at `layer`, one rank-one update per edit.

    Args:
        layer (`int`): the edited layer (paper config: 5 of Llama-3-8B's 32).
        templates: context templates (`context_templates`); k* averages over them.
        r_rome (`bool`, defaults to True): measure the residual at k* (R-ROME) instead of the plain prompt's key.
        cov: C for ``mom2_adjustment`` (None: C = I, the paper's config).
        **value_kw: `optimise_value` settings (steps, lr, weight_decay, clamp_norm_factor, kl_factor).
    """

    name = "rome"

    def __init__(self, model: nn.Module, tokenizer: Any, *, layer: int, templates: Sequence[str], r_rome: bool = True,
                 cov: torch.Tensor | None = None, **value_kw: Any):  # fmt: skip
        super().__init__(model, tokenizer)
        check_editable(model, "ROME")
        check_layers(model, [layer], "rome_layer")
        self.layer, self.templates, self.r_rome, self.cov, self.value_kw = (
            layer,
            list(templates),
            r_rome,
            cov,
            value_kw,
        )
        self.residuals: list[float] = []  # relative |(W + dW) k - v*| / |v*| of every edit (exact up to rounding)

    def edit_one(self, request: EditRecord) -> dict[str, float]:
        down = decoder_layers(self.model)[self.layer].mlp.down_proj
        texts = [t.format(qa_prompt(request.src)) for t in self.templates]
        k_star = mlp_keys(self.model, self.tokenizer, texts, [request.subject] * len(texts), self.layer).mean(0)
        res = optimise_value(self.model, self.tokenizer, request, _mlp_point(self.layer)[1], self.templates,
                             **self.value_kw)  # fmt: skip
        k = None
        if not self.r_rome:
            k = mlp_keys(self.model, self.tokenizer, [qa_prompt(request.src)], [request.subject], self.layer)[0]
        dw = rome_update(down.weight, k_star, res.target, k=k, cov=self.cov)
        with torch.no_grad():
            down.weight.add_(dw.to(down.weight.dtype))
            key = k_star if k is None else k
            after = down.weight.double() @ key
        rel = float((after - res.target).norm() / res.target.norm().clamp_min(1e-12))
        self.residuals.append(rel)
        return {"v_loss_first": res.losses[0], "v_loss_last": res.losses[-1], "delta_norm": res.delta_norm,
                "update_norm": float(dw.norm()), "rank_one_residual": rel}  # fmt: skip

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        stats = [self.edit_one(r) for r in requests]
        self.n_edits += len(requests)
        return {k: float(np.mean([s[k] for s in stats])) for k in stats[0]} if stats else {}


@torch.no_grad()
def compute_covariance(
    model: nn.Module, tokenizer: Any, layers: Sequence[int], texts: Sequence[str], *, max_tokens: int = 64,
    batch_size: int = 8,
) -> dict[int, torch.Tensor]:  # fmt: skip
    """C_l = E[k k^T] over the tokens of `texts` (the uncentred second moment of ``layer_stats.py``, ``mom2``), in
    float64, for every layer in `layers`; one forward per batch, stopped after the deepest layer needed.

    The paper's config uses ``mom2_n_samples: 100`` Wikipedia samples from the Hub; here any offline texts (the
    caller caches the result for the run: the statistics describe the unedited model).
    """
    if not texts:
        raise ValueError("compute_covariance needs at least one text")
    check_layers(model, layers, "covariance layers")
    m = decoder_layers(model)[layers[0]].mlp.down_proj.in_features
    sums = {layer: torch.zeros(m, m, dtype=torch.float64) for layer in layers}
    count = 0
    deepest = max(layers)

    class _Stop(Exception):
        pass

    for start in range(0, len(texts), batch_size):
        rows = [encode(tokenizer, t)[:max_tokens] for t in texts[start : start + batch_size]]
        rows = [r for r in rows if r]
        if not rows:
            continue
        ids, mask = _right_pad(rows, _pad_id(tokenizer))
        flat_mask = mask.bool().reshape(-1)

        def grab(x: torch.Tensor, *, hook: Any, flat_mask: torch.Tensor = flat_mask) -> None:
            k = x.reshape(-1, x.shape[-1])[flat_mask.to(x.device)].double().cpu()  # (tokens, m)
            sums[hook.layer] += k.T @ k
            if hook.layer == deepest:
                raise _Stop

        try:
            with hooks(model, fwd=[(_mlp_point(layer)[0], grab) for layer in layers]):
                model(input_ids=ids.to(_device(model)), attention_mask=mask.to(_device(model)), use_cache=False)
        except _Stop:
            pass
        count += int(mask.sum())
    if count == 0:
        raise ValueError("compute_covariance: the texts have no tokens")
    return {layer: s / count for layer, s in sums.items()}


class MEMITEditor(Editor):
    """MEMIT: one batched update per increment over `layers` (``memit_main.py:execute_memit``).

    For the increment's edits: z_i = optimised residual at the last layer L (`optimise_value` at
    ``blocks.{L}.hook_resid_post``); then for each layer l_i in order: K = mean keys over the templates, R = Z -
    current Z at L (recomputed after the previous layers' updates),
    dW = (R / (len(layers) - i)) K^T (lam C + K K^T)^-1.

    Args:
        layers: edited layers (paper config [4..8] of 32); covs: C per layer (`compute_covariance`); lam: 15000.
    """

    name = "memit"

    def __init__(self, model: nn.Module, tokenizer: Any, *, layers: Sequence[int], templates: Sequence[str],
                 covs: dict[int, torch.Tensor], lam: float = 15000.0, **value_kw: Any):  # fmt: skip
        super().__init__(model, tokenizer)
        check_editable(model, "MEMIT")
        check_layers(model, layers, "memit_layers")
        missing = [layer for layer in layers if layer not in covs]
        if missing:
            raise ValueError(f"MEMIT needs a covariance for every layer, missing {missing}")
        self.layers, self.templates, self.covs, self.lam, self.value_kw = (
            list(layers),
            list(templates),
            covs,
            lam,
            value_kw,
        )

    @torch.no_grad()
    def _resid_at(self, requests: Sequence[EditRecord], layer: int) -> torch.Tensor:
        """(d, n) residual stream after `layer` at each plain prompt's subject-last token."""
        texts = [qa_prompt(r.src) for r in requests]
        rows = [encode(self.tokenizer, t) for t in texts]
        idx = [subject_last_index(self.tokenizer, t, r.subject) for t, r in zip(texts, requests)]
        ids, mask = _right_pad(rows, _pad_id(self.tokenizer))
        got: dict[str, torch.Tensor] = {}

        def grab(x: torch.Tensor, *, hook: Any) -> None:
            got["h"] = x.detach()

        with hooks(self.model, fwd=[(f"blocks.{layer}.hook_resid_post", grab)]):
            self.model(
                input_ids=ids.to(_device(self.model)), attention_mask=mask.to(_device(self.model)), use_cache=False
            )
        return torch.stack([got["h"][i, j] for i, j in enumerate(idx)]).double().T

    def apply(self, requests: Sequence[EditRecord]) -> dict[str, Any]:
        if not requests:
            return {}
        z_layer = self.layers[-1]
        zs = [optimise_value(self.model, self.tokenizer, r, f"blocks.{z_layer}.hook_resid_post", self.templates,
                             **self.value_kw) for r in requests]  # fmt: skip
        z = torch.stack([v.target for v in zs], dim=1)  # (d, n)
        norms = []
        for i, layer in enumerate(self.layers):
            keys = []
            for r in requests:
                texts = [t.format(qa_prompt(r.src)) for t in self.templates]
                keys.append(mlp_keys(self.model, self.tokenizer, texts, [r.subject] * len(texts), layer).mean(0))
            k = torch.stack(keys, dim=1)  # (m, n)
            resid = (z - self._resid_at(requests, z_layer)) / (len(self.layers) - i)  # spread over remaining layers
            dw = memit_update(k, resid, self.covs[layer], self.lam)
            down = decoder_layers(self.model)[layer].mlp.down_proj
            with torch.no_grad():
                down.weight.add_(dw.to(down.weight.dtype))
            norms.append(float(dw.norm()))
        self.n_edits += len(requests)
        return {"z_loss_last": float(np.mean([v.losses[-1] for v in zs])), "update_norm": float(np.mean(norms))}


__all__ = [
    "MEMITEditor",
    "ROMEEditor",
    "ValueResult",
    "compute_covariance",
    "context_prefixes",
    "context_templates",
    "memit_update",
    "mlp_keys",
    "optimise_value",
    "rome_update",
    "subject_last_index",
]
