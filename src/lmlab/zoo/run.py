"""Running one variant: build its model, answer every query, grade and cost each answer (`run_variant`).

By kind (`lmlab.zoo.variants.KINDS`): greedy batched decoding of chat prompts (zeroshot, int4 on the fast engine's
int4 path), train-split shots as earlier turns or a ``Question: / Answer:`` prompt (fewshot, base_fewshot),
self-consistency votes over `lmlab.zoo.answers.answer_key` (sc), program of thought through
`lmlab.zoo.answers.safe_eval` (pot), and derived models: the first blocks (trunc), a Wanda-pruned copy at one
sparsity or at ATP's per-block sparsities (wanda, atp: `lmlab.methods.compression.wanda` and
`lmlab.methods.compression.atp`), a merged LoRA trained on one task family (lora).

Where cheap (variants whose answer is the HF model's greedy text) a multiple-choice query's ``option_probs`` are the
options' first-token probabilities at the answer position, renormalised over the options (one prompt forward; not
part of ``cost_flops``). Cost: `lmlab.data.respcache.flop_cost` per prompt, summed over samples.
"""

from __future__ import annotations

import copy
import gc
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmlab import data as lmdata
from lmlab.data import Example, seeded_rng
from lmlab.data.respcache import ResponseRow, flop_cost
from lmlab.data.respsuite import MC_OPTIONS, MIXED_TASKS, ZOO_SUITES, Query, TaskDef
from lmlab.zoo.answers import POT_INSTRUCTION, _format_value, answer_key, extract_expression, safe_eval
from lmlab.zoo.variants import VariantSpec


@dataclass
class BuildOptions:
    seed: int = 0
    batch_size: int = 16
    max_new_tokens: int = 16
    option_probs: bool = True
    progress: bool = False


def truncated_model(model: Any, n_layers: int) -> Any:
    """`lmlab.core.training.partial.truncated_model` (imported on use: the zoo loads without torch)."""
    from lmlab.core.training.partial import truncated_model as truncate

    return truncate(model, n_layers)


def _full_copy(model: Any) -> Any:
    from lmlab.core.training.partial import _stash_model_caches

    saved = _stash_model_caches(model)
    try:
        return copy.deepcopy(model)
    finally:
        model.__dict__.update(saved)


def _shot_pool(task: TaskDef, seed: int, n: int = 40) -> list[Example]:
    """Train-split examples of `task` (few-shot shots and LoRA training items never come from the test split)."""
    while True:  # the largest of n, n/2, n/4, ... that the train split holds
        try:
            return lmdata.load(task.suite, n, seed=seed, split="train", **task.kwargs)
        except ValueError:
            if n <= 1:
                raise
            n //= 2


def _shots(q: Query, pool: list[Example], k: int, seed: int) -> list[Example]:
    cands = [e for e in pool if e.id != q.id]
    return seeded_rng("zoo-shots", seed, q.id).sample(cands, min(k, len(cands)))


def _chat(tok: Any, user: str, history: Sequence[tuple[str, str]] = ()) -> str:
    from lmlab.core.inference.scoring import chat_prompt

    hist = [m for u, a in history for m in ({"role": "user", "content": u}, {"role": "assistant", "content": a})]
    return chat_prompt(tok, user, history=hist)


def _base_prompt(q: Query, shots: Sequence[Example]) -> str:
    blocks = [f"Question: {s.prompt}{q.suffix}\nAnswer: {s.target}\n\n" for s in shots]
    return "".join(blocks) + f"Question: {q.prompt}\nAnswer:"


def _generate(
    model: Any,
    tok: Any,
    prompts: list[str],
    opts: BuildOptions,
    *,
    engine: str | None = None,
    stop_strings: Sequence[str] = (),
    max_new_tokens: int | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    desc: str = "",
) -> tuple[list[Any], list[float]]:
    """One batched decoding pass (prompts sorted by length to limit padding); (outputs, wall seconds per prompt)."""
    from lmlab.core.inference.generation import decode_batch

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    outs: list[Any] = [None] * len(prompts)
    walls = [0.0] * len(prompts)
    starts = range(0, len(order), opts.batch_size)
    if opts.progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc=desc, leave=False, unit="batch")
    for s in starts:
        idx = order[s : s + opts.batch_size]
        t0 = time.perf_counter()
        res = decode_batch(
            model,
            tok,
            [prompts[i] for i in idx],
            max_new_tokens=max_new_tokens or opts.max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            stop_strings=stop_strings,
            seed=opts.seed + s if do_sample else None,
            batch_size=len(idx),
            engine=engine,
        )
        dt = (time.perf_counter() - t0) / len(idx)
        for i, r in zip(idx, res):
            outs[i], walls[i] = r, dt
    return outs, walls


