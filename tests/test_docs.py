"""The generated docs (README method table, docs/paper_index.md) match the registry."""

from __future__ import annotations

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
