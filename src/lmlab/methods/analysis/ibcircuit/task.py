"""Aligned prompt batches for circuit discovery (IOI, digit greater-than, induction) and the ground-truth model.

- `ioi_dataset`: the official single ABBA template "When [A] and [B] went to the [PLACE], [B] gave a [OBJECT] to
  [A]" (``prepend_bos=False``), words from `lmlab.data.ioi` filtered so every slot has one token length under the
  tokenizer (single tokens for SmolLM2): all prompts have the same positions. Metric: logit(IO) − logit(S).
  Corrupted prompt (EAP only): the ABC variant, S2 replaced by a third name.
- `greater_than_dataset`: "The [NOUN] lasted from the year [CC][X]9 to the year [CC]" (nouns of `lmlab.data.
  greater_than`, one token length; CC in 11..17; X in 1..8); the next token is the tens digit. With YY = X9,
  "greater" ⇔ tens digit > X, so PD = Σ_{d>X} p(d) − Σ_{d≤X} p(d) needs no second forward pass (the spec's quick
  variant). Corrupted: start year CC01.
- `induction_dataset` / `make_induction_model`: repeated random tokens ``[BOS, x_1..x_n, x_1..x_m]`` → x_{m+1},
  and a 2-layer attention-only llama built by hand whose circuit is known: head (0, 0) is a previous-token head,
  head (1, 0) an induction head reading it (K-composition); the other six heads are distractors writing into a
  subspace the unembedding ignores.

Seeded and pure (no I/O). The prompts of one call never repeat; ``split="fit"`` and ``split="eval"`` are disjoint
(a hash of the prompt's words decides the split).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import torch

from lmlab.data import stable_hash
from lmlab.methods.analysis.ibcircuit.method import CircuitBatch

SPLITS = ("fit", "eval")
IOI_TEMPLATE = "When {A} and {B} went to the {place}, {S} gave a {obj} to"


def _check(n: int, split: str, seed: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an int >= 2 (μ, σ are batch statistics), got {n!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _split_of(key: str, seed: int) -> str:
    return "fit" if stable_hash("ibcircuit-split", seed, key) % 2 == 0 else "eval"


def _ids(tok: Any, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _one_length(tok: Any, words: tuple[str, ...] | list[str], prefix: str = " ") -> list[str]:
    """The words whose token count (with `prefix`) is the most common one, preferring single tokens."""
    lens = {w: len(_ids(tok, prefix + w)) for w in words}
    counts = Counter(lens.values())
    best = 1 if counts.get(1, 0) >= 3 else counts.most_common(1)[0][0]
    return [w for w in words if lens[w] == best]


def _vocab_size(tok: Any, model_vocab: int | None) -> int:
    return int(model_vocab or len(tok))


def _mask(rows: list[list[int]], vocab: int) -> torch.Tensor:
    m = torch.zeros(len(rows), vocab, dtype=torch.bool)
    for i, r in enumerate(rows):
        m[i, r] = True
    return m


def ioi_dataset(
    tokenizer: Any, n: int, seed: int = 0, split: str = "fit", *, vocab: int | None = None
) -> CircuitBatch:
    """`n` IOI prompts (ABBA, one template) with identical token positions; see the module docstring."""
    from lmlab.data.ioi import NAMES, OBJECTS, PLACES

    _check(n, split, seed)
    names = _one_length(tokenizer, NAMES)
    places, objs = _one_length(tokenizer, PLACES), _one_length(tokenizer, OBJECTS)
    # the name's first token after what all names share (a byte tokenizer's leading space): the answer token
    first = {w: _ids(tokenizer, " " + w) for w in names}
    shared = 0
    while all(len(t) > shared + 1 for t in first.values()) and len({t[shared] for t in first.values()}) == 1:
        shared += 1
    ans = {w: t[shared] for w, t in first.items()}
    rng = random.Random(stable_hash("ibcircuit-ioi", seed))
    rows, seen, tries = [], set(), 0
    while len(rows) < n:
        tries += 1
        if tries > 200 * n + 2000:
            raise ValueError(f"could not draw {n} distinct IOI prompts for split {split!r} (pool too small)")
        io, s, c = rng.sample(names, 3)
        if len({ans[io], ans[s], ans[c]}) < 3:
            continue
        place, obj = rng.choice(places), rng.choice(objs)
        key = f"{io}|{s}|{place}|{obj}"
        if key in seen or _split_of(key, seed) != split:
            continue
        seen.add(key)
        rows.append((io, s, c, place, obj))
    v = _vocab_size(tokenizer, vocab)
    ids, cor, prompts, good, bad, target = [], [], [], [], [], []
    for io, s, c, place, obj in rows:
        p = IOI_TEMPLATE.format(A=io, B=s, S=s, place=place, obj=obj)
        pc = IOI_TEMPLATE.format(A=io, B=s, S=c, place=place, obj=obj)
        tail = first[io][:shared]
        ids.append(_ids(tokenizer, p) + tail)
        cor.append(_ids(tokenizer, pc) + tail)
        prompts.append(p)
        good.append([ans[io]])
        bad.append([ans[s]])
        target.append(ans[io])
    return _batch("ioi", ids, cor, prompts, good, bad, target, "logit_diff", v, [f"ioi/{'-'.join(r)}" for r in rows])


def greater_than_dataset(
    tokenizer: Any, n: int, seed: int = 0, split: str = "fit", *, vocab: int | None = None
) -> CircuitBatch:
    """`n` digit-level greater-than prompts ending in the century, start years CCX9; see the module docstring."""
    from lmlab.data.greater_than import NOUNS

    _check(n, split, seed)
    digits = [_ids(tokenizer, str(d)) for d in range(10)]
    if any(len(d) != 1 for d in digits):
        raise ValueError("greater_than_dataset needs a tokenizer with single-token digits 0..9 (SmolLM2, Gemma)")
    digit = [d[0] for d in digits]
    nouns = _one_length(tokenizer, NOUNS)
    pool = [(noun, cc, x) for noun in nouns for cc in range(11, 18) for x in range(1, 9)]
    pool = [r for r in pool if _split_of(f"{r[0]}|{r[1]}{r[2]}9", seed) == split]
    random.Random(stable_hash("ibcircuit-gt", seed, split)).shuffle(pool)
    if len(pool) < n:
        raise ValueError(f"n must be <= {len(pool)} (the greater-than {split!r} pool), got {n}")
    rows = pool[:n]
    v = _vocab_size(tokenizer, vocab)
    ids, cor, prompts, good, bad = [], [], [], [], []
    for noun, cc, x in rows:
        p = f"The {noun} lasted from the year {cc}{x}9 to the year {cc}"
        ids.append(_ids(tokenizer, p))
        cor.append(_ids(tokenizer, f"The {noun} lasted from the year {cc}01 to the year {cc}"))
        prompts.append(p)
        good.append([digit[d] for d in range(x + 1, 10)])
        bad.append([digit[d] for d in range(0, x + 1)])
    return _batch(
        "greater_than",
        ids,
        cor,
        prompts,
        good,
        bad,
        None,
        "prob_diff",
        v,
        [f"gt/{noun}/{cc}{x}9" for noun, cc, x in rows],
    )


def _batch(
    task: str,
    ids: list[list[int]],
    cor: list[list[int]],
    prompts: list[str],
    good: list[list[int]],
    bad: list[list[int]],
    target: list[int] | None,
    metric: str,
    vocab: int,
    names: list[str],
) -> CircuitBatch:
    lens = {len(r) for r in ids} | {len(r) for r in cor}
    if len(lens) != 1:
        raise ValueError(f"{task} prompts do not share one token length under this tokenizer ({sorted(lens)})")
    x = torch.tensor(ids, dtype=torch.long)
    return CircuitBatch(
        task=task,
        input_ids=x,
        answer_pos=torch.full((x.shape[0],), x.shape[1] - 1, dtype=torch.long),
        good=_mask(good, vocab),
        bad=_mask(bad, vocab),
        metric=metric,
        target=None if target is None else torch.tensor(target, dtype=torch.long),
        corrupt_ids=torch.tensor(cor, dtype=torch.long),
        ids=names,
        prompts=prompts,
    )


# ---------------------------------------------------------------------------------------------------------------
# induction: data and a hand-built model with a known circuit

IND_VOCAB = 24  # token one-hots live in the 24 RoPE-invariant dims of a 32-dim head
IND_BOS = 0
IND_HIDDEN = 128
KNOWN_HEADS = ((0, 0), (1, 0))  # previous-token head, induction head


def induction_dataset(n: int, seed: int = 0, split: str = "fit", *, half: int = 8, tail: int = 4) -> CircuitBatch:
    """``[BOS, x_1..x_half, x_1..x_tail]`` with distinct random x in 1..23; the answer is x_{tail+1}.

    Metric: logit of x_{tail+1} − mean logit of the other tokens. Corrupted: the first half resampled (nothing to
    copy from).
    """
    _check(n, split, seed)
    if not (2 <= half <= IND_VOCAB - 1 and 1 <= tail < half):
        raise ValueError(f"need 2 <= half <= {IND_VOCAB - 1} and 1 <= tail < half, got half={half}, tail={tail}")
    rng = random.Random(stable_hash("ibcircuit-induction", seed))
    rows, cor, seen = [], [], set()
    while len(rows) < n:
        x = rng.sample(range(1, IND_VOCAB), half)
        key = ",".join(map(str, x))
        if key in seen or _split_of(key, seed) != split:
            continue
        seen.add(key)
        y = rng.sample([t for t in range(1, IND_VOCAB) if t not in x[: tail + 1]], half)
        rows.append([IND_BOS, *x, *x[:tail]])
        cor.append([IND_BOS, *y, *x[:tail]])
    good = [[r[1 + tail]] for r in rows]
    bad = [[t for t in range(1, IND_VOCAB) if t != g[0]] for g in good]
    return _batch(
        "induction",
        rows,
        cor,
        [" ".join(map(str, r)) for r in rows],
        good,
        bad,
        [g[0] for g in good],
        "logit_diff",
        IND_VOCAB,
        [f"induction/{'-'.join(map(str, r[1 : 1 + half]))}" for r in rows],
    )


def make_induction_model(seed: int = 0, *, distractor_scale: float = 0.5, perturb: float = 0.005) -> Any:
    """A 2-layer, 4-head attention-only llama (hidden 128, head dim 32, vocab 24) that solves `induction_dataset`.

    Residual layout: dims 0..23 token one-hot T, 24 a constant, 25..48 the previous token P, 49..72 the prediction
    O, 73..127 junk. Head (0, 0): RoPE-only query/key from the constant (scores Σ_k cos((i − j − 1)ω_k) over the
    four rotating frequency pairs, peaked at j = i − 1), value T → P. Head (1, 0): query T_t, key P_t on the 24
    RoPE-invariant dims (rope_theta 1e12), value T → O. lm_head reads O. MLP outputs are zero (down_proj = 0).
    The six other heads have seeded random weights and write only into junk (`distractor_scale` sets their size):
    they change nothing but the RMSNorm scale. `perturb` adds seeded N(0, perturb²) noise to every q/k/v weight
    (and o_proj rows into junk), so that no activation is constant over a batch.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    d, h, hd, v = IND_HIDDEN, 4, 32, IND_VOCAB
    cfg = LlamaConfig(
        vocab_size=v,
        hidden_size=d,
        intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=h,
        num_key_value_heads=h,
        head_dim=hd,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=IND_BOS,
        eos_token_id=IND_BOS,
        pad_token_id=IND_BOS,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1e12},
    )
    cfg._attn_implementation = "eager"
    gen = torch.Generator().manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    T, C, P, OUT, J = 0, 24, 25, 49, 73
    inv_freq = 1.0 / (1e12 ** (torch.arange(0, hd, 2).double() / hd))  # (16,)
    rot, still = [k for k in range(hd // 2) if inv_freq[k] > 1e-2], [k for k in range(hd // 2) if inv_freq[k] < 2e-3]
    still_dims = still + [k + hd // 2 for k in still]
    if len(still_dims) < v:
        raise RuntimeError("not enough RoPE-invariant dims for the token code")  # only if the constants change
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        emb = model.model.embed_tokens.weight
        emb[torch.arange(v), T + torch.arange(v)] = 1.0
        emb[:, C] = 1.0
        for layer in model.model.layers:
            layer.input_layernorm.weight.fill_(1.0)
            layer.post_attention_layernorm.weight.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        a0, a1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
        # head (0, 0): previous-token head
        for k in rot:
            w = float(inv_freq[k])
            a0.q_proj.weight[k, C] = 2.0
            a0.k_proj.weight[k, C] = 2.0 * math.cos(w)
            a0.k_proj.weight[k + hd // 2, C] = 2.0 * math.sin(w)
        for t in range(v):
            a0.v_proj.weight[t, T + t] = 1.0
            a0.o_proj.weight[P + t, t] = 0.125
        # head (1, 0): induction head (query: current token; key: previous token; value: current token)
        for t in range(v):
            a1.q_proj.weight[still_dims[t], T + t] = 1.5
            a1.k_proj.weight[still_dims[t], P + t] = 1.5
            a1.v_proj.weight[t, T + t] = 1.0
            a1.o_proj.weight[OUT + t, t] = 0.3
        model.lm_head.weight[torch.arange(v), OUT + torch.arange(v)] = 1.2
        # distractors: heads 1..3 of both layers, random, writing into junk only
        for attn in (a0, a1):
            for head in range(1, h):
                rows = slice(head * hd, (head + 1) * hd)
                attn.q_proj.weight[rows, :J] = 0.3 * torch.randn(hd, J, generator=gen)
                attn.k_proj.weight[rows, :J] = 0.3 * torch.randn(hd, J, generator=gen)
                attn.v_proj.weight[rows, :C] = 0.3 * torch.randn(hd, C, generator=gen)
                attn.o_proj.weight[J:, rows] = distractor_scale * torch.randn(d - J, hd, generator=gen) / d
        for layer in model.model.layers:
            # a small dense perturbation of every attention weight: every activation gets a healthy batch variance
            # (exact zeros and e^-20 softmax tails make σ ~ 1e-20 and the compression KL's gradient ~ 1/σ)
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.weight.add_(perturb * torch.randn(proj.weight.shape, generator=gen))
            o = layer.self_attn.o_proj.weight
            o[J:].add_(perturb * torch.randn(o[J:].shape, generator=gen))  # o_proj noise only into junk
            # gate/up nonzero, down zero: the MLP output is exactly 0 (attention-only)
            layer.mlp.gate_proj.weight.normal_(0, 0.1, generator=gen)
            layer.mlp.up_proj.weight.normal_(0, 0.1, generator=gen)
    return model


def induction_truth(n_layers: int = 2, n_heads: int = 4) -> torch.Tensor:
    """The (L, H) boolean matrix of `KNOWN_HEADS`."""
    truth = torch.zeros(n_layers, n_heads, dtype=torch.bool)
    for layer, head in KNOWN_HEADS:
        truth[layer, head] = True
    return truth