def _option_probs(model: Any, tok: Any, queries: list[Query], prompts: list[str], opts: BuildOptions) -> dict:
    """query id -> the MC options' probabilities at the answer's first position, renormalised over the options.

    One forward per prompt with the head on the last position only (selection.md's speed tip: read the logits at
    the answer position); an option is represented by its first answer token (the continent names' first tokens
    are distinct); where two options share a first token, their whole answers are scored instead.
    """
    import torch

    from lmlab.core.inference.scoring import _left_pad, _pad_id, encode_prompt, split_pair

    if not opts.option_probs:
        return {}
    todo = [(q, p) for q, p in zip(queries, prompts) if MC_OPTIONS.get(q.task)]
    if not todo:
        return {}
    device = next(model.parameters()).device
    out: dict[str, tuple[float, ...]] = {}
    for s in range(0, len(todo), opts.batch_size):
        chunk = todo[s : s + opts.batch_size]
        firsts = []
        for q, p in chunk:
            lead = "" if (not p or p[-1].isspace()) else " "
            ids = [split_pair(tok, p, lead + o)[1][:1] for o in MC_OPTIONS[q.task]]
            if any(not i for i in ids) or len({i[0] for i in ids}) < len(ids):
                return _option_probs_full(model, tok, todo, opts)  # e.g. a byte tokenizer: "Africa" / "Asia"
            firsts.append([i[0] for i in ids])
        ids, mask, pos = _left_pad([encode_prompt(tok, p) for _, p in chunk], _pad_id(tok), device)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, logits_to_keep=1).logits[:, -1]
        logp = torch.log_softmax(logits.float(), dim=-1)  # (b, vocab)
        for row, ((q, _), first) in enumerate(zip(chunk, firsts)):
            probs = torch.softmax(logp[row, torch.tensor(first, device=device)], dim=-1)
            out[q.id] = tuple(round(float(x), 6) for x in probs)
    return out


def _option_probs_full(model: Any, tok: Any, todo: list[tuple[Query, str]], opts: BuildOptions) -> dict:
    """The fallback: each option's whole-answer log-likelihood (`lmlab.core.inference.scoring.loglikelihood`),
    softmaxed."""
    from lmlab.core.inference.scoring import loglikelihood

    reqs = []
    for q, p in todo:
        lead = "" if (not p or p[-1].isspace()) else " "
        reqs += [(p, lead + o) for o in MC_OPTIONS[q.task]]
    scores = [lp for lp, _ in loglikelihood(model, tok, reqs, batch_size=opts.batch_size)]
    out, k = {}, 0
    for q, _ in todo:
        m = len(MC_OPTIONS[q.task])
        row, k = scores[k : k + m], k + m
        top = max(row)
        ex = [math.exp(x - top) for x in row]
        out[q.id] = tuple(round(e / sum(ex), 6) for e in ex)
    return out


def _rows(
    spec: VariantSpec,
    queries: list[Query],
    outs: list[Any],
    walls: list[float],
    n_params: int,
    *,
    probs: dict | None = None,
) -> list[ResponseRow]:
    rows = []
    for q, o, w in zip(queries, outs, walls):
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=o.text,
                answer_key=answer_key(q, o.text),
                correct=q.grade(o.text),
                answer_logprob=float(sum(o.token_logprobs)) if o.token_logprobs else float("nan"),
                option_probs=(probs or {}).get(q.id),
                n_prompt_tokens=len(o.prompt_ids),
                n_gen_tokens=len(o.token_ids),
                cost_flops=flop_cost(n_params, len(o.prompt_ids), len(o.token_ids)),
                wall_s=round(w, 6),
            )
        )
    return rows


def _greedy_rows(
    spec: VariantSpec,
    model: Any,
    tok: Any,
    queries: list[Query],
    prompts: list[str],
    opts: BuildOptions,
    *,
    engine: str | None = None,
    stop_strings: Sequence[str] = (),
    mc: bool = True,
) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    outs, walls = _generate(model, tok, prompts, opts, engine=engine, stop_strings=stop_strings, desc=spec.id)
    probs = _option_probs(model, tok, queries, prompts, opts) if mc else {}
    return _rows(spec, queries, outs, walls, flop_params(model), probs=probs)


