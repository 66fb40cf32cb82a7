"""Reproduction: exact weight tests vs MATCH on independent tiny pairs, SmolLM2-derived pairs and Gemma.

Paper claim (Zhu et al., ICML 2025): in the constrained setting PERMTEST gives exact p-values (valid whatever the
training data) and the Hungarian-matching tests (CSW, CSH) give far smaller ones cheaply; all detect derived models.
An output-preserving adversarial transform (permute units, rotate the residual stream) defeats them; MATCH (gate vs
up activation matching) is robust to it and to architecture changes, and behaves like a p-value on independent pairs.

A. Calibration (tiny, H0 true by construction). `tiny_pairs` pairs of tiny llamas, each model initialised from its
   own seed and trained on the same data in the same order (so the pair differs in initialisation only). Per pair
   (the independent unit): PERMTEST (φ_L2, φ_cos; T = `n_perm`), CSW, CSH, MATCH (Fisher over blocks). The same
   statistics on two derived copies of each pair's model a: a fine-tuned copy, and a permuted + rotated copy whose
   logits equal a's (checked in float64). KS test of the independent p-values against U(0, 1) and the false-positive
   rate at `alpha`; the fine-tuned copies' relative weight change (gated above `finetune_min_change`). Plus a
   localized-testing check: a trained 4-block tiny model against its structurally pruned, healed copy.
B. Real models. Pairs derived from `model` (SmolLM2-135M): `finetune_steps` full AdamW steps (`finetune`, its
   relative weight change per tested block gated), the permutation + rotation attack (`perm_rot`, logits checked),
   structured pruning (`pruned`: `prune_keep_blocks` blocks by `deep_block_keep`, `prune_keep_units` MLP units by
   activation importance, `prune_heal_steps` healing steps; MATCH only, per kept tested block and localized over
   every block pair), one MLP block re-initialised and distilled (`retrained`); and `independent_model`
   (Gemma-3-270M: other widths and tokenizer, MATCH on word-pooled activations). Per same-architecture pair:
   PERMTEST once, CSW / CSH / MATCH per tested block (`blocks` evenly spaced).

Pair mode (`a`, `b` set): the tests on those two models, with a freshly initialised model of b's architecture as
the null reference (independent of a by construction).

Claim checks (computed from this run's values; see `_tiny_claims` and `_real_claims`): power of PERMTEST on tiny
fine-tuned copies vs independent pairs (paired by pair), the FPR on independent pairs not above alpha + margin,
MATCH vs CSW detection on the permuted + rotated copies (tiny: by pair; SmolLM2: by block), the fine-tunes' weight
change above the floor (tiny: by pair; SmolLM2: by block), MATCH detection on the fine-tuned SmolLM2 vs on
SmolLM2-Gemma (by block), the localized map of the pruned SmolLM2 vs the relative-depth guess (by base block). The
pooled derived-vs-Gemma detection is clustered by derived pair and reported. The logit equality of the attack is a
mechanism check.
"""

from __future__ import annotations

import copy
import io
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lmlab.core.report.plotting import lines, title_for
from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.analysis.model_independence.baselines import csh_from_activations, csw_test, permtest
from lmlab.methods.analysis.model_independence.method import (
    MLPActivations,
    PairedInputs,
    encode_pair,
    localized_from_activations,
    match_from_activations,
    mlp_activations,
)
from lmlab.methods.analysis.model_independence.pvalues import neg_log10
from lmlab.methods.analysis.model_independence.transforms import (
    deep_block_keep,
    evenly_spaced,
    glu_unit_importance,
    keep_layers,
    keep_mlp_units,
    n_blocks,
    permute_model,
    random_permutations,
    relative_blocks,
    relative_weight_change,
    retrain_mlp_block,
    rotate_residual,
)
from lmlab.results import Claim

STATS = ("permtest_l2", "permtest_cos", "csw", "csh", "match")
TRAIN_PASSAGES = 60  # corpus train split: tiny pretraining stream, pruning calibration windows and healing stream
DEV_PASSAGES = 20  # corpus dev split: the fine-tuning stream (disjoint from the activation texts of the test split)
LOGIT_TOL = 1e-5  # relative logit equality (float64 copies) of the permutation + rotation attack
CHECK_TOKENS = 32  # tokens of the float64 logit check


def _texts(passages: Sequence[str], n: int, min_chars: int) -> list[str]:
    """Up to `n` texts of >= `min_chars` characters, each consecutive passages joined (the last may be shorter)."""
    out, cur = [], ""
    for p in passages:
        cur = p if not cur else f"{cur}\n\n{p}"
        if len(cur) >= min_chars:
            out.append(cur)
            cur = ""
            if len(out) == n:
                return out
    if cur:
        out.append(cur)
    return out


def _perm_rot(model: Any, seed: int) -> Any:
    """The adversarial copy: random unit/residual permutation, then a Haar rotation of the residual stream."""
    gen = torch.Generator().manual_seed(seed)
    mlp_perms, emb_perm = random_permutations(model, gen)
    return rotate_residual(permute_model(model, mlp_perms, emb_perm), seed=seed, inplace=True)


