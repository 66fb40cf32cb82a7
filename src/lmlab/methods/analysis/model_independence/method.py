"""Independence tests for language models: p̂ = (1 + #{t : φ(π_t(θ1), θ2) ≥ φ(θ1, θ2)}) / (T + 1).

Zhu, Ahmed, Kuditipudi & Liang, "Independence Tests for Language Models" (ICML 2025, https://arxiv.org/abs/2502.12292;
official code https://github.com/ahmeda14960/model-tracing, mirror salzhu/model-tracing, read at 9ff5378).
H0: θ1 ⊥ θ2 (independent random initialisations; the training data may be anything). Pure: no I/O, no printing.

Constrained setting (same architecture; the init distribution is invariant under a group Π of hidden-unit
permutations and training is permutation-equivariant):

* PERMTEST (`permtest`, paper Algorithm 1; code ``tracing/statistics/perm_mc_l2.py``). Draw π_1..π_T uniformly from
  Π = (one permutation σ of the d residual dimensions) x (one permutation τ_l of the h MLP units of every block l),
  apply π_t to θ1 consistently (`permute_model`), and return p̂ above: exact for any statistic φ, floor 1/(T + 1).
  φ_L2 = −mean_W ||W1 − W2||_F over the parameter tensors (code ``tracing/statistics/l2.py``: the mean of per-tensor
  Frobenius distances, smaller = closer; negated here so that larger = more similar); φ_cos = mean_W cos(vec W1,
  vec W2) (lmlab's second weight statistic).
* CSW (`csw_test`, the Hungarian-matching variant; code ``tracing/statistics/csu.py``): per block, C = cos(rows of
  W_up^(1), rows of W_up^(2)) (h x h, float64), π = LAP(C, maximize) (`scipy.optimize.linear_sum_assignment`),
  p_l = Spearman(π, identity) two-sided (``scipy.stats.spearmanr``); FISHER: χ² = −2 Σ_l log p_l, df = 2L,
  p = chi2.sf (``combine_pvalues(method="fisher")``). Under H0 the units of θ1 are exchangeable, so π is a uniform
  random permutation relative to the identity.
* CSH (`csh_from_activations`; code ``tracing/statistics/csh.py``): the same on the *activations* of ``up_proj``
  (rows = units, columns = tokens).

Unconstrained setting (the adversary may permute units, rotate the residual stream, change the architecture):

* MATCH (`match_test`; code ``tracing/statistics/match.py``, ``tracing/utils/llama/matching.py:match_wmats``): run the
  same inputs through both models, take the outputs of ``gate_proj`` and ``up_proj`` of block i (rows = units,
  columns = tokens); π_gate = LAP(squared Euclidean distances of gate rows), π_up = LAP(... of up rows);
  p_i = Spearman(π_gate, π_up). In a GLU, gate and up share the unit index, so a derived model has π_gate ≈ π_up
  even after permuting units and rotating the residual stream (each model computes its activations in its own
  basis, so a rotation never reaches them). Not exact; "behaves like a p-value" on independent pairs.
* Localized testing (`localized_match`; code ``match.py:statistic_all``): MATCH on block pairs (i, j); i is matched
  to the first unmatched j with p < 1e-6.
* Generalized robust test (`generalized_match`, paper Algorithm 5; code ``experiments/generalized_match.py``):
  distil each model's block-i MLP into a fresh GLU on X ~ N(0, I_d) (MSE, Adam), then MATCH the distilled gate/up.

Attacks and derived models (`permute_model`, `rotate_residual`, `retrain_mlp_block`, `keep_layers`) keep every tensor
that shares a hidden index consistent, so outputs are unchanged (or, for a retrained block, approximately so).

Layout: this file holds MATCH (activations, localized and generalized tests); `baselines.py` the constrained tests
(PERMTEST, CSW, CSH); `pvalues.py` LAP matching, Spearman and Fisher; `transforms.py` the index plan and the derived
models.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from lmlab.methods.analysis.model_independence.pvalues import BlockTest, match_pvalue
from lmlab.methods.analysis.model_independence.transforms import _fit, _glu, evenly_spaced, n_blocks, relative_blocks

# ----------------------------------------------------------------------------------------------------------------
# Activations: MATCH, localized testing, generalized test


@dataclass
class MLPActivations:
    """Per block, per input sequence: gate/up outputs (n_tokens, h) and, optionally, the MLP inputs (n_tokens, d)."""

    gate: dict[int, list[torch.Tensor]]
    up: dict[int, list[torch.Tensor]]
    inputs: dict[int, list[torch.Tensor]]

    def units(self, block: int, kind: str, pools: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """(h, n_columns) unit activations of `kind` (``gate``, ``up``, ``inputs``: (d, n)), columns pooled if given.

        `pools[i]` (n_cols_i, n_tokens_i) averages sequence i's tokens into shared columns (words) when two models
        tokenize the same text differently; gate/up outputs are linear in the input, so pooling commutes with them.
        """
        seqs = getattr(self, kind)[block]
        if pools is not None:
            if len(pools) != len(seqs):
                raise ValueError(f"got {len(pools)} pooling matrices for {len(seqs)} sequences")
            seqs = [pool @ s for pool, s in zip(pools, seqs)]
        return torch.cat(seqs, dim=0).T.contiguous()


@torch.no_grad()
def mlp_activations(
    model: nn.Module, input_ids: Sequence[torch.Tensor], blocks: Sequence[int], *, capture_inputs: bool = False
) -> MLPActivations:
    """Outputs of ``gate_proj`` and ``up_proj`` (and the MLP inputs) of `blocks`, one forward per sequence.

    `input_ids`: (1, n) or (n,) token ids per sequence (batch 1: no padding enters the activations; code: batch 1).
    The decoder runs without its LM head (Gemma's 262k-row head would dominate the cost).
    """
    acts = MLPActivations({b: [] for b in blocks}, {b: [] for b in blocks}, {b: [] for b in blocks})
    handles = []
    for b in blocks:
        mlp = _glu(model, b)
        handles.append(mlp.gate_proj.register_forward_hook(lambda m, i, o, b=b: acts.gate[b].append(o[0].float())))
        handles.append(mlp.up_proj.register_forward_hook(lambda m, i, o, b=b: acts.up[b].append(o[0].float())))
        if capture_inputs:
            handles.append(mlp.register_forward_pre_hook(lambda m, a, b=b: acts.inputs[b].append(a[0][0].float())))
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    try:
        for ids in input_ids:
            ids = ids.view(1, -1).to(next(model.parameters()).device)
            decoder(input_ids=ids, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return acts


def match_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    block_pairs: Sequence[tuple[int, int]],
    *,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
    cost: str = "sqeuclidean",
) -> BlockTest:
    """MATCH p-value of every (block of a, block of b) pair from captured activations."""
    ps = []
    for i, j in block_pairs:
        ps.append(
            match_pvalue(
                acts_a.units(i, "gate", pools_a),
                acts_a.units(i, "up", pools_a),
                acts_b.units(j, "gate", pools_b),
                acts_b.units(j, "up", pools_b),
                cost,
            )
        )
    return BlockTest(blocks=list(block_pairs), p=ps)


@dataclass
class PairedInputs:
    """The same texts encoded for two models: ids per sequence and, when the tokenizers differ, word pools."""

    ids_a: list[torch.Tensor]
    ids_b: list[torch.Tensor]
    pools_a: list[torch.Tensor] | None
    pools_b: list[torch.Tensor] | None
    columns: str  # "tokens" (shared ids) or "words"

    @property
    def n_columns(self) -> int:
        if self.pools_a is None:
            return sum(int(x.numel()) for x in self.ids_a)
        return sum(int(p.shape[0]) for p in self.pools_a)


def _word_pool(offsets: Sequence[tuple[int, int]], words: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(n_words, n_tokens) averaging matrix: row w averages the tokens whose character span overlaps word w."""
    pool = torch.zeros(len(words), len(offsets))
    for w, (ws, we) in enumerate(words):
        hits = [t for t, (s, e) in enumerate(offsets) if e > s and s < we and e > ws]
        pool[w, hits] = 1.0 / len(hits)
    return pool


def encode_pair(
    texts: Sequence[str], tokenizer_a: Any, tokenizer_b: Any, *, max_tokens: int = 128, columns: str = "auto"
) -> PairedInputs:
    """Encode `texts` for two models so that their activation columns correspond.

    ``columns="tokens"``: both tokenizers must give identical ids (the official setting: Llama derivatives share a
    tokenizer). ``"words"``: each model's tokens are averaged within whitespace-delimited words of the text both
    models cover (SmolLM2 vs Gemma tokenize differently; words are the shared unit). ``"auto"``: tokens when the ids
    agree, else words.
    """
    if columns not in ("auto", "tokens", "words"):
        raise ValueError(f"columns must be 'auto', 'tokens' or 'words', got {columns!r}")
    texts = [t for t in texts if t and t.strip()]
    if not texts:
        raise ValueError("encode_pair needs at least one non-empty text")

    def enc(tok: Any, text: str, offsets: bool) -> dict[str, Any]:
        return tok(text, truncation=True, max_length=max_tokens, return_offsets_mapping=offsets)

    if columns in ("auto", "tokens"):
        ids_a = [enc(tokenizer_a, t, False)["input_ids"] for t in texts]
        ids_b = ids_a if tokenizer_b is tokenizer_a else [enc(tokenizer_b, t, False)["input_ids"] for t in texts]
        if ids_a == ids_b:
            as_t = [torch.tensor(x, dtype=torch.long) for x in ids_a]
            return PairedInputs(as_t, as_t, None, None, "tokens")
        if columns == "tokens":
            raise ValueError("columns='tokens' needs tokenizers that give identical ids; use columns='words'")
    ids_a, ids_b, pools_a, pools_b = [], [], [], []
    for text in texts:
        ea, eb = enc(tokenizer_a, text, True), enc(tokenizer_b, text, True)
        off_a = [tuple(o) for o in ea["offset_mapping"]]
        off_b = [tuple(o) for o in eb["offset_mapping"]]
        covered = min(max((e for _, e in off_a), default=0), max((e for _, e in off_b), default=0))
        words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text) if m.end() <= covered]
        both = [w for w in words if _word_pool(off_a, [w]).sum() > 0 and _word_pool(off_b, [w]).sum() > 0]
        if not both:
            continue
        ids_a.append(torch.tensor(ea["input_ids"], dtype=torch.long))
        ids_b.append(torch.tensor(eb["input_ids"], dtype=torch.long))
        pools_a.append(_word_pool(off_a, both))
        pools_b.append(_word_pool(off_b, both))
    if not ids_a:
        raise ValueError("no word of the texts is covered by both tokenizers' tokens")
    return PairedInputs(ids_a, ids_b, pools_a, pools_b, "words")


