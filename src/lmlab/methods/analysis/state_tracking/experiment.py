"""Reproduction: which state-tracking mechanism do tiny trackers learn, and does AA beat PAA?

Paper claim (Li, Guo & Andreas, ICML 2025): LMs trained to compose permutations learn one of two mechanisms, an
associative scan (AA) or a parity-associative scan (PAA); AA models converge faster and generalise to longer
sequences; intermediate tasks steer the choice (a parity task encouraging the parity heuristic, [verify] §6).

Runs. For each group (S3 by default) and seed, one tiny llama per condition (``plain``: state supervision only;
``parity_cur``: parity labels first, then state supervision; optional ``topic``), trained from the same
initialisation on the same state-phase stories (the seed is the independent unit and the cluster of the CIs) until
the validation accuracy at the training length reaches `stop_acc` (at most `steps`). Stories come from the lmlab
``permutations`` suite (validation: dev split; test: test split), converted to the repository's update rule
(`task.apply_action`). The test stories are split in two halves (`split_test`):

* mechanism half: probe, patching and error-parity indices (`method.mechanism_score`), their mean, the label; the
  error parities are read on the frontier of this half's curve less the outcome lengths T+1..2T;
* outcome half: accuracy at prefix length T (a run is *learned*, and enters the comparison, at >= `learned_min`)
  and `long_acc` = mean accuracy over lengths train_len + 1 .. 2 train_len;
* convergence (validation stories): state-phase steps until the validation accuracy (mean over prefix lengths
  1..train_len) reaches `acc_threshold`.

Claim checks (from this run's numbers). Gating, when both labels occur among learned runs: AA runs need fewer
steps to the threshold and reach higher `long_acc` than PAA runs (unpaired, clustered by seed: decisive with >= 6
seeds on each side). Reported: the parity curriculum raises the mechanism score (paired by seed); runs of both
mechanisms occur. Mechanism check: patching every embedding position from the counterfactual reproduces its answer
(1 by construction).
"""

from __future__ import annotations

import io
import math
import time
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.analysis.state_tracking.diagnostics import patch_grid, probe_grid, residual_stream
from lmlab.methods.analysis.state_tracking.method import (
    early_layers,
    frontier,
    generalisation_curve,
    make_tracker,
    mechanism_score,
    steps_to_threshold,
    train_tracker,
)
from lmlab.methods.analysis.state_tracking.task import (
    PermGroup,
    Stories,
    TrackerVocab,
    check_model,
    group_of,
    perm_group,
    stories_from_examples,
)
from lmlab.results import Claim


def _stories(ctx: Any, group: PermGroup, n: int, split: str, length: int) -> Stories:
    examples = ctx.data("permutations", n, split=split, n_elements=group.n, length=length)
    return stories_from_examples(examples, group)


def split_test(test: Stories) -> tuple[Stories, Stories]:
    """(mechanism stories, outcome stories): the first half of the test stories is read for the mechanism (probes,
    patching, error parities), the second half for the outcomes compared across mechanisms (accuracy at T,
    ``long_acc``), so that the label and the outcome it is compared with share no story. A single story (``--set
    limit=1``) serves both, which `diagnose` flags as ``disjoint: False``."""
    if len(test) < 2:
        return test, test
    k = len(test) // 2
    return test.subset(slice(0, k)), test.subset(slice(k, len(test)))


def outcome_lengths(train_len: int, eval_len: int) -> list[int]:
    """Prefix lengths T+1 .. 2T (within `eval_len`): where ``long_acc``, the generalisation outcome, is read."""
    return list(range(train_len + 1, min(2 * train_len, eval_len) + 1))


