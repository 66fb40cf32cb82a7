"""``lmlab prune``: prune any HF folder or alias with any of lmlab's pruners and write a standard HF folder.

    lmlab prune --model smollm2-135m --method wanda --sparsity 0.5 --out pruned/smollm2-wanda50
    lmlab prune --model DIR --method sparsegpt --structure 2:4 --calib my_text.txt --out DIR2
    lmlab prune --model smollm2 --method atp --sparsity 0.7 --out DIR3          # beta searched on validation
    lmlab run rsd --model pruned/smollm2-wanda50                                # any method takes the result

Methods: ``magnitude``, ``wanda``, ``sparsegpt`` (the shared engine `lmlab.core.pruning.prune_model`), ``owl``
(Wanda with OWL's outlier-weighted per-block sparsities), ``atp`` (Wanda with ATP's arithmetic-progression per-block
sparsities; beta given with ``--beta`` or searched on held-out windows of the calibration text, as `lmlab run atp`
does) and ``maiht`` (the mAIHT solver as the engine's per-layer prune function). The output folder holds the model
(fp32 safetensors, config, tokenizer; zeros stored densely), ``lmlab_pruning.json`` (measured sparsity and the
command's settings), ``sparsity_report.json`` (per linear and per block) and ``sparsity_report.md`` (a readable
table). It is written into a temporary sibling and renamed into place, so a failed prune leaves nothing behind.

Every argument is checked before the model is loaded: a bad value exits with one line naming it (exit 2).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

METHODS = ("magnitude", "wanda", "sparsegpt", "owl", "atp", "maiht")


def add_parser(sub: Any) -> None:
    """The ``prune`` subcommand on the CLI's subparsers."""
    p = sub.add_parser("prune", help="prune a model (wanda, sparsegpt, magnitude, owl, atp, maiht) into an HF folder")
    p.add_argument(
        "--model", default="smollm2-135m", help="alias (lmlab models), HF folder, file.gguf or DIR::file.gguf"
    )
    p.add_argument("--method", required=True, help=f"one of {', '.join(METHODS)}")
    p.add_argument("--sparsity", type=float, default=0.5, help="mean sparsity in [0, 1) (N/M with --structure)")
    p.add_argument("--structure", default="unstructured", help="'unstructured' or N:M (prune N of every M), e.g. 2:4")
    p.add_argument("--calib", default="corpus", help="calibration text: a .txt file or a data suite (default corpus)")
    p.add_argument("--n-calib", dest="n_calib", type=int, default=32, help="calibration windows")
    p.add_argument("--seqlen", type=int, default=128, help="tokens per calibration window")
    p.add_argument("--beta", type=float, default=None, help="atp: the common difference (default: searched)")
    p.add_argument("--owl-m", dest="owl_m", type=float, default=5.0, help="owl: outlier threshold M")
    p.add_argument("--owl-lambda", dest="owl_lambda", type=float, default=0.08, help="owl: max deviation lambda")
    p.add_argument("--seed", type=int, default=0, help="seed of the calibration windows")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", required=True, help="output folder (must not exist)")
    p.add_argument("--no-progress", dest="no_progress", action="store_true")
    p.set_defaults(func=cmd_prune)


