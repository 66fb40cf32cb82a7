"""Fractal parameters of bits-per-token series: E[R/S](n) ∝ n^H and P(|X_{t+τ} − X_t| < ε) ∝ τ^(−S).

Alabdulmohsin, Tran & Dehghani, "Fractal Patterns May Illuminate the Success of Next-Token Prediction" (NeurIPS 2024,
https://arxiv.org/abs/2402.01825) define the estimators; Alabdulmohsin & Steiner, "A Tale of Two Structures: Do LLMs
Capture the Fractal Complexity of Language?" (ICML 2025, https://arxiv.org/abs/2502.14924) apply them to LLM output
and to detection. The estimators follow the official Colab notebook
(google-research/google-research, ``fractals_language/fractal_patterns_in_language.ipynb``: ``power_law_fit``,
``get_self_sim_exponent``, ``get_hurst_exponent``). Pure: no I/O, no printing.

Pipeline (shapes per document d of length T_d):

1. bits   z_t = −log2 p_θ(w_t | w_<t)                           (`bits_series`, `token_bits`; (T_d,))
2. increments x_t = (z_t − mean z) / std z   (z-score per document; the notebook's ``x``)   (`increments`)
   integral   X_t = Σ_{k≤t} x_k                                                              (the notebook's ``X``)
3. Hurst H: for each scale n, `samples_per_doc` random windows y = x[o : o+n] per document (o uniform in
   [0, T_d − n)); y ← y − mean(y); Y = cumsum(y); R = max Y − min Y; S = std(y) (ddof 0);
   E[R/S](n) = mean of R/S over all windows of all documents; fit log E[R/S] = c + H log n by OLS.
4. Self-similarity S: for each lag τ, every offset o in [0, T_d − τ) of every document (the notebook draws
   `samples_per_doc` random ones; ``selfsim_offsets="random"``); p_ε(τ) = mean 1[|X_{o+τ} − X_o| < ε] over all
   of them; fit log p_ε = c − S log τ by OLS; fractal dimension D = 2 − S.

Pooling (pitfall: per-document estimates on a few hundred tokens are very noisy): windows are drawn once per document
and stored as per-document sums (`FractalTable`); any reweighting of documents (the pooled estimate, a leave-one-
cluster-out jackknife, a cluster bootstrap, a single document's own estimate) is a matrix product of weights with
those sums followed by the log-log fit, so every resample sees the same windows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmlab.methods.analysis.fractal_text.config import SELFSIM_OFFSETS

LOG2 = math.log(2.0)
KINDS = ("increments", "levels")


# ----------------------------------------------------------------------------------------------------------------
# 1. bits per token from a fixed scorer


def token_bits(
    model: Any,
    contexts: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[int]],
    *,
    window: int = 1024,
    batch_size: int = 4,
) -> list[np.ndarray]:
    """−log2 p(c_j | context, c_<j) for every continuation token: one float64 array of len(continuation) per pair.

    A sequence longer than `window` tokens is scored in chunks of window // 2 new tokens, each with the preceding
    window − chunk tokens as context (lm-eval's rolling windows), so no token is scored with more than `window`
    tokens of context and every token is scored once.
    """
    from lmlab.core.inference.scoring import continuation_logprobs

    if window < 2:
        raise ValueError(f"window must be >= 2 tokens, got {window}")
    if len(contexts) != len(continuations):
        raise ValueError(f"got {len(contexts)} contexts but {len(continuations)} continuations")
    stride = max(1, window // 2)
    ctx_rows: list[list[int]] = []
    cont_rows: list[list[int]] = []
    owner: list[int] = []
    for d, (ctx, cont) in enumerate(zip(contexts, continuations)):
        if not ctx:
            raise ValueError(f"context {d} is empty: start every sequence with a BOS token")
        full, pos = list(ctx) + list(cont), len(ctx)
        while pos < len(full):
            # first chunk: as many tokens as fit after the context; later chunks: `stride` new tokens each
            n_new = max(1, window - pos) if pos == len(ctx) and pos < window else stride
            end = min(len(full), pos + n_new)
            ctx_rows.append(full[max(0, end - window) : pos])
            cont_rows.append(full[pos:end])
            owner.append(d)
            pos = end
    scored = continuation_logprobs(model, ctx_rows, cont_rows, batch_size=batch_size, pad_id=_pad(model))
    out: list[list[float]] = [[] for _ in contexts]
    for d, (lp, _) in zip(owner, scored):
        out[d].extend(lp)
    return [-np.asarray(v, dtype=np.float64) / LOG2 for v in out]


def _pad(model: Any) -> int:
    pid = getattr(getattr(model, "config", None), "pad_token_id", None)
    return int(pid) if isinstance(pid, int) else 0


def start_token(tokenizer: Any) -> int:
    """The token every scored sequence starts with (BOS, else EOS), so the first text token is scored too."""
    tok = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if tok is None:
        raise ValueError("the scorer's tokenizer has neither a BOS nor an EOS token to start a sequence with")
    return int(tok)


def bits_series(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    prompts: Sequence[str] | None = None,
    window: int = 1024,
    drop_first: int = 32,
    batch_size: int = 4,
) -> list[np.ndarray]:
    """Bits per token of each text under a fixed scorer, prompt tokens and the first `drop_first` tokens excluded.

    Each text is scored as ``[BOS] + prompt + text`` (the prompt, when given, is context only; the boundary token is
    found with `lmlab.core.inference.scoring.split_pair`). Positions are counted from the start of the document (prompt
    included): positions < `drop_first` have too little context and are dropped, and so are all prompt tokens.

    Args:
        model, tokenizer: the scorer (any causal LM); one fixed scorer for every text that is compared.
        texts (`Sequence[str]`): documents (for a generation: the generated text only).
        prompts (`Sequence[str]`, *optional*): the prompt each text continues (for generations).
        window (`int`, defaults to 1024): longest context the scorer sees (paper: >= 1-2K tokens).
        drop_first (`int`, defaults to 32): leading positions dropped (spec: 16-32; notebook: 128 of 1024).

    Returns:
        `list[np.ndarray]`: one float64 array of bits per kept token per text.
    """
    from lmlab.core.inference.scoring import encode, split_pair

    if prompts is not None and len(prompts) != len(texts):
        raise ValueError(f"got {len(texts)} texts but {len(prompts)} prompts")
    if drop_first < 0:
        raise ValueError(f"drop_first must be >= 0, got {drop_first}")
    start = start_token(tokenizer)
    contexts, conts = [], []
    for i, text in enumerate(texts):
        if prompts is None or not prompts[i]:
            ctx, cont = [], encode(tokenizer, text, add_special_tokens=False)
        else:
            ctx, cont = split_pair(tokenizer, prompts[i], text, add_special_tokens=False)
        contexts.append([start] + list(ctx))
        conts.append(list(cont))
    bits = token_bits(model, contexts, conts, window=window, batch_size=batch_size)
    # continuation token j sits at document position len(ctx) + j (BOS excluded)
    return [b[max(0, drop_first - (len(c) - 1)) :] for b, c in zip(bits, contexts)]


# ----------------------------------------------------------------------------------------------------------------
# 2. increments


def increments(bits: Any) -> np.ndarray:
    """x = (z − mean z) / std z of one document (the notebook's normalisation); a constant series is an error."""
    z = np.asarray(bits, dtype=np.float64)
    if z.ndim != 1 or z.size < 2:
        raise ValueError(f"a series must be 1-D with >= 2 values, got shape {z.shape}")
    if not np.all(np.isfinite(z)):
        raise ValueError("a series holds NaN or inf")
    sd = float(z.std())
    if not sd > 1e-12:
        raise ValueError("the series is constant (std 0): its increments are undefined")
    return (z - z.mean()) / sd


def _as_increments(series: Sequence[Any], kind: str) -> list[np.ndarray]:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if len(series) == 0:
        raise ValueError("no series given: pass at least one document")
    out = []
    for d, s in enumerate(series):
        arr = np.asarray(s, dtype=np.float64)
        if arr.ndim != 1:
            raise ValueError(f"series {d} must be 1-D, got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"series {d} holds NaN or inf")
        out.append(np.diff(arr) if kind == "levels" else arr)
    return out


def _check_grid(name: str, grid: Sequence[int]) -> np.ndarray:
    g = np.asarray(list(grid))
    if g.ndim != 1 or g.size < 2 or np.any(g < 1) or np.any(np.diff(g) <= 0) or not np.all(g == np.round(g)):
        raise ValueError(f"{name} must be >= 2 increasing positive integers, got {list(grid)!r}")
    return g.astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# 3-4. per-document window sums and the pooled log-log fits


def loglog_fit(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    """OLS of log y on [1, log x] per row (the notebook's `power_law_fit`): ``(intercept, slope)``, shape (B,).

    `y` is (B, K) (or (K,)); entries that are NaN or <= 0 are left out of that row's fit; a row with fewer than two
    usable points gives NaN.
    """
    lx = np.log(np.asarray(x, dtype=np.float64))
    y = np.atleast_2d(np.asarray(y, dtype=np.float64))
    ok = np.isfinite(y) & (y > 0)
    ly = np.where(ok, np.log(np.where(ok, y, 1.0)), 0.0)
    n = ok.sum(1)
    sx, sy = (ok * lx).sum(1), ly.sum(1)
    sxx, sxy = (ok * lx * lx).sum(1), (ly * lx).sum(1)
    den = n * sxx - sx * sx
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where((n >= 2) & (den > 1e-12), (n * sxy - sx * sy) / den, np.nan)
        inter = np.where(np.isfinite(slope), (sy - slope * sx) / np.maximum(n, 1), np.nan)
    return inter, slope


@dataclass
class FractalTable:
    """Per-document sums of the window statistics, drawn once; every pooled estimate is computed from them.

    Attributes:
        scales (`np.ndarray`, (K,)): Hurst window lengths n. taus (`np.ndarray`, (L,)): self-similarity lags τ.
        rs_sum, rs_count (`np.ndarray`, (D, K)): Σ R/S and the number of windows with std > 0, per document.
        hit_sum, hit_count (`np.ndarray`, (D, L)): Σ 1[|ΔX| < ε] and the number of offsets, per document.
        skipped (`np.ndarray`, (K,)): windows skipped because std(y) = 0 (repetition loops), all documents.
        eps (`float`): ε of the self-similarity estimate.
        lengths (`np.ndarray`, (D,)): tokens per document.
    """

    scales: np.ndarray
    taus: np.ndarray
    rs_sum: np.ndarray
    rs_count: np.ndarray
    hit_sum: np.ndarray
    hit_count: np.ndarray
    skipped: np.ndarray
    eps: float
    lengths: np.ndarray

    @property
    def n_docs(self) -> int:
        return int(self.lengths.size)

    def rescaled_range(self, weights: Any = None) -> np.ndarray:
        """E[R/S](n) pooled over windows of all documents with per-document `weights` ((D,) or (B, D)): (B, K)."""
        w = self._weights(weights)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (w @ self.rs_sum) / (w @ self.rs_count)

    def peak_probability(self, weights: Any = None) -> np.ndarray:
        """p_ε(τ) pooled over documents: (B, L). A zero count of hits becomes 0.5 hits (continuity correction), so
        the log-log fit stays finite on small resamples; it is never needed when each τ has a few hits."""
        w = self._weights(weights)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.maximum(w @ self.hit_sum, 0.5) / (w @ self.hit_count)

    def hurst(self, weights: Any = None) -> np.ndarray:
        """H (slope of log E[R/S] on log n) for each weight row: (B,)."""
        return loglog_fit(self.scales, self.rescaled_range(weights))[1]

    def selfsim(self, weights: Any = None) -> np.ndarray:
        """S (minus the slope of log p_ε on log τ) for each weight row: (B,)."""
        return -loglog_fit(self.taus, self.peak_probability(weights))[1]

    def statistic(self, name: str, weights: Any = None) -> np.ndarray:
        if name == "hurst":
            return self.hurst(weights)
        if name == "selfsim":
            return self.selfsim(weights)
        raise ValueError(f"statistic must be 'hurst' or 'selfsim', got {name!r}")

    def per_document(self) -> tuple[np.ndarray, np.ndarray]:
        """Each document's own (H, S) from its own windows: two (D,) arrays (NaN where undefined)."""
        eye = np.eye(self.n_docs)
        return self.hurst(eye), self.selfsim(eye)

    def _weights(self, weights: Any) -> np.ndarray:
        w = np.ones((1, self.n_docs)) if weights is None else np.atleast_2d(np.asarray(weights, dtype=np.float64))
        if w.shape[1] != self.n_docs:
            raise ValueError(f"weights must have one column per document ({self.n_docs}), got shape {w.shape}")
        return w


def fractal_table(
    series: Sequence[Any],
    *,
    scales: Sequence[int] = (16, 24, 32, 48, 64, 96, 128),
    taus: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    samples_per_doc: int = 100,
    eps: float = 5e-2,
    seed: int = 0,
    kind: str = "increments",
    normalize: bool = True,
    selfsim_offsets: str = "all",
) -> FractalTable:
    """Draw the R/S windows and the self-similarity offsets of every document once (see the module docstring).

    Args:
        series: one 1-D array per document: increments (bits per token) or, with ``kind="levels"``, the integral
            process (differenced first). Pass increments, not levels, unless you say so: R/S of levels measures
            something else (pitfall of the spec).
        scales, taus: window lengths n and lags τ; every document must be longer than the largest of both (drop or
            filter shorter ones first, see `usable`).
        samples_per_doc (`int`, defaults to 100): R/S windows per document per scale (notebook: 100); with
            ``selfsim_offsets="random"`` also the self-similarity offsets per lag.
        eps (`float`, defaults to 0.05): ε of p_ε(τ) (notebook ``DEFAULT_EPS``).
        seed (`int`): seeds the window offsets.
        normalize (`bool`, defaults to `True`): z-score each document first (`increments`). R/S is invariant to it;
            p_ε is not (ε is an absolute threshold on X).
        selfsim_offsets (`str`, defaults to ``"all"``): ``"all"`` counts |X_{o+τ} − X_o| < ε at every offset o of
            every document (T_d − τ pairs per lag), ``"random"`` at `samples_per_doc` random offsets (the notebook).
            With ε = 0.05 a lag τ ≥ 16 gets only a few hits out of 100 random offsets, so the random draw alone moves
            S by ~0.1-0.2 on 12 documents of 224 tokens; every offset costs nothing and halves that (the estimand,
            p_ε(τ) pooled over t, is the same: the notebook's offsets are a Monte-Carlo sample of these).
    """
    xs = _as_increments(series, kind)
    sc, ta = _check_grid("scales", scales), _check_grid("taus", taus)
    if samples_per_doc < 1:
        raise ValueError(f"samples_per_doc must be >= 1, got {samples_per_doc}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if selfsim_offsets not in SELFSIM_OFFSETS:
        raise ValueError(f"selfsim_offsets must be one of {', '.join(SELFSIM_OFFSETS)}, got {selfsim_offsets!r}")
    need = int(max(sc.max(), ta.max())) + 1
    for d, x in enumerate(xs):
        if x.size < need:
            raise ValueError(
                f"series {d} has {x.size} values; every series needs > max(scales, taus) = {need - 1} (drop it first)"
            )
    rng = np.random.default_rng(seed)
    D, K, L = len(xs), sc.size, ta.size
    rs_sum, rs_cnt = np.zeros((D, K)), np.zeros((D, K))
    hit_sum, hit_cnt = np.zeros((D, L)), np.zeros((D, L))
    skipped = np.zeros(K, dtype=np.int64)
    for d, x in enumerate(xs):
        if normalize:
            x = increments(x)
        for k, n in enumerate(sc):
            off = rng.integers(0, x.size - n, size=samples_per_doc)  # the notebook's randint(0, len - n)
            y = x[off[:, None] + np.arange(n)]  # (samples, n)
            y = y - y.mean(1, keepdims=True)
            cum = np.cumsum(y, 1)
            r, s = cum.max(1) - cum.min(1), y.std(1)
            ok = s > 1e-12  # a constant window has no R/S: skipped and counted
            rs_sum[d, k], rs_cnt[d, k] = float((r[ok] / s[ok]).sum()), float(ok.sum())
            skipped[k] += int((~ok).sum())
        X = np.cumsum(x)
        for j, tau in enumerate(ta):
            if selfsim_offsets == "all":
                dX = X[tau:] - X[:-tau]  # (T_d − τ,): every offset o in [0, T_d − τ), the notebook's range
            else:  # the notebook's draw: samples_per_doc offsets randint(0, len − τ)
                off = rng.integers(0, X.size - tau, size=samples_per_doc)
                dX = X[off + tau] - X[off]
            hit_sum[d, j] = float((np.abs(dX) < eps).sum())
            hit_cnt[d, j] = float(dX.size)
    return FractalTable(sc, ta, rs_sum, rs_cnt, hit_sum, hit_cnt, skipped, float(eps),
                        np.array([x.size for x in xs]))  # fmt: skip


def usable(series: Sequence[Any], scales: Sequence[int], taus: Sequence[int]) -> list[bool]:
    """Which documents the estimators can use: longer than every scale and lag, and not constant."""
    need = int(max(max(scales), max(taus))) + 1
    out = []
    for s in series:
        a = np.asarray(s, dtype=np.float64)
        out.append(bool(a.ndim == 1 and a.size >= need and np.all(np.isfinite(a)) and a.std() > 1e-12))
    return out


@dataclass(frozen=True)
class HurstResult:
    """H from pooled rescaled ranges: log E[R/S](n) = intercept + H log n."""

    hurst: float
    intercept: float
    scales: tuple[int, ...]
    rescaled_range: tuple[float, ...]
    n_docs: int
    skipped_windows: int


def hurst_rs(
    series: Sequence[Any],
    scales: Sequence[int] = (16, 24, 32, 48, 64, 96, 128),
    samples_per_doc: int = 100,
    seed: int = 0,
    kind: str = "increments",
) -> HurstResult:
    """Hurst exponent by rescaled range, pooled over all windows of all documents (the notebook's
    ``get_hurst_exponent``). ``kind="increments"`` (default) takes the series as is; ``"levels"`` differences it."""
    t = fractal_table(series, scales=scales, taus=(1, 2), samples_per_doc=samples_per_doc, seed=seed, kind=kind)
    rs = t.rescaled_range()[0]
    inter, slope = loglog_fit(t.scales, rs)
    return HurstResult(float(slope[0]), float(inter[0]), tuple(int(s) for s in t.scales), tuple(map(float, rs)),
                       t.n_docs, int(t.skipped.sum()))  # fmt: skip


@dataclass(frozen=True)
class SelfSimilarityResult:
    """S from pooled peak probabilities: log p_ε(τ) = intercept − S log τ; D = 2 − S."""

    selfsim: float
    fractal_dimension: float
    intercept: float
    taus: tuple[int, ...]
    peak_probability: tuple[float, ...]
    n_docs: int


def self_similarity(
    series: Sequence[Any],
    taus: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    eps: float = 5e-2,
    samples_per_doc: int = 100,
    seed: int = 0,
    kind: str = "increments",
    offsets: str = "all",
) -> SelfSimilarityResult:
    """Self-similarity exponent S of the integral process (the notebook's ``get_self_sim_exponent``; `offsets`:
    ``"all"`` (default) or the notebook's ``"random"`` draw of `samples_per_doc` per lag, see `fractal_table`)."""
    t = fractal_table(series, scales=(1, 2), taus=taus, samples_per_doc=samples_per_doc, eps=eps, seed=seed,
                      kind=kind, selfsim_offsets=offsets)  # fmt: skip
    p = t.peak_probability()[0]
    inter, slope = loglog_fit(t.taus, p)
    s = float(-slope[0])
    return SelfSimilarityResult(s, 2.0 - s, float(inter[0]), tuple(int(v) for v in t.taus), tuple(map(float, p)),
                                t.n_docs)  # fmt: skip


@dataclass(frozen=True)
class DFAResult:
    """Detrended fluctuation analysis: log F(n) = intercept + alpha log n (alpha ≈ H for fGn)."""

    alpha: float
    intercept: float
    scales: tuple[int, ...]
    fluctuation: tuple[float, ...]


def dfa(series: Sequence[Any], scales: Sequence[int] = (16, 24, 32, 48, 64, 96, 128), kind: str = "increments"):
    """DFA-1 pooled over documents, an alternative to R/S (Peng et al. 1994; `nolds.dfa`, `fathon`).

    Profile Y = cumsum(x − mean x) per document; split into non-overlapping windows of n; remove each window's
    least-squares line; F(n)² = mean squared residual over all windows of all documents; alpha = slope of log F.
    """
    xs = _as_increments(series, kind)
    sc = _check_grid("scales", scales)
    f2 = np.zeros(sc.size)
    count = np.zeros(sc.size)
    for x in xs:
        y = np.cumsum(x - x.mean())
        for k, n in enumerate(sc):
            m = y.size // n
            if m == 0:
                continue
            seg = y[: m * n].reshape(m, n)  # (windows, n)
            t = np.arange(n, dtype=np.float64)
            tc = t - t.mean()
            slope = (seg - seg.mean(1, keepdims=True)) @ tc / (tc @ tc)
            resid = seg - seg.mean(1, keepdims=True) - slope[:, None] * tc
            f2[k] += float((resid**2).mean(1).sum())
            count[k] += m
    with np.errstate(invalid="ignore", divide="ignore"):
        fl = np.sqrt(f2 / count)
    inter, slope = loglog_fit(sc, fl)
    return DFAResult(float(slope[0]), float(inter[0]), tuple(int(s) for s in sc), tuple(map(float, fl)))


# ----------------------------------------------------------------------------------------------------------------
# uncertainty over documents (the independent unit), never over windows or positions


def cluster_weights(clusters: Sequence[Any]) -> tuple[list[Any], np.ndarray]:
    """(ids in first-seen order, (G, D) 0/1 membership matrix) for per-document cluster ids."""
    ids: list[Any] = []
    index: dict[Any, int] = {}
    for c in clusters:
        if c not in index:
            index[c] = len(ids)
            ids.append(c)
    member = np.zeros((len(ids), len(clusters)))
    for d, c in enumerate(clusters):
        member[index[c], d] = 1.0
    return ids, member


def jackknife_pseudovalues(table: FractalTable, stat: str, clusters: Sequence[Any] | None = None, transform=None):
    """Leave-one-cluster-out pseudo-values θ_g = G θ − (G − 1) θ_(−g) of a pooled statistic: ``(ids, values)``.

    Their mean is the jackknife (bias-corrected) estimate and their spread gives its standard error, so the
    per-cluster values can enter lmlab's claim checks and bootstrap CIs as one value per independent unit. With a
    single cluster the only value is θ itself. `transform` maps the statistic first (e.g. ``lambda h: abs(h - .5)``).
    """
    clusters = list(range(table.n_docs)) if clusters is None else list(clusters)
    if len(clusters) != table.n_docs:
        raise ValueError(f"clusters must name one cluster per document ({table.n_docs}), got {len(clusters)}")
    ids, member = cluster_weights(clusters)
    f = transform or (lambda v: v)
    full = f(table.statistic(stat))[0]
    if len(ids) == 1:
        return ids, np.array([full])
    loo = f(table.statistic(stat, 1.0 - member))  # (G,)
    g = len(ids)
    return ids, g * full - (g - 1) * loo


def bootstrap_ci(
    table: FractalTable,
    stat: str,
    clusters: Sequence[Any] | None = None,
    *,
    n_boot: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Pooled statistic and its percentile CI over clusters drawn with replacement (documents by default).

    The notebook bootstraps articles the same way (``np.random.choice(len(x), len(x))``), redrawing windows each
    time; here the windows are fixed, so a resample reweights documents only. Resamples whose fit is undefined are
    left out.
    """
    clusters = list(range(table.n_docs)) if clusters is None else list(clusters)
    ids, member = cluster_weights(clusters)
    point = float(table.statistic(stat)[0])
    if len(ids) < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(ids), np.full(len(ids), 1.0 / len(ids)), size=n_boot)  # (B, G)
    boot = table.statistic(stat, counts @ member)
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return point, point, point
    a = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(boot, [a, 1.0 - a])
    return point, float(lo), float(hi)


# ----------------------------------------------------------------------------------------------------------------
# synthetic series with a known answer


def fractional_gaussian_noise(n: int, hurst: float, size: int = 1, seed: int = 0) -> np.ndarray:
    """Exact fractional Gaussian noise (unit variance) by circulant embedding (Davies & Harte 1987): (size, n).

    Autocovariance γ(k) = ½(|k+1|^2H − 2|k|^2H + |k−1|^2H) is embedded in a circulant of size 2n whose eigenvalues
    λ = FFT(c) are non-negative for every H in (0, 1); Re FFT(√(λ/2n)(a + ib)) with a, b ~ N(0, I) then has
    covariance exactly γ on its first n entries.
    """
    if not 0.0 < hurst < 1.0:
        raise ValueError(f"hurst must be in (0, 1), got {hurst}")
    if n < 2 or size < 1:
        raise ValueError(f"n must be >= 2 and size >= 1, got n={n}, size={size}")
    k = np.arange(n + 1, dtype=np.float64)
    h2 = 2.0 * hurst
    gamma = 0.5 * (np.abs(k + 1) ** h2 - 2.0 * k**h2 + np.abs(k - 1) ** h2)
    c = np.concatenate([gamma, gamma[-2:0:-1]])  # (2n,): γ(0..n), γ(n-1..1)
    lam = np.fft.fft(c).real
    if lam.min() < -1e-9 * lam.max():
        raise ValueError(f"circulant embedding failed for hurst={hurst} (negative eigenvalue {lam.min():.3g})")
    lam = np.clip(lam, 0.0, None)
    rng = np.random.default_rng(seed)
    m = c.size
    z = rng.standard_normal((size, m)) + 1j * rng.standard_normal((size, m))
    return np.fft.fft(np.sqrt(lam / m) * z, axis=1).real[:, :n]


# ----------------------------------------------------------------------------------------------------------------
# detection: human vs LLM from per-document features


def placement_values(scores: Any, labels: Any) -> np.ndarray:
    """Per-document AUROC placement values (DeLong): a positive's share of negatives scored below it (ties ½), a
    negative's share of positives scored above it. Their mean over all documents is exactly the AUROC."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels).astype(bool)
    pos, neg = s[y], s[~y]
    if pos.size == 0 or neg.size == 0:
        raise ValueError(f"AUROC needs both classes, got {int(pos.size)} positives and {int(neg.size)} negatives")
    out = np.empty(s.size)
    out[y] = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean(1)
    out[~y] = ((pos[None, :] > neg[:, None]) + 0.5 * (pos[None, :] == neg[:, None])).mean(1)
    return out


def auroc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve (Mann-Whitney), positives = label 1."""
    y = np.asarray(labels).astype(bool)
    return float(placement_values(scores, labels)[y].mean())


@dataclass(frozen=True)
class DetectionResult:
    """Out-of-fold scores of a grouped, stratified k-fold logistic regression, and their AUROC."""

    auroc: float
    scores: np.ndarray  # (N,) out-of-fold P(LLM)
    placement: np.ndarray  # (N,) placement values (mean = auroc)
    folds: int


def detect(features: Any, labels: Any, groups: Sequence[Any] | None = None, *, folds: int = 5, seed: int = 0):
    """Human (0) vs LLM (1) from per-document features: standardised logistic regression, k-fold out-of-fold scores.

    Folds are stratified by label and grouped by `groups` (documents that share a prompt or a source stay in one
    fold, so a continuation is never scored by a model that saw its human source). `folds` is lowered to what the
    smaller class allows; fewer than 2 groups per class is an error.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedGroupKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels).astype(int)
    if X.ndim == 1:
        X = X[:, None]
    if X.shape[0] != y.size or not np.all(np.isfinite(X)):
        raise ValueError(f"features must be a finite (N, F) array with N = len(labels) = {y.size}, got {X.shape}")
    g = np.arange(y.size) if groups is None else np.asarray(cluster_weights(list(groups))[1].argmax(0))
    per_class = min(len(set(g[y == c])) for c in (0, 1)) if set(y) == {0, 1} else 0
    k = min(folds, per_class)
    if k < 2:
        raise ValueError(f"detection needs >= 2 groups in each class, got {per_class} (labels {sorted(set(y))})")
    scores = np.empty(y.size)
    for train, test in StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed).split(X, y, g):
        if len(set(y[train])) < 2:  # a fold without one class cannot be fitted: score it at the base rate
            scores[test] = float(y[train].mean())
            continue
        clf = make_pipeline(StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=1000))
        clf.fit(X[train], y[train])
        scores[test] = clf.predict_proba(X[test])[:, 1]
    pv = placement_values(scores, y)
    return DetectionResult(float(pv[y == 1].mean()), scores, pv, k)