def diagnose(model: Any, test: Stories, train_len: int, cfg: Any, seed: int, vocab: TrackerVocab) -> dict[str, Any]:
    """Generalisation curves, probe grids, patching grids and the mechanism of one tracker.

    The test stories are split (`split_test`): the mechanism is read on the first half, the outcomes (accuracy at
    T, ``long_acc`` over `outcome_lengths`) on the second, and the error-parity index skips the outcome lengths, so
    the mechanism and the outcome share neither stories nor lengths.
    """
    mech_stories, out_stories = split_test(test)
    long = outcome_lengths(train_len, test.length)
    curve = generalisation_curve(model, out_stories, vocab)  # the outcome curve
    mech_curve = generalisation_curve(model, mech_stories, vocab)
    probe_stories = mech_stories.prefix(train_len)
    acts = residual_stream(model, probe_stories, vocab)
    kw = dict(acts=acts, vocab=vocab, max_iter=cfg.probe_max_iter, C=cfg.probe_c)
    state, par = probe_grid(model, probe_stories, "state", **kw), probe_grid(model, probe_stories, "parity", **kw)
    base = probe_stories.subset(slice(0, min(cfg.n_patch, len(probe_stories))))
    pseed = derive_seed(seed, "counterfactual")
    same = patch_grid(model, base, "same_parity", seed=pseed, vocab=vocab)
    diff = patch_grid(model, base, "diff_parity", seed=pseed, vocab=vocab)
    n_layers = model.config.num_hidden_layers
    mech = mechanism_score(state, par, same, diff, mech_curve, n_layers=n_layers, threshold=cfg.paa_threshold,
                           margin=cfg.frontier_margin, gen_exclude=long)  # fmt: skip
    gen_lengths = [t for t in frontier(mech_curve, cfg.frontier_margin) if t not in set(long)]
    return {"curve": curve, "mech_curve": mech_curve, "state": state, "parity": par, "same": same, "diff": diff,
            "mech": mech, "long_acc": float(curve.acc[[t - 1 for t in long]].mean()) if long else float("nan"),
            "acc_at_T": float(curve.acc[train_len - 1]), "gen_lengths": gen_lengths, "n_layers": n_layers,
            "n_mech_stories": len(mech_stories), "n_outcome_stories": len(out_stories),
            "disjoint": len(test) >= 2}  # fmt: skip


def is_learned(diag: dict[str, Any], cfg: Any) -> bool:
    """A run enters the AA/PAA comparison when it learned the task (accuracy at prefix length T on the outcome
    stories >= `learned_min`, 0.9 by default) and its mechanism was read (not ``abstain``). An underfit tracker
    that has learned the cheap parity sum but not the state makes parity-keeping errors and would look PAA."""
    return diag["acc_at_T"] >= cfg.learned_min and diag["mech"].label != "abstain"


def _train_runs(cfg: Any, ctx: Any) -> list[dict[str, Any]]:
    runs = []
    for gname in cfg.groups:
        group = group_of(gname)
        train_len, steps, pre_steps, eval_len = cfg.group_settings(gname)
        val = _stories(ctx, group, cfg.n_val, "dev", train_len)
        test = _stories(ctx, group, cfg.n_eval, "test", eval_len)
        ctx.models[f"tracker_{gname}"] = {
            "spec": f"tiny llama from scratch x {cfg.seeds * len(cfg.conditions)} ({gname}, one token a permutation)",
            "layers": cfg.n_layers,
            "hidden_size": cfg.hidden,
            "vocab_size": TrackerVocab.default(group.n).vocab_size,
            "state_steps_max": steps,
            "pre_steps": pre_steps,
            "train_len": train_len,
        }
        jobs = [(k, c) for k in range(cfg.seeds) for c in cfg.conditions]
        for k, cond in ctx.progress(jobs, f"{gname} trackers", total=len(jobs)):
            seed = derive_seed(cfg.seed, "tracker", gname, k)  # init + state-phase data: shared by the conditions
            model = make_tracker(group.n, n_layers=cfg.n_layers, hidden=cfg.hidden, seed=seed, init_std=cfg.init_std)
            vocab = TrackerVocab.of(model)
            hist = train_tracker(
                model, group, condition=cond, steps=steps, pre_steps=pre_steps, batch_size=cfg.train_batch,
                length=train_len, lr=cfg.lr, warmup_frac=cfg.warmup_frac, weight_decay=cfg.weight_decay,
                grad_clip=cfg.grad_clip, seed=derive_seed(seed, "data"), val=val, eval_every=cfg.eval_every,
                threshold=cfg.acc_threshold, stop_at=cfg.stop_acc, vocab=vocab,
            )  # fmt: skip
            t0 = time.perf_counter()
            diag = diagnose(model, test, train_len, cfg, seed, vocab)
            sts, censored = steps_to_threshold(hist, steps)
            runs.append({"group": gname, "condition": cond, "seed_index": k, "cluster": f"{gname}/seed{k}",
                         "hist": hist, "steps_to_threshold": sts, "censored": censored, "train_len": train_len,
                         "eval_len": eval_len, "learned": is_learned(diag, cfg),
                         "train_s": hist.seconds, "diag_s": time.perf_counter() - t0, **diag})  # fmt: skip
            del model
    return runs


