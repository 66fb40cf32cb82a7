"""Reproduction: LensLLM vs the rectified law, AtS, subtuning, zero-shot and model size on lmlab's candidate zoo.

Paper claim (Zeng et al., ICML 2025): the NTK-based rectified scaling law L(D) = B / (F(Θ, t) + D^β) + E, fitted on
fine-tuning losses at small subset sizes, predicts each candidate's loss at the full budget with up to 5x lower
RMSE than the rectified scaling law, and selects the best candidate (higher relative accuracy and Pearson
correlation) at up to 88.5% less compute than fine-tuning every candidate fully.

Candidates (`candidates`): the base model (SmolLM2-135M), its first 10 / 20 blocks (``base-truncN``: final norm
and head kept), optionally Gemma-3-270M, and seeded random tiny llamas (``tiny*``, byte tokenizer). Task: the task
bank's arithmetic ``add`` (``"Q: What is 23 + 45?\\nA:"`` → ``" 68"``); loss = mean over a fixed test set of the
summed answer NLL (nats per answer, comparable across tokenizers).

Per data seed (the independent unit): a permutation of the train pool makes nested subsets D_1 ⊂ D_2 ⊂ ... ⊂ D*
(D* = `target_size`, the whole pool); every candidate is fine-tuned on every subset (LoRA on the top
`train_layers` blocks over a cached frozen trunk for pretrained candidates, every block for tiny ones; constant-lr
AdamW, batch 8, up to `epochs` epochs, early stopping with `patience` on the validation split, best-validation
weights restored) and scored on the test set. D = 0 is the untouched model. The empirical NTK Θ (n_probe x n_probe,
w.r.t. the trainable parameters at the seed's adapter init) and r₀ = f₀(X) of the probes are computed per
(candidate, seed). Each (candidate, size, seed) fine-tune runs once and every selector reads the same losses.

Metrics per seed, across candidates: RMSE and log-RMSE of the predicted vs the measured D* loss, Pearson and
Spearman correlation of the selector's score with the measured D* loss, RelAcc (best loss / selected candidate's
loss), regret, top-1. Compute: 6·N·tokens of the subset fine-tunes vs of the D* fine-tunes (measured tokens).

Claims (gated, paired by seed): RMSE(LensLLM) < RMSE(lens_free), the same law with F a free constant and no NTK
(the ablation: does the NTK term help?); RMSE(LensLLM) < RMSE(rectified); Pearson(LensLLM) > Pearson(zero-shot) and >
Pearson(model size). Every law (LensLLM, lens_free, rectified) is fitted by the same optimiser, tolerances and
restart budget (`method._minimise`), so the RMSE checks compare laws, not fitting procedures. Reported: Pearson of
LensLLM vs lens_free and of the rectified law vs zero-shot, RMSE vs subtuning and vs phase-fitting LensLLM, RelAcc.
Mechanism: the subset fine-tunes cost less than the D* fine-tunes (fixed by the sizes).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmlab.core.stats.seeding import derive_seed
from lmlab.results import Claim

SUITE = "taskbank"


@dataclass
class Candidate:
    """One candidate model with its cached trunk and caches of the train pool, validation, test and probe sets."""

    name: str
    model: Any
    tok: Any
    full_ft: bool  # tiny: every block trained; otherwise LoRA on the top blocks
    trunk: Any
    n_params: int
    lora_cfg: Any = None
    caches: dict[str, Any] = field(default_factory=dict)

    def build(self) -> Any:
        if self.full_ft:
            return self.trunk.top_k(train_norm=True)
        return self.trunk.top_k(train_norm=False, lora=self.lora_cfg)


@dataclass
class FineTune:
    test_loss: float
    best_step: int
    steps: int
    tokens: int
    best_val: float


# ----------------------------------------------------------------------------------------------------------------
# candidates


def truncated(model: Any, n_layers: int) -> Any:
    """The ``base-trunc<N>`` candidate: `model`'s first `n_layers` blocks with its final norm and head, weights shared
    (`lmlab.core.training.partial.truncated_model`)."""
    from lmlab.core.training.partial import truncated_model

    total = len(model.model.layers)
    if not 1 <= n_layers <= total:
        raise ValueError(f"base-trunc{n_layers}: the base model has {total} blocks, expected 1 <= N <= {total}")
    return truncated_model(model, n_layers)


def _load_candidate(name: str, cfg: Any, ctx: Any, base: list[Any]) -> tuple[Any, Any, bool]:
    from lmlab.core.inference.models import model_info
    from lmlab.methods.selection.lensllm.config import TINY_VARIANTS

    if name in TINY_VARIANTS:
        from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_llama

        seed, layers, hidden = TINY_VARIANTS[name]
        model = make_tiny_llama(seed, n_layers=layers, hidden=hidden)
        ctx.models[name] = model_info(model)
        return model, make_byte_tokenizer(), True
    if name == "gemma3":
        model, tok = ctx.load_model("gemma3-270m")
        return model, tok, False
    if not base:
        base.extend(ctx.load_model())
    model, tok = base
    if name == "base":
        return model, tok, False
    view = truncated(model, int(name[len("base-trunc") :]))
    ctx.models[f"{cfg.model}:{name}"] = model_info(view)
    return view, tok, False


def _candidate(name: str, cfg: Any, ctx: Any, base: list[Any], sets: dict[str, list[Any]]) -> Candidate:
    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.pretrain import count_parameters
    from lmlab.core.training.sft import encode_sequences
    from lmlab.data.taskbank import answer_request

    model, tok, full_ft = _load_candidate(name, cfg, ctx, base)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"candidate {name!r} ({type(model).__name__}) is not a decoder-only LM with model.layers")
    n = len(layers)
    if not full_ft and cfg.train_layers > n:
        raise ValueError(f"train_layers must be <= {n} (the blocks of candidate {name!r}), got {cfg.train_layers}")
    trunk = FrozenTrunk(model, n if full_ft else cfg.train_layers)
    lora_cfg = None
    if not full_ft:
        from peft import LoraConfig

        lora_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                              lora_dropout=0.0, bias="none")  # fmt: skip
    cand = Candidate(name, model, tok, full_ft, trunk, count_parameters(model, exclude_embeddings=True), lora_cfg)
    pad = _pad_id(tok)
    for key, items in sets.items():
        pairs = [answer_request(e) for e in items]
        cand.caches[key] = PaddedCache(trunk, encode_sequences(tok, [p for p, _ in pairs], [a for _, a in pairs]), pad)
    if not full_ft:
        try:
            cand.build()
        except ValueError:
            raise ValueError(f"target_modules {cfg.target_modules} match no linear layer of candidate {name!r}; "
                             "expected llama-style names (q_proj, v_proj, ...)") from None  # fmt: skip
    return cand


# ----------------------------------------------------------------------------------------------------------------
# fine-tuning and the NTK


def _mean_nll(policy: Any, cache: Any) -> float:
    from lmlab.core.training.lora import answer_scores

    nll, _ = answer_scores(policy, cache)
    return float(np.mean(nll))


def finetune(cand: Candidate, rows: Sequence[int], cfg: Any, seed: int, init_seed: int | None = None) -> FineTune:
    """Fine-tune a fresh copy on `rows` of the train pool; early stopping on validation; the test loss of the best
    validation checkpoint. `seed` orders the data; `init_seed` (default `seed`) draws the adapter init (`ntk_of`
    with the same value sees the same init)."""
    from lmlab.core.training.lora import adamw, index_batches
    from lmlab.core.training.partial import response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss

    torch.manual_seed(derive_seed(seed if init_seed is None else init_seed, "init", cand.name))
    policy = cand.build()
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = adamw(policy, cfg.lr)
    train = cand.caches["train"]
    rows = list(rows)
    batch = min(cfg.train_batch, len(rows))
    per_epoch = math.ceil(len(rows) / batch)
    max_steps = cfg.epochs * per_epoch
    every = max(1, per_epoch // cfg.evals_per_epoch)
    order = index_batches(len(rows), max_steps, batch, derive_seed(seed, "order", len(rows)))
    best = (math.inf, 0, None)
    bad = tokens = step = 0
    policy.train()
    for step, local in enumerate(order, 1):
        sub, tm = train.batch([rows[j] for j in local])
        opt.zero_grad(set_to_none=True)
        loss = weighted_sft_loss(response_token_logps(policy, sub, tm), tm, reduction="mean")
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        tokens += int(sub.attention_mask.sum())
        if step % every == 0 or step == max_steps:
            policy.eval()
            val = _mean_nll(policy, cand.caches["val"])
            policy.train()
            if val < best[0]:
                state = {k: v.detach().clone() for k, v in policy.named_parameters() if v.requires_grad}
                best, bad = (val, step, state), 0
            else:
                bad += 1
                if bad >= cfg.patience:
                    break
    policy.eval()
    if best[2] is not None:
        with torch.no_grad():
            named = dict(policy.named_parameters())
            for k, v in best[2].items():
                named[k].copy_(v)
    return FineTune(_mean_nll(policy, cand.caches["test"]), best[1], step, tokens, best[0])


def ntk_of(cand: Candidate, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Θ and r₀ = f₀(X) (Y = 0) on the probes, w.r.t. the trainable parameters at the seed's adapter init."""
    from lmlab.core.training.partial import response_token_logps
    from lmlab.methods.selection.lensllm.method import empirical_ntk

    torch.manual_seed(derive_seed(seed, "init", cand.name))
    policy = cand.build()
    policy.eval()
    probe = cand.caches["probe"]

    def score(i: int) -> torch.Tensor:
        sub, tm = probe.batch([i])
        return response_token_logps(policy, sub, tm).sum()  # f(x_i) = Σ log p(answer tokens | x_i)

    return empirical_ntk(score, list(policy.parameters()), probe.n)


