"""KABB (Zhang et al., ICML 2025): knowledge-aware Thompson sampling for expert coordination."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="kabb",
        name="KABB: knowledge-aware Bayesian bandits for dynamic expert coordination",
        area="selection",
        paper="KABB: Knowledge-Aware Bayesian Bandits for Dynamic Expert Coordination in Multi-Agent Systems",
        paper_url="https://arxiv.org/abs/2502.07350",
        code_url=None,
        config="lmlab.methods.selection.kabb.config:KABBConfig",
        run="lmlab.methods.selection.kabb.experiment:run",
        claim=(
            "Knowledge-aware Thompson sampling (knowledge distance, dual adaptation, decay) picks expert teams with "
            "higher cold-start accuracy and lower cumulative regret than vanilla Thompson sampling on a stream whose "
            "task mix drifts, near the accuracy of all experts aggregated by the same posterior-weighted vote at "
            "top_k / #experts of the calls."
        ),
        baselines=("thompson", "ucb1", "eps_greedy", "random", "all_experts", "best_fixed"),
        default_model="smollm2-135m",
        suites=("respcache:mixed",),
        presets={
            "smoke": {
                "cache": "synthetic",
                "cache_seeds": [0, 1],
                "blocks": 2,
                "synthetic_queries": 60,
                "synthetic_variants": 5,
                "rounds": 200,
                "seeds": 2,
                "cold_rounds": 50,
                "window": 50,
            },
            "quick": {"rounds": 500, "seeds": 2, "cold_rounds": 100, "window": 100},
        },
        requires=("scipy",),
        tags=("selection", "bandit", "multi-agent", "response-cache"),
        bibtex=(
            "@inproceedings{zhang2025kabb,\n  title={KABB: Knowledge-Aware Bayesian Bandits for Dynamic Expert "
            "Coordination in Multi-Agent Systems},\n  author={Zhang, Jusheng and Huang, Zimeng and Fan, Yijia and "
            "Liu, Ningyuan and Li, Mingyan and Yang, Zhuojie and Yao, Jiawei and Wang, Jian and Wang, Keze},\n"
            "  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
)

__all__ = ["SPEC", *_LAZY]
