"""The layering that docs/ARCHITECTURE.md describes, checked on the source."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize
from collections.abc import Iterator, Sequence

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = ("specdec_core", "workers", "pipelines")  # lowest first
MAX_MODULE_LINES = 500  # pipelines/ and workers/: a longer module does several jobs


def _modules(package: str, root: pathlib.Path = REPO_ROOT) -> list[pathlib.Path]:
    return sorted((root / package).rglob("*.py"))


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


# Lab notes: history belongs to git and figures to BENCHMARKS.md, so the prose of the code
# and configs (comments, docstrings, YAML comments) names no date, issue or stop number
# and no commit.
LAB_NOTE_DIRS = ("specdec_core", "workers", "pipelines", "configs")
LAB_NOTES = {
    "a date": re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    "an issue or stop reference": re.compile(r"\b(?:issue|stop)\s+#?\d+", re.IGNORECASE),
    # 7-40 hex digits, at least one letter and one digit: an abbreviated or full commit
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"),
}


def _prose(path: pathlib.Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a file's prose: a Python module's comments and docstrings,
    a YAML file's comments. Code and data (string literals, YAML values) are left out."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.COMMENT:
                yield token.start[0], token.string
        documented = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, documented) and (doc := ast.get_docstring(node, clean=False)):
                for offset, line in enumerate(doc.splitlines()):
                    yield node.body[0].lineno + offset, line
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if comment := re.search(r"(?:^|\s)#(.*)", line):
                yield number, comment.group(1)


def _lab_notes(path: pathlib.Path) -> list[tuple[int, str, str]]:
    """(line number, kind, the text found) of each lab note in ``path``'s prose."""
    return [
        (number, kind, found.group(0))
        for number, line in _prose(path)
        for kind, pattern in LAB_NOTES.items()
        if (found := pattern.search(line))
    ]


def test_code_and_configs_carry_no_lab_notes():
    paths = sorted(
        path
        for folder in LAB_NOTE_DIRS
        for path in (REPO_ROOT / folder).rglob("*")
        if path.suffix in (".py", ".yaml", ".yml")
    )
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {kind} ({text!r})"
        for path in paths
        for number, kind, text in _lab_notes(path)
    ]
    assert len(paths) > 100, "the check reads the code and configs"
    assert not found, (
        "lab notes in comments or docstrings (history is git's; a figure's place is "
        "BENCHMARKS.md, which a comment may name):\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("m.py", "x = 1  # since 2026-12-06\n", [(1, "a date", "2026-12-06")]),
        (
            "m.py",
            'import os\n\n\ndef f():\n    """As CI of Stop 43 showed."""\n',
            [(5, "an issue or stop reference", "Stop 43")],
        ),
        (
            "m.py",
            '"""The model.\n\nFixed in b252b85 (issue 21 item 4)."""\n',
            [(3, "an issue or stop reference", "issue 21"), (3, "a commit hash", "b252b85")],
        ),
        ("c.yaml", "# the run of 2026-12-04\nalpha: 0.39\n", [(1, "a date", "2026-12-04")]),
        (
            "c.yaml",
            "alpha: 0.391  # measured at 3dd3529f\n",
            [(1, "a commit hash", "3dd3529f")],
        ),
    ],
)
def test_the_lab_note_check_finds_each_kind(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert _lab_notes(path) == expected


def test_the_lab_note_check_reads_prose_only(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        'MASK = 0xdeadbeef1\nSHA = "3f2a9c1d0e"\nWHEN = "2026-12-06"  # 16 rows, bfloat16\n'
        'ISSUE = "issue 21"\n'
    )
    config = tmp_path / "c.yaml"
    config.write_text('sha256: 3f2a9c1d0e7b\nissue: 21\nwhen: "2026-12-06"  # a deadbeef\n')
    assert _lab_notes(module) == [] and _lab_notes(config) == []


# ------------------------------------------------------------------ import circles


def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: pathlib.Path, packages: Sequence[str]) -> dict[str, set[str]]:
    """Module -> the modules of ``packages`` it imports, at any depth of the file (inside
    functions and ``if TYPE_CHECKING:`` too): ``from a import b`` counts as importing
    ``a.b`` where that is a module, else ``a``."""
    paths = {
        _module_name(root, path): path for package in packages for path in _modules(package, root)
    }
    graph = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {module for module in found if module in paths and module != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other_in_a_circle():
    circles = _circles(_import_graph(REPO_ROOT, LAYERS))
    assert not circles, f"modules that import each other in a circle: {circles}"


def test_the_circle_check_sees_a_circle_through_a_function_level_import(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")
    (package / "c.py").write_text("from . import a\n\ndef g():\n    pass\n")
    (package / "d.py").write_text("from pkg import a\n")
    assert _circles(_import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b", "pkg.c"]]
