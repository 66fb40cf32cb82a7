"""IBCircuit (Bian et al., ICML 2025): holistic circuit discovery with an information bottleneck on every head."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="ibcircuit",
        name="IBCircuit: holistic circuit discovery with an information bottleneck",
        area="analysis",
        paper="IBCircuit: Towards Holistic Circuit Discovery with Information Bottleneck",
        paper_url="https://arxiv.org/abs/2602.22581",
        code_url="https://github.com/ivanniu/IBCircuit",
        config="lmlab.methods.analysis.ibcircuit.config:IBCircuitConfig",
        run="lmlab.methods.analysis.ibcircuit.experiment:run",
        claim=(
            "Head keep-rates learned with a Gaussian information bottleneck against the KL to the clean output give "
            "IOI circuits that, under the same mean ablation, keep the full model's logit difference more closely "
            "(|F - 1|, F the normalised faithfulness: an overshoot counts against a circuit) and stay closer to "
            "the full model (KL) than attribution patching, head-importance scores and random heads."
        ),
        baselines=("eap", "hap", "random"),
        default_model="smollm2-135m",
        suites=("ioi", "greater_than"),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "tasks": ["induction", "ioi"],
                "n_fit": 4,
                "n_eval": 4,
                "steps": 3,
                "induction_steps": 5,
                "ks": [2, 4],
                "n_random": 2,
            },
            "quick": {
                "tasks": ["induction", "ioi"],
                "n_fit": 8,
                "n_eval": 8,
                "steps": 15,
                "lr": 0.3,
                "induction_steps": 60,
                "ks": [10, 20, 40],
                "n_random": 2,
            },
        },
        tags=("analysis", "interpretability", "circuits"),
        bibtex=(
            "@inproceedings{bian2025ibcircuit,\n  title={IBCircuit: Towards Holistic Circuit Discovery with "
            "Information Bottleneck},\n  author={Bian, Tian and Niu, Yifan and Yuan, Chaohao and Piao, Chengzhi and "
            "Wu, Bingzhe and Huang, Long-Kai and Rong, Yu and Xu, Tingyang and Cheng, Hong and Li, Jia},\n  "
            "booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    task=(
        "greater_than_dataset",
        "induction_dataset",
        "ioi_dataset",
        "make_induction_model",
    ),
)

__all__ = ["SPEC", *_LAZY]
