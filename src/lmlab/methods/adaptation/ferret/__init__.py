"""Ferret (Shu et al., ICML 2025): federated full-parameter tuning with first-order updates on shared-seed bases."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="ferret",
        name="Ferret: federated full-parameter tuning with shared randomness",
        area="adaptation",
        paper="Ferret: Federated Full-Parameter Tuning at Scale for Large Language Models",
        paper_url="https://arxiv.org/abs/2409.06277",
        code_url="https://github.com/allen4747/Ferret",
        config="lmlab.methods.adaptation.ferret.config:FerretConfig",
        run="lmlab.methods.adaptation.ferret.experiment:run",
        claim=(
            "Projecting first-order local updates onto shared-seed random bases (an adaptive number of seeds per "
            "block) and reconstructing them on the server uploads orders of magnitude fewer floats than FedAvg while "
            "staying close to its loss, and reaches a lower held-out loss than the zeroth-order FedKSeed at the same "
            "number of rounds."
        ),
        baselines=("fedavg", "fedkseed", "round0"),
        default_model="smollm2-135m",
        suites=("taskbank",),
        presets={
            "smoke": {
                "model": "tiny-llama",
                "systems": ["fedavg", "ferret", "fedkseed"],
                "families": ["geography/capital", "arithmetic/add", "strings/reverse", "geography/iso3"],
                "train_per_family": 6,
                "eval_per_family": 2,
                "unseen_items": 2,
                "n_clients": 3,
                "clients_per_round": 2,
                "rounds": 2,
                "train_layers": 1,
                "local_steps": 2,
                "local_batch": 2,
                "K": 16,
                "fedkseed_k": 16,
                "dev_per_family": 2,
                "lr_grid": [1.0, 3.0],
            },
            "quick": {
                "systems": ["fedavg", "ferret"],
                "rounds": 2,
                "train_layers": 2,  # reconstruction costs O(K d) random numbers: half the default trainable set
                "clients_per_round": 2,
                "local_steps": 4,
                "train_per_family": 12,
                "eval_per_family": 6,
                "unseen_items": 6,
                "lr_grid": [1.0],  # no search at quick: FedAvg and Ferret at the same lr (3 seeds each)
            },
        },
        # default: 10 minutes, not 5: the claims need 3 training seeds and the lr grid's edge extensions (README)
        budget_s={"smoke": 20.0, "quick": 60.0, "default": 600.0},
        requires=(),  # flwr is optional: only the Flower apps need it (pip install 'lmlab[federated]')
        tags=("adaptation", "federated", "communication"),
        bibtex=(
            "@inproceedings{shu2025ferret,\n  title={Ferret: Federated Full-Parameter Tuning at Scale for Large "
            "Language Models},\n  author={Shu, Yao and Hu, Wenyang and Ng, See-Kiong and Low, Bryan Kian Hsiang and "
            "Yu, Fei Richard},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use.
__getattr__, _LAZY = lazy_exports(
    __name__,
    method="__all__",
    experiment=("flower_setup", "partition"),
)

__all__ = ["SPEC", *_LAZY]
