"""Potemkin understanding (Mancoridis et al., ICML 2025): keystone-conditioned potemkin rates, the automatic lower
bound and incoherence, on any local model or OpenAI-compatible endpoint."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="potemkin",
        name="Potemkin understanding: keystone-conditioned potemkin rate, automatic lower bound, incoherence",
        area="evaluation",
        paper="Potemkin Understanding in Large Language Models",
        paper_url="https://arxiv.org/abs/2506.21521",
        code_url="https://github.com/MarinaMancoridis/PotemkinBenchmark",
        config="lmlab.methods.evaluation.potemkin.config:PotemkinConfig",
        run="lmlab.methods.evaluation.potemkin.experiment:run",
        claim=(
            "Potemkins are ubiquitous: on concepts whose definition (the keystone) the model gets right, its potemkin "
            "rate on classify / generate / edit is above 0 (the programmatic oracle's), its self-classification of "
            "its "
            "own examples is incoherent (above 0), and the automatic lower bound from self-graded related questions "
            "is above 0; the oracle scores 0 and a random responder about 1 (metric controls)."
        ),
        baselines=("oracle", "random"),
        default_model="smollm2-135m",
        suites=("arithmetic", "countries"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "models": [],
                "concepts": ["strict_dominance", "zero_sum", "palindrome"],
                "n_classify": 2,
                "n_generate": 1,
                "n_edit": 1,
                "n_incoherence": 2,
                "max_tokens": 8,
                "lb_questions": 2,
            },
            "quick": {
                "models": [],
                "concepts": [
                    "strict_dominance",
                    "weak_dominance",
                    "pure_nash",
                    "pareto_optimality",
                    "zero_sum",
                    "symmetric_game",
                ],
                "n_classify": 4,
                "n_generate": 2,
                "n_edit": 2,
                "n_incoherence": 2,
                "max_tokens": 36,
                "lb_questions": 6,
            },
        },
        tags=("evaluation", "benchmark-validity", "api"),
        bibtex=(
            "@inproceedings{mancoridis2025potemkin,\n  title={Potemkin Understanding in Large Language Models},\n"
            "  author={Mancoridis, Marina and Weeks, Bec and Vafa, Keyon and Mullainathan, Sendhil},\n"
            "  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm and the concepts load on first use (`lmlab list` imports only the spec).
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    concepts="__all__",
)

__all__ = ["SPEC", *_LAZY]
