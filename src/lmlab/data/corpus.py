"""An offline corpus of human-written English: the Python standard library's docstrings (plus optional system texts).

Task: none; ``Example.prompt`` is a passage of text and ``target`` is ``""``. For text statistics, perplexity and
calibration sets (`corpus_text` gives one long string).

Metric: none. `grade` returns 1.0 for any non-empty output, so generic harnesses run; it measures nothing.

Data (``sources``):
    - ``"stdlib"`` (default): docstrings of the CPython standard library of the running interpreter. For every name
      in ``sys.stdlib_module_names`` that is public (no leading underscore) and not in `SKIP_MODULES` (modules with
      side effects on import, such as ``antigravity``, ``this``, ``tkinter``, ``turtle``, ``idlelib``, ``readline``,
      test packages, and deprecated ones like ``distutils``), the module is imported in a separate, isolated
      interpreter (``python -I -S``: no site-packages, no environment, no current directory, so nothing installed
      or monkeypatched can change the text), and we take the module docstring, then the own docstrings
      (``obj.__doc__``, never inherited ones) of its public functions and classes defined in it, and of those
      classes' public methods and properties, all in sorted name order. Modules that fail to import are skipped.
      One document per module, named ``stdlib:<module>``.
    - ``"licenses"`` (opt-in): Debian's ``/usr/share/common-licenses/*`` (GPL, Apache-2.0, ...; symlinks
      deduplicated), one document per file, ``license:<name>``.
    - ``"python_docs"`` (opt-in): README and policy texts under ``/usr/share/doc/python3*/`` (``README*``,
      ``python-policy.txt*``; gzipped ones decompressed; identical copies deduplicated), ``pydoc:<dir>/<file>``.

Reproducibility: the ``"stdlib"`` pool is a function of the Python version (``meta["python"]`` records
``sys.version_info[:2]`` and ``meta["python_version"]`` the full version; a new minor or patch release rewrites
some docstrings) and of which optional C modules the
build has (``curses``, ``readline``, ``lzma``, ...). On two machines with the same CPython build the passages are
identical. The system sources depend on installed Debian packages, which is why they are off by default.

Splits: a document's split is a hash of its name and the seed (`lmlab.data.split_of`, 40/10/50), so train, dev and
test passages never come from the same module (and a paragraph repeated verbatim in several docstrings is kept
once); passages are then chunked within a document and ordered by a seeded shuffle. ``kind="prose"`` keeps only
paragraphs that read as English sentences (no code, doctest, signatures, tables or field lists) and joins their
wrapped lines; ``kind="all"`` keeps every paragraph verbatim.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

from lmlab.data import (
    Example,
    check_choice,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    seeded_rng,
    split_of,
)

KINDS: tuple[str, ...] = ("prose", "all")
SOURCES: tuple[str, ...] = ("stdlib", "licenses", "python_docs")

SKIP_MODULES: frozenset[str] = frozenset(
    {
        "antigravity",  # opens a web browser
        "this",  # prints the Zen of Python
        "idlelib",  # GUI
        "tkinter",  # GUI
        "turtle",  # GUI
        "turtledemo",  # GUI
        "test",  # the regression-test package: huge and not documentation
        "readline",  # may write terminal control sequences on import
        "lib2to3",  # writes grammar pickles next to itself on first import; deprecated
        "distutils",  # deprecated and removed in 3.12: would make the pool jump between versions
        "ensurepip",  # bundles wheels; no documentation to speak of
        "pydoc_data",  # the generated Sphinx topic index, not docstrings
    }
)

_LICENSE_DIR = Path("/usr/share/common-licenses")
_DOC_ROOT = Path("/usr/share/doc")

# Runs in a fresh `python -I -S` so that the harvested text depends on the interpreter build only.
_HARVEST = r"""
import contextlib, importlib, inspect, io, json, sys, warnings
skip = set(json.loads(sys.argv[1]))
out = {}
for name in sorted(sys.stdlib_module_names):
    if name.startswith("_") or name in skip:
        continue
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            mod = importlib.import_module(name)
    except BaseException:
        continue
    docs = []
    if isinstance(mod.__doc__, str) and mod.__doc__.strip():
        docs.append(inspect.cleandoc(mod.__doc__))
    for attr in sorted(vars(mod)):
        obj = vars(mod)[attr]
        if attr.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if getattr(obj, "__module__", None) != name:
            continue
        doc = getattr(obj, "__doc__", None)
        if isinstance(doc, str) and doc.strip():
            docs.append(inspect.cleandoc(doc))
        if inspect.isclass(obj):
            for meth in sorted(vars(obj)):
                member = vars(obj)[meth]
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if meth.startswith("_") or not (inspect.isroutine(member) or isinstance(member, property)):
                    continue
                doc = getattr(member, "__doc__", None)
                if isinstance(doc, str) and doc.strip():
                    docs.append(inspect.cleandoc(doc))
    out[name] = docs
