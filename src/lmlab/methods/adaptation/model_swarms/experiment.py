"""Reproduction: Model Swarms vs best single expert, uniform soup, TIES, DARE and random search at equal budget.

Paper claim (Feng et al., ICML 2025, abstract): a swarm of LLM experts, each a particle moving in weight space under
inertia, its personal best, the global best and away from the global worst, adapts to a new objective from ~200
examples and beats 12 model-composition baselines by up to 21%.

Design. Experts: one LoRA per task-bank family of `experts` (default: add, sub, mul, unit length / mass, letter
count, continent, capital), trained briefly on its train split; the LoRA sits on the top `train_layers` blocks over
a frozen trunk cached once (`lmlab.core.training.partial`, `lmlab.core.training.lora`). Objective: log-likelihood
multiple-choice
accuracy on `dev_items` dev items of `target` (default ``arithmetic/two_step``: two-step problems, a task no
expert saw); every system is reported on `test_items` test items. Searchers and their utility evaluations:
the swarm uses B (its initial particles plus N per iteration until patience or `max_iteration`); random search
over mixing weights, TIES and DARE-linear (density and λ tuned on dev) each get exactly B; the best single expert
uses N (the swarm's first evaluation), the uniform soup none. Reporting evaluations (dev accuracy of the winners,
all test scores) are outside the budget.

Claims (computed from this run, paired by test item). Gated: swarm test accuracy above the best single expert and
above the uniform soup. Reported: above random search, TIES and DARE at the same B. Mechanism check: on dev, the
swarm's global best is at least the best expert (g starts there and never decreases; checked, a decrease stops the
run).
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

import numpy as np

from lmlab.core.stats.seeding import derive_seed
from lmlab.methods.adaptation.model_swarms.config import GRIDS, parse_family
from lmlab.results import Claim

SEARCHERS = ("model_swarms", "random_search", "ties", "dare_linear")
SYSTEMS = ("model_swarms", "best_single", "uniform_soup", "ties", "dare_linear", "random_search")
TEST, DEV = "test_acc", "dev_acc"


def swarm_config(cfg: Any) -> tuple[Any, dict[str, float]]:
    """The `SwarmConfig` of a run: φ's and λ fixed, or drawn from the run scripts' grids with `search_seed`."""
    from lmlab.methods.adaptation.model_swarms.method import SwarmConfig

    if cfg.hparams == "sampled":
        rng = random.Random(derive_seed(cfg.search_seed, "model_swarms-grid"))
        hp = {k: rng.choice(v) for k, v in GRIDS.items()}
    else:
        hp = {k: getattr(cfg, k) for k in GRIDS}
    scfg = SwarmConfig(phi_v=hp["phi_v"], phi_p=hp["phi_p"], phi_g=hp["phi_g"], phi_w=hp["phi_w"], step=hp["step"],
                       step_decay=cfg.step_decay, step_floor=min(cfg.step_floor, hp["step"]), patience=cfg.patience,
                       max_iteration=cfg.max_iteration, restart_patience=cfg.restart_patience,
                       velocity_init=cfg.velocity_init, populate_to=cfg.populate_to,
                       seed=derive_seed(cfg.seed, "model_swarms-search", cfg.search_seed))  # fmt: skip
    return scfg, hp


def family_items(ctx: Any, cfg: Any, family: str, n: int, split: str, n_choices: int) -> list[Any]:
    """`n` task-bank items of ``domain/task`` `family` (arithmetic with `cfg.digits`; `cfg.limit` caps n)."""
    domain, task = parse_family(family, "family")
    kw = {"digits": cfg.digits} if domain == "arithmetic" else {}
    try:
        items = ctx.data("taskbank", n, split=split, domain=domain, task=task, n_choices=n_choices, **kw)
    except ValueError as e:
        raise ValueError(f"the task bank cannot give {n} {split} items of {family}: {e}") from None
    if not items:
        raise ValueError(f"the task bank gave no {split} items of {family}; expected at least one (check --limit)")
    return items


def _expert_key(cfg: Any, ctx: Any, family: str, train: list[Any], seed: int) -> str:
    what = {"model": cfg.model, "model_info": ctx.models.get(cfg.model), "family": family, "digits": cfg.digits,
            "items": [e.id for e in train], "steps": cfg.expert_steps, "batch": cfg.expert_batch,
            "lr": cfg.expert_lr, "rank": cfg.rank, "alpha": cfg.alpha, "targets": list(cfg.target_modules),
            "train_layers": cfg.train_layers, "clip": cfg.max_grad_norm, "seed": seed, "dtype": cfg.dtype,
            "shared_init": cfg.shared_init,
            "version": 1}  # fmt: skip
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:20]


def _cached_expert(cfg: Any, key: str, train_fn: Any) -> tuple[dict[str, Any], list[float], bool]:
    """(state, losses, from_cache): a trained expert from lmlab's cache folder, or trained and stored there."""
    if not cfg.expert_cache:
        state, losses = train_fn()
        return state, losses, False
    import os

    from safetensors.torch import load_file, save_file

    from lmlab.core.inference.models import cache_root

    folder = cache_root() / "model_swarms" / "experts"
    path = folder / f"{key}.safetensors"
    meta_path = folder / f"{key}.json"
    if path.exists() and meta_path.exists():
        return load_file(str(path)), json.loads(meta_path.read_text())["losses"], True
    state, losses = train_fn()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp))
    os.replace(tmp, path)
    meta_path.write_text(json.dumps({"losses": losses}))
    return state, losses, False


