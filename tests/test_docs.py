"""The generated docs (README method table and study block, docs/paper_index.md, docs/reproduction.md) are up to
date with the registry and results/study."""

from __future__ import annotations

import pytest

from lmlab import docs


def test_readme_method_table_is_up_to_date():
    text = (docs.ROOT / "README.md").read_text()
    assert docs.readme_with_table(text) == text, "run `python -m lmlab.docs`"


def test_paper_index_is_up_to_date():
    assert (docs.ROOT / "docs" / "paper_index.md").read_text() == docs.paper_index(), "run `python -m lmlab.docs`"


def test_readme_starts_with_the_two_setup_commands():
    text = (docs.ROOT / "README.md").read_text()
    block = text.split("```bash", 1)[1].split("```", 1)[0].strip().splitlines()
    assert block[0].startswith("make run") and block[1].startswith("make test")


def _result(**claim):
    base = {"text": "a beats b", "metric": "m", "method": "a", "baseline": "b", "direction": ">", "min_effect": 0.0,
            "method_value": 0.7, "baseline_value": 0.5, "observed_effect": 0.2, "ci": [0.1, 0.3], "n": 8,
            "status": "supported", "gate": True, "null_status": "not_supported"}  # fmt: skip
    base.update(claim)
    return {"run_info": {"method": "x", "preset": "default", "seed": 0, "created_at": "T"}, "config": {},
            "meta_info": {"models": {"m": {"spec": "smollm2-135m"}}}, "claims": [base],
            "claim": {"status": "supported"}}  # fmt: skip


def test_measured_block_shows_units_kind_and_the_baseline_check():
    block = docs.measured_block(_result(n_values=256))
    assert "| gated | a beats b |" in block and "8 (of 256 values)" in block and "does not hold |" in block
    assert "Verdict: **holds**" in block
    mech = docs.measured_block(_result(mechanism=True, gate=False))
    assert "| mechanism |" in mech


def test_measured_block_is_replaced_in_place():
    text = "# X\n\nintro\n\n## Deviations\n\n- one\n"
    once = docs.readme_with_measured(text, docs.measured_block(_result()))
    assert once.index(docs.MEASURED_BEGIN) < once.index("## Deviations")
    twice = docs.readme_with_measured(once, docs.measured_block(_result(status="inconclusive")))
    assert twice.count(docs.MEASURED_BEGIN) == 1 and "inconclusive" in twice and "## Deviations" in twice


def _full_git_history() -> bool:
    """The stale markers come from `git log`: a checkout without git or with shallow history cannot recompute them."""
    import shutil
    import subprocess

    if shutil.which("git") is None:
        return False
    cmd = ["git", "rev-parse", "--is-shallow-repository"]
    out = subprocess.run(cmd, cwd=docs.ROOT, capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip() == "false"


needs_git = pytest.mark.skipif(not _full_git_history(), reason="stale markers need the full git history")


@needs_git
@needs_git  # the page marks stale cells, from `git log`
def test_reproduction_page_is_up_to_date():
    page = (docs.ROOT / "docs" / "reproduction.md").read_text()
    assert page == docs.reproduction_md(), "run `python -m lmlab.docs` (results/study changed)"


@needs_git
def test_readme_study_block_is_up_to_date():
    text = (docs.ROOT / "README.md").read_text()
    assert docs.readme_with_study(text) == text, "run `python -m lmlab.docs` (results/study changed)"
