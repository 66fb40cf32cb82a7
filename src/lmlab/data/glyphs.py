"""Glyph pictures between prose: a mixed-modality input with real 2D structure, for text-only models.

Task: a prompt alternates prose paragraphs (templated English, `lmlab.data.ruler.filler_text`) with "pictures":
short words drawn in a fixed 5x7 bitmap font (the classic column-encoded "glcdfont" of small LCD drivers), one text
row per pixel row, ``#`` for ink and ``.`` for paper, pixels separated by single spaces, each row ending in a
newline. A word of `chars` characters is drawn side by side with one blank pixel column between characters and a
blank margin of one pixel all around, every pixel repeated `scale` times in both directions. So every picture is a
grid of ``rows x width`` pixels with ``rows = 9 * scale`` and ``width = (6 * chars + 1) * scale``; with a tokenizer
that gives one token per pixel (SmolLM2: ``"#"``, ``" #"``, ``"."``, ``" ."`` are single tokens), a picture row is
exactly ``width + 1`` tokens, the newline included, so the picture is a 2D token grid of that stride. This is the
"vision segment" of the MMInference mixed-modality experiment: its pixel at (r, c) sits one stride after (r - 1, c).

Layout: ``prose_0 + "\\n\\nPicture 1:\\n" + picture_1 + "\\n" + prose_1 + ... + "\\nPicture k:\\n" + picture_k + "\\n"
+ prose_k + "\\n\\nQuestion: Which word is drawn in picture k?\\nAnswer:"`` (k = `n_images`): prose, picture,
prose, ... ending in prose and a question (modality order text, vision, text, ..., text).

Meta: ``words`` (the word of every picture), ``rows``, ``width`` (pixels), ``scale``, and ``segments``: the prompt
cut into consecutive pieces ``{"modality": "text" | "vision", "text": ...}`` (vision pieces also carry ``rows``,
``width`` and their ``row_texts``) whose texts concatenate to the prompt exactly, so a caller can tokenize piece by
piece and know each token's modality and each picture's row stride.

Metric: exact match of the last picture's word (whole word, any case) in the output's first non-empty line. A
135M text model does not read the pictures; the suite exists for the attention structure, and the grader makes
the task well defined.

Data: synthetic (seeded). Words are drawn uniformly from the font's 36 symbols (A-Z, 0-9); an example's key is its
sequence of words and belongs to the split `split_of(key, seed)` assigns it, so splits are disjoint. Nothing is
downloaded.
"""

from __future__ import annotations

import random
from typing import Any

from lmlab.data import (
    Example,
    check_n,
    check_split,
    register_suite,
    reject_unknown,
    sample_unique,
    seeded_rng,
)
from lmlab.data.normalize import contains_answer

# 5x7 font, one hex byte per column (left to right), bit r = pixel row r (top = bit 0): the widely copied
# "glcdfont" table of HD44780-style LCD libraries, letters and digits only.
FONT: dict[str, str] = {
    "A": "7C1211127C", "B": "7F49494936", "C": "3E41414122", "D": "7F4141221C", "E": "7F49494941",
    "F": "7F09090901", "G": "3E4149497A", "H": "7F0808087F", "I": "00417F4100", "J": "2040413F01",
    "K": "7F08142241", "L": "7F40404040", "M": "7F020C027F", "N": "7F0408107F", "O": "3E4141413E",
    "P": "7F09090906", "Q": "3E4151215E", "R": "7F09192946", "S": "4649494931", "T": "01017F0101",
    "U": "3F4040403F", "V": "1F2040201F", "W": "3F4038403F", "X": "6314081463", "Y": "0708700807",
    "Z": "6151494543", "0": "3E5149453E", "1": "00427F4000", "2": "4261514946", "3": "2141454B31",
    "4": "1814127F10", "5": "2745454539", "6": "3C4A494930", "7": "0171090503", "8": "3649494936",
    "9": "064949291E",
}  # fmt: skip
SYMBOLS: str = "".join(FONT)
INK, PAPER = "#", "."
GLYPH_ROWS, GLYPH_COLS = 7, 5

_KEYWORDS = ("n_images", "chars", "scale", "prose_chars")


def glyph(ch: str) -> list[str]:
    """The 7 pixel rows (strings of ``#``/``.``, 5 wide) of one font symbol."""
    if ch not in FONT:
        raise ValueError(f"glyph symbol must be one of {SYMBOLS!r}, got {ch!r}")
    cols = [int(FONT[ch][2 * i : 2 * i + 2], 16) for i in range(GLYPH_COLS)]
    return ["".join(INK if (c >> r) & 1 else PAPER for c in cols) for r in range(GLYPH_ROWS)]


