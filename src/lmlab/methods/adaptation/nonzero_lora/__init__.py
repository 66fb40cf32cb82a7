"""NZ-LoRA / Init[AB] (Li et al., ICML 2025): both LoRA factors initialised non-zero, U(±sqrt(β/n_in))."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="nonzero_lora",
        name="NZ-LoRA: non-zero initialization of both LoRA factors (Init[AB])",
        area="adaptation",
        paper="Beyond Zero Initialization: Investigating the Impact of Non-Zero Initialization on LoRA Fine-Tuning "
        "Dynamics",
        paper_url="https://arxiv.org/abs/2505.23194",
        code_url="https://github.com/Leopold1423/non_zero_lora-icml25",
        config="lmlab.methods.adaptation.nonzero_lora.config:NonZeroLoRAConfig",
        run="lmlab.methods.adaptation.nonzero_lora.experiment:run",
        claim=(
            "Initialising both LoRA factors non-zero (A, B ~ U(±sqrt(β/n_in))) makes fine-tuning more robust to "
            "sub-optimal, especially small, learning rates: at the smallest learning rates of the sweep its held-out "
            "NLL is below peft's zero init (B = 0) after the same number of steps."
        ),
        baselines=("zero", "nz_reset"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "lrs": [1e-3, 1e-2],
                "n_seeds": 2,  # exercises the per-seed rows and the every-seed checks
                "steps": 3,
                "train_batch": 4,
                "rank": 4,
                "alpha": 8.0,
                "train_layers": 1,
                "eval_items": 8,
                "dev_items": 4,
                "claim_lrs": 1,
            },
            "quick": {
                "lrs": [3e-5, 3e-4],
                "inits": ["zero", "nz"],
                "n_seeds": 1,
                "steps": 15,
                "eval_items": 30,
                "dev_items": 12,
                "claim_lrs": 1,
            },
        },
        # default: the 10-minute class (3 seeds x the lr grid x 3 inits; config.py's budget note)
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 600.0},
        requires=("peft",),
        tags=("adaptation", "lora", "initialization"),
        bibtex=(
            "@inproceedings{li2025beyondzero,\n  title={Beyond Zero Initialization: Investigating the Impact of "
            "Non-Zero Initialization on LoRA Fine-Tuning Dynamics},\n  author={Li, Shiwei and Luo, Xiandi and Tang, "
            "Xing and Wang, Haozhao and Chen, Hao and Luo, Weihong and Li, Yuhua and He, Xiuqiang and Li, Ruixuan},\n"
            "  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch and peft; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method=(
        "INIT_MODES",
        "LayerInit",
        "NonZeroInit",
        "SweepRun",
        "apply_nonzero_lora_init",
        "init_lora",
        "init_nonzero_lora",
        "lora_factor_stats",
        "lora_layers",
        "lr_sweep",
        "nonzero_bound",
        "reset_base_weight",
        "restore_base_weight",
        "sweep_table",
        "train_steps",
    ),
)

__all__ = ["SPEC", *_LAZY]
