"""Cascade routing (Dekoninck et al., ICML 2025): routing and cascading unified as a search over supermodels."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="cascade_routing",
        name="Cascade routing: a unified approach to routing and cascading for LLMs",
        area="selection",
        paper="A Unified Approach to Routing and Cascading for LLMs",
        paper_url="https://arxiv.org/abs/2410.10347",
        code_url="https://github.com/eth-sri/cascade-routing",
        config="lmlab.methods.selection.cascade_routing.config:CascadeRoutingConfig",
        run="lmlab.methods.selection.cascade_routing.experiment:run",
        claim=(
            "Cascade routing (a search over supermodels of the models already run, with ex-ante and post-hoc quality "
            "estimates) gives a larger area under the quality-cost curve than routing and the optimal cascade on the "
            "same pool, and its gain shrinks as the quality estimators get noisier."
        ),
        baselines=("router", "optimal_cascade", "threshold_cascade", "linear"),
        default_model="smollm2-135m",
        suites=("respcache:mixed",),
        presets={
            "smoke": {
                "cache": "synthetic",
                "synthetic_queries": 48,
                "synthetic_variants": 4,
                "splits": 1,
                "bootstrap": 200,
                "max_depth": 2,
                "search_evals": 0,
                "budgets_per_interval": 2,
                "n_samples": 32,
                "noise_levels": [[0.6, 0.3], [2.4, 1.2]],
            },
            "quick": {
                "bootstrap": 300,
                "search_evals": 0,
                "budgets_per_interval": 3,
            },
        },
        requires=("scipy",),
        tags=("selection", "routing", "cascade", "response-cache"),
        bibtex=(
            "@inproceedings{dekoninck2025cascade,\n  title={A Unified Approach to Routing and Cascading for LLMs},\n"
            "  author={Dekoninck, Jasper and Baader, Maximilian and Vechev, Martin},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

# The algorithm imports numpy/scipy/sklearn; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    baselines="__all__",
    estimators="__all__",
    metric="__all__",
)

__all__ = ["SPEC", *_LAZY]
