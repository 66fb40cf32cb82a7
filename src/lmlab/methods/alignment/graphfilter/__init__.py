"""GraphFilter (Wu et al., ICML 2025): greedy set cover on the example / n-gram graph, priority quality x diversity."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="graphfilter",
        name="GraphFilter: quality x diversity data selection on a bipartite graph",
        area="alignment",
        paper="The Best of Both Worlds: Bridging Quality and Diversity in Data Selection with Bipartite Graph",
        paper_url="https://arxiv.org/abs/2410.12458",
        code_url=None,
        config="lmlab.methods.alignment.graphfilter.config:GraphFilterConfig",
        run="lmlab.methods.alignment.graphfilter.experiment:run",
        claim=(
            "Selecting SFT data by greedy set cover on the example / n-gram graph with the multiplicative priority "
            "quality x diversity gives higher macro accuracy after SFT than quality-only, diversity-only, K-center "
            "and random selection at the same budget, and selects faster than K-center greedy."
        ),
        baselines=("quality_only", "diversity_only", "k_center", "random", "additive"),
        default_model="smollm2-135m",
        suites=("arithmetic", "countries", "strings"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "master_pool_size": 40,
                "pool_size": 32,
                "k": 8,
                "replicates": 2,
                "systems": ["graphfilter", "quality_only", "diversity_only", "k_center", "random", "additive"],
                "embedder": "hashing",
                "train_layers": 1,
                "epochs": 1,
                "eval_per_family": 1,
                "timing_pool": 0,
            },
            "quick": {
                "quality": "oracle",
                "master_pool_size": 128,
                "pool_size": 96,
                "k": 16,
                "replicates": 3,
                "systems": ["graphfilter", "random", "quality_only"],
                "eval_per_family": 4,
                "timing_pool": 0,
            },
        },
        requires=("sklearn", "scipy"),
        tags=("alignment", "data-selection", "sft"),
        bibtex=(
            "@inproceedings{wu2025graphfilter,\n  title={The Best of Both Worlds: Bridging Quality and Diversity in "
            "Data Selection with Bipartite Graph},\n  author={Wu, Minghao and Vu, Thuy-Trang and Qu, Lizhen and "
            "Haffari, Gholamreza},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports numpy/scipy/sklearn (and torch for IFD); its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "IFDScores",
        "NgramGraph",
        "Selection",
        "answer_marker",
        "build_ngram_graph",
        "format_prompt",
        "graphfilter_select",
        "ifd_from_nll",
        "ifd_scores",
        "k_center_greedy",
        "quality_from_ifd",
        "quality_only_select",
        "random_select",
        "rescale_quality",
        "response_nll_alone",
        "select_on_graph",
    ),
)

__all__ = ["SPEC", *_LAZY]
