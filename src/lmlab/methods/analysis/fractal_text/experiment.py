"""Reproduction: fractal parameters of human text vs SmolLM2 / Gemma generations, and detection, in one run.

1. Human documents (offline ``corpus`` suite): one passage per CPython stdlib module (``kind="prose"``) and, where
   Debian's license texts are installed, passages of /usr/share/common-licenses (round-robin over license files).
   Each is scored by the fixed scorer from a BOS token; the first `drop_first` positions are dropped.
2. Generations: the first `n_generate` stdlib documents give the prompts. ``prefix``: the document's first
   `drop_first` scorer tokens (so human and LLM series start after the same context: the human continuation vs the
   LLM continuation, as in GAGLE). ``instruction``: "Write a detailed technical article about the Python module X."
   in the generator's chat template (plain ``Question:/Answer:`` for a base model). Sampling at each temperature on
   the fast engine (`decode_batch`), EOS allowed. Every generator's text, the scorer's own included, goes through
   one procedure: re-tokenised by the scorer and scored with the same context (the prefix text, or the plain
   request), prompt tokens excluded (`bits_series`). The decoder's own log-probs are never used: they would score
   the scorer's generations in its chat-template context and its sampled (not re-tokenised) tokens, a different
   regime from every other generator's.
3. Per system (a human domain or a generator x prompt style x temperature): documents shorter than the largest
   scale, or constant, are dropped and counted; H and S are pooled over all windows of all documents (`method`),
   with a cluster-bootstrap CI, and recorded as leave-one-cluster-out jackknife pseudo-values (one value per
   independent unit: a stdlib module, a license file, a prompt), which is what the claim checks compare.
4. Detection: per-document [mean bits] vs [mean bits, std bits, H, S] (series cut to the generation length),
   logistic regression, out-of-fold scores from k folds grouped by source document; AUROC as DeLong placement
   values per document (their mean is the AUROC), pooled over all LLM systems and per system.

Claim checks: see `_claims`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmlab.methods.analysis.fractal_text.config import parse_condition
from lmlab.methods.analysis.fractal_text.method import (
    FractalTable,
    bits_series,
    bootstrap_ci,
    cluster_weights,
    detect,
    dfa,
    fractal_table,
    fractional_gaussian_noise,
    jackknife_pseudovalues,
    loglog_fit,
    start_token,
    token_bits,
    usable,
)
from lmlab.results import Claim

INSTRUCTION = "Write a detailed technical article about the Python module {name}."
# per-document feature columns: (mean bits, std bits, H, S); mean bits alone is the paper's first-order baseline
FEATURE_SETS = {"mean_bits_only": [0], "first_order": [0, 1], "fractal_features": [0, 1, 2, 3]}


@dataclass
class Doc:
    """One document of one system: its bits series (scorer tokens, prompt and warm-up excluded)."""

    system: str
    doc_id: str
    cluster: str
    text: str
    bits: np.ndarray
    stop: str = ""
    kept: bool = True
    reason: str = ""
    features: np.ndarray | None = None  # (mean, std, H, S) of the detection cut


@dataclass
class System:
    """A human domain or a generation condition, with what the estimators made of its documents."""

    name: str
    kind: str  # "human" | "llm"
    generator: str = ""
    style: str = ""
    temperature: float | None = None
    docs: list[Doc] = field(default_factory=list)
    table: FractalTable | None = None
    hurst: tuple[float, float, float] | None = None  # point, ci_low, ci_high
    selfsim: tuple[float, float, float] | None = None
    dfa_alpha: float | None = None
    boot_h: np.ndarray | None = None
    boot_s: np.ndarray | None = None

    @property
    def kept(self) -> list[Doc]:
        return [d for d in self.docs if d.kept]


def _reflow(text: str) -> str:
    """Join the hard-wrapped lines of each paragraph (the corpus' prose passages are already reflowed)."""
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    return "\n\n".join(p for p in paras if p)


def _label(spec: str) -> str:
    from lmlab.core.inference.models import canonical_alias

    alias = canonical_alias(spec)
    name = alias.split("-")[0] if alias else Path(spec.split("::")[0]).name
    return re.sub(r"[^a-z0-9]+", "", name.lower())[:12] or "gen"


# ----------------------------------------------------------------------------------------------------------------
# data


def _passages(cfg: Any, ctx: Any, domain: str) -> list[Any]:
    """Candidate corpus passages of a human domain (long enough for `human_tokens` at ~5 characters a token)."""
    min_chars = max(200, 5 * cfg.human_tokens)
    kw = dict(min_chars=min_chars, max_chars=2 * min_chars)
    if domain == "stdlib":
        return ctx.data("corpus", None, split="test", kind="prose", sources=("stdlib",), **kw)
    out: list[Any] = []
    for split in ("test", "dev", "train"):  # ~13 license files in all: every split is needed
        try:
            out.extend(ctx.data("corpus", None, split=split, kind="all", sources=("licenses",), **kw))
        except ValueError:  # absent on this machine (or an empty split under --limit)
            continue
    return out


def _human_docs(cfg: Any, ctx: Any, tok: Any, domain: str) -> tuple[list[Doc], list[list[int]]]:
    """`n_human` documents of `domain` (one per module; license files round-robin) and their scorer token ids."""
    from lmlab.core.inference.scoring import encode

    need = cfg.drop_first + max(max(cfg.scales), max(cfg.taus)) + 1
    by_doc: dict[str, list[Any]] = {}
    for ex in _passages(cfg, ctx, domain):
        by_doc.setdefault(ex.meta["document"], []).append(ex)
    per_round = 1 if domain == "stdlib" else max((len(v) for v in by_doc.values()), default=0)
    docs: list[Doc] = []
    ids_out: list[list[int]] = []
    for r in range(per_round):
        for name, exs in by_doc.items():
            if len(docs) >= cfg.n_human or r >= len(exs):
                continue
            text = _reflow(exs[r].prompt)
            ids = encode(tok, text, add_special_tokens=False)[: cfg.human_tokens]
            if len(ids) < need:
                continue
            docs.append(Doc(f"human_{domain}", exs[r].id, name, text, np.zeros(0)))
            ids_out.append(ids)
    return docs, ids_out


def _generate(
    cfg: Any,
    ctx: Any,
    gen: tuple[str, Any, Any],
    scorer: tuple[Any, Any],
    prompts: list[tuple[Doc, list[int]]],
    style: str,
    temperature: float,
    system: str,
) -> list[Doc]:
    """Sample one document per prompt and score its text with the fixed scorer (one procedure for every generator).

    The scorer sees ``[BOS] + context + text`` re-tokenised (`bits_series`), whichever model generated the text:
    the context is the prefix text (``prefix``) or the plain request (``instruction``), never a generator's chat
    template, so the bits of two generators differ by their text only.
    """
    from lmlab.core.inference.generation import decode_batch
    from lmlab.core.inference.scoring import chat_prompt, encode_prompt
    from lmlab.core.stats.seeding import derive_seed

    label, gm, gtok = gen
    sm, stok = scorer
    start = start_token(stok)
    names = [d.cluster.split(":", 1)[-1] for d, _ in prompts]
    if style == "prefix":
        contexts = [stok.decode(ids[: cfg.drop_first]) for _, ids in prompts]  # the text both models continue
        # a generator with the scorer's tokenizer continues exactly the tokens the scorer conditions on
        same_tokens = gtok is stok
        gen_prompts: list[Any] = [[start] + ids[: cfg.drop_first] for _, ids in prompts] if same_tokens else contexts
    else:
        requests = [INSTRUCTION.format(name=n) for n in names]
        contexts = [f"{r}\n\n" for r in requests]  # what a cross-scorer sees as context: the plain request
        gen_prompts = [encode_prompt(gtok, chat_prompt(gtok, r)) for r in requests]
    outs = decode_batch(gm, gtok, gen_prompts, max_new_tokens=cfg.max_new_tokens, do_sample=True,
                        temperature=temperature, seed=derive_seed(cfg.seed, "generate", system),
                        batch_size=cfg.batch_size, meter=ctx.meter, meter_name=label)  # fmt: skip
    series = bits_series(sm, stok, [o.text for o in outs], prompts=contexts, window=cfg.window,
                         drop_first=cfg.drop_first, batch_size=cfg.score_batch_size)  # fmt: skip
    return [
        Doc(system, f"{system}/{d.cluster}", d.cluster, o.text, s, stop=o.stop_reason)
        for (d, _), o, s in zip(prompts, outs, series)
    ]


# ----------------------------------------------------------------------------------------------------------------
# estimation


def _estimate(cfg: Any, ctx: Any, sys: System) -> None:
    """Drop unusable documents, then pool H and S, bootstrap them over clusters, and record pseudo-values."""
    from lmlab.core.stats.seeding import derive_seed

    ok = usable([d.bits for d in sys.docs], cfg.scales, cfg.taus)
    for d, good in zip(sys.docs, ok):
        if not good:
            d.kept = False
            d.reason = (
                "shorter than the largest scale"
                if d.bits.size <= max(max(cfg.scales), max(cfg.taus))
                else ("constant series")
            )
    docs = sys.kept
    if not docs:
        ctx.note(f"{sys.name}: no usable document (all {len(sys.docs)} shorter than the largest scale or constant).")
        return
    seed = derive_seed(cfg.seed, "windows", sys.name)
    sys.table = t = fractal_table([d.bits for d in docs], scales=cfg.scales, taus=cfg.taus,
                                  samples_per_doc=cfg.samples_per_doc, eps=cfg.eps, seed=seed,
                                  selfsim_offsets=cfg.selfsim_offsets)  # fmt: skip
    clusters = [d.cluster for d in docs]
    boot_seed = derive_seed(cfg.seed, "bootstrap", sys.name)
    sys.hurst = bootstrap_ci(t, "hurst", clusters, n_boot=cfg.n_boot, seed=boot_seed)
    sys.selfsim = bootstrap_ci(t, "selfsim", clusters, n_boot=cfg.n_boot, seed=boot_seed)
    sys.boot_h = _replicates(t, "hurst", clusters, cfg.n_boot, boot_seed)
    sys.boot_s = _replicates(t, "selfsim", clusters, cfg.n_boot, boot_seed)
    sys.dfa_alpha = dfa([d.bits for d in docs], cfg.scales).alpha
    note = "leave-one-cluster-out jackknife pseudo-values of the pooled estimate (one per independent unit)"
    for stat in ("hurst", "selfsim"):
        ids, pv = jackknife_pseudovalues(t, stat, clusters)
        _record(ctx, sys.name, stat, pv, ids, note)
    ids, pv = jackknife_pseudovalues(t, "hurst", clusters, transform=lambda h: np.abs(h - 0.5))
    _record(ctx, sys.name, "hurst_dev", pv, ids, "|H - 0.5|, " + note)
    ctx.record(sys.name, "mean_bits", [float(d.bits.mean()) for d in docs], clusters=clusters, unit="bits",
               note="mean bits per token of each document (the first-order statistic)")  # fmt: skip


def _replicates(t: FractalTable, stat: str, clusters: list[str], n_boot: int, seed: int) -> np.ndarray:
    ids, member = cluster_weights(clusters)
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(len(ids), np.full(len(ids), 1.0 / len(ids)), size=n_boot)
    rep = t.statistic(stat, counts @ member)
    return rep[np.isfinite(rep)]


def _record(ctx: Any, system: str, metric: str, values: np.ndarray, ids: list[Any], note: str) -> None:
    keep = np.isfinite(values)
    if not keep.any():
        ctx.note(f"{system}/{metric}: the fit was undefined on every jackknife subsample; not recorded.")
        return
    ctx.record(system, metric, values[keep].tolist(), clusters=[i for i, k in zip(ids, keep) if k], note=note)


def _distance(cfg: Any, ctx: Any, sys: System, ref: System) -> None:
    """Jackknife pseudo-values of the (H, S) distance of `sys` to the human reference's pooled point."""
    if sys.table is None or ref.hurst is None or ref.selfsim is None:
        return
    h0, s0 = ref.hurst[0], ref.selfsim[0]
    ids, member = cluster_weights([d.cluster for d in sys.kept])
    t = sys.table
    g = len(ids)

    def dist(w: Any) -> np.ndarray:
        return np.hypot(t.hurst(w) - h0, t.selfsim(w) - s0)

    full = dist(None)[0]
    pv = np.array([full]) if g == 1 else g * full - (g - 1) * dist(1.0 - member)
    _record(ctx, sys.name, "human_distance", pv, ids, f"distance in (H, S) to {ref.name}'s pooled point; "
            "jackknife pseudo-values")  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# detection


def _detection(cfg: Any, ctx: Any, human: System, llm: list[System]) -> dict[str, Any]:
    """AUROC of [mean bits] vs [mean bits, std, H, S], pooled over LLM systems and per system."""
    from lmlab.core.stats.seeding import derive_seed

    llm = [s for s in llm if s.kept]
    if not human.kept or not llm:
        return {}
    length = cfg.max_new_tokens  # match the human series to the generation length (features depend on length)
    docs = [(d, 0) for d in human.kept] + [(d, 1) for s in llm for d in s.kept]
    cut = [d.bits[:length] for d, _ in docs]
    ok = usable(cut, cfg.scales, cfg.taus)
    docs = [x for x, k in zip(docs, ok) if k]
    cut = [c for c, k in zip(cut, ok) if k]
    if not docs:
        return {}
    t = fractal_table(cut, scales=cfg.scales, taus=cfg.taus, samples_per_doc=cfg.samples_per_doc, eps=cfg.eps,
                      seed=derive_seed(cfg.seed, "detection"), selfsim_offsets=cfg.selfsim_offsets)  # fmt: skip
    h_doc, s_doc = t.per_document()
    feats = np.column_stack([[c.mean() for c in cut], [c.std() for c in cut], h_doc, s_doc])
    finite = np.all(np.isfinite(feats), 1)
    docs = [x for x, k in zip(docs, finite) if k]
    feats = feats[finite]
    for (d, _), row in zip(docs, feats):
        d.features = row
    labels = np.array([y for _, y in docs])
    groups = [d.cluster for d, _ in docs]
    systems = [d.system for d, _ in docs]
    out: dict[str, Any] = {"n_docs": len(docs), "dropped": int((~finite).sum() + (~np.array(ok)).sum())}
    seed = derive_seed(cfg.seed, "folds")
    note = "DeLong placement values of out-of-fold scores (mean = AUROC), one per document; CI over source clusters"
    subsets = [("", np.ones(len(docs), dtype=bool))] + [
        (s.name, np.array([(y == 0) or (n == s.name) for (_, y), n in zip(docs, systems)])) for s in llm
    ]
    for name, mask in subsets:
        idx = np.flatnonzero(mask)
        metric = "auroc" if not name else f"auroc_{name}"
        cl = [groups[i] for i in idx]
        try:  # the same folds (seed, groups) for every feature set: the AUROCs are paired by document
            res = {fs: detect(feats[idx][:, cols], labels[idx], cl, folds=cfg.folds, seed=seed)
                   for fs, cols in FEATURE_SETS.items()}  # fmt: skip
        except ValueError as e:
            ctx.note(f"detection ({name or 'all LLM systems'}) skipped: {e}")
            continue
        for fs, r in res.items():
            ctx.record(fs, metric, r.placement.tolist(), clusters=cl, note=note)
        row = {fs: round(r.auroc, 4) for fs, r in res.items()}
        row.update(folds=res["fractal_features"].folds, n_human=int((labels[idx] == 0).sum()),
                   n_llm=int((labels[idx] == 1).sum()))  # fmt: skip
        out[name or "all"] = row
    return out


# ----------------------------------------------------------------------------------------------------------------
# the run


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.errors import ModelNotFoundError

    t0 = time.perf_counter()
    scorer_spec = cfg.scorer or cfg.model
    sm, stok = ctx.load_model(scorer_spec)
    start = start_token(stok)

    # 1. human documents, scored once by the fixed scorer
    systems: dict[str, System] = {}
    prompt_docs: list[tuple[Doc, list[int]]] = []
    for domain in cfg.human_domains:
        docs, ids = _human_docs(cfg, ctx, stok, domain)
        if not docs:
            ctx.note(f"human domain {domain!r}: no document of >= {cfg.human_tokens} tokens here; skipped.")
            continue
        bits = token_bits(sm, [[start]] * len(ids), ids, window=cfg.window, batch_size=cfg.score_batch_size)
        for d, b in zip(docs, bits):
            d.bits = b[cfg.drop_first :]
        systems[f"human_{domain}"] = System(f"human_{domain}", "human", docs=docs)
        if domain == "stdlib":
            prompt_docs = list(zip(docs, ids))[: cfg.n_generate]
    ctx.record_value("scorer", "human_scoring_time", time.perf_counter() - t0, unit="s")
    if "human_stdlib" not in systems:
        raise ValueError("no stdlib document is long enough for human_tokens; lower human_tokens")

    # 2. generations: model (A) and generator_b (B), each condition from the same prompts
    gens: list[tuple[str, Any, Any, list]] = [(_label(cfg.model), *ctx.load_model(cfg.model), cfg.conditions)]
    if cfg.generator_b and cfg.b_conditions:
        try:
            label_b = _label(cfg.generator_b)
            gens.append((label_b if label_b != gens[0][0] else f"{label_b}_b", *ctx.load_model(cfg.generator_b),
                         cfg.b_conditions))  # fmt: skip
        except (ModelNotFoundError, ImportError, OSError) as e:
            ctx.note(f"generator_b {cfg.generator_b!r} is not available ({e}); its conditions were skipped.")
    for label, gm, gtok, conds in gens:
        t1 = time.perf_counter()
        for cond in conds:
            style, temp = parse_condition(cond)
            name = f"{label}_{style}_t{temp:g}"
            docs = _generate(cfg, ctx, (label, gm, gtok), (sm, stok), prompt_docs, style, temp, name)
            systems[name] = System(name, "llm", generator=label, style=style, temperature=temp, docs=docs)
        ctx.record_value(label, "generation_time", time.perf_counter() - t1, unit="s",
                         note=f"{len(conds)} conditions x {len(prompt_docs)} prompts, scoring included")  # fmt: skip

    # 3. estimation per system
    for sys in systems.values():
        _estimate(cfg, ctx, sys)
    ref = systems["human_stdlib"]
    for sys in systems.values():
        if sys.kind == "llm":
            _distance(cfg, ctx, sys, ref)

    # 4. detection
    llm = [s for s in systems.values() if s.kind == "llm"]
    det = _detection(cfg, ctx, ref, llm)

    _tables(cfg, ctx, systems, det)
    _samples(ctx, systems)
    _figures(cfg, ctx, systems, det)
    own = [label for label, gm, _, _ in gens if gm is sm]
    ctx.flag("scoring", {"scorer": scorer_spec, "procedure": "re-tokenised, prompt text as context (bits_series)",
                         "generators_scored_by_their_own_model": own})  # fmt: skip
    mirror = (
        f"The scorer is generator {own[0]}'s own model, so that generator's text gets lower bits than another model "
        "would give it; a run with the other scorer (--set scorer=...) is the mirror check. "
        if own
        else ""
    )
    ctx.note(
        f"One fixed scorer ({scorer_spec}) and one procedure for every text: re-tokenised and scored with the prompt "
        f"text as context. {mirror}The stdlib docstrings and license texts are likely in the scorer's training data, "
        "so their bits are low: read the numbers as a relative comparison."
    )
    return ctx.finish(claims=_claims(cfg, ctx, systems, gens[0][0]))


# ----------------------------------------------------------------------------------------------------------------
# reporting


def _tables(cfg: Any, ctx: Any, systems: dict[str, System], det: dict[str, Any]) -> None:
    rows = []
    for s in systems.values():
        kept = s.kept
        stops = [d.stop for d in s.docs if d.stop]
        rows.append({
            "system": s.name, "generator": s.generator or "human", "prompt": s.style or "-",
            "temperature": s.temperature if s.temperature is not None else "-",
            "docs": len(kept), "dropped": len(s.docs) - len(kept),
            "eos_stops": sum(x == "eos" for x in stops),
            "tokens_mean": round(float(np.mean([d.bits.size for d in kept])), 1) if kept else 0,
            "mean_bits": round(float(np.mean([d.bits.mean() for d in kept])), 3) if kept else None,
            "H": _fmt(s.hurst), "S": _fmt(s.selfsim),
            "D=2-S": round(2.0 - s.selfsim[0], 3) if s.selfsim else None,
            "dfa_alpha": round(s.dfa_alpha, 3) if s.dfa_alpha is not None else None,
            "skipped_windows": int(s.table.skipped.sum()) if s.table is not None else 0,
        })  # fmt: skip
    ctx.table("fractal_parameters", rows)

    # the estimator's own reading of series with a known answer, at this run's lengths, scales and document count
    ref = systems["human_stdlib"]
    if ref.table is not None:
        cal = _calibration(cfg, [d.bits.size for d in ref.kept])
        ctx.table("estimator_calibration", cal)
        # (H mean, S mean, S SD) over the draws, per series and offset mode
        ctx.flag("calibration", {f"{r['series']}, {r['selfsim_offsets']}": [r["H_mean"], r["S_mean"], r["S_sd"]]
                                 for r in cal})  # fmt: skip

    # narrow human range vs wide LLM range: spread of the pooled estimates, bootstrap over each system's clusters
    spread = []
    for stat, attr in (("H", "boot_h"), ("S", "boot_s")):
        for kind in ("human", "llm"):
            reps = [getattr(s, attr) for s in systems.values() if s.kind == kind and getattr(s, attr) is not None]
            if len(reps) < 2:
                continue
            m = min(r.size for r in reps)
            stack = np.stack([r[:m] for r in reps])  # (systems, replicates): independent resamples per system
            width = stack.max(0) - stack.min(0)
            points = [getattr(s, "hurst" if stat == "H" else "selfsim")[0] for s in systems.values()
                      if s.kind == kind and getattr(s, attr) is not None]  # fmt: skip
            lo, hi = np.quantile(width, [0.025, 0.975])
            spread.append({"parameter": stat, "group": kind, "systems": len(reps),
                           "range": round(max(points) - min(points), 3), "ci": f"[{lo:.3f}, {hi:.3f}]"})  # fmt: skip
    if spread:
        ctx.table("spread", spread)
    if det:
        ctx.table("detection", [{"subset": k, **v} for k, v in det.items() if isinstance(v, dict)])


def _calibration(cfg: Any, lengths: list[int]) -> list[dict[str, Any]]:
    """H and S of white noise and fGn (H = 0.8) drawn `calibration_draws` times at the human reference's lengths and
    document count: the mean is the estimator's reading at these sizes (compare systems with it, not with 0.5), the
    SD across draws its sampling noise for one collection of this size. S is computed from every offset (this run's
    estimator) and from `samples_per_doc` random offsets (the notebook's), on the same series, so the table shows
    how much of the S noise the random offsets add."""
    from lmlab.core.stats.seeding import derive_seed

    rows = []
    for true_h in (0.5, 0.8):
        draws: dict[str, list[tuple[float, float]]] = {"all": [], "random": []}
        for r in range(cfg.calibration_draws):
            xs = [fractional_gaussian_noise(n, true_h, seed=derive_seed(cfg.seed, "calibration", true_h, r, i))[0]
                  for i, n in enumerate(lengths)]  # fmt: skip
            for mode, out in draws.items():
                t = fractal_table(xs, scales=cfg.scales, taus=cfg.taus, samples_per_doc=cfg.samples_per_doc,
                                  eps=cfg.eps, seed=derive_seed(cfg.seed, "calibration", r),
                                  selfsim_offsets=mode)  # fmt: skip
                out.append((float(t.hurst()[0]), float(t.selfsim()[0])))
        for mode, out in draws.items():
            h, s = np.array(out).T
            rows.append({"series": f"fGn H={true_h}" if true_h != 0.5 else "white noise (H=0.5)",
                         "selfsim_offsets": mode + (" (this run)" if mode == cfg.selfsim_offsets else ""),
                         "docs": len(lengths), "draws": len(out),
                         "H_mean": round(float(h.mean()), 3), "H_sd": round(float(h.std(ddof=1)), 3),
                         "S_mean": round(float(s.mean()), 3), "S_sd": round(float(s.std(ddof=1)), 3)})  # fmt: skip
    return rows


def _fmt(est: tuple[float, float, float] | None) -> str | None:
    return None if est is None else f"{est[0]:.3f} [{est[1]:.3f}, {est[2]:.3f}]"


def _samples(ctx: Any, systems: dict[str, System]) -> None:
    recs = []
    for s in systems.values():
        for d in s.docs:
            rec = {"system": s.name, "doc": d.doc_id, "cluster": d.cluster, "kept": d.kept, "reason": d.reason,
                   "tokens": int(d.bits.size), "stop": d.stop,
                   "mean_bits": round(float(d.bits.mean()), 4) if d.bits.size else None,
                   "text_start": d.text[:200]}  # fmt: skip
            f = d.features
            if f is not None:
                rec.update({"doc_H": round(float(f[2]), 4), "doc_S": round(float(f[3]), 4)})
            recs.append(rec)
    ctx.add_samples(recs)


def _figures(cfg: Any, ctx: Any, systems: dict[str, System], det: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    from lmlab.core.report.plotting import _png, bar_with_ci, title_for

    est = [s for s in systems.values() if s.table is not None]
    if not est:
        return
    colors = plt.get_cmap("viridis")

    def style(i: int, s: System) -> dict[str, Any]:
        if s.kind == "human":
            return {"color": "black" if s.name == "human_stdlib" else "#7f8c8d", "linestyle": "-", "linewidth": 2.2}
        return {"color": colors(i / max(1, len(est) - 1)), "linestyle": "--", "linewidth": 1.3}

    model = str(cfg.scorer or cfg.model)
    for name, xs_attr, fn, ylabel, what in (
        ("rescaled_range_fit", "scales", "rescaled_range", "E[R/S](n)", "rescaled-range fit (slope = H)"),
        ("self_similarity_fit", "taus", "peak_probability", "p_eps(tau)", "peak probability (slope = -S)"),
    ):
        fig, ax = plt.subplots(figsize=(6.2, 4.2))
        for i, s in enumerate(est):
            t = s.table
            x = getattr(t, xs_attr).astype(float)
            y = getattr(t, fn)()[0]
            val = s.hurst[0] if fn == "rescaled_range" else -s.selfsim[0]
            inter, _ = loglog_fit(x, y)
            st = style(i, s)
            ax.scatter(x, y, color=st["color"], s=14)
            ax.plot(x, np.exp(inter[0]) * x**val, label=f"{s.name} ({'H' if fn == 'rescaled_range' else 'S'}="
                    f"{abs(val):.2f})", **st)  # fmt: skip
        if fn == "rescaled_range":
            x = est[0].table.scales.astype(float)
            y0 = est[0].table.rescaled_range()[0][0]
            ax.plot(x, y0 * (x / x[0]) ** 0.5, color="red", linewidth=0.8, linestyle=":", label="slope 0.5")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n (tokens)" if fn == "rescaled_range" else "tau (tokens)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6.5)
        ax.set_title(title_for("fractal_text", model, cfg.seed, None, what), fontsize=8)
        ctx.add_figure(name, _png(fig))

    fig, ax = plt.subplots(figsize=(6.2, 4.4))
    for i, s in enumerate(est):
        st = style(i, s)
        h, sv = s.hurst, s.selfsim
        ax.errorbar([h[0]], [sv[0]], xerr=[[h[0] - h[1]], [h[2] - h[0]]], yerr=[[sv[0] - sv[1]], [sv[2] - sv[0]]],
                    fmt="o" if s.kind == "human" else "s", color=st["color"], capsize=3,
                    markersize=8 if s.kind == "human" else 5)  # fmt: skip
        ax.annotate(s.name, (h[0], sv[0]), textcoords="offset points", xytext=(4, 4), fontsize=6.5)
    ax.axvline(0.5, color="red", linewidth=0.6, linestyle=":")
    ax.set_xlabel("Hurst exponent H (R/S, pooled; 95% cluster-bootstrap CI)")
    ax.set_ylabel("self-similarity exponent S")
    ax.set_title(title_for("fractal_text", model, cfg.seed, None, "(H, S): human (circles) vs LLM"), fontsize=8)
    ctx.add_figure("hs_scatter", _png(fig))

    rows = [m for m in ctx.metrics if m.metric == "auroc" and m.system in FEATURE_SETS]
    if rows:
        ctx.add_figure("detection_auroc", bar_with_ci(
            rows, title=title_for("fractal_text", model, cfg.seed, rows[0].n, "human vs LLM detection (pooled)"),
            ylabel="AUROC (out-of-fold)", highlight=["fractal_features"]))  # fmt: skip
    del det


def _claims(cfg: Any, ctx: Any, systems: dict[str, System], label_a: str) -> list[Claim]:
    """The paper's claims that this run's numbers can decide.

    1. human_stable (gated): the two human domains are equivalent within ±`equivalence_margin` in H and in S
       (two one-sided checks each: the CI of the difference lies above −m and below +m).
    2. temperature_moves (gated): H at the lowest temperature > H at the highest, and |H − 0.5| is smaller at the
       highest (generator A, prefix prompts; else the style with the most temperatures).
    3. instruct_deviates_more (gated, when generator_b ran a condition that A also ran): A's (H, S) lies farther from
       the human stdlib point than B's. Both texts are scored by one model through one procedure (`_generate`).
    4. fractal_helps_detection (gated, twice): pooled AUROC of [mean, std, H, S] > AUROC of [mean bits] (the paper's
       first-order baseline) and > AUROC of [mean, std] (the ablation: what H and S add beyond the std of the bits,
       which the first check alone cannot tell apart); per system the fractal features are not worse than mean
       bits by more than `detect_margin` (reported, not gated).
    """

    def ok(a: str, b: str, metric: str) -> bool:
        try:
            ctx.values(a, metric), ctx.values(b, metric)
        except KeyError:
            return False
        return True

    claims: list[Claim] = []
    m = cfg.equivalence_margin
    for metric, sym in (("hurst", "H"), ("selfsim", "S")):
        if ok("human_stdlib", "human_licenses", metric):
            claims += [
                Claim(metric, "human_stdlib", "human_licenses", ">", min_effect=-m, paired=False,
                      text=f"human_stable: {sym}(stdlib docstrings) - {sym}(licenses) > -{m:g}"),
                Claim(metric, "human_stdlib", "human_licenses", "<", min_effect=-m, paired=False,
                      text=f"human_stable: {sym}(stdlib docstrings) - {sym}(licenses) < +{m:g}"),
            ]  # fmt: skip
    a_sys = [s for s in systems.values() if s.kind == "llm" and s.generator == label_a]
    by_style: dict[str, list[System]] = {}
    for s in a_sys:
        by_style.setdefault(s.style, []).append(s)
    style = "prefix" if len(by_style.get("prefix", [])) >= 2 else max(by_style, key=lambda k: len(by_style[k]),
                                                                       default="")  # fmt: skip
    temps = sorted(by_style.get(style, []), key=lambda s: s.temperature)
    if len(temps) >= 2:
        lo, hi = temps[0], temps[-1]
        if ok(lo.name, hi.name, "hurst"):
            claims += [
                Claim("hurst", lo.name, hi.name, ">", paired=False,
                      text=f"temperature_moves: H(T={lo.temperature:g}) > H(T={hi.temperature:g}) ({style} prompts)"),
                Claim("hurst_dev", hi.name, lo.name, "<", paired=False,
                      text=f"temperature_moves: |H - 0.5| smaller at T={hi.temperature:g} than at "
                           f"T={lo.temperature:g}"),
            ]  # fmt: skip
    b_sys = {(s.style, s.temperature): s for s in systems.values() if s.kind == "llm" and s.generator != label_a}
    for s in a_sys:
        b = b_sys.get((s.style, s.temperature))
        if b is not None and ok(s.name, b.name, "human_distance"):
            claims.append(Claim("human_distance", s.name, b.name, ">", paired=False,
                                text=f"instruct_deviates_more: {s.name} lies farther from human (H, S) than "
                                     f"{b.name}"))  # fmt: skip
            break
    if ok("fractal_features", "mean_bits_only", "auroc"):
        claims.append(Claim("auroc", "fractal_features", "mean_bits_only", ">",
                            text="fractal_helps_detection: AUROC([mean, std, H, S]) > AUROC([mean bits]), "
                                 "all LLM systems pooled"))  # fmt: skip
        claims.append(Claim("auroc", "fractal_features", "first_order", ">",
                            text="fractal_helps_detection: AUROC([mean, std, H, S]) > AUROC([mean, std]), "
                                 "all LLM systems pooled (what H and S add)"))  # fmt: skip
    for s in systems.values():
        metric = f"auroc_{s.name}"
        if s.kind == "llm" and ok("fractal_features", "mean_bits_only", metric):
            claims.append(Claim(metric, "fractal_features", "mean_bits_only", ">", min_effect=-cfg.detect_margin,
                                gate=False, text=f"fractal features do not lower AUROC on {s.name} "
                                                 f"(margin {cfg.detect_margin:g})"))  # fmt: skip
    if not claims:
        ctx.note("No claim could be checked: too few usable documents or systems in this run.")
    return claims