# ----------------------------------------------------------------------------------------------------------------
# recording


def _num(x: float, digits: int = 3) -> float | None:
    """Rounded, or None for NaN (an abstaining index): the table and samples stay valid JSON."""
    return None if x is None or math.isnan(x) else round(float(x), digits)


def _row(r: dict[str, Any]) -> dict[str, Any]:
    m, h = r["mech"], r["hist"]
    return {"group": r["group"], "condition": r["condition"], "seed": r["seed_index"], "learned": r["learned"],
            "mechanism": m.label if r["learned"] else "unlearned", "score": _num(m.score),
            "probe_index": _num(m.probe_index), "patch_index": _num(m.patch_index), "gen_index": _num(m.gen_index),
            "steps_to_threshold": r["steps_to_threshold"], "censored": r["censored"],
            "state_steps": dict(h.phases).get("state"), "stopped_at": h.stopped_at,
            "val_acc": _num(h.eval_acc[-1]) if h.eval_acc else None,
            "val_acc_at_T": _num(h.eval_acc_at_len[-1]) if h.eval_acc_at_len else None,
            "acc_at_T": _num(r["acc_at_T"]), "long_acc": _num(r["long_acc"]), "gen_lengths": r["gen_lengths"],
            "patch_pairs_same": r["same"].n_valid, "patch_pairs_diff": r["diff"].n_valid,
            "train_s": round(r["train_s"], 1)}  # fmt: skip


