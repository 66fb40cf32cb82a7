"""`lmlab serve` strategies: strict parsing, and a strategy request runs the method's own decoder."""

from __future__ import annotations

import pytest

from lmlab.core.inference.tiny import make_byte_tokenizer, make_tiny_model
from lmlab.serve.scheduler import GenRequest, Scheduler
from lmlab.serve.strategies import StrategyError, parse_strategy


@pytest.mark.parametrize(
    "obj, param, message",
    [
        ({"strategy": "nope"}, "lmlab.strategy", "unknown strategy 'nope'"),
        ({"sigma": 0.5}, "lmlab.strategy", "is required"),
        ({"strategy": "reflection_window", "sigma": -1}, "lmlab.sigma", "greater than or equal to 0"),
        ({"strategy": "reflection_window", "sigmaa": 1}, "lmlab.sigmaa", "Extra inputs"),
        ({"strategy": "reflection_window", "rule": "some"}, "lmlab.rule", "'all'"),
        ({"strategy": "beam_search", "num_beams": "four"}, "lmlab.num_beams", "integer"),
        ("reflection_window", "lmlab", "must be an object"),
    ],
)
def test_bad_options_name_the_field(obj, param, message):
    with pytest.raises(StrategyError, match=message) as err:
        parse_strategy(obj)
    assert err.value.param == param


def test_request_option_wins_over_the_launch_default():
    assert parse_strategy(None) is None
    default = {"strategy": "beam_search", "num_beams": 2}
    assert parse_strategy(None, default).name == "beam_search"
    s = parse_strategy({"strategy": "reflection_window", "sigma": 0.1}, default)
    assert s.name == "reflection_window" and s.params.sigma == 0.1 and s.params.window == 4


def test_reflection_window_request_equals_the_method_called_directly():
    from lmlab.methods.decoding.reflection_window.method import reflection_window_generate

    model, tok = make_tiny_model(0, arch="llama", n_layers=2), make_byte_tokenizer()
    ids = tok("Once upon a time")["input_ids"]
    strategy = parse_strategy({"strategy": "reflection_window", "sigma": 0.2, "window": 3, "beam_width": 2})
    with Scheduler(model, tok) as s:
        fin = s.submit(GenRequest(ids, max_tokens=16, temperature=0, strategy=strategy)).result(timeout=120)
        plain = s.submit(GenRequest(ids, max_tokens=16, temperature=0)).result(timeout=60)
    direct = reflection_window_generate(model, tok, ids, max_new_tokens=16, sigma=0.2, window=3, beam_width=2)
    assert [t.token_id for t in fin.tokens] == direct.token_ids
    assert fin.text == direct.text and fin.n_completion_tokens == len(direct.token_ids)
    assert direct.n_pauses > 0 and fin.text != plain.text  # the strategy changed the output on this input