def _fewshot_prompts(tok: Any, queries: list[Query], shots: int, seed: int, *, base: bool) -> list[str]:
    defs = {d.name: d for suite in ZOO_SUITES.values() for d in suite}  # every suite's tasks, not only mixed's
    pools = {t: _shot_pool(defs[t], seed) for t in {q.task for q in queries}}
    prompts = []
    for q in queries:
        chosen = _shots(q, pools[q.task], shots, seed)
        if base:
            prompts.append(_base_prompt(q, chosen))
        else:
            prompts.append(_chat(tok, q.prompt, [(s.prompt + q.suffix, s.target) for s in chosen]))
    return prompts


def _run_sc(spec: VariantSpec, model: Any, tok: Any, queries: list[Query], opts: BuildOptions) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    k = int(spec.params.get("samples", 5))
    temp = float(spec.params.get("temperature", 0.7))
    if k < 1 or not temp > 0:
        raise ValueError(f"self-consistency needs samples >= 1 and temperature > 0, got {k}, {temp}")
    prompts = [_chat(tok, q.prompt) for q in queries]
    outs, walls = _generate(
        model, tok, [p for p in prompts for _ in range(k)], opts, do_sample=True, temperature=temp, desc=spec.id
    )
    n_params = flop_params(model)
    rows = []
    for j, q in enumerate(queries):
        samples = outs[j * k : (j + 1) * k]
        keys = [answer_key(q, s.text) for s in samples]
        votes = Counter(key for key in keys if key is not None)
        if votes:
            best = max(votes.values())
            winner = next(key for key in keys if key is not None and votes[key] == best)  # ties: first seen
            rep = samples[keys.index(winner)]
        else:
            rep = samples[0]
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=rep.text,
                answer_key=answer_key(q, rep.text),
                correct=q.grade(rep.text),
                answer_logprob=float(sum(rep.token_logprobs)) if rep.token_logprobs else float("nan"),
                n_prompt_tokens=len(rep.prompt_ids),
                n_gen_tokens=sum(len(s.token_ids) for s in samples),
                cost_flops=sum(flop_cost(n_params, len(s.prompt_ids), len(s.token_ids)) for s in samples),
                wall_s=round(sum(walls[j * k : (j + 1) * k]), 6),
            )
        )
    return rows


def _run_pot(spec: VariantSpec, model: Any, tok: Any, queries: list[Query], opts: BuildOptions) -> list[ResponseRow]:
    from lmlab.core.inference.models import flop_params

    prompts = [_chat(tok, POT_INSTRUCTION.format(q=q.example.prompt)) for q in queries]  # no answer suffix
    outs, walls = _generate(
        model, tok, prompts, opts, max_new_tokens=int(spec.params.get("max_new_tokens", 24)), desc=spec.id
    )
    n_params = flop_params(model)
    rows = []
    for q, o, w in zip(queries, outs, walls):
        expr = extract_expression(o.text)
        if expr is None:
            answer, key, correct = f"[no program] {o.text}", None, 0.0
        else:
            value = _format_value(safe_eval(expr))
            answer, key, correct = f"{expr} = {value}", answer_key(q, value), q.grade(value)
        rows.append(
            ResponseRow(
                variant=spec.id,
                query_id=q.id,
                task=q.task,
                tags=q.tags,
                answer=answer,
                answer_key=key,
                correct=correct,
                answer_logprob=float(sum(o.token_logprobs)) if o.token_logprobs else float("nan"),
                n_prompt_tokens=len(o.prompt_ids),
                n_gen_tokens=len(o.token_ids),
                cost_flops=flop_cost(n_params, len(o.prompt_ids), len(o.token_ids)),
                wall_s=round(w, 6),
            )
        )
    return rows


def _corpus_windows(tok: Any, split: str, n: int, seq_len: int, seed: int, *, random_windows: bool) -> Any:
    """(n, seq_len) token windows of the `corpus` suite's `split`: random (calibration) or consecutive (scoring)."""
    from lmlab.core.pruning.evaluate import calibration_windows, eval_windows, token_stream

    stream = token_stream(tok, [e.prompt for e in lmdata.load("corpus", None, seed=seed, split=split)])
    if random_windows:
        return calibration_windows(stream, n, seq_len, seed=seed)
    return eval_windows(stream, n, seq_len)