def render(word: str, scale: int = 1) -> list[str]:
    """Pixel rows of `word`: glyphs side by side, one blank column between them, a blank 1-pixel margin, scaled.

    Returns:
        `list[str]`: ``9 * scale`` rows of ``(6 * len(word) + 1) * scale`` characters (``#`` ink, ``.`` paper).
    """
    if not word:
        raise ValueError("word must be a non-empty string of font symbols")
    glyphs = [glyph(ch) for ch in word]
    inner = [PAPER.join(g[r] for g in glyphs) for r in range(GLYPH_ROWS)]
    width = len(inner[0]) + 2
    rows = [PAPER * width] + [PAPER + r + PAPER for r in inner] + [PAPER * width]
    return ["".join(px * scale for px in row) for row in rows for _ in range(scale)]


def picture_rows(word: str, scale: int = 1) -> list[str]:
    """The text rows of a picture: pixels separated by single spaces, each row ending in a newline."""
    return [" ".join(row) + "\n" for row in render(word, scale)]


def _check_int(name: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {value!r}")


def generate(
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    *,
    n_images: int = 2,
    chars: int = 4,
    scale: int = 1,
    prose_chars: int = 400,
    **unknown: Any,
) -> list[Example]:
    """Prose / picture / prose ... prompts (see the module docstring for the layout and meta).

    Args:
        n (`int`): number of examples (the pool is 36^(chars x n_images) word tuples, so ``None`` is rejected).
        seed (`int`): fixes the split assignment, the words and the prose.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``; disjoint by the tuple of words.
        n_images (`int`, defaults to `2`): pictures per prompt (each followed by prose).
        chars (`int`, defaults to `4`): symbols per picture.
        scale (`int`, defaults to `1`): pixel repetition in both directions (picture rows 9 x scale).
        prose_chars (`int`, defaults to `400`): maximum characters of each prose paragraph (whole sentences).

    Returns:
        `list[Example]`: ``target`` is the last picture's word.
    """
    reject_unknown("glyphs", unknown, _KEYWORDS)
    check_split(split)
    check_n(n, what="glyphs pool")
    _check_int("n_images", n_images, 1, 16)
    _check_int("chars", chars, 1, 12)
    _check_int("scale", scale, 1, 4)
    _check_int("prose_chars", prose_chars, 0, 100_000)
    assert n is not None
    from lmlab.data.ruler import filler_text  # lazy: the ruler module builds its sentence pool on import

    def draw(rng: random.Random) -> tuple[str, Example]:
        words = ["".join(rng.choice(SYMBOLS) for _ in range(chars)) for _ in range(n_images)]
        key = "-".join(words)
        # prose depends only on (seed, key), so an example is the same whatever else is drawn
        prose_seed = seeded_rng("glyphs-prose", seed, key).randrange(2**31)
        paragraphs = [filler_text(prose_seed + i, prose_chars) for i in range(n_images + 1)]
        segments: list[dict[str, Any]] = []
        for i, word in enumerate(words):
            lead = "" if i == 0 else "\n"
            segments.append({"modality": "text", "text": f"{lead}{paragraphs[i]}\n\nPicture {i + 1}:\n"})
            rows = picture_rows(word, scale)
            segments.append(
                {
                    "modality": "vision",
                    "text": "".join(rows),
                    "rows": len(rows),
                    "width": len(render(word, scale)[0]),
                    "row_texts": rows,
                    "word": word,
                }
            )
        question = f"\n{paragraphs[-1]}\n\nQuestion: Which word is drawn in picture {n_images}?\nAnswer:"
        segments.append({"modality": "text", "text": question})
        prompt = "".join(s["text"] for s in segments)
        meta = {
            "words": words,
            "rows": 9 * scale,
            "width": (6 * chars + 1) * scale,
            "scale": scale,
            "segments": segments,
        }
        ex_id = f"glyphs/{n_images}x{chars}x{scale}/{key}"
        return key, Example(ex_id, prompt, words[-1], None, meta)

    return sample_unique(draw, n, seed, split, stream=("glyphs", n_images, chars, scale), what="glyphs pool")


def grade(example: Example, output: str) -> float:
    """1.0 when the last picture's word occurs (whole word, any case) in the output's first non-empty line."""
    line = next((ln for ln in output.splitlines() if ln.strip()), "")
    return 1.0 if contains_answer(line, [example.target]) else 0.0


register_suite(
    "glyphs",
    generate,
    grade,
    "Prose paragraphs alternating with words drawn as 5x7 bitmap-font pictures (rows of '#'/'.' pixel tokens): a "
    "mixed-modality input with a 2D token grid for text models.",
    metric="exact_match (the last picture's word in the first line)",
    source="synthetic (seeded); prose templated from lmlab.data.countries facts, glcdfont 5x7 glyphs",
)

__all__ = ["FONT", "SYMBOLS", "generate", "glyph", "grade", "picture_rows", "render"]
