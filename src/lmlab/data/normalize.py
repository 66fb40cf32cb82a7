"""Answer normalisation shared by the suites' graders.

`normalize` maps text to a canonical form (accents stripped by NFKD, casefolded, apostrophes dropped, other
punctuation and symbols turned into spaces, whitespace squeezed), so that ``"Bogotá."``, ``"BOGOTA"`` and
``"bogota"`` compare equal. `contains_answer` looks for any normalised alias as a whole-word phrase inside the
normalised output; `first_number` / `last_number` pull integers or decimals out of free text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

# Letters that NFKD does not decompose into a base letter plus a combining mark.
_EXTRA_FOLD = str.maketrans({"ø": "o", "Ø": "o", "đ": "d", "Đ": "d", "ł": "l", "Ł": "l", "ı": "i", "þ": "th"})
_EXTRA_FOLD_MULTI = {"æ": "ae", "Æ": "ae", "œ": "oe", "Œ": "oe"}
# Apostrophes vanish rather than split words: "N'Djamena" -> "ndjamena", "Sana'a" -> "sanaa", "St. John's" ->
# "st johns" (a space would make "john s").
_APOSTROPHES = "'\u2019\u2018\u02bc\u02bb`\u00b4"


def strip_accents(text: str) -> str:
    """Remove diacritics: NFKD, then drop the combining marks (plus a few letters NFKD leaves alone, e.g. ø)."""
    text = text.translate(_EXTRA_FOLD)
    for src, dst in _EXTRA_FOLD_MULTI.items():
        text = text.replace(src, dst)
    decomposed = unicodedata.normalize("NFKD", text)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def normalize(text: str) -> str:
    """Canonical form for answer matching: accents stripped, casefolded, punctuation squeezed to single spaces.

    Example: ``normalize("  Port-au-Prince!  ") == "port au prince"``, ``normalize("Bogotá") == "bogota"``.
    """
    text = strip_accents(text).casefold()
    chars = []
    for ch in text:
        if ch in _APOSTROPHES:
            continue
        cat = unicodedata.category(ch)
        # Letters, digits and marks stay; punctuation (P*), symbols (S*), separators and controls become spaces.
        chars.append(ch if cat[0] in "LNM" else " ")
    return " ".join("".join(chars).split())


def contains_answer(output: str, answers: Iterable[str], exclude: Iterable[str] = ()) -> bool:
    """Whether any normalised alias in `answers` occurs as a whole-word phrase in the normalised `output`.

    Args:
        output (`str`): the model's text.
        answers (`Iterable[str]`): accepted aliases (raw; they are normalised here). Empty aliases are ignored.
        exclude (`Iterable[str]`, *optional*): longer phrases removed from the output before matching, so that an
            alias contained in a different answer does not match it (e.g. "guinea" inside "papua new guinea").

    Returns:
        `bool`: True when some alias matches on word boundaries (``"paris"`` matches "It is Paris." but
        ``"niger"`` does not match "Nigeria").
    """
    text = f" {normalize(output)} "
    # Longest first, so that a short excluded phrase never cuts a longer one in half.
    for phrase in sorted({normalize(e) for e in exclude if normalize(e)}, key=len, reverse=True):
        # The "|" marker keeps the words on either side of a removed phrase from fusing into a new phrase.
        while f" {phrase} " in text:
            text = text.replace(f" {phrase} ", " | ")
    return any(f" {alias} " in text for alias in {normalize(a) for a in answers} if alias)


# A number not glued to a preceding word character (so "x-3" and "5-3" give 3, not -3); thousands separators are
# accepted only in groups of three ("1,234"), so a list "1,2,3" gives three numbers.
_NUMBER_RE = re.compile(r"(?<![\w.])(-?)(\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.(\d+))?")
_LEADING_MINUS = re.compile(r"(?<![\w.])[-\u2212](?=\d)")


def _numbers(text: str) -> list[int | float]:
    # A typographic minus sign counts as a minus.
    text = _LEADING_MINUS.sub("-", text)
    out: list[int | float] = []
    for m in _NUMBER_RE.finditer(text):
        sign, whole, frac = m.group(1), m.group(2).replace(",", ""), m.group(3)
        if frac is not None and set(frac) != {"0"}:
            value: int | float = float(f"{sign}{whole}.{frac}")
        else:
            # "12.0" is the integer 12; ints keep exactness beyond 2**53.
            value = int(f"{sign}{whole}")
        out.append(value)
    return out


def first_number(text: str) -> int | float | None:
    """The first number in `text` (int when it has no non-zero decimals), or None.

    Handles a leading minus ("-12"), thousands separators ("1,234") and decimals ("3.5"); ``"12.0"`` gives 12.
    """
    nums = _numbers(text)
    return nums[0] if nums else None


def last_number(text: str) -> int | float | None:
    """The last number in `text` (see `first_number`), or None. ``"23 + 45 = 68."`` gives 68."""
    nums = _numbers(text)
    return nums[-1] if nums else None


__all__ = ["contains_answer", "first_number", "last_number", "normalize", "strip_accents"]