# ----------------------------------------------------------------------------------------------------------------
# the run


def _sets(ctx: Any, cfg: Any) -> tuple[dict[str, list[Any]], int, list[int]]:
    kw = dict(domain="arithmetic", task=cfg.task, digits=cfg.digits, n_choices=0)
    train = ctx.data(SUITE, cfg.target_size, split="train", **kw)
    dev = ctx.data(SUITE, cfg.val_size + cfg.n_probe, split="dev", **kw)
    test = ctx.data(SUITE, cfg.test_size, split="test", **kw)
    if not train or not dev or not test:
        raise ValueError("the train, dev or test split is empty (check --limit)")
    val = dev[: cfg.val_size]
    probe = dev[cfg.val_size :] or dev[: cfg.n_probe]  # --limit can leave no disjoint probes
    target = len(train)
    sizes = [s for s in cfg.sizes if s < target]
    if len([s for s in sizes if s > 0]) < 1:
        sizes = [0, target]  # a --limit run: degenerate but complete
    if target < cfg.target_size:
        ctx.note(f"--limit shrank the train pool: D* = {target}, sizes {sizes}.")
    return {"train": train, "val": val, "test": test, "probe": probe}, target, sizes


def run(cfg: Any, ctx: Any) -> Any:
    from lmlab.methods.selection.lensllm.method import compute_ratio, select, selection_metrics

    sets, target, sizes = _sets(ctx, cfg)
    base: list[Any] = []
    cands = [_candidate(name, cfg, ctx, base, sets) for name in ctx.progress(cfg.candidates, "candidates")]
    names = [c.name for c in cands]
    seeds = [derive_seed(cfg.seed, "lensllm-data", s) for s in range(cfg.n_seeds)]
    n_pool = len(sets["train"])

    # zero-shot losses (seed-free) and every (candidate, size, seed) fine-tune, once
    zero = {c.name: _mean_nll(c.trunk.reference, c.caches["test"]) for c in cands}
    runs: dict[tuple[str, int, int], FineTune] = {}
    ntks: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}
    jobs = [(c, s) for s in seeds for c in cands]
    t0 = time.perf_counter()
    for c, s in ctx.progress(jobs, "fine-tunes (seed x candidate)"):
        perm = np.random.default_rng(derive_seed(s, "nested")).permutation(n_pool).tolist()
        for d in [*(x for x in sizes if x > 0), target]:
            if (c.name, d, s) not in runs:
                runs[(c.name, d, s)] = finetune(c, perm[:d], cfg, derive_seed(s, "ft", d), init_seed=s)
        ntks[(c.name, s)] = ntk_of(c, s)
    ft_s = time.perf_counter() - t0

    # "lensllm" fits in cfg.mode (gated); the other mode is reported beside it
    alt = "lensllm_phase" if cfg.mode == "prediction" else "lensllm_prediction"
    selector = {"lensllm": "lensllm" if cfg.mode == "prediction" else "lensllm_phase",
                alt: "lensllm_phase" if cfg.mode == "prediction" else "lensllm"}  # fmt: skip
    systems = ["lensllm", alt, "lens_free", "rectified", "ats", "subtuning", "zeroshot", "modelsize"]
    per: dict[str, dict[str, list[float]]] = {s: {} for s in systems}
    rows, samples = [], []
    flops_sub, flops_full = [], []
    d_max = max(sizes)
    for s in seeds:
        losses = np.array([[zero[n] if d == 0 else runs[(n, d, s)].test_loss for d in sizes] for n in names])
        actual = np.array([runs[(n, target, s)].test_loss for n in names])
        ntk = [ntks[(n, s)] for n in names]
        t_obs = [float(runs[(n, d_max, s)].best_step) if d_max > 0 else 0.0 for n in names]
        for system in systems:
            sel = select(names, sizes, losses, target, selector.get(system, system), ntk=ntk, t_obs=t_obs,
                         model_sizes=[c.n_params for c in cands], n_restarts=cfg.n_restarts, eta=cfg.eta,
                         ats_k=cfg.ats_k, ats_delta=cfg.ats_delta, seed=derive_seed(s, "fit"))  # fmt: skip
            m = selection_metrics(sel.scores, actual, is_loss=sel.is_loss)
            for k, v in m.items():
                per[system].setdefault(k, []).append(v)
            rows.append({"seed": s, "system": system, "selected": sel.best, **m})
            fits = {n: (f.params if f is not None else None) for n, f in zip(names, sel.fits)}
            samples.append({"seed": s, "system": system, "scores": dict(zip(names, sel.scores.tolist())),
                            "actual": dict(zip(names, actual.tolist())), "ranking": sel.ranking,
                            "fits": fits})  # fmt: skip
        sub = {n: 6.0 * c.n_params * sum(runs[(n, d, s)].tokens for d in sizes if d > 0) for n, c in zip(names, cands)}
        full = {n: 6.0 * c.n_params * runs[(n, target, s)].tokens for n, c in zip(names, cands)}
        flops_sub.append(sum(sub.values()))
        flops_full.append(sum(full.values()))
        per.setdefault("_ratio", {}).setdefault("compute_ratio", []).append(compute_ratio(sub, full))

    clusters = list(range(len(seeds)))
    for system in systems:
        for metric, vals in per[system].items():
            ctx.record(system, metric, vals, clusters=clusters, note=f"one value per data seed ({len(names)} "
                       "candidates each)")  # fmt: skip
    ctx.record("lensllm", "train_flops", flops_sub, clusters=clusters, unit="FLOP",
               note=f"6·N·tokens of the fine-tunes on {[d for d in sizes if d > 0]} (all candidates)")  # fmt: skip
    ctx.record("full_ft", "train_flops", flops_full, clusters=clusters, unit="FLOP",
               note=f"6·N·tokens of the fine-tunes on D* = {target} (all candidates)")  # fmt: skip
    ctx.record("lensllm", "compute_ratio", per["_ratio"]["compute_ratio"], clusters=clusters,
               note="subset fine-tunes / D* fine-tunes (FLOPs)")  # fmt: skip
    ctx.record_value("all", "finetune_s", ft_s, unit="s", note=f"{len(runs)} fine-tunes + {len(ntks)} NTKs")
    ctx.table("per_seed", rows)
    ctx.table("losses", [{"candidate": n, "seed": s, "size": d,
                          "test_loss": zero[n] if d == 0 else runs[(n, d, s)].test_loss,
                          "best_step": 0 if d == 0 else runs[(n, d, s)].best_step,
                          "steps": 0 if d == 0 else runs[(n, d, s)].steps}
                         for s in seeds for n in names for d in [*sizes, target]])  # fmt: skip
    ctx.flag("candidates", {c.name: {"params_non_embedding": c.n_params, "full_ft": c.full_ft,
                                     "zero_shot_loss": zero[c.name]} for c in cands})  # fmt: skip
    ctx.flag("sizes", sizes)
    ctx.flag("target_size", target)
    ctx.add_samples(samples)
    _figure(ctx, cfg, names, sizes, target, seeds, zero, runs)
    ctx.note(
        f"{len(names)} candidates x {len(seeds)} data seeds x sizes {[d for d in sizes if d > 0]} + D* = {target} on "
        f"taskbank arithmetic/{cfg.task} ({cfg.digits} digits); loss = summed answer NLL over {len(sets['test'])} "
        f"test items; LoRA r={cfg.rank} on {', '.join(cfg.target_modules)} of the top {cfg.train_layers} blocks "
        f"(tiny candidates: every block), lr {cfg.lr:g}, batch {cfg.train_batch}, <= {cfg.epochs} epochs, early "
        f"stopping (patience {cfg.patience}, {len(sets['val'])} validation items); NTK on {len(sets['probe'])} "
        f"probes; "
        f"LensLLM mode = {cfg.mode}; every law fit (LensLLM, lens_free, rectified): L-BFGS-B with one set of "
        f"tolerances, {cfg.n_restarts} restarts."
    )
    return ctx.finish(claims(alt))


