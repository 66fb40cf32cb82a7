"""lmlab.core.execution.tools (the AST-whitelisted calculator, the call parser, the tool box) and lmlab.data.tools (the
country
lookup, the default tool box)."""

from __future__ import annotations

import random

import pytest

from lmlab.core.execution.tools import (
    Calculator,
    ToolBox,
    ToolCall,
    ToolError,
    format_number,
    parse_call,
)
from lmlab.data.tools import FactLookup, default_tools


def _random_expr(rng: random.Random, depth: int) -> tuple[str, int]:
    """A random integer expression and its value, computed without evaluating any string."""
    if depth == 0 or rng.random() < 0.3:
        v = rng.randint(0, 99)
        return str(v), v
    a, va = _random_expr(rng, depth - 1)
    b, vb = _random_expr(rng, depth - 1)
    op = rng.choice(["+", "-", "*", "//", "%"])
    if op in ("//", "%") and vb == 0:
        op = "+"
    value = {"+": va + vb, "-": va - vb, "*": va * vb, "//": va // vb if vb else 0, "%": va % vb if vb else 0}[op]
    return f"({a} {op} {b})", value


def test_calculator_matches_integer_arithmetic_on_random_expressions():
    calc = Calculator()
    rng = random.Random(0)
    for _ in range(300):
        expr, value = _random_expr(rng, 4)
        assert calc.evaluate(expr) == value, expr
        assert calc(expr) == str(value)


@pytest.mark.parametrize(
    "expr, out",
    [("12*37", "444"), ("2 + 3 * 4", "14"), ("(2 + 3) * 4", "20"), ("-3 ** 2", "-9"), ("2 ** 10", "1024"),
     ("7 // 2", "3"), ("7 % 3", "1"), ("10 / 4", "2.5"), ("1 / 3", "0.3333333333"), ("6 / 3", "2"),
     ("+5 - -2", "7"), ("386 × 275", "106150"), ("2 ^ 3", "8"), ("1.5 * 2", "3")],
)  # fmt: skip
def test_calculator_values(expr, out):
    assert Calculator()(expr) == out


@pytest.mark.parametrize(
    "expr, needle",
    [("__import__('os').system('ls')", "not allowed"), ("x + 1", "a name"), ("abs(-1)", "a call"),
     ("(1).real", "an attribute"), ("[1, 2][0]", "not allowed"), ("'a' * 3", "not a number"),
     ("1 < 2", "a comparison"), ("lambda: 1", "a lambda"), ("True + 1", "not a number"), ("1 if 1 else 2", "a "),
     ("2 ** 65", "exponent"), ("10 ** 64 * 10 ** 64", "digits"), ("1 / 0", "division by zero"),
     ("5 % 0", "division by zero"), ("0 ** -1", "division by zero"), ("", "empty"), ("1 +", "not an arithmetic"),
     ("1" * 300, "characters"), ("1 & 2", "BitAnd"), ("~1", "Invert"), ("1e308 * 10", "digits")],
)  # fmt: skip
def test_calculator_refuses_with_one_line(expr, needle):
    with pytest.raises(ToolError) as e:
        Calculator()(expr)
    msg = str(e.value)
    assert "\n" not in msg and needle in msg and msg.startswith("calculator:")


def test_calculator_bounds_are_validated():
    with pytest.raises(ValueError, match="max_exponent must be an int >= 1, got 0"):
        Calculator(max_exponent=0)
    assert Calculator(max_exponent=3)("2 ** 3") == "8"
    with pytest.raises(ToolError, match="exceeds 3"):
        Calculator(max_exponent=3)("2 ** 4")


def test_format_number():
    assert format_number(3.0) == "3" and format_number(2.5) == "2.5" and format_number(7) == "7"


def test_lookup_reads_country_facts():
    from lmlab.data.countries import country_record

    look = FactLookup()
    assert look("France, capital") == "Paris"
    assert look("FR, iso3") == "FRA"
    assert look("france , Currency_Code") == "EUR"
    assert look("Chad, population") == str(country_record("Chad")["population"])
    assert look("Japan, continent") == country_record("Japan")["continent"]


@pytest.mark.parametrize(
    "arg, needle",
    [("France", "no field"), ("Atlantis, capital", "Atlantis"), ("France, anthem", "anthem"),
     (", capital", "empty")],
)  # fmt: skip
def test_lookup_refuses_with_one_line(arg, needle):
    with pytest.raises(ToolError) as e:
        FactLookup()(arg)
    assert "\n" not in str(e.value) and needle in str(e.value)


def test_parse_call():
    assert parse_call("calculator[12*37]") == ToolCall("calculator", "12*37")
    assert parse_call("  lookup[ France, capital ] ") == ToolCall("lookup", "France, capital")
    assert parse_call("answer_question") == ToolCall("answer_question", "")
    assert parse_call("what is this") is None
    assert parse_call("calc[1+2") is None
    assert str(ToolCall("calculator", "1+2")) == "calculator[1+2]"


def test_toolbox_runs_and_observes_errors():
    box = default_tools()
    assert box.names == ["calculator", "lookup"]
    assert box.observe(parse_call("calculator[12*37]")) == "444"
    assert box.observe(parse_call("lookup[France, capital]")) == "Paris"
    assert box.observe(parse_call("calculator[open('x')]")).startswith("Error: calculator: a call")
    assert box.observe(parse_call("search[x]")) == "Error: unknown tool 'search'; expected one of calculator, lookup"
    assert box.observe(None).startswith("Error: no tool call")
    with pytest.raises(ToolError, match="unknown tool"):
        box.run(ToolCall("search", "x"))
    assert "calculator[12*37]" in box.describe()
    with pytest.raises(ToolError, match="must be a string"):
        box["calculator"](12)


def test_toolbox_bad_input():
    with pytest.raises(ValueError, match="distinct, got 'calculator' twice"):
        ToolBox([Calculator(), Calculator()])
    with pytest.raises(ValueError, match="tools is empty"):
        ToolBox([])
    with pytest.raises(ValueError, match="must be named Tool instances"):
        ToolBox([object()])
    with pytest.raises(ValueError, match="tool 'python' is unknown; expected one of calculator, lookup"):
        default_tools(["python"])