def check_args(args: argparse.Namespace) -> tuple[int, int] | None:
    """Validate every argument without loading anything; returns the parsed N:M structure (None = unstructured)."""
    from lmlab.core.inference.models import resolve_model
    from lmlab.core.pruning.masks import parse_mask_structure

    if args.method not in METHODS:
        raise ValueError(f"--method {args.method!r}: expected one of {', '.join(METHODS)}")
    nm = parse_mask_structure(None if args.structure == "unstructured" else args.structure)
    if nm is None and not 0.0 <= args.sparsity < 1.0:
        raise ValueError(f"--sparsity {args.sparsity}: expected a fraction in [0, 1)")
    if nm is not None and args.method in ("owl", "atp"):
        raise ValueError(f"--method {args.method} allocates per-block unstructured sparsity; --structure {nm[0]}:"
                         f"{nm[1]} fixes it at N/M: use wanda, sparsegpt, magnitude or maiht")  # fmt: skip
    if args.beta is not None and args.method != "atp":
        raise ValueError(f"--beta {args.beta} is ATP's common difference: it needs --method atp")
    if args.beta is not None and not math.isfinite(args.beta):  # abs(nan) > bound is False: NaN rates
        raise ValueError(f"--beta {args.beta}: expected a finite common difference")
    if not (math.isfinite(args.owl_m) and args.owl_m > 0):
        raise ValueError(f"--owl-m {args.owl_m}: expected a finite outlier threshold > 0 (OWL's default 5)")
    if not (math.isfinite(args.owl_lambda) and args.owl_lambda >= 0):
        raise ValueError(f"--owl-lambda {args.owl_lambda}: expected a finite deviation >= 0 (OWL's default 0.08)")
    if args.method == "owl" and args.sparsity + args.owl_lambda >= 1.0:  # OWL's blocks span sparsity +- lambda
        raise ValueError(f"--owl-lambda {args.owl_lambda}: with --sparsity {args.sparsity} a block would be pruned "
                         f"to {args.sparsity + args.owl_lambda:g}; expected sparsity + lambda < 1")  # fmt: skip
    if args.threads is not None and not 1 <= args.threads <= 4096:  # 0 was taken as 'no setting'
        raise ValueError(f"--threads {args.threads}: expected an integer in [1, 4096]")
    if not 0 <= args.seed < 2**32:
        raise ValueError(f"--seed {args.seed}: expected an integer in [0, 2**32)")
    if args.n_calib < 1 or args.seqlen < 2:
        raise ValueError(f"--n-calib {args.n_calib} / --seqlen {args.seqlen}: expected >= 1 windows of >= 2 tokens")
    out = Path(args.out)
    if out.exists():
        raise ValueError(f"--out {str(out)!r} already exists: lmlab never overwrites a model folder")
    parent = out.resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ValueError(f"--out {str(out)!r}: {str(parent)!r} is not a writable folder")
    if args.calib.endswith(".txt"):
        if not Path(args.calib).is_file():
            raise ValueError(f"--calib {args.calib!r}: no such file (expected a .txt file or a data suite name)")
    else:
        from lmlab import data

        names = [suite.name for suite in data.list_suites()]
        if args.calib not in names:
            raise ValueError(
                f"--calib {args.calib!r}: not a .txt file nor a suite (expected one of {', '.join(names)})"
            )
    resolve_model(args.model)
    return nm


def _calibration_text(args: argparse.Namespace) -> list[str]:
    if args.calib.endswith(".txt"):
        text = Path(args.calib).read_text()
        paragraphs = [p for p in text.split("\n\n") if p.strip()]
        return paragraphs or [text]
    from lmlab import data

    examples = data.load(args.calib, None, seed=args.seed, split="train")
    return [str(getattr(e, "prompt", None) or getattr(e, "text", None) or e) for e in examples]


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="prune", unit="block", leave=False)


