"""GraphFilter: u* = argmax_u Q(u) · D(u), D(u) = Σ_{v ∈ N(u), v uncovered} tfidf(u, v); then cover N(u*).

Wu, Vu, Qu & Haffari, "The Best of Both Worlds: Bridging Quality and Diversity in Data Selection with Bipartite
Graph" (ICML 2025, PMLR 267:67741-67755, https://arxiv.org/abs/2410.12458). No official code is public; this is a
reconstruction from the paper's abstract, its Eq. 2 as a reviewer quotes it, and the Superfiltering code for the
quality score (see the README's Deviations for what is unconfirmed). Pure: no I/O, no printing.

* Bipartite graph G = (U ∪ V, E): U the examples, V their distinct n-grams (n = 1..3), edge u-v with weight
  tfidf(u, v) when n-gram v occurs in u. scikit-learn's `TfidfVectorizer` gives it directly: its (|U|, |V|) CSR
  matrix *is* the weighted bi-adjacency matrix (`build_ngram_graph`).
* Quality Q(u): SuperFilter, i.e. IFD from a small LM (Li et al., Superfiltering, ACL 2024; code
  ``tianyi-lab/Superfiltering/code_ifd``), prompt ``"{instruction}\\n"``, over the same N response tokens in both
  perplexities (`ifd_scores`):
      IFD(x, y) = exp(−1/N Σ_{i=1..N} log p(y_i | x ⊕ a, y_<i)) / exp(−1/N Σ_{i=1..N} log p(y_i | a, y_<i)),
  a = the template's text after the instruction (``"\\n"``). Examples with IFD >= 1 are dropped
  (``select_data.py --filter_threash 1``) and higher IFD is selected. Here dropped examples keep the floor quality
  ε (`quality_from_ifd`, `rescale_quality`).
* Priority φ(u) = Q(u) · D(u) (multiplicative; ``combine="add"`` gives the additive ablation
  Q̃(u) + λ · D(u) / D_max with min-max normalised Q̃).
* Loop: select u* = argmax φ, mark every n-gram adjacent to u* covered (the "removed" n-gram nodes), recompute the
  affected priorities, repeat until k examples; when every n-gram of the remaining examples is covered, reset the
  coverage over the remaining examples and continue (``reset=True``).
* Lazy greedy (``lazy=True``): with Q fixed, D(u) only falls as coverage grows, so a max-heap of stale priorities
  is exact: pop the top, recompute its priority, select it if it is still at least the next stale priority,
  otherwise push it back. Priorities are computed from integer (fixed-point) TF-IDF weights, so the lazy and the
  naive loop (recompute every priority every step, ``lazy=False``) compare bit-identical numbers and pick the same
  examples in the same order, ties included: ties go to the higher quality, then to the lower rank (index order, or
  a seeded permutation with ``seed``).

Baselines of the reproduction: `quality_only_select` (top-k by Q), diversity-only (GraphFilter with Q ≡ 1),
`k_center_greedy` (Sener & Savarese 2018, on sentence embeddings) and `random_select`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Superfiltering's ``PROMPT_DICT_NONE["prompt_no_input"]`` (code_ifd/data_analysis.py): the instruction, a newline,
# then the response; the SFT sequences of the reproduction use the same text.
PROMPT_TEMPLATE = "{instruction}\n"
# words, numbers, single characters and punctuation marks: sklearn's default pattern (\b\w\w+\b) drops single
# characters and every bracket, which are the answers and format tags of the reproduction's pool
TOKEN_PATTERN = r"(?u)\w+|[^\w\s]"
COMBINES = ("mul", "add")


def format_prompt(instruction: str, template: str = PROMPT_TEMPLATE) -> str:
    """The prompt text of an example: ``template.format(instruction=...)`` (Superfiltering's plain format)."""
    return template.format(instruction=instruction)


# ---------------------------------------------------------------------------------------------------------------
# the graph


@dataclass
class NgramGraph:
    """The example / n-gram bipartite graph.

    Attributes:
        weights (`scipy.sparse.csr_matrix`, (n_examples, n_ngrams), float64): tfidf(u, v), the edge weights.
        weights_int (`scipy.sparse.csr_matrix`, (n_examples, n_ngrams), int64): the same weights in fixed point
            (``round(w * scale)``, at least 1), so priorities are exact integer sums whatever the summation order.
        scale (`float`): the fixed-point scale (a power of two).
        vocabulary (`np.ndarray` of str, (n_ngrams,)): the n-gram of each column.
    """

    weights: Any
    weights_int: Any
    scale: float
    vocabulary: np.ndarray

    @property
    def n_examples(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_ngrams(self) -> int:
        return int(self.weights.shape[1])

    def ngrams_of(self, u: int) -> list[str]:
        """The n-grams adjacent to example `u`."""
        s, e = self.weights.indptr[u], self.weights.indptr[u + 1]
        return [str(v) for v in self.vocabulary[self.weights.indices[s:e]]]


def _fixed_point(weights: Any) -> tuple[Any, float]:
    """int64 copy of a non-negative CSR matrix, scaled so that every row sum stays exact in float64 (< 2**52)."""
    import scipy.sparse as sp

    row_max = float(np.asarray(weights.sum(axis=1)).max()) if weights.nnz else 1.0
    exp = min(32, 52 - math.ceil(math.log2(max(row_max, 1.0) + 1.0)) - 1)
    scale = float(2.0**exp)
    data = np.maximum(1, np.rint(weights.data * scale)).astype(np.int64)  # every edge keeps a positive weight
    w_int = sp.csr_matrix((data, weights.indices.copy(), weights.indptr.copy()), shape=weights.shape)
    return w_int, scale


def build_ngram_graph(
    texts: Sequence[str],
    *,
    ngram_range: tuple[int, int] = (1, 3),
    tokenizer: Callable[[str], list[str]] | None = None,
    token_pattern: str = TOKEN_PATTERN,
    lowercase: bool = True,
    norm: str | None = "l2",
    sublinear_tf: bool = False,
) -> NgramGraph:
    """Build the bipartite graph of `texts` with scikit-learn's `TfidfVectorizer` (its CSR matrix is the graph).

    Args:
        texts (`Sequence[str]`): one text per example (instruction and response together).
        ngram_range (`tuple[int, int]`, defaults to ``(1, 3)``): n-gram orders.
        tokenizer (`Callable`, *optional*): a word tokenizer (e.g. a subword or multilingual one); replaces
            `token_pattern`.
        token_pattern (`str`): regex of a token when `tokenizer` is None.
        lowercase (`bool`), norm (`str`, ``"l2"``, ``"l1"`` or None), sublinear_tf (`bool`): `TfidfVectorizer`'s.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: need at least one example to build the n-gram graph")
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("texts must be strings (one per example)")
    lo, hi = ngram_range
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise ValueError(f"ngram_range must be (lo, hi) with 1 <= lo <= hi, got {ngram_range!r}")
    vec = TfidfVectorizer(
        ngram_range=(lo, hi),
        tokenizer=tokenizer,
        token_pattern=None if tokenizer is not None else token_pattern,
        lowercase=lowercase,
        norm=norm,
        sublinear_tf=sublinear_tf,
    )
    try:
        weights = vec.fit_transform(texts).tocsr()  # (n_examples, n_ngrams)
    except ValueError as e:  # "empty vocabulary; perhaps the documents only contain stop words"
        raise ValueError(f"no n-gram found in the {len(texts)} texts ({e})") from None
    weights.sort_indices()
    w_int, scale = _fixed_point(weights)
    return NgramGraph(weights, w_int, scale, np.asarray(vec.get_feature_names_out(), dtype=object))


# ---------------------------------------------------------------------------------------------------------------
# quality


def rescale_quality(quality: Any, n: int, *, eps: float = 1e-3) -> np.ndarray:
    """Q into [eps, 1]: ``clip(q / max(q), eps, 1)``; NaN counts as 0 (then eps), so φ is never zeroed by Q.

    Dividing by the maximum keeps the ratios, so the multiplicative priority ranks exactly as with the raw scores;
    only scores below ``eps * max`` are lifted to the floor. ``quality=None`` is Q ≡ 1 (diversity only).
    """
    if quality is None:
        return np.ones(n)
    q = np.asarray(quality, dtype=np.float64).reshape(-1)
    if q.shape[0] != n:
        raise ValueError(f"quality has {q.shape[0]} values, expected one per example ({n})")
    q = np.nan_to_num(q, nan=0.0, posinf=np.inf)
    if (q < 0).any():
        raise ValueError(f"quality must be >= 0 (got a minimum of {float(q.min()):g}); shift or rescale it first")
    if np.isinf(q).any():
        raise ValueError("quality has infinite values")
    top = float(q.max()) if n else 0.0
    if top <= 0.0:
        return np.ones(n)  # no example has a usable score: uniform quality
    return np.clip(q / top, eps, 1.0)


def quality_from_ifd(ifd: Any, *, max_ifd: float | None = 1.0) -> np.ndarray:
    """SuperFilter quality: the IFD itself (higher = selected), 0 for NaN and for ``IFD >= max_ifd``.

    Superfiltering keeps only ``ifd_ppl < filter_threash`` (1 by default: the instruction does not help predict
    the response) and selects the highest remaining IFD (``code_ifd/select_data.py``); 0 becomes the floor ε in
    `rescale_quality`, so such examples are selected last instead of never.
    """
    q = np.asarray(ifd, dtype=np.float64).copy()
    bad = ~np.isfinite(q) | (q <= 0)
    if max_ifd is not None:
        bad |= q >= max_ifd
    q[bad] = 0.0
    return q


# ---------------------------------------------------------------------------------------------------------------
# selection


@dataclass
class Selection:
    """What `select_on_graph` chose.

    Attributes:
        order (`list[int]`): selected examples in selection order.
        priority (`np.ndarray`, (k,)): φ(u*) when each was selected.
        gain (`np.ndarray`, (k,)): D(u*) when selected: the TF-IDF weight it newly covered.
        resets (`list[int]`): selection steps before which the coverage was reset.
        covered (`np.ndarray` of bool, (n_ngrams,)): n-grams covered by the selected set (the union of their
            neighbourhoods, over resets).
        vocabulary (`np.ndarray` of str): the graph's n-grams.
        evaluations (`int`): priority computations (N per step for the naive loop; far fewer when lazy).
    """

    order: list[int]
    priority: np.ndarray
    gain: np.ndarray
    resets: list[int]
    covered: np.ndarray
    vocabulary: np.ndarray
    evaluations: int = 0
    lazy: bool = True
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def covered_ngrams(self) -> list[str]:
        return [str(v) for v in self.vocabulary[self.covered]]

    @property
    def coverage(self) -> float:
        """Fraction of the graph's distinct n-grams that the selection covers."""
        return float(self.covered.mean()) if self.covered.size else 0.0


def _check_k(k: int, n: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 1 <= k <= n:
        raise ValueError(f"k must be an int in [1, {n}] (the number of examples), got {k!r}")


class _Priority:
    """φ as a function of the exact integer diversity: ``q * d`` or ``q̃ + lam * d / d_max``. Scalar and vector
    forms do the same IEEE operations in the same order, so lazy and naive loops see identical values."""

    def __init__(self, q: np.ndarray, d0: np.ndarray, combine: str, lam: float) -> None:
        self.combine, self.lam = combine, float(lam)
        if combine == "mul":
            self.q = q
        else:
            lo, hi = float(q.min()), float(q.max())
            self.q = (q - lo) / (hi - lo) if hi > lo else np.ones_like(q)
        self.d_max = float(max(int(d0.max()) if d0.size else 1, 1))

    def one(self, u: int, d: int) -> float:
        if self.combine == "mul":
            return float(self.q[u]) * float(d)
        return float(self.q[u]) + self.lam * (float(d) / self.d_max)

    def all(self, d: np.ndarray, items: np.ndarray | None = None) -> np.ndarray:
        """φ of `items` (default all) from their integer diversities `d` (same length)."""
        q = self.q if items is None else self.q[items]
        if self.combine == "mul":
            return q * d.astype(np.float64)
        return q + self.lam * (d.astype(np.float64) / self.d_max)


def select_on_graph(
    graph: NgramGraph,
    k: int,
    *,
    quality: Any = None,
    combine: str = "mul",
    lam: float = 1.0,
    eps: float = 1e-3,
    reset: bool = True,
    lazy: bool = True,
    seed: int | None = None,
) -> Selection:
    """GraphFilter's greedy set cover on a built graph; see the module docstring for the algorithm.

    Args:
        graph (`NgramGraph`): from `build_ngram_graph`.
        k (`int`): examples to select, 1 <= k <= n.
        quality (array of n floats >= 0, *optional*): Q(u), e.g. `quality_from_ifd`; None is Q ≡ 1 (diversity only).
            Rescaled by `rescale_quality` (floor `eps`).
        combine (`str`, defaults to ``"mul"``): ``"mul"`` (the paper's Q · D) or ``"add"`` (Q̃ + lam · D / D_max).
        lam (`float`, defaults to 1.0): weight of the diversity term of ``"add"``.
        eps (`float`, defaults to 1e-3): quality floor.
        reset (`bool`, defaults to `True`): reset the coverage when every n-gram of the remaining examples is covered.
        lazy (`bool`, defaults to `True`): lazy heap (exact) instead of recomputing every priority each step.
        seed (`int`, *optional*): break exact ties by a seeded permutation instead of by index.
    """
    n = graph.n_examples
    _check_k(k, n)
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {', '.join(COMBINES)}, got {combine!r}")
    if not (math.isfinite(lam) and lam >= 0):
        raise ValueError(f"lam must be a finite number >= 0, got {lam!r}")
    if not 0.0 < eps <= 1.0:
        raise ValueError(f"eps must be in (0, 1], got {eps!r}")
    q = rescale_quality(quality, n, eps=eps)
    rank = np.arange(n) if seed is None else np.random.default_rng(seed).permutation(n)
    w = graph.weights_int
    d0 = np.asarray(w.sum(axis=1)).reshape(-1).astype(np.int64)  # (n,) exact D with nothing covered
    phi = _Priority(q, d0, combine, lam)
    run = _lazy_greedy if lazy else _naive_greedy
    order, pri, gain, resets, covered, evals = run(w, k, q, rank, d0, phi, reset)
    return Selection(order, np.asarray(pri), np.asarray(gain) / graph.scale, resets, covered, graph.vocabulary,
                     evals, lazy, {"combine": combine, "lam": lam, "eps": eps, "reset": reset})  # fmt: skip


def _naive_greedy(w, k, q, rank, d0, phi, reset):  # noqa: ANN001, ANN202 - internal, see select_on_graph
    """The literal loop: every step recomputes D for every remaining example and takes the best key
    (φ, then Q, then the lower rank)."""
    n, n_v = w.shape
    nnz = np.diff(w.indptr)
    remaining = np.ones(n, dtype=bool)
    covered = np.zeros(n_v, dtype=bool)
    ever = np.zeros(n_v, dtype=bool)
    order, pri, gain, resets, evals = [], [], [], [], 0
    while len(order) < k:
        d = w @ (~covered).astype(np.int64)  # (n,) exact integer sums of the uncovered weights
        if reset and not (d[remaining] > 0).any() and (nnz[remaining] > 0).any():
            covered[:] = False
            resets.append(len(order))
            d = w @ np.ones(n_v, dtype=np.int64)
        evals += int(remaining.sum())
        p = phi.all(d)
        idx = np.flatnonzero(remaining)
        best = idx[np.lexsort((rank[idx], -q[idx], -p[idx]))[0]]  # max φ, then max Q, then min rank
        order.append(int(best))
        pri.append(float(p[best]))
        gain.append(int(d[best]))
        remaining[best] = False
        cols = w.indices[w.indptr[best] : w.indptr[best + 1]]
        covered[cols] = True
        ever[cols] = True
    return order, pri, gain, resets, ever, evals


def _lazy_greedy(w, k, q, rank, d0, phi, reset):  # noqa: ANN001, ANN202 - internal, see select_on_graph
    """Max-heap of stale keys (−φ, −Q, rank, u): a popped example whose fresh key still beats the next stale key is
    the exact argmax, because stale priorities only overestimate (D never grows between resets)."""
    n, n_v = w.shape
    indptr, indices, data = w.indptr, w.indices, w.data
    nnz = np.diff(indptr)
    covered = np.zeros(n_v, dtype=bool)
    ever = np.zeros(n_v, dtype=bool)
    df_rem = np.bincount(indices, minlength=n_v).astype(np.int64)  # remaining examples containing each n-gram
    n_useful = int((df_rem > 0).sum())  # uncovered n-grams that some remaining example contains
    nonempty_left = int((nnz > 0).sum())
    remaining = np.ones(n, dtype=bool)

    def build(items: np.ndarray, d: np.ndarray) -> list[tuple[float, float, int, int]]:
        p = phi.all(d[items], items)
        heap = list(zip((-p).tolist(), (-q[items]).tolist(), rank[items].tolist(), items.tolist()))
        heapq.heapify(heap)
        return heap

    heap = build(np.arange(n), d0)
    order, pri, gain, resets, evals = [], [], [], [], n
    while len(order) < k:
        if reset and n_useful == 0 and nonempty_left > 0:
            covered[:] = False
            n_useful = int((df_rem > 0).sum())
            resets.append(len(order))
            items = np.flatnonzero(remaining)
            heap = build(items, d0)  # every n-gram uncovered again: D = the full row sums
            evals += len(items)
        while True:
            _, negq, r, u = heapq.heappop(heap)
            s, e = indptr[u], indptr[u + 1]
            d = int(data[s:e][~covered[indices[s:e]]].sum())
            evals += 1
            p = phi.one(u, d)
            key = (-p, negq, r, u)
            if not heap or key <= heap[0]:
                break
            heapq.heappush(heap, key)
        order.append(u)
        pri.append(p)
        gain.append(d)
        remaining[u] = False
        cols = indices[s:e]
        df_rem[cols] -= 1
        n_useful -= int((~covered[cols]).sum())
        covered[cols] = True
        ever[cols] = True
        nonempty_left -= int(e > s)
    return order, pri, gain, resets, ever, evals


def graphfilter_select(
    texts: Sequence[str],
    k: int,
    *,
    quality: Any = None,
    ngram_range: tuple[int, int] = (1, 3),
    tokenizer: Callable[[str], list[str]] | None = None,
    token_pattern: str = TOKEN_PATTERN,
    lowercase: bool = True,
    combine: str = "mul",
    lam: float = 1.0,
    eps: float = 1e-3,
    reset: bool = True,
    lazy: bool = True,
    seed: int | None = None,
) -> Selection:
    """Select `k` of `texts` with GraphFilter; returns a `Selection` (``.order``: indices in selection order).

    Example:
        >>> sel = graphfilter_select(["Q: 2+2?\\nA: 4", "Q: capital of France?\\nA: Paris", "Q: 2+3?\\nA: 5"], 2)
        >>> sel.order, sel.covered_ngrams[:3]

    Args: see `build_ngram_graph` (graph) and `select_on_graph` (selection).
    """
    graph = build_ngram_graph(texts, ngram_range=ngram_range, tokenizer=tokenizer, token_pattern=token_pattern,
                              lowercase=lowercase)  # fmt: skip
    return select_on_graph(graph, k, quality=quality, combine=combine, lam=lam, eps=eps, reset=reset, lazy=lazy,
                           seed=seed)  # fmt: skip


# ---------------------------------------------------------------------------------------------------------------
# baselines


def quality_only_select(quality: Any, k: int, *, eps: float = 1e-3) -> list[int]:
    """Top-k by Q (the SuperFilter / IFD baseline), ties to the lower index."""
    q = rescale_quality(quality, len(quality), eps=eps)
    _check_k(k, len(q))
    return [int(i) for i in np.lexsort((np.arange(len(q)), -q))[:k]]


def random_select(n: int, k: int, *, seed: int) -> list[int]:
    """k of n examples uniformly without replacement (seeded)."""
    _check_k(k, n)
    return [int(i) for i in np.random.default_rng(seed).choice(n, size=k, replace=False)]


def k_center_greedy(x: Any, k: int, *, seed: int = 0) -> list[int]:
    """K-center greedy (Sener & Savarese, ICLR 2018): start from a seeded random point, then repeatedly add the point
    farthest (Euclidean) from its nearest selected center: u* = argmax_u min_{c ∈ S} ||x_u − x_c||².

    Args:
        x (array, (n, d)): embeddings (e.g. MiniLM, unit norm).
        k (`int`): points to select.
        seed (`int`): picks the first center.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"x must be an (n, d) array of embeddings, got shape {x.shape}")
    n = x.shape[0]
    _check_k(k, n)
    sq = (x * x).sum(1)  # (n,)
    first = int(np.random.default_rng(seed).integers(n))
    order = [first]
    min_d = np.maximum(sq - 2.0 * (x @ x[first]) + sq[first], 0.0)  # (n,) squared distance to the nearest center
    min_d[first] = -1.0
    while len(order) < k:
        u = int(np.argmax(min_d))  # ties (and all-duplicate pools) go to the lower index
        order.append(u)
        min_d = np.minimum(min_d, np.maximum(sq - 2.0 * (x @ x[u]) + sq[u], 0.0))
        min_d[order] = -1.0
    return order


# ---------------------------------------------------------------------------------------------------------------
# IFD (SuperFilter quality) with a small LM


@dataclass
class IFDScores:
    """IFD(x, y) = PPL(y | x) / PPL(y) per example, with both perplexities (NaN where undefined)."""

    ifd: np.ndarray
    ppl_conditional: np.ndarray
    ppl_alone: np.ndarray


def ifd_from_nll(nll_conditional: Any, nll_alone: Any) -> np.ndarray:
    """IFD = exp(mean NLL(y | x)) / exp(mean NLL(y)) = exp(nll_cond − nll_alone) (NaN propagates)."""
    return np.exp(np.asarray(nll_conditional, dtype=np.float64) - np.asarray(nll_alone, dtype=np.float64))


def answer_marker(template: str = PROMPT_TEMPLATE) -> str:
    """The template's text after the instruction (``"\\n"`` for Superfiltering's plain format): the context of the
    unconditional score, so that PPL(y) and PPL(y | x) predict the same response tokens from the same marker."""
    if "{instruction}" not in template:
        raise ValueError(f"template must contain '{{instruction}}', got {template!r}")
    return template.rsplit("{instruction}", 1)[1]


def response_nll_alone(
    model: Any, tokenizer: Any, responses: Sequence[str], *, template: str = PROMPT_TEMPLATE, batch_size: int = 8
) -> np.ndarray:
    """Mean NLL of each response without its instruction, over the tokens the conditional score averages:

        NLL(y) = −1/N Σ_{i=1..N} log p(y_i | a, y_<i),   a = `answer_marker(template)` (``"\\n"``),

    y_1..y_N = the continuation of ``split_pair(a, y)``: the same N tokens that PPL(y | x) scores after
    ``template.format(instruction=x)``, which ends in `a` (the prompt/response boundary is the one of
    `lmlab.core.inference.scoring.split_pair` in both). NaN for an empty response.

    Why the marker: ``encode(y)`` scored on its own (Superfiltering's ``get_perplexity_and_embedding_whole_text``,
    labels = input ids) predicts tokens 2..N only, when the tokenizer adds no BOS (GPT-2, SmolLM2), while PPL(y | x)
    predicts all N; on a response of a few tokens whose first token is a novel tag that token alone decides the ratio.
    Cherry_LLM, the code that defined IFD, scores PPL(y) over the response span of ``"### Response:" + y``, the
    marker its prompts end in, for the same tokens. A template with nothing after the instruction falls back to the
    BOS token (EOS where there is none) as the context.
    """
    from lmlab.core.inference.scoring import _pad_id, continuation_logprobs, split_pair

    marker = answer_marker(template)
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    contexts, conts = [], []
    for r in responses:
        ctx_ids, cont = split_pair(tokenizer, marker, r)
        if not ctx_ids and start_id is None:
            raise ValueError("the template ends with its instruction and the tokenizer has no BOS/EOS to score y from")
        contexts.append(ctx_ids or [int(start_id)])  # (|a|,) or the start token: every y_i has a predicting position
        conts.append(cont)
    out = np.full(len(conts), np.nan)
    if not conts:
        return out
    scored = continuation_logprobs(model, contexts, conts, batch_size=batch_size, pad_id=_pad_id(tokenizer))
    for j, (lp, _) in enumerate(scored):
        if lp:
            out[j] = -float(sum(lp)) / len(lp)
    return out


def ifd_scores(
    model: Any,
    tokenizer: Any,
    instructions: Sequence[str],
    responses: Sequence[str],
    *,
    template: str = PROMPT_TEMPLATE,
    batch_size: int = 8,
) -> IFDScores:
    """SuperFilter IFD of (instruction, response) pairs with a (small) causal LM.

    PPL(y | x) scores the N response tokens after ``template.format(instruction=x)`` (boundary: `lmlab.core.
    inference.scoring.split_pair`), PPL(y) the same N tokens after the template's answer marker alone
    (`response_nll_alone`), so IFD = exp(mean_i NLL(y_i | x, a, y_<i) − mean_i NLL(y_i | a, y_<i)). Example:
        >>> s = ifd_scores(model, tok, ["What is 2+2?"], ["The answer is 4."])
        >>> quality = quality_from_ifd(s.ifd)         # IFD >= 1 filtered, higher selected
    """
    import torch

    from lmlab.core.training.preference import seq_logprobs

    instructions, responses = list(instructions), list(responses)
    if len(instructions) != len(responses):
        raise ValueError(f"got {len(instructions)} instructions but {len(responses)} responses")
    if not instructions:
        raise ValueError("no examples to score: instructions and responses are empty")
    prompts = [format_prompt(x, template) for x in instructions]
    with torch.no_grad():
        cond = seq_logprobs(model, tokenizer, prompts, responses, padding_side="left", batch_size=batch_size)
    nll_cond = -cond.mean.double().numpy()
    nll_alone = response_nll_alone(model, tokenizer, responses, template=template, batch_size=batch_size)
    return IFDScores(ifd_from_nll(nll_cond, nll_alone), np.exp(nll_cond), np.exp(nll_alone))