def _zero_weights(model: Any) -> int:
    linears = [m for layer in model.model.layers for m in layer.modules() if type(m).__name__ == "Linear"]
    return sum(int((m.weight == 0).sum()) for m in linears)


def _pruned_model(spec: VariantSpec, model: Any, tok: Any, seed: int) -> tuple[Any, dict[str, Any]]:
    """A Wanda-pruned copy: one sparsity for every block (`wanda`), or ATP's arithmetic progression (`atp`).

    For `atp` the common difference beta is chosen as in `lmlab.methods.compression.atp` (`search_beta`: the grid
    walked upward with patience, lowest validation perplexity on the corpus dev split wins; beta = 0 is uniform, so
    the variant falls back to uniform Wanda when no beta helps).
    """
    from lmlab.methods.compression.wanda import wanda_prune

    sparsity = float(spec.params.get("sparsity", 0.5))
    if not 0.0 < sparsity < 1.0:
        raise ValueError(f"sparsity must be in (0, 1), got {sparsity}")
    seq_len = int(spec.params.get("calib_seqlen", 128))
    calib = _corpus_windows(tok, "train", int(spec.params.get("n_calib", 8)), seq_len, seed, random_windows=True)
    extra: dict[str, Any] = {"calib_windows": list(calib.shape)}

    def prune(rates: float | list[float]) -> Any:
        pruned = _full_copy(model)
        wanda_prune(pruned, calib, rates, "unstructured", track_dense=False)
        return pruned.eval()

    if spec.kind == "wanda":
        pruned = prune(sparsity)
    else:
        from lmlab.core.pruning.evaluate import window_nll
        from lmlab.methods.compression.atp.method import max_beta, search_beta

        val = _corpus_windows(tok, "dev", int(spec.params.get("n_val", 8)), seq_len, seed, random_windows=False)
        n_blocks = len(model.model.layers)
        betas = [float(b) for b in spec.params.get("betas", [0.0, 0.008, 0.016, 0.024])]
        bound = max_beta(n_blocks, sparsity)
        illegal = [b for b in betas if b > bound + 1e-12]
        if illegal:
            raise ValueError(
                f"betas {illegal} exceed beta_max={bound:.4f} for {n_blocks} blocks at sparsity {sparsity}"
            )
        best: dict[str, Any] = {}

        def evaluate(rates: list[float]) -> float:
            candidate = prune(rates)
            nll = window_nll(candidate, val)
            ppl = math.exp(sum(nll) / len(nll))
            if not best or ppl < best["ppl"]:
                best.update(ppl=ppl, model=candidate)
            else:
                del candidate
            return ppl

        search = search_beta(evaluate, n_blocks, sparsity, betas, patience=int(spec.params.get("patience", 1)))
        pruned = best["model"]
        extra.update(
            beta=search.best_beta,
            beta_search=[{"beta": r["beta"], "val_ppl": round(r["val_ppl"], 3)} for r in search.table],
            block_sparsity_first_last=[round(search.sparsities[0], 4), round(search.sparsities[-1], 4)],
        )
    extra["pruned_zero_weights"] = _zero_weights(pruned)
    return pruned, extra