def match_test(
    model_a: nn.Module,
    model_b: nn.Module,
    inputs: PairedInputs | Sequence[torch.Tensor],
    *,
    blocks: Sequence[int] | None = None,
    blocks_b: Sequence[int] | None = None,
    cost: str = "sqeuclidean",
) -> BlockTest:
    """MATCH on block pairs (blocks[k] of a, blocks_b[k] of b) for shared inputs; ``.aggregate`` is Fisher's p.

    Args:
        model_a, model_b: GLU causal LMs (any widths, depths and residual bases).
        inputs: `encode_pair(texts, tok_a, tok_b)` or a list of token-id tensors both models share.
        blocks (`list[int]`, *optional*): blocks of a (default: all, or `evenly_spaced` to the shallower depth).
        blocks_b (`list[int]`, *optional*): blocks of b (default: the same relative depth, `relative_blocks`).
        cost (`str`): LAP cost, ``"sqeuclidean"`` (code) or ``"cosine"``.
    """
    if not isinstance(inputs, PairedInputs):
        ids = [torch.as_tensor(x, dtype=torch.long).view(-1) for x in inputs]
        inputs = PairedInputs(ids, ids, None, None, "tokens")
    la, lb = n_blocks(model_a), n_blocks(model_b)
    blocks = evenly_spaced(la, min(la, lb)) if blocks is None else list(blocks)
    blocks_b = relative_blocks(blocks, la, lb) if blocks_b is None else list(blocks_b)
    if len(blocks_b) != len(blocks):
        raise ValueError(f"blocks and blocks_b must have the same length, got {len(blocks)} and {len(blocks_b)}")
    acts_a = mlp_activations(model_a, inputs.ids_a, sorted(set(blocks)))
    acts_b = mlp_activations(model_b, inputs.ids_b, sorted(set(blocks_b)))
    return match_from_activations(
        acts_a, acts_b, list(zip(blocks, blocks_b)), pools_a=inputs.pools_a, pools_b=inputs.pools_b, cost=cost
    )