sys.stdout.write(json.dumps(out, sort_keys=True))
"""


@lru_cache(maxsize=1)
def _stdlib_documents() -> tuple[tuple[str, str, str], ...]:
    """(name, source, text) per stdlib module, harvested once per process."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-W", "ignore", "-c", _HARVEST, json.dumps(sorted(SKIP_MODULES))],
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=300,
        check=False,
        env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"harvesting stdlib docstrings failed: {proc.stderr.strip()[-500:]}")
    data: dict[str, list[str]] = json.loads(proc.stdout)
    return tuple((f"stdlib:{mod}", "stdlib docstrings", "\n\n".join(docs)) for mod, docs in sorted(data.items()))


def _read_text(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


@lru_cache(maxsize=1)
def _system_documents() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """Debian license and Python documentation texts present on this machine (empty where absent)."""
    licenses: dict[str, tuple[str, str, str]] = {}
    if _LICENSE_DIR.is_dir():
        for path in sorted(_LICENSE_DIR.iterdir()):
            real = path.resolve()
            text = _read_text(real) if real.is_file() else None
            # GPL -> GPL-3 and the like: keep one document per real file, named after the real file.
            if text and real.name not in licenses:
                licenses[real.name] = (f"license:{real.name}", "debian common-licenses", text)
    docs: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    if _DOC_ROOT.is_dir():
        for folder in sorted(_DOC_ROOT.glob("python3*")):
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if not (path.name.startswith("README") or path.name.startswith("python-policy.txt")):
                    continue
                text = _read_text(path) if path.is_file() else None
                digest = hashlib.sha256(text.encode("utf-8")).hexdigest() if text else ""
                if text and digest not in seen:
                    seen.add(digest)
                    name = path.name.removesuffix(".gz")
                    docs.append((f"pydoc:{folder.name}/{name}", "debian /usr/share/doc/python3*", text))
    return {"licenses": tuple(licenses[k] for k in sorted(licenses)), "python_docs": tuple(docs)}


_STOPWORDS = frozenset(
    "the a an of to in is are be it that this for with as on by or and not from if at which can its when".split()
)
_CODE_LINE = re.compile(r"^(\s{2,}|>>>|\.\.\.|\$ |[-=~^*#+]{3,}\s*$|\|)")
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")
_FIELD = re.compile(r"^\s*(:\w+.*:|@\w+|\w[\w ]*:\s*$|[-*+] |\d+[.)] )")


def _is_prose(paragraph: str) -> bool:
    """Whether a paragraph reads as English sentences (a heuristic; errs on the side of dropping text)."""
    lines = paragraph.splitlines()
    if any(_CODE_LINE.match(line) for line in lines) or _SIGNATURE.match(lines[0].strip()):
        return False
    if sum(bool(_FIELD.match(line)) for line in lines) > 0:
        return False
    text = " ".join(line.strip() for line in lines)
    words = text.split()
    if len(words) < 8 or text[-1] not in ".!?" or text.rstrip(".").endswith(":"):
        return False
    chars = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in chars)
    if letters / len(chars) < 0.85 or text.count("`") > 4 or "::" in text:
        return False
    # Real sentences are full of function words; identifier lists and tables are not.
    stop = sum(w.lower().strip(",.;:()") in _STOPWORDS for w in words)
    return stop / len(words) >= 0.12