def prune(args: argparse.Namespace, nm: tuple[int, int] | None) -> dict[str, Any]:
    """Load, calibrate, prune and write; returns the report dict (also written as sparsity_report.json)."""
    import copy

    import torch

    from lmlab.core.inference.models import load_model
    from lmlab.core.pruning import (
        calibration_windows,
        decoder_blocks,
        model_sparsity,
        owl_sparsities,
        prune_model,
        save_pruned,
        token_stream,
        window_nll,
    )
    from lmlab.core.stats.seeding import set_seed, set_threads
    from lmlab.runner import progress_enabled

    set_seed(args.seed)
    if args.threads:
        set_threads(args.threads)
    model, tok = load_model(args.model, fresh=True)  # pruned in place: never the shared in-process instance
    stream = token_stream(tok, _calibration_text(args))
    # ATP's beta search scores held-out windows: the stream's tail, disjoint from the calibration windows
    n_val = max(4, args.n_calib // 4) if args.method == "atp" and args.beta is None else 0
    need = (args.n_calib + n_val) * args.seqlen
    if stream.numel() < need + args.seqlen:
        raise ValueError(
            f"--calib {args.calib!r} gives {stream.numel()} tokens; {args.n_calib + n_val} windows of {args.seqlen} "
            f"need {need} (lower --n-calib or --seqlen)"
        )
    val_tokens = n_val * args.seqlen
    calib_stream = stream[: stream.numel() - val_tokens] if val_tokens else stream
    calib = calibration_windows(calib_stream, args.n_calib, args.seqlen, seed=args.seed)
    n_blocks = len(decoder_blocks(model))
    method: Any = args.method
    sparsity: Any = nm[0] / nm[1] if nm else args.sparsity
    info: dict[str, Any] = {"command": "lmlab prune", "model": args.model, "method": args.method,
                            "structure": args.structure, "calib": args.calib, "n_calib": args.n_calib,
                            "seqlen": args.seqlen, "seed": args.seed}  # fmt: skip
    if args.method == "owl":
        alloc = owl_sparsities(model, calib, args.sparsity, m=args.owl_m, lmbda=args.owl_lambda)
        method, sparsity = "wanda", list(alloc.sparsities)
        info.update(owl_m=args.owl_m, owl_lambda=args.owl_lambda)
    elif args.method == "atp":
        from lmlab.methods.compression.atp.method import beta_grid, layer_sparsities, search_beta

        if args.beta is not None:
            beta = args.beta
            layer_sparsities(n_blocks, args.sparsity, beta)  # an illegal beta fails here, before any pruning
        else:  # the beta walk of `lmlab run atp`: Wanda prunes of a copy, scored on held-out windows
            val = stream[stream.numel() - val_tokens :].reshape(n_val, args.seqlen)

            def evaluate(rates: list[float]) -> float:
                trial = copy.deepcopy(model)
                prune_model(trial, calib, method="wanda", sparsity=rates, track_dense=False)
                return float(torch.tensor(window_nll(trial, val)).mean().exp())

            found = search_beta(evaluate, n_blocks, args.sparsity, beta_grid(n_blocks, args.sparsity, 0.004), 1)
            beta = found.best_beta
            info["beta_search"] = found.table
        method, sparsity = "wanda", layer_sparsities(n_blocks, args.sparsity, beta)
        info["beta"] = beta
    elif args.method == "maiht":
        from lmlab.methods.compression.maiht.experiment import maiht_prune_fn

        method = maiht_prune_fn()
    bar = _progress(n_blocks, progress_enabled(False if args.no_progress else None))
    last = [-1]

    def on_layer(rec: Any, stats: Any, old: Any, new: Any) -> None:
        if bar is not None and rec.block != last[0]:
            if last[0] >= 0:
                bar.update(1)
            last[0] = rec.block
            bar.set_postfix_str(f"block {rec.block}")

    try:
        report = prune_model(model, calib, method=method, sparsity=sparsity, track_dense=False, on_layer=on_layer,
                             mask_structure="unstructured" if nm is None else f"{nm[0]}:{nm[1]}")  # fmt: skip
    finally:
        if bar is not None:
            bar.update(n_blocks - bar.n)
            bar.close()
    result = {**report.to_dict(), "settings": info, "measured": model_sparsity(model)}
    result["method"] = args.method
    out = Path(args.out)
    # the parents this prune creates go again if the write fails: a failed prune leaves no folder at all
    created = [p for p in reversed(out.absolute().parents) if not p.exists()]
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_pruned(model, tok, tmp, info=info)
        (tmp / "sparsity_report.json").write_text(json.dumps(result, indent=2, default=str))
        (tmp / "sparsity_report.md").write_text(report_markdown(result))
        os.replace(tmp, out)
    except OSError as e:  # a full disk, a read-only folder: one line naming --out (exit 1), nothing left behind
        from lmlab.results import write_error

        shutil.rmtree(tmp, ignore_errors=True)
        for parent in reversed(created):
            with contextlib.suppress(OSError):
                parent.rmdir()  # only if still empty
        raise write_error(out, e) from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def report_markdown(result: dict[str, Any]) -> str:
    """The per-block and per-linear sparsity of a prune as markdown tables."""
    lines = [
        f"# {result['method']} at mean sparsity {result['sparsity']:.4f} ({result['mask_structure']})",
        "",
        f"{result['n_params']:,} weights in the blocks' linears; {result['n_calib_tokens']:,} calibration tokens; "
        f"{result['seconds']:.1f} s.",
        "",
        "| block | linear | shape | target | measured | relative reconstruction error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["layers"]:
        shape = "x".join(map(str, r.get("shape", ())))
        err = r.get("rel_recon_error")
        lines.append(f"| {r['block']} | {r['name']} | {shape} | {r['target_sparsity']:.4f} | {r['sparsity']:.4f} | "
                     f"{'-' if err is None else f'{err:.4g}'} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def cmd_prune(args: argparse.Namespace) -> int:
    nm = check_args(args)
    result = prune(args, nm)
    print(f"pruned {args.model} with {args.method}: mean sparsity {result['sparsity']:.4f} over "
          f"{result['n_params']:,} weights -> {args.out} (report: sparsity_report.md)")  # fmt: skip
    return 0


__all__ = ["METHODS", "add_parser", "check_args", "cmd_prune", "prune", "report_markdown"]