@torch.no_grad()
def _logit_gap(model: Any, seed: int, ids: torch.Tensor) -> tuple[float, float]:
    """Relative logit change of the attack, max |Δ logit| / max(1, max |logit|): (float64 copies, float32 models).

    HF's RMSNorm and rotary tables compute in float32 even for float64 inputs, so even the float64 forward carries
    ~1e-7 relative rounding; a model with logits of tens (the tiny test llama) shows ~1e-5 absolute.
    """
    ids = ids.view(1, -1)[:, :CHECK_TOKENS]

    def gap(m: Any) -> float:
        ref = m(input_ids=ids).logits
        return float((ref - _perm_rot(m, seed)(input_ids=ids).logits).abs().max() / ref.abs().max().clamp_min(1.0))

    m64 = copy.deepcopy(model).double()
    gap64 = gap(m64)
    del m64
    return gap64, gap(model)


def _tests(
    a: Any,
    b: Any,
    acts_a: MLPActivations,
    acts_b: MLPActivations,
    blocks: list[int],
    cfg: Any,
    seed: int,
) -> dict[str, Any]:
    """Every constrained and unconstrained test of one same-architecture pair (per-block p-values where per block)."""
    pairs = [(i, i) for i in blocks]
    perm = permtest(a, b, n_perm=cfg.n_perm, seed=seed, blocks=blocks, tensors=cfg.perm_tensors)
    return {
        "permtest_l2": perm.p["l2"],
        "permtest_cos": perm.p["cos"],
        "csw": csw_test(a, b, blocks),
        "csh": csh_from_activations(acts_a, acts_b, pairs),
        "match": match_from_activations(acts_a, acts_b, pairs, cost=cfg.match_cost),
    }


def _record_p(
    ctx: Any, system: str, ps: Sequence[float], cfg: Any, note: str, clusters: Sequence[Any] | None = None
) -> None:
    """p-values of one system, one per value (`clusters`: the independent unit of each), and their 0/1 decisions."""
    ps = [1.0 if math.isnan(p) else float(p) for p in ps]  # NaN (constant input) = no evidence, as skipped by Fisher
    ctx.record(system, "p_value", ps, note=note, clusters=clusters)
    ctx.record(system, "rejects_at_alpha", [float(p <= cfg.alpha) for p in ps], note=f"p <= {cfg.alpha:g}",
               clusters=clusters)  # fmt: skip
    ctx.record(system, "detected", [float(p < cfg.match_threshold) for p in ps], note=f"p < {cfg.match_threshold:g}",
               clusters=clusters)  # fmt: skip
    ctx.record(system, "neg_log10_p", [neg_log10(p) for p in ps], note="-log10 p, p clipped at 1e-300",
               clusters=clusters)  # fmt: skip


def _structured_prune(model: Any, calib: torch.Tensor, keep_blocks: int, keep_units: int) -> tuple[Any, list[int]]:
    """Depth and width pruning: keep `deep_block_keep` blocks, then the `keep_units` most important MLP units of
    each (`glu_unit_importance` on the calibration windows `calib` (n, seq)); returns (pruned copy, kept blocks)."""
    keep = deep_block_keep(n_blocks(model), keep_blocks)
    acts = mlp_activations(model, list(calib), keep)
    units = []
    for b in keep:
        imp = glu_unit_importance(model.model.layers[b].mlp, acts.units(b, "gate"), acts.units(b, "up"))  # (h,)
        if keep_units >= imp.numel():
            raise ValueError(f"prune_keep_units must be below the MLP width {imp.numel()}, got {keep_units}")
        units.append(imp.topk(keep_units).indices)
    return keep_mlp_units(keep_layers(model, keep), units, inplace=True), keep


# ----------------------------------------------------------------------------------------------------------------
# A. tiny calibration pairs


