"""The layering that docs/ARCHITECTURE.md describes, checked on the source."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ("specdec_core", "workers", "pipelines")  # lowest first
MAX_MODULE_LINES = 500  # pipelines/ and workers/ (issue 24)


def _modules(package: str) -> list[pathlib.Path]:
    return sorted((REPO_ROOT / package).rglob("*.py"))


def _imported_packages(path: pathlib.Path) -> set[str]:
    """Top-level packages that a module imports (at any depth of the file)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("layer", LAYERS[:-1])
def test_a_layer_never_imports_a_layer_above_it(layer):
    above = set(LAYERS[LAYERS.index(layer) + 1 :])
    offenders = {
        str(path.relative_to(REPO_ROOT)): sorted(_imported_packages(path) & above)
        for path in _modules(layer)
        if _imported_packages(path) & above
    }
    assert not offenders, f"{layer} imports a layer above it: {offenders}"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from pipelines import text\n")
    assert "pipelines" in _imported_packages(module)


@pytest.mark.parametrize("package", ("pipelines", "workers"))
def test_no_module_is_over_the_line_limit(package):
    long = {
        str(path.relative_to(REPO_ROOT)): n
        for path in _modules(package)
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them): {long}"


def test_the_architecture_doc_names_modules_that_exist():
    doc = (REPO_ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:specdec_core|workers|pipelines)/[\w/]+\.py)`", doc))
    missing = sorted(name for name in named if not (REPO_ROOT / name).is_file())
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"