def _record(ctx: Any, cfg: Any, runs: list[dict[str, Any]]) -> list[Claim]:
    for gname in cfg.groups:
        for cond in cfg.conditions:
            sel = [r for r in runs if r["group"] == gname and r["condition"] == cond]
            sys_ = f"{gname}/{cond}"
            for metric, key in (("steps_to_threshold", "steps_to_threshold"), ("acc_at_train_len", "acc_at_T"),
                                ("long_acc", "long_acc"), ("learned", "learned")):  # fmt: skip
                ctx.record(sys_, metric, [float(r[key]) for r in sel], note="one value per seed")
            for metric in ("score", "probe_index", "patch_index", "gen_index"):
                vals = [getattr(r["mech"], metric) for r in sel]
                vals = [v for v in vals if not math.isnan(v)]  # an abstaining index (no evidence) is left out
                if vals:
                    ctx.record(sys_, f"mechanism_{metric}", vals,
                               note="one value per seed where the index is defined")  # fmt: skip
            ctx.record(sys_, "train_time", [r["train_s"] for r in sel], unit="s")
    cl_all = [r["cluster"] for r in runs]
    ctx.record("trackers", "acc_at_train_len", [r["acc_at_T"] for r in runs], clusters=cl_all,
               note="accuracy of the state after train_len actions (test split); one value per run")  # fmt: skip
    ctx.record("chance", "acc_at_train_len", [1.0 / group_of(r["group"]).size for r in runs], clusters=cl_all,
               note="1/G: a uniform guess (the majority-class baseline of a uniform state)")  # fmt: skip
    claims: list[Claim] = [
        Claim("acc_at_train_len", "trackers", "chance", ">", min_effect=0.1, gate=False,
              text="the trackers learn the task: state accuracy at the training length above chance (reported)")
    ]  # fmt: skip
    learned = [r for r in runs if r["learned"]]
    aa = [r for r in learned if r["mech"].label == "AA"]
    paa = [r for r in learned if r["mech"].label == "PAA"]
    ctx.flag("runs", len(runs))
    ctx.flag("learned_runs", len(learned))
    ctx.flag("aa_runs", len(aa))
    ctx.flag("paa_runs", len(paa))
    # the unpaired checks count seeds (clusters): each side needs min_n (6) of them to be decisive
    ctx.flag("aa_seeds", len({r["cluster"] for r in aa}))
    ctx.flag("paa_seeds", len({r["cluster"] for r in paa}))
    ctx.flag("abstained_runs", sum(r["mech"].label == "abstain" for r in runs))
    note = "one value per run, clustered by seed (the conditions of one seed share init and data)"
    if aa and paa:
        for name, sel in (("aa_runs", aa), ("paa_runs", paa)):
            cl = [r["cluster"] for r in sel]
            ctx.record(name, "steps_to_threshold", [float(r["steps_to_threshold"]) for r in sel], clusters=cl,
                       note=note + "; censored at the budget when never reached")  # fmt: skip
            ctx.record(name, "long_acc", [r["long_acc"] for r in sel], clusters=cl, note=note)
        claims += [
            Claim("steps_to_threshold", "aa_runs", "paa_runs", "<", paired=False,
                  text="AA runs converge faster: fewer state-phase steps to the validation accuracy threshold than "
                       "PAA runs (unpaired, clustered by seed)"),
            Claim("long_acc", "aa_runs", "paa_runs", ">", paired=False,
                  text="AA runs generalise further: higher accuracy at train_len+1 .. 2 train_len actions than PAA "
                       "runs (unpaired, clustered by seed)"),
        ]  # fmt: skip
    else:
        only = "AA" if aa else "PAA" if paa else None
        ctx.note(
            f"No AA-vs-PAA comparison: of {len(runs)} runs, {len(learned)} learned the task"
            + (f" and all of them were classified {only}" if only else "")
            + "; the claim needs learned runs of both mechanisms (more seeds, more steps or another condition)."
        )
    if learned:
        cl = [r["cluster"] for r in learned]
        ctx.record(
            "learned_runs", "is_paa", [float(r["mech"].label == "PAA") for r in learned], clusters=cl, note=note
        )
        ctx.record("learned_runs", "is_aa", [float(r["mech"].label == "AA") for r in learned], clusters=cl, note=note)
        ctx.record("none", "is_paa", [0.0] * len(learned), clusters=cl, note="no run of that mechanism")
        ctx.record("none", "is_aa", [0.0] * len(learned), clusters=cl, note="no run of that mechanism")
        claims += [
            Claim("is_paa", "learned_runs", "none", ">", gate=False,
                  text="both mechanisms occur: some learned runs are PAA (reported)"),
            Claim("is_aa", "learned_runs", "none", ">", gate=False,
                  text="both mechanisms occur: some learned runs are AA (reported)"),
        ]  # fmt: skip
        if len(learned) >= 3:
            from lmlab.core.stats.uncertainty import spearman

            for metric, key in (("steps_to_threshold", "steps_to_threshold"), ("long_acc", "long_acc")):
                rho, p = spearman([r["mech"].score for r in learned], [float(r[key]) for r in learned])  # scores
                # of learned runs are defined (an abstaining run is not learned)
                rho_note = f"Spearman rho over {len(learned)} runs (p={p:.3g}); NaN shown as 0"
                ctx.record_value("learned_runs", f"spearman_score_vs_{metric}", 0.0 if math.isnan(rho) else rho,
                                 note=rho_note)  # fmt: skip
    if "plain" in cfg.conditions and "parity_cur" in cfg.conditions:
        # pairs of one seed where both runs track something (accuracy at T > chance + 0.1): a slower curriculum
        # run still shows its mechanism; runs at chance (S5 here) have no mechanism to compare
        def tracking(r: dict[str, Any]) -> bool:
            return r["acc_at_T"] > 1.0 / group_of(r["group"]).size + 0.1 and not math.isnan(r["mech"].score)

        pairs = []
        for r in runs:
            if r["condition"] == "plain" and tracking(r):
                mate = [q for q in runs if q["cluster"] == r["cluster"] and q["condition"] == "parity_cur"]
                if mate and tracking(mate[0]):
                    pairs.append((r, mate[0]))
        if pairs:
            cl = [a["cluster"] for a, _ in pairs]
            ctx.record("parity_cur", "mechanism_score", [b["mech"].score for _, b in pairs], clusters=cl,
                       note="seeds where both conditions track above chance + 0.1 and have a score")  # fmt: skip
            ctx.record("plain", "mechanism_score", [a["mech"].score for a, _ in pairs], clusters=cl,
                       note="seeds where both conditions track above chance + 0.1 and have a score")  # fmt: skip
            claims.append(Claim("mechanism_score", "parity_cur", "plain", ">", gate=False,
                                text="the parity curriculum shifts runs toward PAA: higher mechanism score than "
                                     "plain training from the same seed (paired; direction [verify], reported)"),
                          )  # fmt: skip
    full = [float(np.nanmean(r["diff"].full)) for r in runs if r["diff"].n_valid]
    if full:
        ctx.record("full_patch", "normalised_ld", full, note="every embedding position patched: the counterfactual")
        ctx.record("no_patch", "normalised_ld", [0.0] * len(full), note="the base run")
        claims.append(Claim("normalised_ld", "full_patch", "no_patch", ">", min_effect=0.5, mechanism=True,
                            text="patching the whole input from the counterfactual reproduces its answer (metric 1 "
                                 "by construction)"))  # fmt: skip
    return claims


