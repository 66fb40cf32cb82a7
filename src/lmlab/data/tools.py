"""Tools over lmlab's packaged facts: the country-fact lookup, and the default tool box (calculator + lookup).

The tool machinery (call syntax, `Tool`, `ToolBox`, the AST-whitelisted `Calculator`) is `lmlab.core.execution.tools`;
this
module holds what reads task data, which the core must not.

Usage:
    >>> box = default_tools()
    >>> box.observe(parse_call("lookup[France, capital]"))
    'Paris'
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from lmlab.core.execution.tools import Calculator, Tool, ToolBox, ToolError, parse_call, shorten  # noqa: F401 (parse_call: doctest)

# ----------------------------------------------------------------------------------------------------------------
# the country-fact lookup

LOOKUP_FIELDS: dict[str, str] = {
    "capital": "capital",
    "continent": "continent",
    "iso3": "iso3",
    "currency_code": "currency_code",
    "currency": "currency",
    "population": "population",
}


class FactLookup(Tool):
    """``lookup[country, field]``: a fact of a country from `lmlab.data.countries` (GeoNames / pycountry).

    The country is any name or ISO code `lmlab.data.countries.country_record` accepts; the field one of
    `LOOKUP_FIELDS` (``capital``, ``continent``, ``iso3``, ``currency_code``, ``currency``, ``population``). The
    argument is split at its last comma, so country names with commas work.
    """

    name = "lookup"
    description = "a fact of a country (capital, continent, iso3, currency_code, currency, population)"
    syntax = "lookup[France, capital]"

    def parse(self, argument: str) -> tuple[dict[str, Any], str]:
        from lmlab.data.countries import country_record

        if "," not in argument:
            raise ToolError(f"lookup: {shorten(argument)!r} has no field; expected 'country, field' such as "
                            "'France, capital'")  # fmt: skip
        country, fld = (s.strip() for s in argument.rsplit(",", 1))
        fld = fld.lower().replace(" ", "_")
        if fld not in LOOKUP_FIELDS:
            raise ToolError(f"lookup: field {fld!r} is unknown; expected one of {', '.join(LOOKUP_FIELDS)}")
        if not country:
            raise ToolError("lookup: the country is empty; expected a country name or ISO code")
        try:
            rec = country_record(country)
        except ValueError:
            raise ToolError(f"lookup: country {shorten(country)!r} is unknown; expected a country name or ISO "
                            "code") from None  # fmt: skip
        return rec, fld

    def run(self, parsed: tuple[dict[str, Any], str]) -> str:
        rec, fld = parsed
        value = rec[LOOKUP_FIELDS[fld]]
        if value in ("", None):
            raise ToolError(f"lookup: {rec['name']} has no {fld} in GeoNames")
        return str(value)


def default_tools(names: Iterable[str] | Mapping[str, Any] = ("calculator", "lookup")) -> ToolBox:
    """A `ToolBox` of lmlab's tools by name (``calculator``, ``lookup``)."""
    known = {"calculator": Calculator, "lookup": FactLookup}
    out = []
    for n in names:
        if n not in known:
            raise ValueError(f"tool {n!r} is unknown; expected one of {', '.join(known)}")
        out.append(known[n]())
    return ToolBox(out)


__all__ = ["LOOKUP_FIELDS", "FactLookup", "default_tools"]
