"""Configuration of the lifelong-editing comparison on the GeoBigEdit stream (WikiBigEdit's protocol).

Budget (default preset, SmolLM2-135M, 2 quiet cores): about 5 min. 3 x 12 edits (about 32 kept) cost ROME about
3 s per edit (~100 s), LoRA / LoRA-Merge / FT ~15-20 s each, the dev lr search of LoRA and FT ~35 s (6-8 trials on
8 dev edits), and 6 lifelong evaluations ~15 s each. MEMIT (another ~110 s at this stream) is in the full setting
only: ``--set "methods=['rag','lora','lora_merge','ft','rome','memit']"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.config import BaseConfig, check_range, param

METHODS = ("rag", "lora", "lora_merge", "ft", "rome", "memit")
PARAMETRIC = ("lora", "lora_merge", "ft", "rome", "memit")
FINE_TUNED = ("lora", "lora_merge", "ft")  # trained by gradient steps on the increment: their lr is searched on dev
# the official recipe's lr scaling (``lora_main.py``): lr * batch_size / LR_BATCH_REF
LR_BATCH_REF = 256


@dataclass
class WikiBigEditConfig(BaseConfig):
    """Lifelong knowledge editing at scale (Thede et al., ICML 2025), on the offline GeoBigEdit stream.

    Args:
        methods (`list[str]`): editors run on the same stream, one after the other, each from the unedited model
            (default: all but MEMIT, which the full setting adds; see the budget note above).
        increments (`int`, defaults to 3): timestamped increments T (paper: 8).
        edits_per_increment (`int`, defaults to 12): edits B per increment (paper: > 500K QA pairs over 8). 12 keeps
            >= 6 facts (the `min_n` of a decisive check) in the last increment and in the first one after
            ``filter_edits`` and the re-edits.
        reedit_fraction (`float`, defaults to 0.1): share of each increment t >= 2 overwriting an earlier edit.
        filter_known (`bool`, defaults to True): drop edits the unedited model already answers (``filter_edits``).
        n_general, n_fluency: held-out unedited facts and HumanEval prompts tracking general ability.
        fewshot (`bool`): prepend the 3 fixed geography shots (``fs_examples: true``).
        retriever (`str`): RAG embeddings, ``minilm`` (all-MiniLM-L6-v2) or ``hashing`` (lexical fallback).
        rag_top_k (`int`): facts retrieved per question (code: 1).
        rag_fact_shots (`bool`, defaults to True): RAG's 3 shots each carry a "Fact:" line, as its test prompts do
            (an IKE-style demonstration of using a retrieved fact: copy it, follow it against prior knowledge, ignore
            an unrelated one); False: the plain shots every other editor gets. The other variant is re-scored after
            the last increment and reported beside it.
        lora_*: LoRA rank / alpha / dropout, Adam base lr, epochs per increment, batch; `lora_lr_batch_scaling`
            applies the code's lr * batch / 256 (to LoRA and FT); `merge_alpha` is LoRA-Merge's interpolation weight.
        ft_*: layers whose ``down_proj`` the FT baseline trains, and its base lr (same epochs, batch and scaling).
        lr_search (`list[float]`): multipliers of the scaled lr searched on dev for LoRA and FT (LoRA-Merge trains
            at LoRA's, as in the official configs). With batch 4, 1 / 8 / 64 are the recipe's rate at this batch,
            the paper's per-step rate (its batch 32) and the unscaled base rate. ``[1.0]``: no search.
        lr_max_extensions, lr_dev_edits: dev runs past an edge of `lr_search` (at its ratio there); edits of the
            one dev increment (GeoBigEdit dev split) each trial trains on, scored by its held-out rephrases.
        rome_*: ROME layer, v-optimisation steps / lr / weight decay / clamp / KL factor, context templates,
            R-ROME key fix, covariance adjustment.
        memit_*: MEMIT layers and lambda (``mom2_update_weight``); cov_*: offline covariance samples.
        min_effect (`float`): the margin of the "high edit accuracy" check (ROME vs the unedited model).
    """

    methods: list = param(
        ["rag", "lora", "lora_merge", "ft", "rome"],
        "editors to compare: " + ", ".join(METHODS),
        paper="RAG, LoRA, LoRA-Merge, FT, ROME, R-ROME, MEMIT, WISE, ...",
    )
    increments: int = param(3, "timestamped increments T of the stream", paper="8 (first instance)")
    edits_per_increment: int = param(12, "edits B per increment", paper="> 500K QA pairs over 8 increments")
    reedit_fraction: float = param(0.1, "share of each later increment that overwrites an earlier edit")
    filter_known: bool = param(True, "drop edits the unedited model already answers", paper="filter_edits")
    n_general: int = param(20, "held-out unedited facts (general ability)", paper="SQuAD/TriviaQA/CSQA, 500 each")
    n_fluency: int = param(6, "HumanEval prompts whose log-likelihood tracks fluency")
    fewshot: bool = param(True, "prepend 3 fixed geography shots", paper="fs_examples: true")
    retriever: str = param("minilm", "RAG embeddings", paper="all-MiniLM-L6-v2, HNSW", choices=("minilm", "hashing"))
    rag_top_k: int = param(1, "facts retrieved per question", paper="top_k: 1")
    rag_fact_shots: bool = param(True, "RAG's shots show a retrieved fact in use (IKE-style); False: plain shots")
    lora_rank: int = param(4, "LoRA rank", paper="4 (merge runs; 8 otherwise)")
    lora_alpha: float = param(8.0, "LoRA alpha", paper="8 (merge runs; 32 otherwise)")
    lora_dropout: float = param(0.1, "LoRA dropout", paper="0.1 [code hparams]")
    lora_lr: float = param(5e-3, "Adam base learning rate of LoRA", paper="5e-3 * batch / 256 [lora_main.py]")
    lora_lr_batch_scaling: bool = param(
        True, "scale the LoRA and FT lrs by batch / 256 as the code does", paper="True [lora_main.py]"
    )
    lora_epochs: int = param(10, "passes over each increment", paper="10 (num_steps)")
    lora_batch: int = param(4, "edits per optimiser step", paper="32")
    merge_alpha: float = param(0.25, "LoRA-Merge: share of each increment's update kept", paper="0.25")
    ft_layers: list | None = param(None, "layers whose down_proj FT trains (None: the two middle layers)")
    ft_lr: float = param(5e-4, "Adam base learning rate of FT", paper="5e-4 (EasyEdit FT-L)")
    lr_search: list = param([1.0, 8.0, 64.0], "multipliers of the scaled LoRA / FT lr searched on dev")
    lr_max_extensions: int = param(3, "dev runs past an edge of lr_search, at the grid's ratio there (FT's choice sat "
                                   "on the top edge after 1: x512 of the scaled lr)")  # fmt: skip
    lr_dev_edits: int = param(8, "edits of the dev increment each lr trial trains on (GeoBigEdit dev split)")
    rome_layer: int = param(4, "layer whose down_proj ROME edits", paper="5 (Llama-3-8B)")
    rome_steps: int = param(12, "v* optimisation steps", paper="25 (v_num_grad_steps)")
    rome_lr: float = param(0.5, "v* Adam learning rate", paper="0.5")
    rome_weight_decay: float = param(1e-3, "v* weight decay", paper="1e-3")
    rome_clamp: float = param(4.0, "clamp of |delta| / |v|", paper="4 (clamp_norm_factor)")
    rome_kl: float = param(0.0625, "KL factor on the essence prompt", paper="0.0625")
    rome_templates: int = param(2, "generated context prefixes (plus the bare prompt)", paper="20 ([[5,10],[10,10]])")
    rome_template_tokens: int = param(5, "tokens per generated context prefix", paper="5 and 10")
    r_rome: bool = param(True, "R-ROME: the residual at the averaged key k*", paper="ROME: False; R-ROME: True")
    rome_mom2: bool = param(False, "use the covariance C in ROME's update", paper="mom2_adjustment: false")
    memit_layers: list = param([3, 4, 5, 6, 7], "layers MEMIT edits", paper="[4, 5, 6, 7, 8] (Llama-3-8B)")
    memit_lambda: float = param(15000.0, "MEMIT covariance weight lambda", paper="15000 (mom2_update_weight)")
    cov_samples: int = param(100, "offline corpus passages for C", paper="100 (mom2_n_samples), Wikipedia")
    cov_tokens: int = param(64, "tokens per covariance passage")
    min_effect: float = param(0.3, "margin of the 'ROME edit accuracy is high' check over the unedited model")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.methods:
            raise ValueError("methods must name at least one editor: " + ", ".join(METHODS))
        for m in self.methods:
            if m not in METHODS:
                raise ValueError(f"methods entries must be among {', '.join(METHODS)}, got {m!r}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods must not repeat an editor, got {self.methods}")
        check_range("increments", self.increments, 1)
        check_range("edits_per_increment", self.edits_per_increment, 1)
        if not 0 <= self.reedit_fraction < 1:
            raise ValueError(f"reedit_fraction must be in [0, 1), got {self.reedit_fraction!r}")
        check_range("n_general", self.n_general, 0)
        check_range("n_fluency", self.n_fluency, 0)
        check_range("rag_top_k", self.rag_top_k, 1)
        check_range("lora_rank", self.lora_rank, 1)
        check_range("lora_alpha", self.lora_alpha, 0.0, open_lo=True)
        check_range("lora_dropout", self.lora_dropout, 0.0, 0.99)
        check_range("lora_lr", self.lora_lr, 0.0, open_lo=True)
        check_range("lora_epochs", self.lora_epochs, 1)
        check_range("lora_batch", self.lora_batch, 1)
        check_range("merge_alpha", self.merge_alpha, 0.0, 1.0, open_lo=True)
        if self.ft_layers is not None and (not self.ft_layers or any(int(x) < 0 for x in self.ft_layers)):
            raise ValueError(f"ft_layers must be None or non-negative layer indices, got {self.ft_layers!r}")
        check_range("ft_lr", self.ft_lr, 0.0, open_lo=True)
        mults = [m for m in self.lr_search if isinstance(m, int | float) and not isinstance(m, bool) and m > 0]
        if not self.lr_search or len(mults) != len(self.lr_search) or len(set(mults)) != len(mults):
            raise ValueError(f"lr_search must be distinct positive multipliers, got {self.lr_search!r}")
        check_range("lr_max_extensions", self.lr_max_extensions, 0)
        check_range("lr_dev_edits", self.lr_dev_edits, 1)
        check_range("rome_layer", self.rome_layer, 0)
        check_range("rome_steps", self.rome_steps, 1)
        check_range("rome_lr", self.rome_lr, 0.0, open_lo=True)
        check_range("rome_weight_decay", self.rome_weight_decay, 0.0)
        check_range("rome_clamp", self.rome_clamp, 0.0, open_lo=True)
        check_range("rome_kl", self.rome_kl, 0.0)
        check_range("rome_templates", self.rome_templates, 0)
        check_range("rome_template_tokens", self.rome_template_tokens, 1)
        if not self.memit_layers or any(int(x) < 0 for x in self.memit_layers):
            raise ValueError(f"memit_layers must be non-empty non-negative layer indices, got {self.memit_layers!r}")
        if list(self.memit_layers) != sorted(set(self.memit_layers)):
            raise ValueError(f"memit_layers must be increasing and distinct, got {self.memit_layers!r}")
        check_range("memit_lambda", self.memit_lambda, 0.0, open_lo=True)
        check_range("cov_samples", self.cov_samples, 1)
        check_range("cov_tokens", self.cov_tokens, 2)
        check_range("min_effect", self.min_effect, 0.0, 1.0)