# ----------------------------------------------------------------------------------------------------------------
# figures


def _png(fig: Any) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _colour(r: dict[str, Any]) -> str:
    if not r["learned"]:
        return "#bdc3c7"
    return "#2471a3" if r["mech"].label == "AA" else "#c0392b"


def _fig_generalisation(runs: list[dict[str, Any]], gname: str, seed: int, threshold: float) -> bytes:
    import matplotlib.pyplot as plt

    sel = [r for r in runs if r["group"] == gname]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in sel:
        x = np.arange(1, len(r["curve"].acc) + 1)
        style = "-" if r["condition"] == "plain" else "--" if r["condition"] == "parity_cur" else ":"
        lab = f"s{r['seed_index']} {r['condition']} ({r['mech'].label if r['learned'] else 'unlearned'})"
        axes[0].plot(x, r["curve"].acc, style, color=_colour(r), label=lab, lw=1.2)
        h = r["hist"]
        axes[1].plot(h.eval_steps, h.eval_acc, style, color=_colour(r), lw=1.2)
    t = sel[0]["train_len"] if sel else 0
    g = group_of(gname).size
    axes[0].axvline(t, color="k", lw=0.6)
    axes[0].axhline(1.0 / g, color="k", lw=0.6, ls=":")
    axes[0].set_xlabel("prefix length (actions)")
    axes[0].set_ylabel("state accuracy")
    axes[0].set_title(f"state_tracking {gname}: generalisation (train length {t}; blue AA, red PAA) | seed {seed}",
                      fontsize=8)  # fmt: skip
    axes[0].legend(fontsize=6, ncol=2)
    axes[1].axhline(threshold, color="k", lw=0.6, ls=":")
    axes[1].set_xlabel("state-phase step")
    axes[1].set_ylabel("validation accuracy (lengths 1..T)")
    axes[1].set_title("convergence", fontsize=8)
    return _png(fig)