def _best_so_far(history: list[float]) -> list[float]:
    return np.maximum.accumulate(np.asarray(history, dtype=float)).tolist() if history else []


def run(cfg: Any, ctx: Any) -> Any:
    from peft import LoraConfig

    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache
    from lmlab.core.training.partial import FrozenTrunk
    from lmlab.core.training.sft import encode_sequences
    from lmlab.data.taskbank import answer_request
    from lmlab.methods.adaptation.model_swarms.adapters import ChoiceSet, LoraSlot, train_lora_expert
    from lmlab.methods.adaptation.model_swarms.method import (
        CountingUtility,
        ModelSwarm,
        best_single,
        knob_search,
        lora_task_vectors,
        merge_task_vectors,
        random_search,
        uniform_soup,
    )

    dev = family_items(ctx, cfg, cfg.target, cfg.dev_items, "dev", cfg.n_choices)
    test = family_items(ctx, cfg, cfg.target, cfg.test_items, "test", cfg.n_choices)
    model, tok = ctx.load_model()
    n_layers = len(model.model.layers)
    if cfg.train_layers > n_layers:
        raise ValueError(f"train_layers must be <= {n_layers} (the blocks of {cfg.model}), got {cfg.train_layers}")
    trunk = FrozenTrunk(model, cfg.train_layers)
    lora_cfg = LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules),
                          lora_dropout=0.0, bias="none")  # fmt: skip
    try:
        slot = LoraSlot(trunk, lora_cfg)
    except ValueError:
        raise ValueError(f"target_modules {cfg.target_modules} match no linear layer of {cfg.model}'s blocks; "
                         "expected llama-style names (q_proj, v_proj, up_proj, down_proj, ...)") from None  # fmt: skip

    # the experts: one LoRA per family, trained on its train split (cached on disk when expert_cache)
    experts, expert_rows, cached = [], [], 0
    for i, fam in enumerate(ctx.progress(cfg.experts, "experts", total=len(cfg.experts))):
        train = family_items(ctx, cfg, fam, cfg.expert_items, "train", 0)
        seed = derive_seed(cfg.seed, "model_swarms-expert", fam)

        def train_fn(train: list[Any] = train, seed: int = seed) -> tuple[Any, list[float]]:
            pairs = [answer_request(e) for e in train]
            cache = PaddedCache(trunk, encode_sequences(tok, [p for p, _ in pairs], [a for _, a in pairs]),
                                _pad_id(tok))  # fmt: skip
            init = derive_seed(cfg.seed, "model_swarms-lora-init") if cfg.shared_init else None
            return train_lora_expert(trunk, lora_cfg, cache, steps=cfg.expert_steps, batch=cfg.expert_batch,
                                     lr=cfg.expert_lr, seed=seed, init_seed=init,
                                     max_grad_norm=cfg.max_grad_norm)  # fmt: skip

        state, losses, hit = _cached_expert(cfg, _expert_key(cfg, ctx, fam, train, seed), train_fn)
        cached += hit
        experts.append(state)
        expert_rows.append({"expert": i, "family": fam, "train_items": len(train), "loss_first": losses[0],
                            "loss_last": losses[-1], "from_cache": hit})  # fmt: skip

    dev_set, test_set = ChoiceSet(trunk, tok, dev), ChoiceSet(trunk, tok, test)

    def dev_lora(state: Any) -> float:
        return float(np.mean(dev_set.correct(slot.load(state))))

    def dev_dense(deltas: Any) -> float:
        return float(np.mean(dev_set.correct(slot.load_dense(deltas))))

    # the swarm sets the budget B; every other searcher gets exactly B evaluations
    scfg, hp = swarm_config(cfg)
    counters = {"model_swarms": CountingUtility(dev_lora)}
    res = ModelSwarm(
        experts,
        counters["model_swarms"],
        scfg,
        on_iteration=lambda it, u: ctx.log.info("swarm iteration %d: max dev %.3f", it, max(u)),
    ).search()
    budget = counters["model_swarms"].calls
    if any(b < a for a, b in zip(res.g_history, res.g_history[1:])):
        raise RuntimeError(f"the swarm's global best decreased: {res.g_history}")
    # the best single expert: the swarm's first evaluation already scored every expert (the first N particles; a
    # populate step appends its children after them), so its N evaluations are read back, not recomputed
    first = iter([h[0] for h in res.particle_history[: len(experts)]])
    counters["best_single"] = CountingUtility(lambda state: next(first))
    single = best_single(experts, counters["best_single"])
    soup = uniform_soup(experts)
    counters["random_search"] = CountingUtility(dev_lora, budget)
    rs = random_search(experts, counters["random_search"], budget, seed=derive_seed(cfg.seed, "random_search"),
                       concentration=cfg.random_concentration)  # fmt: skip
    vectors = [lora_task_vectors(e, slot.scaling) for e in experts]
    ones = [1.0] * len(experts)
    merged: dict[str, Any] = {}
    for method in ("ties", "dare_linear"):

        def build(knobs: dict[str, float], method: str = method) -> Any:
            return merge_task_vectors(method, vectors, ones, density=knobs["density"], lam=knobs["lam"],
                                      seed=derive_seed(cfg.seed, method, knobs["draw"]),
                                      rescale=cfg.dare_rescale)  # fmt: skip

        counters[method] = CountingUtility(dev_dense, budget)
        first_knobs = {"density": cfg.merge_density, "lam": 1.0}
        ranges = {"density": tuple(cfg.density_range), "lam": tuple(cfg.lambda_range)}
        merged[method] = knob_search(build, counters[method], budget, first=first_knobs, ranges=ranges,
                                     seed=derive_seed(cfg.seed, method, "knobs"))  # fmt: skip
    calls = {s: counters[s].calls for s in SEARCHERS}
    if len(set(calls.values())) != 1:
        raise RuntimeError(f"unequal evaluation budgets {calls}; every searcher must use exactly {budget}")

    # test (and dev, for the mechanism check) of every system; outside the budget
    tests = {"model_swarms": test_set.correct(slot.load(res.global_best)),
             "best_single": test_set.correct(slot.load(single.best)),
             "uniform_soup": test_set.correct(slot.load(soup)),
             "random_search": test_set.correct(slot.load(rs.best)),
             "ties": test_set.correct(slot.load_dense(merged["ties"].best)),
             "dare_linear": test_set.correct(slot.load_dense(merged["dare_linear"].best)),
             "base": test_set.correct(trunk.reference)}  # fmt: skip
    devs = {
        "model_swarms": dev_set.correct(slot.load(res.global_best)),
        "best_single": dev_set.correct(slot.load(single.best)),
    }
    for i, e in enumerate(experts):
        expert_rows[i]["dev_acc"] = single.history[i]
        expert_rows[i]["test_acc"] = float(np.mean(test_set.correct(slot.load(e))))

    notes = {"model_swarms": f"global best (particle {res.global_best_particle}), {budget} dev evaluations",
             "best_single": f"expert {single.best_info['expert']} ({cfg.experts[single.best_info['expert']]}), "
                            f"{single.evaluations} dev evaluations",
             "uniform_soup": "mean of the experts' A and B, no evaluation",
             "random_search": f"best of {budget} (experts + Dirichlet mixtures): {rs.best_info}",
             "ties": f"best of {budget} knob draws: {merged['ties'].best_info}",
             "dare_linear": f"best of {budget} knob draws: {merged['dare_linear'].best_info}",
             "base": "the model without any LoRA"}  # fmt: skip
    for s, vals in tests.items():
        ctx.record(s, TEST, vals, clusters=test_set.ids, note=notes[s])
    for s, vals in devs.items():
        ctx.record(s, DEV, vals, clusters=dev_set.ids, note="the search objective, re-scored")
    for s in (*SEARCHERS, "best_single"):
        ctx.record_value(s, "utility_evaluations", counters[s].calls, note="dev utility calls")
        ctx.record_value(s, "best_dev_utility", max(counters[s].history), note="best dev accuracy found")

    ctx.flag("evaluation_budget", budget)
    ctx.flag("equal_budget", calls)
    ctx.flag("swarm_hparams", hp)
    ctx.flag("swarm", {"stopped": res.stopped, "iterations": res.iterations, "restarts": len(res.restarts),
                       "g_history": res.g_history, "best_particle": res.global_best_particle,
                       "start_expert_of_best": cfg.experts[res.global_best_particle]
                       if res.global_best_particle < len(cfg.experts) else "populated"})  # fmt: skip
    ctx.flag("g_monotone", True)
    ctx.table("experts", expert_rows)
    ctx.table("swarm_history", [{"iteration": t, "g": g, "g_worst": w, "step": res.step_history[t - 1] if t else None,
                                 "particles": [h[t] for h in res.particle_history]}
                                for t, (g, w) in enumerate(zip(res.g_history, res.g_worst_history))])  # fmt: skip
    ctx.add_samples({"id": ex_id, "answer_index": gold, **{s: tests[s][j] for s in tests}}
                    for j, (ex_id, gold) in enumerate(zip(test_set.ids, test_set.gold)))  # fmt: skip
    _figures(ctx, cfg, counters, budget)

    if cfg.save_model:
        from lmlab.core.training.partial import merge_back

        full = merge_back(copy.deepcopy(model), slot.load(res.global_best))
        full.save_pretrained(cfg.save_model)
        tok.save_pretrained(cfg.save_model)
        ctx.flag("saved_model", str(cfg.save_model))
        ctx.note(f"The swarm's best model (LoRA merged) was saved to {cfg.save_model}: use it as --model "
                 f"{cfg.save_model}.")  # fmt: skip
        del full

    ctx.note(
        f"{len(experts)} LoRA experts (r={cfg.rank}, alpha={cfg.alpha:g}, {', '.join(cfg.target_modules)}; top "
        f"{cfg.train_layers} of {n_layers} blocks; {cfg.expert_steps} steps each, {cached} from cache) on "
        f"{', '.join(cfg.experts)}; target {cfg.target} ({len(dev)} dev / {len(test)} test items, {cfg.n_choices} "
        f"options, log-likelihood). Swarm: {res.iterations} iterations ({res.stopped}), {len(res.restarts)} "
        f"restarts, hparams {hp}; budget B = {budget} dev evaluations for every searcher."
    )
    return ctx.finish(claims())