def _lora_items(family: str, seed: int, max_items: int = 96) -> list[tuple[Example, str]]:
    """(train-split example, prompt suffix) of one task family of `MIXED_TASKS`, at most `max_items`, balanced."""
    tasks = {"arithmetic": ("arith1", "arith2"), "geography": ("capital", "currency", "continent")}
    if family in tasks:
        per = max(1, max_items // len(tasks[family]))
        return [(e, d.suffix) for d in MIXED_TASKS if d.name in tasks[family] for e in _shot_pool(d, seed, per)]
    raise ValueError(f"family must be 'arithmetic' or 'geography', got {family!r}")


def _lora_model(spec: VariantSpec, model: Any, tok: Any, seed: int) -> tuple[Any, dict[str, Any]]:
    """Train a LoRA (peft, on the top `train_layers` blocks over a cached frozen trunk) and merge it into a copy."""
    import torch
    from peft import LoraConfig

    from lmlab.core.inference.scoring import _pad_id
    from lmlab.core.training.lora import PaddedCache, index_batches, train_steps
    from lmlab.core.training.partial import FrozenTrunk, policy_model, response_token_logps
    from lmlab.core.training.preference import weighted_sft_loss
    from lmlab.core.training.sft import encode_sequences

    p = spec.params
    items = _lora_items(str(p.get("family")), seed, int(p.get("max_items", 96)))
    n_layers = len(model.model.layers)
    k = min(int(p.get("train_layers", 4)), n_layers)
    trunk = FrozenTrunk(model, k)
    eos = tok.eos_token or ""
    seqs = encode_sequences(tok, [_chat(tok, e.prompt + s) for e, s in items], [e.target + eos for e, _ in items])
    cache = PaddedCache(trunk, seqs, _pad_id(tok))
    lora = LoraConfig(
        r=int(p.get("rank", 8)),
        lora_alpha=float(p.get("alpha", 16.0)),
        target_modules=list(p.get("targets", ["q_proj", "v_proj"])),
        lora_dropout=0.0,
        bias="none",
    )
    torch.manual_seed(seed)
    policy = trunk.top_k(train_norm=False, lora=lora)

    def loss_fn(pol: Any, batch: list[int]) -> torch.Tensor:
        sub, tm = cache.batch(batch)
        return weighted_sft_loss(response_token_logps(pol, sub, tm), tm, reduction="mean")

    steps, batch = int(p.get("steps", 200)), int(p.get("batch", 4))
    losses = train_steps(policy, loss_fn, index_batches(len(seqs), steps, batch, seed), float(p.get("lr", 1e-3)))
    merged = policy_model(model, policy)
    for key in ("_lmlab_engines", "_lmlab_flop_params"):
        merged.__dict__.pop(key, None)
    return merged, {
        "train_items": len(items),
        "train_layers": k,
        "loss_first": round(losses[0], 4),
        "loss_last": round(float(sum(losses[-10:]) / len(losses[-10:])), 4),
    }


def run_variant(
    spec: VariantSpec, queries: list[Query], opts: BuildOptions | None = None
) -> tuple[list[ResponseRow], dict[str, Any]]:
    """Build `spec`'s model, answer every query, grade and cost it; (rows, description for the cache header)."""
    from lmlab.core.inference.models import flop_params, load_model

    opts = opts or BuildOptions()
    if not queries:
        raise ValueError("queries is empty; expected at least one query")
    t0 = time.perf_counter()
    base, tok = load_model(spec.model)
    desc = spec.describe()
    model = base
    extra: dict[str, Any] = {}
    kind = spec.kind
    if kind == "zeroshot":
        rows = _greedy_rows(spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts)
    elif kind == "fewshot":
        prompts = _fewshot_prompts(tok, queries, int(spec.params.get("shots", 3)), opts.seed, base=False)
        rows = _greedy_rows(spec, model, tok, queries, prompts, opts)
    elif kind == "base_fewshot":
        prompts = _fewshot_prompts(tok, queries, int(spec.params.get("shots", 3)), opts.seed, base=True)
        rows = _greedy_rows(spec, model, tok, queries, prompts, opts, stop_strings=("\n",))
    elif kind == "sc":
        rows = _run_sc(spec, model, tok, queries, opts)
    elif kind == "pot":
        rows = _run_pot(spec, model, tok, queries, opts)
    elif kind == "int4":
        rows = _greedy_rows(
            spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts, engine="fast-int4", mc=False
        )
        from lmlab.core.inference.generation import resolve_engine

        extra["engine"] = "fast-int4" if resolve_engine(model, "fast-int4") is not None else "hf (int4 unsupported)"
    elif kind in ("trunc", "wanda", "atp", "lora"):
        if kind == "trunc":
            model = truncated_model(base, int(spec.params.get("layers", 10)))
        elif kind in ("wanda", "atp"):
            model, extra = _pruned_model(spec, base, tok, opts.seed)
        else:
            model, extra = _lora_model(spec, base, tok, opts.seed)
        rows = _greedy_rows(spec, model, tok, queries, [_chat(tok, q.prompt) for q in queries], opts)
    else:  # pragma: no cover - resolve_variants checks the kind
        raise ValueError(f"unknown kind {kind!r}")
    desc.update(extra)
    desc["flop_params"] = int(flop_params(model))
    desc["build_s"] = round(time.perf_counter() - t0, 2)
    if model is not base:
        del model
        gc.collect()
    return rows, desc


__all__ = ["BuildOptions", "run_variant", "truncated_model"]
