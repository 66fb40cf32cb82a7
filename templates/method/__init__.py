"""<Method name> (<authors>, ICML 2025): <one line>."""

from lmlab.registry import MethodSpec, register_method

SPEC = register_method(
    MethodSpec(
        id="<id>",
        name="<Method name>",
        area="<area>",
        paper="<paper title>",
        paper_url="https://arxiv.org/abs/<id>",
        code_url=None,
        config="lmlab.methods.<area>.<id>.config:<Name>Config",
        run="lmlab.methods.<area>.<id>.experiment:run",
        claim="<the paper's headline claim, as lmlab checks it>",
        baselines=("<baseline>",),
        suites=("<suite>",),
        presets={"smoke": {}, "quick": {}},
    )
)

_LAZY = ("<public_function>",)


def __getattr__(name: str):
    if name in _LAZY:
        from lmlab.methods.<area>.<id> import method

        return getattr(method, name)
    raise AttributeError(name)
