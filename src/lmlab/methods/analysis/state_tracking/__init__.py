"""(How) Do Language Models Track State? (Li, Guo & Andreas, ICML 2025): AA vs PAA state-tracking mechanisms."""

from lmlab.registry import MethodSpec, lazy_exports, register_method

SPEC = register_method(
    MethodSpec(
        id="state_tracking",
        name="(How) Do Language Models Track State?",
        area="analysis",
        paper="(How) Do Language Models Track State?",
        paper_url="https://arxiv.org/abs/2503.02854",
        code_url="https://github.com/belindal/state-tracking",
        config="lmlab.methods.analysis.state_tracking.config:StateTrackingConfig",
        run="lmlab.methods.analysis.state_tracking.experiment:run",
        claim=(
            "Trackers trained to compose permutations learn an associative scan (AA) or a parity-associative scan "
            "(PAA), told apart automatically by probes, parity-controlled patching and the parity of their errors; "
            "AA runs converge faster and generalise to longer sequences than PAA runs."
        ),
        baselines=("paa_runs", "plain", "majority_probe"),
        default_model="tiny-llama",
        suites=("permutations",),
        presets={
            "smoke": {
                "groups": ["S3"],
                "seeds": 1,
                "n_layers": 2,
                "hidden": 16,
                "train_len": 4,
                "eval_len": 8,
                "steps": 12,
                "pre_steps": 4,
                "train_batch": 16,
                "n_val": 16,
                "eval_every": 4,
                "n_eval": 16,
                "n_patch": 8,
                "probe_max_iter": 50,
            },
            "quick": {
                "groups": ["S3"],
                "seeds": 1,
                "steps": 500,
                "pre_steps": 80,
                "n_eval": 192,
                "n_patch": 48,
            },
        },
        # default: the 10-minute class (12 plain-condition seeds trained until learned; config.py's budget note)
        budget_s={"smoke": 10.0, "quick": 60.0, "default": 600.0},
        tags=("analysis", "interpretability", "from-scratch"),
        bibtex=(
            "@inproceedings{li2025howtrack,\n  title={(How) Do Language Models Track State?},\n  author={Li, "
            "Belinda Z. and Guo, Zifan Carl and Andreas, Jacob},\n  booktitle={ICML},\n  year={2025}}"
        ),
    )
)

# The algorithm imports torch; its names load on first use so that `lmlab list` stays torch-free.
__getattr__, _LAZY = lazy_exports(
    __name__,
    task=(
        "PermGroup",
        "Stories",
        "TrackerVocab",
        "apply_action",
        "make_stories",
        "parity",
        "perm_group",
        "rollout",
        "stories_from_examples",
    ),
    diagnostics=("counterfactual_actions", "patch_grid", "probe_grid", "residual_stream"),
    method=("classify", "generalisation_curve", "make_tracker", "mechanism_score", "topic_documents", "train_tracker"),
    experiment=("diagnose",),
)

__all__ = ["SPEC", *_LAZY]
