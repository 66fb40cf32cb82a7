"""D-ReFT (Deng et al., ICML 2025): distribution-wise (stochastic) LoReFT interventions vs pointwise LoReFT."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="d_reft",
        name="D-ReFT: distribution-wise (stochastic) representation interventions",
        area="adaptation",
        paper="Learning Distribution-Wise Control in Representation Space for Language Models",
        paper_url="https://arxiv.org/abs/2506.06686",
        code_url="https://github.com/chili-lab/D-Intervention",
        config="lmlab.methods.adaptation.d_reft.config:DReftConfig",
        run="lmlab.methods.adaptation.d_reft.experiment:run",
        claim=(
            "A distribution-wise LoReFT intervention (z = mu + sigma * eps replacing W h + b) at an early layer is "
            "more robust than pointwise LoReFT: higher accuracy on paraphrased, typo and representation-noised inputs."
        ),
        baselines=("loreft", "base"),
        default_model="smollm2-135m",
        suites=("countries",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "layers": [0],
                "rank": 2,
                "seeds": 1,
                "steps": 3,
                "train_batch": 4,
                "n_train": 4,
                "n_test": 6,
                "noise_scales": [1.0],
                "sigma_sweep": [2.0],
                "eval_batch": 8,
            },
            "quick": {
                "layers": [0],
                "seeds": 1,
                "steps": 30,
                "n_test": 24,
                "eval_mean": False,
                "sigma_sweep": [],
            },
        },
        # 10-minute class: 60 steps x 2 seeds x layers {0, 20} (20 steps left LoReFT short of the bare model)
        budget_s={"smoke": 20.0, "quick": 90.0, "default": 600.0},
        tags=("adaptation", "representation-finetuning", "reft", "robustness"),
        bibtex=(
            "@inproceedings{deng2025dreft,\n  title={Learning Distribution-Wise Control in Representation Space for "
            "Language Models},\n  author={Deng, Chunyuan and Chang, Ruidi and Chen, Hanjie},\n  booktitle={ICML},\n"
            "  year={2025}}"
        ),
    )
)

__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    storage=("load_interventions", "save_interventions"),
    task=("CONTINENT_OPTIONS", "HELDOUT_TEMPLATES", "TRAIN_TEMPLATES", "build_items", "typo"),
)

__all__ = ["SPEC", *_LAZY]