def _paragraphs(text: str, kind: str) -> list[str]:
    out = []
    for block in re.split(r"\n\s*\n", text.replace("\r\n", "\n")):
        block = block.strip("\n").rstrip()
        if not block.strip():
            continue
        if kind == "prose":
            if not _is_prose(block):
                continue
            # Docstrings are hard-wrapped at ~72 columns; prose reads better (and tokenizes naturally) reflowed.
            block = " ".join(block.split())
        out.append(block)
    return out


def _split_long(paragraph: str, max_chars: int) -> list[str]:
    """Cut an over-long paragraph at sentence ends, then at spaces, so every piece is at most `max_chars`."""
    pieces: list[str] = []
    current = ""
    for sentence in re.split(r"(?<=[.!?])\s+", paragraph):
        while len(sentence) > max_chars:
            cut = sentence.rfind(" ", 0, max_chars + 1)
            cut = cut if cut > 0 else max_chars
            head, sentence = sentence[:cut].rstrip(), sentence[cut:].lstrip()
            if current:
                pieces.append(current)
                current = ""
            pieces.append(head)
        if current and len(current) + 1 + len(sentence) > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}" if current else sentence
    if current:
        pieces.append(current)
    return pieces


def _chunks(paragraphs: list[str], min_chars: int, max_chars: int) -> list[str]:
    """Greedily pack consecutive paragraphs (joined by a blank line) into passages of `min_chars`..`max_chars`."""
    passages: list[str] = []
    current = ""
    for para in paragraphs:
        for piece in _split_long(para, max_chars) if len(para) > max_chars else [para]:
            if current and len(current) + 2 + len(piece) > max_chars:
                passages.append(current)
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
    if current:
        passages.append(current)
    return [p for p in passages if len(p) >= min_chars]


def _documents(sources: tuple[str, ...]) -> list[tuple[str, str, str]]:
    docs: list[tuple[str, str, str]] = []
    if "stdlib" in sources:
        docs.extend(_stdlib_documents())
    system = _system_documents() if any(s != "stdlib" for s in sources) else {}
    for source in ("licenses", "python_docs"):
        if source in sources:
            docs.extend(system[source])
    return sorted(docs)


@lru_cache(maxsize=32)
def _passages(
    sources: tuple[str, ...], kind: str, min_chars: int, max_chars: int
) -> tuple[tuple[str, str, int, str], ...]:
    """(document, source, index in document, passage) for every passage, in document order.

    A paragraph repeated verbatim (``json.dump`` and ``json.dumps`` share most of their docstring) is kept only at
    its first occurrence in sorted document order, so no paragraph is in two splits.
    """
    seen: set[str] = set()
    out = []
    for name, source, text in _documents(sources):
        paragraphs = []
        for para in _paragraphs(text, kind):
            key = " ".join(para.split())
            if key not in seen:
                seen.add(key)
                paragraphs.append(para)
        for i, passage in enumerate(_chunks(paragraphs, min_chars, max_chars)):
            out.append((name, source, i, passage))
    return tuple(out)