def _tiny_part(cfg: Any, ctx: Any, texts: list[str], train: list[str], dev: list[str]) -> list[Claim]:
    from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_model
    from lmlab.core.training.pretrain import encode_documents, pretrain_lm

    tok = make_byte_tokenizer()
    train_ids, ft_ids = encode_documents(tok, train), encode_documents(tok, dev or train)
    seq = max(2, min(cfg.tiny_seq_len, len(train_ids) - 2, len(ft_ids) - 2))
    enc = encode_pair(texts, tok, tok, max_tokens=cfg.seq_len, columns="tokens")
    blocks = list(range(cfg.tiny_layers))

    def trained(seed: int, n_layers: int = cfg.tiny_layers) -> Any:
        m = make_tiny_model(seed, n_layers=n_layers, hidden=cfg.tiny_hidden, init_std=cfg.tiny_init_std)
        # one fixed data order for every tiny model: a pair differs in its initialisation only (H0 holds exactly)
        pretrain_lm(m, train_ids, steps=cfg.tiny_steps, batch_size=cfg.tiny_batch, seq_len=seq, lr=cfg.tiny_lr,
                    warmup=min(5, cfg.tiny_steps - 1), seed=derive_seed(cfg.seed, "tiny-data"))  # fmt: skip
        return m

    per: dict[str, list[float]] = defaultdict(list)
    gaps64, gaps32, rows, moved, match_alt = [], [], [], [], []
    alt_cost = "sqeuclidean" if cfg.match_cost == "cosine" else "cosine"
    t0 = time.perf_counter()
    first_a = None
    for i in ctx.progress(range(cfg.tiny_pairs), "tiny pairs", total=cfg.tiny_pairs):
        a = trained(derive_seed(cfg.seed, "tiny", i, "a"))
        b = trained(derive_seed(cfg.seed, "tiny", i, "b"))
        first_a = a if first_a is None else first_a
        ft = copy.deepcopy(a)
        pretrain_lm(ft, ft_ids, steps=cfg.tiny_ft_steps, batch_size=cfg.tiny_batch, seq_len=seq, lr=cfg.tiny_lr / 3,
                    warmup=0, seed=derive_seed(cfg.seed, "tiny-ft", i))  # fmt: skip
        moved.append(float(np.mean(relative_weight_change(a, ft, blocks))))
        rot_seed = derive_seed(cfg.seed, "tiny-attack", i)
        pr = _perm_rot(a, rot_seed)
        g64, g32 = _logit_gap(a, rot_seed, enc.ids_a[0])
        gaps64.append(g64)
        gaps32.append(g32)
        acts = {k: mlp_activations(m, enc.ids_a, blocks) for k, m in (("a", a), ("b", b), ("ft", ft), ("pr", pr))}
        # the other LAP cost on the fine-tuned copy: squared Euclidean (the code's) is scale-sensitive, cosine
        # (Algorithm 2) is not, and a fine-tune rescales units before it reorders anything
        alt_ft = match_from_activations(acts["a"], acts["ft"], [(k, k) for k in blocks], cost=alt_cost)
        match_alt.append(alt_ft.aggregate)
        for kind, key, other in (("independent", "b", b), ("finetuned", "ft", ft), ("perm_rot", "pr", pr)):
            res = _tests(a, other, acts["a"], acts[key], blocks, cfg, derive_seed(cfg.seed, "perm", i, kind))
            row = {"pair": i, "kind": kind}
            for s in STATS:
                p = res[s] if isinstance(res[s], float) else res[s].aggregate
                per[f"{s}@tiny_{kind}"].append(p)
                row[s] = p
            rows.append(row)
    ctx.flag("tiny_seconds", round(time.perf_counter() - t0, 1))
    ctx.models["tiny_calibration"] = {
        "spec": f"tiny llama x {2 * cfg.tiny_pairs} (independent seeds, same data order)",
        "layers": cfg.tiny_layers,
        "hidden_size": cfg.tiny_hidden,
        "mlp_units": 2 * cfg.tiny_hidden,
        "train_steps": cfg.tiny_steps,
        "train_tokens_each": cfg.tiny_steps * cfg.tiny_batch * seq,
    }
    n = cfg.tiny_pairs
    for system, ps in per.items():
        _record_p(ctx, system, ps, cfg, "one value per tiny pair (Fisher over blocks for csw/csh/match)")
    _record_p(
        ctx, f"match_{alt_cost}@tiny_finetuned", match_alt, cfg, f"MATCH, {alt_cost} LAP cost, Fisher over blocks"
    )
    ctx.record("tiny_finetuned", "rel_weight_change", moved, note="||W_ft - W||_F / ||W||_F, block mean, per pair")
    ctx.record("min_change@tiny", "rel_weight_change", [cfg.finetune_min_change] * n, note="the gated floor")
    ctx.record("nominal_alpha", "rejects_at_alpha", [cfg.alpha] * n, note="the level a calibrated test rejects at")
    ctx.record("perm_rot@tiny", "logit_rel_diff", gaps64, note="max|Δ logit|/max(1, max|logit|), float64 copies")
    ctx.record("tolerance", "logit_rel_diff", [LOGIT_TOL] * n, note="the equality tolerance")
    ctx.record_value("perm_rot@tiny", "logit_rel_diff_fp32", max(gaps32), note="float32 models (rounding only)")
    from scipy.stats import kstest

    calib = []
    for s in STATS:
        ps = per[f"{s}@tiny_independent"]
        ks = float(kstest(ps, "uniform").pvalue)
        ctx.record_value(f"{s}@tiny_independent", "ks_uniform_p", ks, note=f"KS test vs U(0,1) over {n} pairs")
        calib.append({"statistic": s, "exact": s.startswith("permtest"), "pairs": n, "ks_p": round(ks, 4),
                      "false_positives": int(sum(p <= cfg.alpha for p in ps)), "fpr": round(float(np.mean(
                          [p <= cfg.alpha for p in ps])), 3), "median_p": round(float(np.median(ps)), 3)})  # fmt: skip
    ctx.table("calibration", calib)
    ctx.table("tiny_pairs", rows)
    ctx.add_samples({"part": "tiny", **r} for r in rows)

    # the floor: a model against itself
    floor = permtest(first_a, copy.deepcopy(first_a), n_perm=cfg.n_perm, seed=cfg.seed, tensors=cfg.perm_tensors)
    ctx.record_value("permtest_l2@tiny_identical", "p_value", floor.p["l2"], note=f"floor 1/(T+1) = {floor.floor:g}")
    from lmlab.core.pruning import calibration_windows

    loc_calib = calibration_windows(train_ids, cfg.tiny_batch, seq, seed=derive_seed(cfg.seed, "tiny-localized"))
    loc_a = trained(derive_seed(cfg.seed, "tiny-localized"), n_layers=4)
    loc_b, keep = _structured_prune(loc_a, loc_calib, 3, 3 * 2 * cfg.tiny_hidden // 4)
    pretrain_lm(loc_b, ft_ids, steps=cfg.tiny_ft_steps, batch_size=cfg.tiny_batch, seq_len=seq, lr=cfg.tiny_lr / 10,
                warmup=0, seed=derive_seed(cfg.seed, "tiny-localized-heal"))  # fmt: skip
    _tiny_localized(cfg, ctx, enc, loc_a, loc_b, keep)

    x = [(k + 0.5) / n for k in range(n)]
    series = {s: sorted(per[f"{s}@tiny_independent"]) for s in STATS}
    series["U(0,1)"] = x
    ctx.add_figure(
        "calibration_qq",
        lines(x, series, title=title_for("model_independence", "tiny llamas", cfg.seed, n,
              "independent pairs: sorted p vs uniform quantiles"), xlabel="uniform quantile",
              ylabel="sorted p-value"),
    )  # fmt: skip
    ctx.note(
        f"Tiny calibration: {n} pairs of {cfg.tiny_layers}-block llamas (width {cfg.tiny_hidden}, "
        f"{2 * cfg.tiny_hidden} MLP units), each trained {cfg.tiny_steps} steps from its own initialisation on one "
        "data order. KS p vs U(0,1): "
        + ", ".join(f"{r['statistic']} {r['ks_p']:.3f}" for r in calib)
        + "; false positives at "
        f"alpha={cfg.alpha:g}: " + ", ".join(f"{r['statistic']} {r['false_positives']}/{n}" for r in calib) + ". "
        f"The permuted + rotated copies reproduce the logits to a relative {max(gaps64):.1e} (float64 copies; "
        f"{max(gaps32):.1e} in float32: summation order only). The fine-tuned copies moved their block weights by "
        f"a relative {min(moved):.3f}-{max(moved):.3f}."
    )
    return _tiny_claims(cfg)


def _tiny_localized(cfg: Any, ctx: Any, enc: PairedInputs, a: Any, b: Any, keep: list[int]) -> None:
    """Localized testing on a trained 4-block tiny model `a` vs its structurally pruned and healed copy `b` (blocks
    `keep` = [0, 1, 3], 3/4 of the MLP units): the map {0: 0, 1: 1, 3: 2}."""
    acts_a = mlp_activations(a, enc.ids_a, list(range(4)))
    acts_b = mlp_activations(b, enc.ids_a, list(range(3)))
    loc = localized_from_activations(acts_a, acts_b, list(range(4)), list(range(3)), threshold=cfg.match_threshold,
                                     cost=cfg.match_cost)  # fmt: skip
    truth = {k: j for j, k in enumerate(keep)}
    ctx.record_value("localized@tiny_pruned", "map_correct", float(loc.layer_map == truth),
                     note=f"found {loc.layer_map}, true {truth}")  # fmt: skip
    table = []
    for ii, i in enumerate(loc.blocks_a):
        row: dict[str, Any] = {"block_a": i}
        for j, v in enumerate(loc.p[ii]):
            row[f"p_vs_b{j}"] = None if math.isnan(v) else float(f"{v:.3g}")  # NaN: skipped by the greedy loop
        table.append(row)
    ctx.table("localized_tiny", table)


def _tiny_claims(cfg: Any) -> list[Claim]:
    claims = [
        Claim("rel_weight_change", "tiny_finetuned", "min_change@tiny", ">",
              text=f"A: the tiny fine-tunes moved the block weights by more than {cfg.finetune_min_change:g} "
                   "(relative Frobenius, per pair)"),
        Claim("rejects_at_alpha", "permtest_l2@tiny_finetuned", "permtest_l2@tiny_independent", ">", min_effect=0.5,
              text="A power: PERMTEST-L2 rejects at alpha on fine-tuned copies far more often than on independent "
                   "pairs (paired by pair)"),
        Claim("rejects_at_alpha", "permtest_l2@tiny_independent", "nominal_alpha", "<", min_effect=-cfg.fpr_margin,
              text=f"A calibration: PERMTEST-L2's false-positive rate on independent pairs stays below alpha + "
                   f"{cfg.fpr_margin:g} (exact p-values)"),
        Claim("detected", "match@tiny_perm_rot", "csw@tiny_perm_rot", ">", min_effect=0.5,
              text="A attack: on permuted + rotated copies MATCH detects (p < threshold) where CSW does not"),
        Claim("rejects_at_alpha", "permtest_l2@tiny_finetuned", "permtest_l2@tiny_perm_rot", ">", min_effect=0.5,
              gate=False, text="A attack: the permutation + rotation defeats PERMTEST-L2 (reported)"),
        Claim("rejects_at_alpha", "match@tiny_independent", "nominal_alpha", "<", min_effect=-cfg.fpr_margin,
              gate=False, text="A: MATCH (not exact) behaves like a p-value on independent pairs (reported)"),
        Claim("rejects_at_alpha", "csw@tiny_independent", "nominal_alpha", "<", min_effect=-cfg.fpr_margin,
              gate=False, text="A: CSW's false-positive rate on independent pairs (reported)"),
        Claim("logit_rel_diff", "perm_rot@tiny", "tolerance", "<", mechanism=True,
              text=f"the attack leaves the logits unchanged (float64, relative |diff| < {LOGIT_TOL:g})"),
    ]  # fmt: skip
    return claims


# ----------------------------------------------------------------------------------------------------------------
# B. real models


def _derive(kind: str, cfg: Any, model: Any, tok: Any, acts: MLPActivations, rb: int, train: list[str],
            dev: list[str], ids0: torch.Tensor) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    from lmlab.core.pruning import calibration_windows, token_stream
    from lmlab.core.training.pretrain import pretrain_lm

    seed = derive_seed(cfg.seed, "derive", kind)
    if kind == "finetune":
        from lmlab.core.training.pretrain import encode_documents

        ids = encode_documents(tok, dev or train)
        seq = max(2, min(cfg.finetune_seq_len, len(ids) - 2))
        d = copy.deepcopy(model)
        res = pretrain_lm(d, ids, steps=cfg.finetune_steps, batch_size=cfg.finetune_batch, seq_len=seq,
                          lr=cfg.finetune_lr, warmup=0, seed=seed)  # fmt: skip
        return d, {"steps": cfg.finetune_steps, "tokens": res.tokens, "loss_first": res.losses[0],
                   "loss_last": res.losses[-1]}  # fmt: skip
    if kind == "perm_rot":
        g64, g32 = _logit_gap(model, seed, ids0)
        if g64 > LOGIT_TOL:  # every downstream number about the attack would be meaningless
            raise RuntimeError(
                f"the permutation + rotation changed the logits by {g64:.2e} (relative) > {LOGIT_TOL:g}"
            )
        return _perm_rot(model, seed), {"logit_rel_diff_fp64": g64, "logit_rel_diff_fp32": g32}
    if kind == "pruned":
        stream = token_stream(tok, train)
        seq = max(2, min(cfg.prune_seq_len, len(stream) - 1))
        calib = calibration_windows(stream, cfg.prune_calib, seq, seed=seed)
        if cfg.prune_keep_blocks >= n_blocks(model):
            raise ValueError(f"prune_keep_blocks must be below {n_blocks(model)} for {cfg.model}, got "
                             f"{cfg.prune_keep_blocks}")  # fmt: skip
        d, keep = _structured_prune(model, calib, cfg.prune_keep_blocks, cfg.prune_keep_units)
        info: dict[str, Any] = {
            "method": "depth + width",
            "keep": keep,
            "blocks_kept": len(keep),
            "mlp_units_kept": cfg.prune_keep_units,
            "calib_windows": list(calib.shape),
        }
        if cfg.prune_heal_steps > 0:  # a brief heal: the pruned model is trained on, as released pruned models are
            heal_seq = max(2, min(cfg.finetune_seq_len, len(stream) - 2))
            res = pretrain_lm(d, stream, steps=cfg.prune_heal_steps, batch_size=cfg.finetune_batch, seq_len=heal_seq,
                              lr=cfg.finetune_lr, warmup=0, seed=derive_seed(seed, "heal"))  # fmt: skip
            info.update(heal_steps=cfg.prune_heal_steps, heal_loss_first=res.losses[0], heal_loss_last=res.losses[-1])
        return d, info
    if kind == "retrained":
        d = copy.deepcopy(model)
        x = acts.units(rb, "inputs").T  # (tokens, d) real inputs of the block's MLP
        with torch.no_grad():
            scale = float(model.model.layers[rb].mlp(x).pow(2).mean())
        losses = retrain_mlp_block(d, rb, x, steps=cfg.retrain_steps, batch_size=cfg.retrain_batch,
                                   lr=cfg.retrain_lr, seed=seed)  # fmt: skip
        return d, {"block": rb, "steps": cfg.retrain_steps, "rel_mse_last": losses[-1] / max(scale, 1e-30)}
    raise ValueError(f"unknown derived kind {kind!r}")


def _pruned_tests(cfg: Any, ctx: Any, model: Any, pruned: Any, acts_base: MLPActivations, enc: PairedInputs,
                  blocks: list[int], keep: list[int]) -> dict[str, Any]:  # fmt: skip
    """MATCH on the structurally pruned copy: localized over every block pair (the kept-block map, gated against the
    relative-depth guess) and per tested kept block through the true map (rectangular LAP: fewer units)."""
    n_a, n_b = n_blocks(model), n_blocks(pruned)
    truth = {k: j for j, k in enumerate(keep)}  # block of the base -> its block in the pruned copy
    acts_p = mlp_activations(pruned, enc.ids_a, list(range(n_b)))
    loc = localized_from_activations(acts_base, acts_p, list(range(n_a)), list(range(n_b)),
                                     threshold=cfg.match_threshold, cost=cfg.match_cost)  # fmt: skip
    guess = relative_blocks(list(range(n_a)), n_a, n_b)  # the trivial map: the same relative depth
    ctx.record("localized@pruned", "map_correct", [float(loc.layer_map.get(i) == truth.get(i)) for i in range(n_a)],
               note="per base block: matched to its true pruned block, or (dropped) to none")  # fmt: skip
    ctx.record("relative_depth@pruned", "map_correct", [float(guess[i] == truth.get(i)) for i in range(n_a)],
               note="per base block: the block at the same relative depth (dropped blocks: always wrong)")  # fmt: skip
    ctx.table("localized_pruned", [
        {"block_a": i, "true_b": truth.get(i), "found_b": loc.layer_map.get(i), "relative_depth_b": guess[i],
         "tested_pairs": int(np.sum(~np.isnan(loc.p[i]))),
         "p_true": None if i not in truth or math.isnan(loc.p[i, truth[i]]) else float(f"{loc.p[i, truth[i]]:.3g}")}
        for i in range(n_a)
    ])  # fmt: skip
    ctx.note(
        f"Structured pruning: kept blocks {keep} of {n_a}; localized MATCH recovered "
        f"{sum(loc.layer_map.get(i) == truth.get(i) for i in range(n_a))}/{n_a} base blocks' map "
        f"({int(np.sum(~np.isnan(loc.p)))} block pairs tested)."
    )
    pairs = [(i, truth[i]) for i in blocks if i in truth]
    return {"match": match_from_activations(acts_base, acts_p, pairs, cost=cfg.match_cost)} if pairs else {}


def _real_part(cfg: Any, ctx: Any, texts: list[str], train: list[str], dev: list[str]) -> list[Claim]:
    model, tok = ctx.load_model()
    n_layers = n_blocks(model)
    blocks = evenly_spaced(n_layers, cfg.blocks)
    rb = blocks[len(blocks) // 2] if cfg.retrain_block is None else cfg.retrain_block
    if "retrained" in cfg.derived:
        if rb >= n_layers:
            raise ValueError(f"retrain_block must be in [0, {n_layers - 1}] for {cfg.model}, got {rb}")
        blocks = sorted(set(blocks) | {rb})
    enc = encode_pair(texts, tok, tok, max_tokens=cfg.seq_len, columns="tokens")
    # localized testing of the pruned copy needs every block of the base model; the other pairs the tested ones
    act_blocks = list(range(n_layers)) if "pruned" in cfg.derived else blocks
    acts_base = mlp_activations(model, enc.ids_a, act_blocks, capture_inputs="retrained" in cfg.derived)
    ctx.flag("real_blocks", blocks)
    block_rows, pair_rows = [], []
    values: dict[str, list[float]] = defaultdict(list)
    value_pairs: dict[str, list[str]] = defaultdict(list)  # the derived pair of each pooled value (its cluster)
    for kind in ctx.progress(cfg.derived, "derived pairs"):
        t0 = time.perf_counter()
        derived, info = _derive(kind, cfg, model, tok, acts_base, rb, train, dev, enc.ids_a[0])
        build_s = time.perf_counter() - t0
        if kind == "pruned":  # other depth and widths: only MATCH applies (constrained tests need one architecture)
            res = _pruned_tests(cfg, ctx, model, derived, acts_base, enc, blocks, info["keep"])
        else:
            acts_d = mlp_activations(derived, enc.ids_a, blocks)
            res = _tests(model, derived, acts_base, acts_d, blocks, cfg, derive_seed(cfg.seed, "perm", kind))
        if kind == "retrained" and cfg.generalized_steps > 0:
            from lmlab.methods.analysis.model_independence.method import generalized_match

            x = acts_base.units(rb, "inputs").T  # blocks before rb are unchanged: both models see the same inputs
            p_gen, _ = generalized_match(model.model.layers[rb].mlp, derived.model.layers[rb].mlp, x, x,
                                         steps=cfg.generalized_steps, batch_size=cfg.generalized_batch,
                                         seed=derive_seed(cfg.seed, "generalized"))  # fmt: skip
            ctx.record_value(
                "generalized@retrained", "p_value", p_gen, note=f"block {rb}, {cfg.generalized_steps} steps"
            )
            info["generalized_p"] = p_gen
        if kind == "finetune":  # the gate that the fine-tune really moved the model
            moved = relative_weight_change(model, derived, blocks)
            info["rel_weight_change_min"] = min(moved)
            ctx.record("finetune", "rel_weight_change", moved, note="||W_ft - W||_F / ||W||_F per tested block")
            ctx.record("min_change", "rel_weight_change", [cfg.finetune_min_change] * len(moved), note="gated floor")
        del derived
        for s in ("permtest_l2", "permtest_cos"):
            if s in res:
                floor = 1 / (cfg.n_perm + 1)
                ctx.record_value(f"{s}@{kind}", "p_value", res[s], note=f"T={cfg.n_perm}, floor {floor:g}")
        for s in ("csw", "csh", "match"):
            if s not in res:
                continue
            bt = res[s]
            _record_p(ctx, f"{s}@{kind}", bt.p, cfg, "one value per tested block (the paper's Fisher unit)")
            ctx.record_value(f"{s}@{kind}", "fisher_p", bt.aggregate, note=f"Fisher over {len(bt.p)} blocks")
            if kind != "perm_rot":
                values[f"{s}@derived"] += bt.p
                value_pairs[f"{s}@derived"] += [kind] * len(bt.p)
            for (i, j), p in zip(bt.blocks, bt.p):
                block_rows.append({"pair": kind, "statistic": s, "block": i, "block_b": j, "p": p})
        ctx.record_value(kind, "build_time", build_s, unit="s")
        pair_rows.append({"pair": kind, "permtest_l2": res.get("permtest_l2"), "permtest_cos": res.get("permtest_cos"),
                          **{f"{s}_fisher": res[s].aggregate if s in res else None for s in ("csw", "csh", "match")},
                          **{k: v for k, v in info.items() if not isinstance(v, list)}})  # fmt: skip
        ctx.flag(f"derived_{kind}", info)
    for system, ps in values.items():
        note = "pooled over the non-adversarial derived pairs x tested blocks, clustered by derived pair"
        _record_p(ctx, system, ps, cfg, note, clusters=value_pairs[system])  # blocks of one model share its derivation
    has_indep = False
    if cfg.independent_model:
        has_indep = True
        mb, tb = ctx.load_model(cfg.independent_model)
        enc_b = encode_pair(texts, tok, tb, max_tokens=cfg.seq_len, columns=cfg.columns)
        same_ids = enc_b.columns == "tokens" and all(torch.equal(x, y) for x, y in zip(enc_b.ids_a, enc.ids_a))
        acts_a = (
            acts_base
            if same_ids and len(enc_b.ids_a) == len(enc.ids_a)
            else mlp_activations(model, enc_b.ids_a, blocks)
        )
        blocks_b = relative_blocks(blocks, n_layers, n_blocks(mb))
        acts_b = mlp_activations(mb, enc_b.ids_b, sorted(set(blocks_b)))
        bt = match_from_activations(acts_a, acts_b, list(zip(blocks, blocks_b)), pools_a=enc_b.pools_a,
                                    pools_b=enc_b.pools_b, cost=cfg.match_cost)  # fmt: skip
        _record_p(ctx, "match@independent_real", bt.p, cfg, f"{cfg.model} vs {cfg.independent_model}, per block pair")
        ctx.record_value("match@independent_real", "fisher_p", bt.aggregate, note=f"Fisher over {len(bt.p)} blocks")
        for (i, j), p in zip(bt.blocks, bt.p):
            block_rows.append({"pair": "independent_real", "statistic": "match", "block": i, "block_b": j, "p": p})
        pair_rows.append({"pair": "independent_real", "match_fisher": bt.aggregate, "columns": enc_b.columns,
                          "n_columns": enc_b.n_columns})  # fmt: skip
        ctx.note(
            f"{cfg.model} vs {cfg.independent_model}: different architectures, so only MATCH applies (the LAP is "
            f"rectangular when widths differ; {enc_b.n_columns} shared {enc_b.columns} columns)."
        )
    ctx.table("pairs", pair_rows)
    ctx.table("blocks", block_rows)
    ctx.add_samples({"part": "real", **r} for r in block_rows)
    ctx.add_figure("pvalue_grid", _pvalue_grid(pair_rows, cfg))
    ctx.note(
        "A p-value here certifies dependence of the initialisation, not of the training data: H0 is 'the two models "
        "were initialised independently'. CSW/CSH/MATCH p-values of one model pair are per block; the Fisher "
        "aggregate (and the per-block claims below) treat blocks as independent, as the paper does (approximately "
        "true)."
    )
    return _real_claims(cfg, has_indep)


def _real_claims(cfg: Any, has_indep: bool) -> list[Claim]:
    claims = []
    derived = set(cfg.derived)
    if "perm_rot" in derived:
        claims.append(Claim("detected", "match@perm_rot", "csw@perm_rot", ">", min_effect=0.5,
                            text="B attack: on the permuted + rotated SmolLM2 MATCH detects per block, CSW does not "
                                 "(paired by block)"))  # fmt: skip
        if "finetune" in derived:
            claims.append(Claim("detected", "csw@finetune", "csw@perm_rot", ">", min_effect=0.5, gate=False,
                                text="B: CSW detects the fine-tuned copy, not the attack (reported)"))  # fmt: skip
    if "finetune" in derived:
        claims.append(Claim("rel_weight_change", "finetune", "min_change", ">",
                            text=f"B: the fine-tune moved every tested block's weights by more than "
                                 f"{cfg.finetune_min_change:g} (relative Frobenius, per block)"))  # fmt: skip
        if has_indep:
            claims.append(Claim("detected", "match@finetune", "match@independent_real", ">", min_effect=0.5,
                                paired=False, text="B: MATCH detects the fine-tuned SmolLM2 per block and not SmolLM2 "
                                                   "vs the independent model (per block)"))  # fmt: skip
    if "pruned" in derived:
        claims.append(Claim("map_correct", "localized@pruned", "relative_depth@pruned", ">", min_effect=0.5,
                            text="B localized: block x block MATCH recovers the kept-block map of the structurally "
                                 "pruned SmolLM2 (per base block), far beyond the relative-depth guess"))  # fmt: skip
    if has_indep and derived - {"perm_rot"}:
        claims.append(Claim("detected", "match@derived", "match@independent_real", ">", min_effect=0.5, paired=False,
                            gate=False, text="B: MATCH detects the derived SmolLM2 pairs per block and not "
                                             "SmolLM2 vs the independent model (clustered by derived pair; "
                                             "reported)"))  # fmt: skip
    return claims


def _pvalue_grid(rows: list[dict[str, Any]], cfg: Any) -> bytes:
    """Pairs x statistics heatmap of -log10 p (PERMTEST: its own p; the others: Fisher over blocks), capped at 30."""
    import matplotlib.pyplot as plt

    cols = ["permtest_l2", "permtest_cos", "csw_fisher", "csh_fisher", "match_fisher"]
    grid = np.full((len(rows), len(cols)), np.nan)
    for r, row in enumerate(rows):
        for c, col in enumerate(cols):
            v = row.get(col)
            if v is not None and not math.isnan(v):
                grid[r, c] = min(neg_log10(v), 30.0)
    fig, ax = plt.subplots(figsize=(6.4, 0.5 * len(rows) + 1.8))
    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=30, aspect="auto")
    ax.set_xticks(range(len(cols)), [c.replace("_fisher", "") for c in cols], rotation=20, ha="right")
    ax.set_yticks(range(len(rows)), [r["pair"] for r in rows])
    for r in range(len(rows)):
        for c in range(len(cols)):
            if not math.isnan(grid[r, c]):
                ax.text(c, r, f"{grid[r, c]:.1f}", ha="center", va="center", color="w", fontsize=8)
    fig.colorbar(im, ax=ax, label="-log10 p (capped at 30)")
    ax.set_title(title_for("model_independence", str(cfg.model), cfg.seed, None, "evidence of dependence"), fontsize=9)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# pair mode


def _fresh_like(model: Any, seed: int) -> Any:
    """A freshly initialised model of `model`'s architecture: independent of anything by construction."""
    from transformers import AutoModelForCausalLM

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        fresh = AutoModelForCausalLM.from_config(copy.deepcopy(model.config))
    finally:
        torch.random.set_rng_state(state)
    return fresh.to(dtype=next(model.parameters()).dtype).eval()


def _pair_mode(cfg: Any, ctx: Any, texts: list[str]) -> Any:
    ma, ta = ctx.load_model(cfg.a)
    mb, tb = ctx.load_model(cfg.b)
    enc = encode_pair(texts, ta, tb, max_tokens=cfg.seq_len, columns=cfg.columns)
    la, lb = n_blocks(ma), n_blocks(mb)
    blocks_a = evenly_spaced(la, min(cfg.blocks, la, lb))
    blocks_b = relative_blocks(blocks_a, la, lb)
    acts_a = mlp_activations(ma, enc.ids_a, blocks_a)
    acts_b = mlp_activations(mb, enc.ids_b, sorted(set(blocks_b)))
    pairs = list(zip(blocks_a, blocks_b))
    kw = dict(pools_a=enc.pools_a, pools_b=enc.pools_b)
    match = match_from_activations(acts_a, acts_b, pairs, cost=cfg.match_cost, **kw)
    _record_p(ctx, "match@pair", match.p, cfg, "per tested block pair")
    fresh = _fresh_like(mb, derive_seed(cfg.seed, "fresh-null"))
    acts_f = mlp_activations(fresh, enc.ids_b, sorted(set(blocks_b)))
    null = match_from_activations(acts_a, acts_f, pairs, cost=cfg.match_cost, **kw)
    del fresh
    _record_p(ctx, "match@fresh_init_null", null.p, cfg, "a vs a freshly initialised model of b's architecture")
    row: dict[str, Any] = {"pair": "a_vs_b", "match_fisher": match.aggregate, "columns": enc.columns,
                           "n_columns": enc.n_columns}  # fmt: skip
    try:
        res = _tests(ma, mb, acts_a, acts_b, blocks_a, cfg, derive_seed(cfg.seed, "perm", "pair"))
        row.update(permtest_l2=res["permtest_l2"], permtest_cos=res["permtest_cos"],
                   csw_fisher=res["csw"].aggregate, csh_fisher=res["csh"].aggregate)  # fmt: skip
        for s in ("permtest_l2", "permtest_cos"):
            ctx.record_value(f"{s}@pair", "p_value", res[s], note=f"T={cfg.n_perm}")
        for s in ("csw", "csh"):
            _record_p(ctx, f"{s}@pair", res[s].p, cfg, "per tested block")
    except ValueError as e:  # different architectures: the constrained tests do not apply
        ctx.note(f"Constrained tests (PERMTEST, CSW, CSH) skipped: {e}")
    rows = [row, {"pair": "a_vs_fresh_init", "match_fisher": null.aggregate}]
    ctx.table("pairs", rows)
    ctx.table("blocks", [{"block_a": i, "block_b": j, "match_p": p, "null_p": q}
                         for (i, j), p, q in zip(pairs, match.p, null.p)])  # fmt: skip
    if cfg.localized:
        all_a, all_b = list(range(la)), list(range(lb))
        full_a, full_b = mlp_activations(ma, enc.ids_a, all_a), mlp_activations(mb, enc.ids_b, all_b)
        loc = localized_from_activations(full_a, full_b, all_a, all_b, threshold=cfg.match_threshold,
                                         cost=cfg.match_cost, **kw)  # fmt: skip
        ctx.flag("localized_map", {str(k): v for k, v in loc.layer_map.items()})
        ctx.table("localized", [{"block_a": i, "block_b": loc.layer_map.get(i)} for i in all_a])
    ctx.add_figure("pvalue_grid", _pvalue_grid(rows, cfg))
    verdict = "dependent" if match.aggregate < cfg.match_threshold else "no evidence of dependence"
    ctx.note(
        f"{cfg.a} vs {cfg.b}: MATCH Fisher p = {match.aggregate:.3g} over {len(pairs)} block pairs ({verdict} at "
        f"{cfg.match_threshold:g}); a fresh initialisation of b's architecture gives {null.aggregate:.3g}. The "
        "p-value certifies dependence of the initialisation (H0: independently initialised), not of the training data."
    )
    claims = [Claim("detected", "match@pair", "match@fresh_init_null", ">", min_effect=0.5,
                    text="MATCH detects b as derived from a per block, unlike a fresh initialisation of b's "
                         "architecture (paired by block)")]  # fmt: skip
    return ctx.finish(claims, text=f"{cfg.b} is not independent of {cfg.a} (H0: independent initialisations)")


def run(cfg: Any, ctx: Any) -> Any:
    test = [e.prompt for e in ctx.data("corpus", cfg.n_texts * 4, split="test")]
    texts = _texts(test, cfg.n_texts, min_chars=6 * cfg.seq_len)  # ~4-5 characters per SmolLM2 token
    if cfg.a is not None:
        return _pair_mode(cfg, ctx, texts)
    train = [e.prompt for e in ctx.data("corpus", TRAIN_PASSAGES, split="train")]
    dev = [e.prompt for e in ctx.data("corpus", DEV_PASSAGES, split="dev")]
    claims: list[Claim] = []
    if cfg.tiny_pairs > 0:
        claims += _tiny_part(cfg, ctx, texts, train, dev)
    if cfg.derived or cfg.independent_model:
        claims += _real_part(cfg, ctx, texts, train, dev)
    return ctx.finish(claims)
