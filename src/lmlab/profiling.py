"""Where `lmlab reproduce` spends its time: py-spy stacks bucketed by method and by phase.

A sampling profile needs no timers inside the methods: record a whole reproduction with py-spy's raw (collapsed)
output, then bucket every sample by

- **method**: the outermost frame inside ``lmlab/methods/<area>/<id>/`` (samples outside any method folder, such
  as the runner, the report or imports before the first method, go to ``(runner)``);
- **phase**: the innermost frame that names one, walking from the leaf towards the root, so a forward pass inside
  scoring counts as scoring and a decode inside an RL loop as generation:

  ======================  =====================================================================================
  ``load``                `lmlab.core.inference.models` (load, GGUF dequantisation, the verified cache), transformers'
                          ``from_pretrained``, safetensors
  ``generation``          `lmlab.core.inference.generation`, the fast engine (`lmlab.core.inference.engine`),
  transformers' generate
  ``training``            autograd's backward, torch optimisers, `lmlab.core.training.pretrain` / `sft` / `preference`
  /
                          `lora` / `federated`, peft, flwr
  ``pruning``             `lmlab.core.pruning` (calibration passes and the solvers)
  ``scoring``             `lmlab.core.inference.scoring`, `lmlab.core.training.partial`, `lmlab.core.inference.embed`,
  `lmlab.core.inference.hooks`
  ``sandbox``             `lmlab.core.execution.sandbox` (waiting on children is idle time and not sampled)
  ``report``              plotting, reporting, matplotlib, `lmlab.core.stats.uncertainty`
  ``import``              module import (frames of importlib's bootstrap)
  ``other``               everything else: the method's own code and numpy / torch calls made directly from it
  ======================  =====================================================================================

py-spy's raw format is one line per distinct stack: ``frame;frame;...;frame COUNT``, root first, each frame
``function (path/to/file.py:line)``. Usage::

    py-spy record --format raw -r 20 -o prof.txt -- python -m lmlab reproduce --quick --all
    python -m lmlab.profiling prof.txt          # a Markdown table: seconds per method x phase
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

PHASES: tuple[str, ...] = (
    "load",
    "generation",
    "training",
    "pruning",
    "scoring",
    "sandbox",
    "report",
    "import",
    "other",
)
RUNNER = "(runner)"

# (phase, pattern on the frame text); the first pattern that matches a frame names its phase
_PHASE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (phase, re.compile(pattern))
    for phase, pattern in (
        ("load", r"lmlab/core/inference/(models\.py|engine/gguf_file\.py)|from_pretrained|safetensors/"),
        ("generation", r"lmlab/core/inference/(generation\.py|engine/)|generation/utils\.py"),
        (
            "training",
            r"torch/autograd/|^backward \(.*torch/_tensor\.py|torch/optim/|lmlab/core/training/(pretrain|sft|"
            r"preference|lora)\.py|lmlab/core/federated/|/peft/|/flwr/",
        ),
        ("pruning", r"lmlab/core/pruning/"),
        ("scoring", r"lmlab/core/(inference/(scoring|embed|hooks)|training/partial)\.py"),
        ("sandbox", r"lmlab/core/execution/sandbox\.py"),
        ("report", r"lmlab/core/(report/(plotting|reporting)|stats/uncertainty)\.py|/matplotlib/|lmlab/results\.py"),
        ("import", r"<frozen importlib\._bootstrap|importlib/_bootstrap"),
    )
)
_METHOD = re.compile(r"lmlab/methods/[a-z_]+/([a-z0-9_]+)/")
_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def parse_raw(lines: Iterable[str]) -> list[tuple[list[str], int]]:
    """``[(frames root -> leaf, samples), ...]`` from py-spy's raw output; a malformed line raises ValueError."""
    stacks = []
    for n, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m is None:
            raise ValueError(f"line {n} is not py-spy raw output ('frame;frame;... COUNT'): {line[:80]!r}")
        stacks.append((m["stack"].split(";"), int(m["count"])))
    return stacks


def classify(frames: list[str]) -> tuple[str, str]:
    """(method id or ``(runner)``, phase) of one stack, ``frames`` root first."""
    method = next((m.group(1) for f in frames if (m := _METHOD.search(f))), RUNNER)
    for frame in reversed(frames):
        for phase, pattern in _PHASE_PATTERNS:
            if pattern.search(frame):
                return method, phase
    return method, "other"


def bucket(stacks: Iterable[tuple[list[str], int]], rate_hz: float) -> dict[str, dict[str, float]]:
    """Seconds per method and phase (`rate_hz`: py-spy's sampling rate, ``-r``)."""
    if not rate_hz > 0:
        raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
    out: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(PHASES, 0.0))
    for frames, count in stacks:
        method, phase = classify(frames)
        out[method][phase] += count / rate_hz
    return dict(out)


def format_table(table: dict[str, dict[str, float]]) -> str:
    """A Markdown table, methods by total time (descending), with each phase's seconds and a total row."""
    rows = sorted(table.items(), key=lambda kv: -sum(kv[1].values()))
    totals = {p: sum(t[p] for _, t in rows) for p in PHASES}
    grand = sum(totals.values())
    head = "| method | total s | " + " | ".join(PHASES) + " |"
    lines = [head, "| --- " * (len(PHASES) + 2) + "|"]
    for method, t in [*rows, ("**all**", totals)]:
        total = sum(t.values())
        lines.append(f"| {method} | {total:.1f} | " + " | ".join(f"{t[p]:.1f}" for p in PHASES) + " |")
    shares = " | ".join(f"{100 * totals[p] / grand:.0f}%" if grand else "-" for p in PHASES)
    lines.append(f"| share | 100% | {shares} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or len(args) > 2:
        print("usage: python -m lmlab.profiling RAW_FILE [RATE_HZ=20]", file=sys.stderr)
        return 2
    path = Path(args[0])
    if not path.is_file():
        print(f"error: {str(path)!r} is not a file (expected py-spy --format raw output)", file=sys.stderr)
        return 2
    try:
        rate = float(args[1]) if len(args) == 2 else 20.0
        table = bucket(parse_raw(path.read_text().splitlines()), rate)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
