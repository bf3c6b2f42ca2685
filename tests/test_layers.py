"""The house rules, read from the code itself: folders import only the folders below them, no module imports
itself back through a cycle, at most 13 entries at the top of optbench/, no module over 400 lines and no
function over 50."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "optbench"
# The floors, top to bottom, along the data path: a folder may import any folder on a lower floor, none beside or
# above it.
FLOORS = (("cli",), ("workflows",), ("sweep",), ("trial",), ("memory",), ("workloads",), ("report", "job"),
          ("records", "probes", "optimizers"))
FLOOR = {folder: len(FLOORS) - i for i, floor in enumerate(FLOORS) for folder in floor}
MAY_IMPORT = {folder: {other for other, level in FLOOR.items() if level < FLOOR[folder]} for folder in FLOOR}
TOP_LEVEL_FILES = {"__init__.py", "__main__.py"}


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _folder(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def _imported_folders(path: Path) -> set[str]:
    """The optbench folders `path` imports, at module level or inside functions."""
    folders = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[0] == "optbench" and len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
                folders.add(parts[1])
    return folders


def test_every_folder_is_in_the_layer_table_and_the_top_holds_at_most_13_entries():
    entries = [p.name for p in PACKAGE.iterdir() if p.name != "__pycache__"]
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(FLOOR), "a new folder needs its floor in FLOORS (and its row in CONTRIBUTING.md)"
    assert set(entries) - folders == TOP_LEVEL_FILES
    assert len(entries) <= 13, sorted(entries)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_only_point_down(path):
    folder = _folder(path)
    if folder is None:  # __main__ / __init__ at the top may use any folder
        return
    upward = _imported_folders(path) - MAY_IMPORT[folder] - {folder}
    assert not upward, f"{path.relative_to(PACKAGE)} imports {sorted(upward)}, above or beside {folder}/"


def test_at_most_eight_floors():
    assert len(FLOORS) <= 8


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_400_lines_and_no_function_over_50(path):
    text = path.read_text()
    assert len(text.splitlines()) <= 400
    long = [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 50]
    assert not long, long


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """The optbench modules `path` imports; `from pkg import submodule` is the submodule, not the package."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in known}


def test_no_import_cycle_between_modules():
    paths = {_module_name(p): p for p in _modules()}
    graph = {name: _imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path[path.index(name):] + (name,))}"
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, path + (name,))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())
