"""ATP (Huang et al., ICML 2025): per-block sparsity rising in an arithmetic progression, on Wanda and SparseGPT."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="atp",
        name="ATP: arithmetic-progression layer-wise sparsity",
        area="compression",
        paper="Determining Layer-wise Sparsity for Large Language Models Through a Theoretical Perspective",
        paper_url="https://arxiv.org/abs/2502.14770",
        code_url="https://github.com/wzhuang-xmu/ATP",
        config="lmlab.methods.compression.atp.config:ATPConfig",
        run="lmlab.methods.compression.atp.experiment:run",
        claim=(
            "Block sparsities in an increasing arithmetic progression (mean S, common difference beta chosen by a "
            "small search) give lower perplexity than uniform sparsity and than OWL at 70% unstructured sparsity, "
            "with Wanda and with SparseGPT."
        ),
        baselines=("uniform", "owl", "reverse", "wanda", "sparsegpt"),
        default_model="smollm2-135m",
        suites=("corpus", "countries"),
        presets={
            "smoke": {
                "betas": [0.0, 0.05],
                "owl_lambdas": [0.0, 0.08],  # as many candidates as betas: the same tuning budget
                "sweep": [0.5],
                "sweep_pruners": ["wanda", "sparsegpt"],
                "pruners": ["wanda", "sparsegpt"],
                "n_calib": 2,
                "seq_len": 16,
                "n_val": 2,
                "n_test": 3,
                "n_cloze": 4,
            },
            "quick": {
                "betas": [0.0, 0.008],
                "owl_lambdas": [0.0, 0.08],
                "sweep": [],
                "pruners": ["wanda"],
                "n_calib": 4,
                "seq_len": 128,
                "n_val": 4,
                "n_test": 8,
                "n_cloze": 24,
                "reverse": False,
            },
        },  # fmt: skip
        tags=("compression", "pruning", "sparsity-allocation"),
        bibtex=(
            "@inproceedings{huang2025atp,\n  title={Determining Layer-wise Sparsity for Large Language Models Through "
            "a Theoretical Perspective},\n  author={Huang, Weizhong and Zhang, Yuxin and Zheng, Xiawu and Chao, Fei "
            "and Ji, Rongrong},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# Exported names load on first use, as in every method package (`lmlab list` imports only the specs).
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "layer_sparsities",
        "beta_grid",
        "max_beta",
        "search_beta",
        "SearchResult",
    ),
)

__all__ = ["SPEC", *_LAZY]