def claims(alt: str = "lensllm_phase") -> list[Claim]:
    return [
        Claim("rmse", "lensllm", "lens_free", "<",
              text="RMSE of the predicted vs measured loss at D* (across candidates, per seed): LensLLM below the "
                   "same law with F a free constant and no NTK (lens_free; same optimiser, tolerances and restarts): "
                   "the NTK term helps"),
        Claim("rmse", "lensllm", "rectified", "<",
              text="RMSE of the predicted vs measured loss at D* (across candidates, per seed): LensLLM below the "
                   "rectified scaling law (same optimiser, tolerances and restarts)"),
        Claim("pearson", "lensllm", "zeroshot", ">",
              text="Pearson correlation of predicted and measured D* loss: LensLLM above the zero-shot loss"),
        Claim("pearson", "lensllm", "modelsize", ">",
              text="Pearson correlation with the measured D* loss: LensLLM above model size (more parameters = "
                   "better)"),
        Claim("pearson", "lensllm", "lens_free", ">", gate=False,
              text="Pearson correlation with the measured D* loss: LensLLM above lens_free (F free, no NTK) "
                   "(reported)"),
        Claim("pearson", "rectified", "zeroshot", ">", gate=False,
              text="Pearson correlation: the rectified law above the zero-shot loss (reported)"),
        Claim("rmse", "lensllm", "subtuning", "<", gate=False,
              text="RMSE at D*: LensLLM below the loss at the largest fitted subset taken as the prediction "
                   "(reported)"),
        Claim("rmse", "lensllm", alt, "<", gate=False,
              text=f"RMSE at D*: the gated LensLLM mode below the other mode, {alt} (reported)"),
        Claim("relacc", "lensllm", "zeroshot", ">", gate=False,
              text="relative accuracy of the selected candidate (best loss / selected loss): LensLLM above "
                   "zero-shot (reported)"),
        Claim("relacc", "lensllm", "rectified", ">", gate=False,
              text="relative accuracy of the selected candidate: LensLLM above the rectified law (reported)"),
        Claim("train_flops", "lensllm", "full_ft", "<", mechanism=True,
              text="the subset fine-tunes cost fewer FLOPs than fine-tuning every candidate on D* (fixed by the "
                   "sizes)"),
    ]  # fmt: skip


def _figure(ctx: Any, cfg: Any, names: list[str], sizes: list[int], target: int, seeds: list[int],
            zero: dict[str, float], runs: dict[tuple[str, int, int], FineTune]) -> None:  # fmt: skip
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    xs = [math.log2(d) if d > 0 else -1.0 for d in [*sizes, target]]
    series = {n: [float(np.mean([zero[n] if d == 0 else runs[(n, d, s)].test_loss for s in seeds]))
                  for d in [*sizes, target]] for n in names}  # fmt: skip
    ctx.add_figure("loss_vs_size", lines(xs, series, title=title_for("lensllm", str(cfg.model), cfg.seed, len(seeds),
                                                                     "test loss vs subset size"),
                                         xlabel="log2 D (D = 0 at -1)", ylabel="answer NLL (nats)",
                                         logy=True))  # fmt: skip
    rows = [m for m in ctx.metrics if m.metric == "rmse"]
    ctx.add_figure("rmse", bar_with_ci(rows, title=title_for("lensllm", str(cfg.model), cfg.seed, len(seeds),
                                                             f"RMSE of the D* = {target} loss"),
                                       ylabel="RMSE (nats)", highlight=("lensllm",)))  # fmt: skip
