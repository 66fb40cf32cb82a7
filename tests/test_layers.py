"""The house's layering (pyproject's ``[tool.importlinter]``), checked by import-linter; these tests keep it honest.

- the contracts hold on the tree (``lint-imports``, also run by ``make test``);
- the only method-to-method imports import-linter lets through are a method's declared baselines (the registry's
  ``MethodSpec.baselines`` that are themselves registered methods);
- the checker can fail: the same contracts on a copy of the sources with one forbidden import planted are broken.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import lmlab
from lmlab.registry import list_methods

ROOT = Path(__file__).resolve().parents[1]
SRC = Path(lmlab.__file__).resolve().parent
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")


def _config() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def _lint(src_parent: Path, config: Path) -> subprocess.CompletedProcess:
    if LINT is None:
        pytest.skip("lint-imports (import-linter) is not installed: pip install -e '.[dev]'")
    env = {"PYTHONPATH": str(src_parent), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    return subprocess.run(
        [LINT, "--config", str(config), "--no-cache"], capture_output=True, text=True, env=env, cwd=src_parent,
        timeout=120,
    )  # fmt: skip


def test_the_contracts_hold():
    proc = _lint(SRC.parent, ROOT / "pyproject.toml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "BROKEN" not in proc.stdout


def test_method_to_method_imports_are_exactly_the_declared_baselines():
    specs = {s.id: s for s in list_methods()}
    package = {s.id: f"lmlab.methods.{s.area}.{s.id}" for s in specs.values()}
    declared = {f"{package[s.id]}.** -> {package[b]}.**" for s in specs.values() for b in s.baselines if b in package}
    contract = next(c for c in _config()["contracts"] if c["id"] == "methods")
    ignored = set(contract.get("ignore_imports", []))
    assert ignored <= declared, f"ignored imports that are no declared baseline: {sorted(ignored - declared)}"
    # every ignore line is used: a declared baseline that is not imported needs no line (import-linter warns)
    for line in ignored:
        src, dst = (re.sub(r"\.\*\*$", "", part.strip()) for part in line.split("->"))
        src_dir = SRC.parent.joinpath(*src.split("."))
        assert any(dst in p.read_text() for p in src_dir.rglob("*.py")), f"{line}: {src} never imports {dst}"


def test_a_planted_forbidden_import_breaks_the_contracts(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "lmlab", ignore=shutil.ignore_patterns("__pycache__", "*.gz", "*.png"))
    stats = copy / "lmlab" / "core" / "stats" / "uncertainty.py"
    stats.write_text(stats.read_text() + "\n\ndef _planted():\n    from lmlab.data import load\n\n    return load\n")
    proc = _lint(copy, ROOT / "pyproject.toml")
    assert proc.returncode != 0
    assert "lmlab.core.stats.uncertainty -> lmlab.data" in proc.stdout, proc.stdout[-3000:]