def _check_args(
    kind: str, min_chars: int, max_chars: int, sources: tuple[str, ...] | list[str] | str
) -> tuple[str, ...]:
    check_choice("kind", kind, KINDS)
    if isinstance(min_chars, bool) or not isinstance(min_chars, int) or min_chars < 1:
        raise ValueError(f"min_chars must be an int >= 1, got {min_chars!r}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < max(min_chars, 50):
        raise ValueError(f"max_chars must be an int >= max(min_chars, 50), got {max_chars!r}")
    srcs = (sources,) if isinstance(sources, str) else tuple(sources)
    if not srcs or any(s not in SOURCES for s in srcs):
        raise ValueError(f"sources must be a non-empty subset of {', '.join(SOURCES)}, got {sources!r}")
    return tuple(sorted(set(srcs)))


def _split_passages(
    seed: int, split: str, kind: str, min_chars: int, max_chars: int, sources: tuple[str, ...]
) -> list[tuple[str, str, int, str]]:
    chosen = [p for p in _passages(sources, kind, min_chars, max_chars) if split_of(p[0], seed) == split]
    seeded_rng("corpus-order", seed, split, kind, min_chars, max_chars, sources).shuffle(chosen)
    return chosen


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    kind: str = "prose",
    min_chars: int = 200,
    max_chars: int = 1000,
    sources: tuple[str, ...] | list[str] | str = ("stdlib",),
    **unknown: Any,
) -> list[Example]:
    """Corpus passages.

    Args:
        n (`int`, *optional*): number of passages; None gives the whole split.
        seed (`int`): fixes which documents are train/dev/test and the passage order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.
        kind (`str`): ``"prose"`` (English-sentence paragraphs only, reflowed) or ``"all"`` (every paragraph).
        min_chars (`int`): drop passages shorter than this.
        max_chars (`int`): pack paragraphs into passages of at most this many characters.
        sources (`tuple[str, ...]`): subset of `SOURCES`; the default ``("stdlib",)`` is the only machine-
            independent one.

    Returns:
        `list[Example]`: ``prompt`` is the passage, ``target`` is ``""``; ``meta`` has ``document``, ``source``,
        ``chunk`` (index within the document), ``n_chars``, ``kind``, ``python`` (``[major, minor]``) and
        ``python_version``.
    """
    reject_unknown("corpus", unknown, ("kind", "min_chars", "max_chars", "sources"))
    check_split(split)
    srcs = _check_args(kind, min_chars, max_chars, sources)
    chosen = _split_passages(seed, split, kind, min_chars, max_chars, srcs)
    check_n(n, pool=len(chosen), what=f"corpus {split} split ({kind}, {min_chars}..{max_chars} chars)")
    version = list(sys.version_info[:2])
    full_version = platform.python_version()
    out = []
    for name, source, i, passage in chosen if n is None else chosen[:n]:
        meta = {
            "document": name,
            "source": source,
            "chunk": i,
            "n_chars": len(passage),
            "kind": kind,
            "python": version,
            "python_version": full_version,
        }
        out.append(Example(f"corpus/{name}/{i}", passage, "", None, meta))
    return out


def corpus_text(
    split: str = "train",
    seed: int = 0,
    max_chars: int = 100_000,
    *,
    kind: str = "prose",
    sources: tuple[str, ...] | list[str] | str = ("stdlib",),
) -> str:
    """One long string of whole passages of `split` (seeded order, blank-line separated), at most `max_chars`.

    Example: ``corpus_text("train", seed=0, max_chars=20_000)`` for a calibration set, with ``"test"`` passages
    (other modules) for evaluation.
    """
    check_split(split)
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be an int >= 1, got {max_chars!r}")
    srcs = _check_args(kind, 200, 1000, sources)
    parts: list[str] = []
    total = 0
    for _, _, _, passage in _split_passages(seed, split, kind, 200, 1000, srcs):
        extra = len(passage) + (2 if parts else 0)
        if total + extra > max_chars:
            break
        parts.append(passage)
        total += extra
    return "\n\n".join(parts)


def grade(example: Example, output: str) -> float:
    """1.0 for any non-empty (non-whitespace) output: there is no task, this only lets generic loops run."""
    return 1.0 if output.strip() else 0.0


register_suite(
    "corpus",
    generate,
    grade,
    "Human-written English passages (CPython standard-library docstrings; optionally Debian license and Python doc "
    "texts) for text statistics, perplexity and calibration.",
    metric="none (non-empty)",
    source="CPython stdlib docstrings of the running interpreter (version-dependent); opt-in /usr/share texts",
)