def _fig_grids(r: dict[str, Any], title: str) -> bytes:
    """Probe grids (state, parity, above chance) and patching grids (same / diff parity) of one run."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(14, 3.2))
    st, pa = r["state"].above_chance(), r["parity"].above_chance()
    ylabels = ["emb"] + [f"L{i}" for i in range(r["n_layers"])]
    for ax, arr, name in ((axes[0], st, "state probe"), (axes[1], pa, "parity probe")):
        im = ax.imshow(arr, aspect="auto", cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(r["state"].lengths)), r["state"].lengths)
        ax.set_yticks(range(len(ylabels)), ylabels)
        ax.set_xlabel("prefix length")
        ax.set_title(f"{name} (above chance)", fontsize=8)
    fig.colorbar(im, ax=axes[1])
    for ax, grid, name in ((axes[2], r["same"], "same-parity"), (axes[3], r["diff"], "diff-parity")):
        im = ax.imshow(grid.effect, aspect="auto", cmap="magma", vmin=0, vmax=1)
        ax.set_yticks(range(len(ylabels)), ylabels)
        ax.set_xlabel("patched position (0 = BOS)")
        ax.set_title(f"{name} patching, n={grid.n_valid}", fontsize=8)
    fig.colorbar(im, ax=axes[3])
    fig.suptitle(title, fontsize=9)
    return _png(fig)


def _fig_scatter(runs: list[dict[str, Any]], cfg: Any) -> bytes:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for r in runs:
        marker = {"plain": "o", "parity_cur": "s", "topic": "^"}[r["condition"]]
        for ax, y in ((axes[0], r["steps_to_threshold"]), (axes[1], r["long_acc"])):
            ax.scatter([r["mech"].score], [y], color=_colour(r), marker=marker, s=36,
                       facecolors="none" if r["censored"] and ax is axes[0] else _colour(r))  # fmt: skip
    for ax in axes:
        ax.axvline(cfg.paa_threshold, color="k", lw=0.6, ls=":")
        ax.set_xlabel("mechanism score (0 ~ AA, 1 ~ PAA)")
    axes[0].set_ylabel("steps to threshold (hollow: censored)")
    axes[1].set_ylabel("accuracy at T+1..2T")
    axes[0].set_title("state_tracking: convergence vs mechanism (o plain, s parity_cur)", fontsize=8)
    axes[1].set_title("generalisation vs mechanism", fontsize=8)
    return _png(fig)


def _figures(ctx: Any, cfg: Any, runs: list[dict[str, Any]]) -> None:
    for gname in cfg.groups:
        ctx.add_figure(f"generalisation_{gname}", _fig_generalisation(runs, gname, cfg.seed, cfg.acc_threshold))
    scored = [r for r in runs if not math.isnan(r["mech"].score)]
    learned = [r for r in scored if r["learned"]] or scored
    if not learned:  # every run abstained: no extreme to show
        ctx.add_figure("mechanism_scatter", _fig_scatter(runs, cfg))
        return
    lo, hi = min(learned, key=lambda r: r["mech"].score), max(learned, key=lambda r: r["mech"].score)
    for tag, r in (("most_aa", lo), ("most_paa", hi)):
        ctx.add_figure(f"grids_{tag}", _fig_grids(r, f"state_tracking: {tag.replace('_', ' ')} run ({r['group']} "
                       f"{r['condition']} seed {r['seed_index']}, score {r['mech'].score:.2f})"))  # fmt: skip
    ctx.add_figure("mechanism_scatter", _fig_scatter(runs, cfg))


# ----------------------------------------------------------------------------------------------------------------
# analysis of a saved tracker


def _analyse(cfg: Any, ctx: Any) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cfg.tracker, attn_implementation="eager").eval()
    vocab = TrackerVocab.of(model)
    check_model(model, vocab)
    group = perm_group(vocab.n)
    gname = f"S{vocab.n}"
    train_len, _, _, eval_len = cfg.group_settings(gname if gname in ("S3", "S5") else "S3")
    test = _stories(ctx, group, cfg.n_eval, "test", eval_len)
    ctx.models["tracker"] = {"spec": cfg.tracker, "layers": model.config.num_hidden_layers,
                             "hidden_size": model.config.hidden_size, "vocab_size": vocab.vocab_size}  # fmt: skip
    diag = diagnose(model, test, train_len, cfg, cfg.seed, vocab)
    r = {"group": gname, "condition": "given", "seed_index": 0, "cluster": "given", "learned": is_learned(diag, cfg),
         **diag}  # fmt: skip
    m = diag["mech"]
    ctx.record_value("tracker", "mechanism_score", m.score, note=f"label {m.label}")
    for metric in ("probe_index", "patch_index", "gen_index"):
        ctx.record_value("tracker", metric, getattr(m, metric))
    ctx.record_value("tracker", "acc_at_train_len", diag["acc_at_T"])
    curve = diag["curve"]
    ctx.table("curve", [{"length": t + 1, "acc": float(a), "parity_acc": float(p)}
                        for t, (a, p) in enumerate(zip(curve.acc, curve.parity_acc))])  # fmt: skip
    ctx.record_value("tracker", "long_acc", diag["long_acc"])
    ctx.flag("mechanism", m.label if r["learned"] else "unlearned")
    ctx.add_figure("grids", _fig_grids(r, f"state_tracking: {cfg.tracker} (score {m.score:.2f}, {m.label})"))
    claims = []
    full = r["diff"].full[~np.isnan(r["diff"].full)]
    if full.size:
        ctx.record("full_patch", "normalised_ld", full.tolist(), note="every embedding position patched")
        ctx.record("no_patch", "normalised_ld", [0.0] * full.size, note="the base run")
        claims.append(Claim("normalised_ld", "full_patch", "no_patch", ">", min_effect=0.5, mechanism=True,
                            text="patching the whole input from the counterfactual reproduces its answer"),
                      )  # fmt: skip
    ctx.note(f"{cfg.tracker}: mechanism score {m.score:.2f} (probe {m.probe_index:.2f}, patch {m.patch_index:.2f}, "
             f"gen {m.gen_index:.2f}) -> {m.label if r['learned'] else 'unlearned'}.")  # fmt: skip
    return ctx.finish(claims, text=f"mechanism of {cfg.tracker}: {m.label}")


def run(cfg: Any, ctx: Any) -> Any:
    if cfg.tracker is not None:
        return _analyse(cfg, ctx)
    torch_threads = torch.get_num_threads()
    runs = _train_runs(cfg, ctx)
    claims = _record(ctx, cfg, runs)
    rows = [_row(r) for r in runs]
    ctx.table("runs", rows)
    ctx.add_samples(rows)
    _figures(ctx, cfg, runs)
    ctx.flag("torch_threads", torch_threads)
    ctx.flag("mechanism_outcome_disjoint", all(r["disjoint"] for r in runs))  # False only with fewer than 2 stories
    ctx.flag("early_layers", [x - 1 for x in early_layers(cfg.n_layers)])
    learned = [r for r in runs if r["learned"]]
    by = {lab: [r for r in learned if r["mech"].label == lab] for lab in ("AA", "PAA")}
    parts = []
    for lab, sel in by.items():
        if sel:
            steps = np.mean([r["steps_to_threshold"] for r in sel])
            long = np.mean([r["long_acc"] for r in sel])
            parts.append(
                f"{lab}: {len(sel)} runs, steps to {cfg.acc_threshold:g} {steps:.0f}, accuracy at T+1..2T {long:.2f}"
            )
    unlearned = sorted({r["group"] for r in runs if not r["learned"]})
    seeds_by = {lab: len({r["cluster"] for r in sel}) for lab, sel in by.items()}
    stopped = sum(r["hist"].stopped_at is not None for r in runs)
    ctx.note(
        f"{len(runs)} runs ({', '.join(cfg.groups)} x {', '.join(cfg.conditions)} x {cfg.seeds} seeds), "
        f"{stopped} reached validation accuracy {cfg.stop_acc} at the training length and stopped, "
        f"{len(learned)} learned (test accuracy >= {cfg.learned_min:g} at the training length, mechanism read). "
        + "; ".join(parts) + "."
        + (f" Unlearned runs in {', '.join(unlearned)} are left out of the AA/PAA comparison." if unlearned else "")
        + (f" AA runs come from {seeds_by['AA']} seeds, PAA runs from {seeds_by['PAA']}: with fewer than 6 on a side "
           "the unpaired checks are inconclusive (min_n = 6); read the per-run table and the scatter plot."
           if min(seeds_by.values()) < 6 else "")
    )  # fmt: skip
    return ctx.finish(claims)