def claims() -> list[Claim]:
    return [
        Claim(TEST, "model_swarms", "best_single", ">",
              text="test accuracy on the new task: the swarm's global best above the best single expert (chosen on "
                   "dev)"),
        Claim(TEST, "model_swarms", "uniform_soup", ">",
              text="test accuracy: the swarm's global best above the uniform soup of the experts"),
        Claim(TEST, "model_swarms", "random_search", ">", gate=False,
              text="test accuracy: swarm above random search over mixing weights at the same number of utility "
                   "evaluations (reported; a tie is possible at this scale)"),
        Claim(TEST, "model_swarms", "ties", ">", gate=False,
              text="test accuracy: swarm above TIES (density, λ tuned with the same budget; reported)"),
        Claim(TEST, "model_swarms", "dare_linear", ">", gate=False,
              text="test accuracy: swarm above DARE-linear (density, λ tuned with the same budget; reported)"),
        Claim(DEV, "model_swarms", "best_single", ">", mechanism=True,
              text="dev accuracy (the objective): the swarm's global best is at least the best expert, since g starts "
                   "there and never decreases (checked)"),
    ]  # fmt: skip


def _figures(ctx: Any, cfg: Any, counters: dict[str, Any], budget: int) -> None:
    from lmlab.core.report.plotting import bar_with_ci, lines, title_for

    rows = [m for m in ctx.metrics if m.metric == TEST]
    n = rows[0].n if rows else None
    title = title_for("model_swarms", str(cfg.model), cfg.seed, n, f"test accuracy, {cfg.target}")
    ctx.add_figure(TEST, bar_with_ci(rows, title=title, ylabel="test accuracy", highlight=("model_swarms",)))
    series = {s: _best_so_far(counters[s].history) for s in SEARCHERS}
    title = title_for("model_swarms", str(cfg.model), cfg.seed, budget, "best dev utility vs evaluations")
    ctx.add_figure("best_dev_vs_evaluations", lines(list(range(1, budget + 1)), series, title=title,
                                                    xlabel="utility evaluations",
                                                    ylabel="best dev accuracy so far"))  # fmt: skip
