"""Diagnostics on a tracker's residual stream (Li, Guo & Andreas, ICML 2025): linear probes and patching.

* probes (`probe_grid`, [code] ``probing_interpreter.py``): linear probes for the state and its parity per layer x
  prefix length, on the residual stream at the action tokens (`residual_stream`), fitted on half of the stories and
  scored on the other half, with the majority class of the fitting labels as the baseline (`ProbeGrid`).
* parity-controlled activation patching (`patch_grid`, [code] ``activation_patching_interpreter.py``): the first
  action replaced by a random action of the same or of a different parity (`counterfactual_actions`), the residual
  stream of layer l at position p patched from the counterfactual run into the base run, read at the last token as
  ``clip((LD_patched - LD_base) / (LD_new - LD_base), 0, 1)`` with ``LD = log p(new answer) - log p(base answer)``
  (`PatchGrid`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmlab.methods.analysis.state_tracking.task import Stories, TrackerVocab, rollout

# ----------------------------------------------------------------------------------------------------------------
# diagnostics: probes


def layer_names(model: Any) -> list[str]:
    """``hook_embed`` then ``blocks.{l}.hook_resid_post`` for every block (the residual stream after layer l)."""
    return ["hook_embed"] + [f"blocks.{i}.hook_resid_post" for i in range(model.config.num_hidden_layers)]


@torch.no_grad()
def residual_stream(model: Any, stories: Stories, vocab: TrackerVocab | None = None) -> torch.Tensor:
    """(L + 1, N, T, d) residual stream at the action tokens: the embeddings, then after each block."""
    from lmlab.core.inference.hooks import run_with_cache

    vocab = vocab or TrackerVocab.of(model)
    names = layer_names(model)
    _, cache = run_with_cache(model, vocab.encode(stories.actions), names)
    return torch.stack([cache[n][:, vocab.offset :] for n in names])


@dataclass
class ProbeGrid:
    """Held-out linear-probe accuracy per layer x prefix length, with the majority-class baseline.

    Attributes:
        target: ``state`` or ``parity``.
        acc: (L + 1, P) accuracy on the held-out stories (row 0 = embeddings, row l + 1 = after block l).
        baseline: (P,) accuracy of the majority class of the probe-training labels.
        chance: 1 / number of classes (1/G for state, 1/2 for parity).
        lengths: the P prefix lengths (1-based).
        n_train, n_test: stories on each side.
    """

    target: str
    acc: np.ndarray
    baseline: np.ndarray
    chance: float
    lengths: list[int]
    n_train: int
    n_test: int

    def above_chance(self) -> np.ndarray:
        """``(acc - base) / (1 - base)`` with base = max(baseline, chance): 0 at the baseline, 1 when perfect."""
        base = np.maximum(self.baseline, self.chance)[None, :]
        return (self.acc - base) / np.maximum(1e-9, 1.0 - base)


def probe_split(n: int) -> tuple[np.ndarray, np.ndarray]:
    """First half of the stories trains the probes, the rest tests them (one story: both, flagged by the caller)."""
    k = max(1, n // 2)
    train = np.arange(k)
    test = np.arange(k, n) if n > k else train
    return train, test


def probe_grid(
    model: Any,
    stories: Stories,
    target: str = "state",
    *,
    layers: Sequence[int] | None = None,
    prefix_lengths: Sequence[int] | None = None,
    vocab: TrackerVocab | None = None,
    acts: torch.Tensor | None = None,
    max_iter: int = 500,
    C: float = 1.0,
) -> ProbeGrid:
    """Linear probes (scikit-learn ``LogisticRegression``, as [code] ``probing_interpreter.py``) for the state or
    its parity, one per layer x prefix length, trained on the first half of `stories` and tested on the rest.

    Args:
        target: ``"state"`` (the state after t actions) or ``"parity"`` (its parity).
        layers: rows of `residual_stream` (0 = embeddings); default all.
        prefix_lengths: 1-based prefix lengths t (the activation at a_t's token); default 1..T.
        acts: a precomputed `residual_stream` (L + 1, N, T, d).
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression

    if target not in ("state", "parity"):
        raise ValueError(f"target must be 'state' or 'parity', got {target!r}")
    if len(stories) < 1:
        raise ValueError("probe_grid needs at least one story, got none")
    acts = residual_stream(model, stories, vocab) if acts is None else acts
    layers = list(range(acts.shape[0])) if layers is None else list(layers)
    lengths = list(range(1, stories.length + 1)) if prefix_lengths is None else list(prefix_lengths)
    for t in lengths:
        if not 1 <= t <= stories.length:
            raise ValueError(f"prefix lengths must be in 1..{stories.length}, got {t}")
    labels = (stories.states if target == "state" else stories.parities).numpy()  # (N, T + 1)
    n_classes = stories.group.size if target == "state" else 2
    tr, te = probe_split(len(stories))
    acc = np.zeros((len(layers), len(lengths)))
    base = np.zeros(len(lengths))
    import warnings

    for j, t in enumerate(lengths):
        y_tr, y_te = labels[tr, t], labels[te, t]
        major = np.bincount(y_tr, minlength=n_classes).argmax()
        base[j] = float((y_te == major).mean())
        for i, layer in enumerate(layers):
            x = acts[layer, :, t - 1].double().numpy()  # (N, d): the token of a_t
            if len(np.unique(y_tr)) < 2:  # one class seen: the probe can only predict it
                acc[i, j] = base[j]
                continue
            # standardised on the probe-training stories: same linear family, ~10x fewer lbfgs iterations
            mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-6
            clf = LogisticRegression(max_iter=max_iter, C=C)
            with warnings.catch_warnings():  # lbfgs cap reached; S5: 120 classes on few stories (sklearn warns)
                warnings.simplefilter("ignore", ConvergenceWarning)
                warnings.simplefilter("ignore", UserWarning)
                clf.fit((x[tr] - mu) / sd, y_tr)
            acc[i, j] = float(clf.score((x[te] - mu) / sd, y_te))
    return ProbeGrid(target, acc, base, 1.0 / n_classes, lengths, len(tr), len(te))


# ----------------------------------------------------------------------------------------------------------------
# diagnostics: activation patching


@dataclass
class PatchGrid:
    """Normalised logit-difference effect of patching each layer x sequence position.

    Attributes:
        counterfactual: ``same_parity`` or ``diff_parity``.
        mode: ``substitute`` (counterfactual activations) or ``delete`` (zeros).
        effect: (L + 1, S) mean over the valid stories of the clipped normalised LD (row 0 = embeddings).
        per_story: (N, L + 1, S), NaN for stories left out: substitute, unless the model answers both runs right
            (the two answers then differ); delete, unless it answers the base run right.
        full: (N,) effect of patching every position of the embeddings (substitute: the counterfactual run itself,
            so 1 by construction wherever defined).
        n_valid: stories with a defined metric.
    """

    counterfactual: str
    mode: str
    effect: np.ndarray
    per_story: np.ndarray
    full: np.ndarray
    n_valid: int


def counterfactual_actions(stories: Stories, kind: str, position: int = 1, seed: int = 0) -> Stories:
    """Replace action `position` (1-based) of each story by a random *other* action of the same parity or of the
    other parity ([code] ``generate_prompt_pairs``: the first action, ``item_to_replace = 0``)."""
    if kind not in ("same_parity", "diff_parity"):
        raise ValueError(f"counterfactual must be 'same_parity' or 'diff_parity', got {kind!r}")
    if not 1 <= position <= stories.length:
        raise ValueError(f"position must be in 1..{stories.length}, got {position}")
    g = stories.group
    rng = np.random.default_rng(int(seed))
    acts = stories.actions.clone()
    par = g.parity.numpy()
    for i in range(len(stories)):
        a = int(acts[i, position - 1])
        want = par[a] if kind == "same_parity" else 1 - par[a]
        pool = [b for b in range(g.size) if par[b] == want and b != a]
        acts[i, position - 1] = int(rng.choice(pool))
    return Stories(g, acts, rollout(g, acts))


def _normalised_ld(lp: torch.Tensor, new: torch.Tensor, base: torch.Tensor, ld_base: torch.Tensor,
                   ld_new: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """clip((LD - LD_base) / (LD_new - LD_base), 0, 1) with LD = lp[new] - lp[base]; lp (..., G) log-probs."""
    ld = lp.gather(-1, new[..., None])[..., 0] - lp.gather(-1, base[..., None])[..., 0]
    return ((ld - ld_base) / (ld_new - ld_base)).clamp(0.0, 1.0)


@torch.no_grad()
def patch_grid(
    model: Any,
    base: Stories,
    counterfactual: str = "diff_parity",
    *,
    mode: str = "substitute",
    position: int = 1,
    seed: int = 0,
    vocab: TrackerVocab | None = None,
    only_correct: bool = True,
) -> PatchGrid:
    """Activation patching of the residual stream at every layer x position, read at the last token.

    ``substitute``: the base run with the residual of layer l at one position replaced by the counterfactual run's
    (`counterfactual_actions`); metric ``clip((LD_p - LD_b) / (LD_n - LD_b), 0, 1)``, ``LD = log p(new answer) -
    log p(base answer)`` over the log-softmax of the full vocabulary ([code] ``get_metric_from_logits``), answers
    being the argmax state of each run. ``delete``: the residual zeroed, ``LD = log p(base answer) - max_other log
    p``, metric ``clip((LD_p - LD_b) / (0 - LD_b), 0, 1)``. Stories whose two runs predict the same final state (no
    difference to explain) get NaN and are left out of the mean.
    """
    from lmlab.core.inference.hooks import hooks, run_with_cache

    if mode not in ("substitute", "delete"):
        raise ValueError(f"mode must be 'substitute' or 'delete', got {mode!r}")
    if len(base) < 1:
        raise ValueError("patch_grid needs at least one story, got none")
    vocab = vocab or TrackerVocab.of(model)
    sid = torch.tensor(vocab.state_ids)
    cf = counterfactual_actions(base, counterfactual, position, seed)
    ids_b, ids_c = vocab.encode(base.actions), vocab.encode(cf.actions)
    names = layer_names(model)
    n, seq = ids_b.shape

    def final_lp(logits: torch.Tensor) -> torch.Tensor:  # (B, S, V) -> (B, G) log-probs of the states, last token
        return torch.log_softmax(logits[:, -1].double(), -1)[:, sid]

    lg_b, _ = run_with_cache(model, ids_b, [])
    lg_c, cache_c = run_with_cache(model, ids_c, names)
    lp_b, lp_c = final_lp(lg_b), final_lp(lg_c)
    ans_b, ans_c = lp_b.argmax(-1), lp_c.argmax(-1)
    # only pairs the model gets right on both sides: a wrong answer's logit difference is noise, and its ratio
    # (clipped to [0, 1]) would bias the mean upwards
    right = (ans_b == base.states[:, -1]) & (ans_c == cf.states[:, -1])
    if not only_correct:
        right = torch.ones_like(right)
    if mode == "substitute":
        ld_b = lp_b.gather(-1, ans_c[:, None])[:, 0] - lp_b.gather(-1, ans_b[:, None])[:, 0]
        ld_n = lp_c.gather(-1, ans_c[:, None])[:, 0] - lp_c.gather(-1, ans_b[:, None])[:, 0]
        valid = right & (ans_b != ans_c)
    else:
        others = lp_b.clone()
        others.scatter_(-1, ans_b[:, None], -math.inf)
        ld_b = lp_b.gather(-1, ans_b[:, None])[:, 0] - others.max(-1).values
        ld_n = torch.zeros_like(ld_b)
        valid = (ans_b == base.states[:, -1] if only_correct else torch.ones_like(right)) & (ld_b.abs() > 1e-9)
    per = np.full((n, len(names), seq), np.nan)
    rows = torch.arange(n * seq)
    pos = torch.arange(seq).repeat(n)  # batch row k = story k // seq patched at position k % seq
    for li, name in enumerate(names):
        src = cache_c[name].repeat_interleave(seq, dim=0)  # (n * seq, S, d)

        def patch(t: torch.Tensor, *, hook: Any, src: torch.Tensor = src) -> torch.Tensor:
            out = t.clone()
            out[rows, pos] = 0.0 if mode == "delete" else src[rows, pos].to(t.dtype)
            return out

        with hooks(model, [(name, patch)]):
            lp = final_lp(model(input_ids=ids_b.repeat_interleave(seq, dim=0), use_cache=False).logits)
        lp = lp.view(n, seq, -1)
        if mode == "substitute":
            m = _normalised_ld(lp, ans_c[:, None].expand(n, seq), ans_b[:, None].expand(n, seq), ld_b[:, None],
                               ld_n[:, None])  # fmt: skip
        else:
            oth = lp.clone()
            oth.scatter_(-1, ans_b[:, None, None].expand(n, seq, 1), -math.inf)
            ld = lp.gather(-1, ans_b[:, None, None].expand(n, seq, 1))[..., 0] - oth.max(-1).values
            m = ((ld - ld_b[:, None]) / (ld_n - ld_b)[:, None]).clamp(0.0, 1.0)
        per[:, li, :] = m.numpy()
    per[~valid.numpy()] = np.nan
    # patching every position of the embeddings: the counterfactual's (or a zero) input in full
    full_src = cache_c[names[0]]

    def patch_all(t: torch.Tensor, *, hook: Any) -> torch.Tensor:
        return torch.zeros_like(t) if mode == "delete" else full_src.to(t.dtype)

    with hooks(model, [(names[0], patch_all)]):
        lp_full = final_lp(model(input_ids=ids_b, use_cache=False).logits)
    if mode == "substitute":
        full = _normalised_ld(lp_full, ans_c, ans_b, ld_b, ld_n).numpy()
    else:
        oth = lp_full.clone()
        oth.scatter_(-1, ans_b[:, None], -math.inf)
        ld = lp_full.gather(-1, ans_b[:, None])[:, 0] - oth.max(-1).values
        full = ((ld - ld_b) / (ld_n - ld_b)).clamp(0.0, 1.0).numpy()
    full = np.where(valid.numpy(), full, np.nan)
    n_valid = int(valid.sum())
    effect = np.nanmean(per, axis=0) if n_valid else np.zeros((len(names), seq))
    return PatchGrid(counterfactual, mode, effect, per, full, n_valid)


__all__ = [
    "PatchGrid",
    "ProbeGrid",
    "counterfactual_actions",
    "layer_names",
    "patch_grid",
    "probe_grid",
    "probe_split",
    "residual_stream",
]