@dataclass
class LocalizedMatch:
    """Block x block MATCH p-values (NaN where the official greedy loop skipped the pair) and the matched map."""

    blocks_a: list[int]
    blocks_b: list[int]
    p: np.ndarray  # (len(blocks_a), len(blocks_b))
    layer_map: dict[int, int]


def localized_from_activations(
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    blocks_a: Sequence[int],
    blocks_b: Sequence[int],
    *,
    threshold: float = 1e-6,
    pools_a: Sequence[torch.Tensor] | None = None,
    pools_b: Sequence[torch.Tensor] | None = None,
    cost: str = "sqeuclidean",
) -> LocalizedMatch:
    """``match.py:statistic_all``: for i in blocks_a, for j in blocks_b not yet matched: MATCH(i, j); the first
    j with p < `threshold` is i's match (both are then marked)."""
    p = np.full((len(blocks_a), len(blocks_b)), np.nan)
    used: set[int] = set()
    layer_map: dict[int, int] = {}
    for ii, i in enumerate(blocks_a):
        for jj, j in enumerate(blocks_b):
            if j in used:
                continue
            p[ii, jj] = match_from_activations(
                acts_a, acts_b, [(i, j)], pools_a=pools_a, pools_b=pools_b, cost=cost
            ).p[0]
            if p[ii, jj] < threshold:
                layer_map[i] = j
                used.add(j)
                break
    return LocalizedMatch(list(blocks_a), list(blocks_b), p, layer_map)


def localized_match(
    model_a: nn.Module,
    model_b: nn.Module,
    inputs: PairedInputs | Sequence[torch.Tensor],
    *,
    blocks_a: Sequence[int] | None = None,
    blocks_b: Sequence[int] | None = None,
    threshold: float = 1e-6,
    cost: str = "sqeuclidean",
) -> LocalizedMatch:
    """Localized testing: which blocks of b derive from which blocks of a (p < `threshold`, paper: 1e-6)."""
    if not isinstance(inputs, PairedInputs):
        ids = [torch.as_tensor(x, dtype=torch.long).view(-1) for x in inputs]
        inputs = PairedInputs(ids, ids, None, None, "tokens")
    blocks_a = list(range(n_blocks(model_a))) if blocks_a is None else list(blocks_a)
    blocks_b = list(range(n_blocks(model_b))) if blocks_b is None else list(blocks_b)
    acts_a = mlp_activations(model_a, inputs.ids_a, blocks_a)
    acts_b = mlp_activations(model_b, inputs.ids_b, blocks_b)
    return localized_from_activations(
        acts_a, acts_b, blocks_a, blocks_b, threshold=threshold, pools_a=inputs.pools_a, pools_b=inputs.pools_b,
        cost=cost,
    )  # fmt: skip


class GLU(nn.Module):
    """down(act(gate(x)) * up(x)): the fresh MLP of the generalized test (code ``CustomLlamaMLP``)."""

    def __init__(self, d: int, h: int, act: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(d, h, bias=False)
        self.up_proj = nn.Linear(d, h, bias=False)
        self.down_proj = nn.Linear(h, d, bias=False)
        self.act = {"silu": nn.SiLU(), "gelu": nn.GELU(approximate="tanh")}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def distill_glu(
    mlp: nn.Module, d: int, h: int, *, steps: int, batch_size: int, lr: float, seed: int
) -> tuple[GLU, list[float]]:
    """A fresh GLU fitted to `mlp` by MSE on X ~ N(0, I_d) (code: batch 5000, 10000 steps, Adam lr 1e-3)."""
    gen = torch.Generator().manual_seed(seed)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        glu = GLU(d, h)
    finally:
        torch.random.set_rng_state(state)

    def batch(_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(batch_size, d, generator=gen)
        with torch.no_grad():
            return x, mlp(x)

    return glu, _fit(glu, batch, 0, steps, batch_size, lr, gen)


def generalized_match(
    mlp_a: nn.Module,
    mlp_b: nn.Module,
    inputs_a: torch.Tensor,
    inputs_b: torch.Tensor,
    *,
    steps: int = 10000,
    batch_size: int = 5000,
    lr: float = 1e-3,
    seed: int = 0,
    width: int | None = None,
) -> tuple[float, dict[str, list[float]]]:
    """Algorithm 5: distil both MLPs into fresh GLUs (`distill_glu`), then MATCH their gate/up outputs.

    `inputs_a` (n, d_a) and `inputs_b` (n, d_b) are the two models' MLP inputs at the tested blocks on the same n
    columns (tokens, or words pooled; the distilled projections are linear, so pooled inputs give pooled outputs).
    `width` defaults to each MLP's own width (code: ``width_fac = 1``). Returns (p, {"a": losses, "b": losses}).
    """
    if inputs_a.shape[0] != inputs_b.shape[0]:
        raise ValueError(
            f"inputs_a and inputs_b must cover the same columns, got {inputs_a.shape[0]} and {inputs_b.shape[0]}"
        )
    fitted = {}
    for name, mlp, x in (("a", mlp_a, inputs_a), ("b", mlp_b, inputs_b)):
        d = x.shape[1]
        h = width or int(getattr(mlp, "up_proj", getattr(mlp, "gate_proj", None)).weight.shape[0])
        fitted[name] = distill_glu(mlp, d, h, steps=steps, batch_size=batch_size, lr=lr, seed=seed + (name == "b"))
    with torch.no_grad():
        (ga, la), (gb, lb) = fitted["a"], fitted["b"]
        xa, xb = inputs_a.float(), inputs_b.float()
        p = match_pvalue(ga.gate_proj(xa).T, ga.up_proj(xa).T, gb.gate_proj(xb).T, gb.up_proj(xb).T)
    return p, {"a": la, "b": lb}


__all__ = [
    "GLU",
    "LocalizedMatch",
    "MLPActivations",
    "PairedInputs",
    "distill_glu",
    "encode_pair",
    "generalized_match",
    "localized_from_activations",
    "localized_match",
    "match_from_activations",
    "match_test",
    "mlp_activations",
]
