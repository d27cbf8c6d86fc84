"""The import direction of src/attnlab (docs/architecture.md): no import circle between modules or packages, and
every package imports only its own layer or the layers below it.

Every import statement counts, wherever it stands: at the top, deferred into a function, under ``TYPE_CHECKING``
(a circle hidden in a function is still a circle). ``from package import name`` counts the package too (its
``__init__`` runs first, and its re-exports are imports of its own).
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top; a package (``attnlab.<name>``, or a top-level module) imports only from its own layer and those
# below. Entry points (``__main__`` modules) are commands whichever package holds them. docs/architecture.md draws it.
LAYERS: list[tuple[str, set[str]]] = [
    (
        "foundation",
        {"errors", "files", "digest", "configs", "defaults", "console", "hub", "nn_utils", "numerics", "plots"}
        | {"slurm", "field_checks"},
    ),
    ("run directories", {"run_directory", "compare"}),
    ("attention", {"attention"}),
    ("models", {"models"}),
    ("data", {"data"}),
    ("run set-up", {"config_checks", "validation", "cells", "resolvers", "model_card"}),
    ("training and evaluation", {"training", "eval"}),
    ("experiments", {"bench", "tables", "synthetic"}),
    ("commands", {"cli", "api", "export", "generate", "report", "__init__", "__main__"}),
]
# Side by side in one layer, and never importing each other.
INDEPENDENT = [("training", "eval")]


def modules(src: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the attnlab package (a package is its ``__init__``)."""
    found = {}
    for path in sorted((src / "attnlab").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(src: Path) -> dict[str, dict[str, int]]:
    """Module -> {attnlab module it imports: the line of the first such import}."""
    known = modules(src)

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the package that holds this module
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = {f"{base}.{alias.name}" for alias in node.names}
                targets = {owner(base), *(names & known.keys())}
            else:
                continue
            for imported in targets - {None, name}:
                graph[name].setdefault(imported, node.lineno)
    return graph


def package_of(module: str) -> str:
    """The package (or top-level module) a module belongs to, by its name under ``attnlab``; entry points apart."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "__main__"
    return parts[1] if len(parts) > 1 else "__init__"


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (as graphlib finds it), or None when its imports all run one way."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def module_circle(src: Path) -> list[str] | None:
    return circle({name: set(targets) for name, targets in imports(src).items()})


def package_circle(src: Path) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for name, targets in imports(src).items():
        here = package_of(name)
        graph.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    return circle(graph)


def upward_imports(src: Path) -> list[str]:
    """Every import from a higher layer (or between independent packages), as ``file:line: a -> b``; a package with
    no layer is ``test_every_package_has_a_layer``'s to report."""
    layer = {package: rank for rank, (_, packages) in enumerate(LAYERS) for package in packages}
    found = []
    for name, targets in imports(src).items():
        for target, line in targets.items():
            here, there = package_of(name), package_of(target)
            apart = (here, there) in INDEPENDENT or (there, here) in INDEPENDENT
            if here not in layer or there not in layer:
                continue
            if layer[there] > layer[here] or apart:
                found.append(f"{modules(src)[name].relative_to(src)}:{line}: {name} -> {target}")
    return found


def test_every_package_has_a_layer() -> None:
    placed = {package for _, packages in LAYERS for package in packages}
    unplaced = sorted({package_of(name) for name in modules(SRC)} - placed)
    assert not unplaced, f"place these in LAYERS (and docs/architecture.md): {unplaced}"


def test_no_module_imports_in_a_circle() -> None:
    assert module_circle(SRC) is None, f"import circle: {' -> '.join(module_circle(SRC) or [])}"


def test_no_package_imports_in_a_circle() -> None:
    assert package_circle(SRC) is None, f"import circle between packages: {' -> '.join(package_circle(SRC) or [])}"


def test_every_import_points_down_the_layers() -> None:
    assert upward_imports(SRC) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("def f():\n    from attnlab.b import x\n", {"attnlab.b"}),  # deferred into a function
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from attnlab.b import x\n", {"attnlab.b"}),
        ("from attnlab import b\n", {"attnlab", "attnlab.b"}),  # the package's __init__ runs first
        ("from . import b\n", {"attnlab", "attnlab.b"}),
        ("import attnlab.b.c as c\n", {"attnlab.b"}),
    ],
)
def test_every_kind_of_import_counts(tmp_path: Path, source: str, found: set[str]) -> None:
    package = tmp_path / "attnlab"
    (package / "b").mkdir(parents=True)
    for path in (package / "__init__.py", package / "b" / "__init__.py"):
        path.write_text("")
    (package / "a.py").write_text(source)
    assert set(imports(tmp_path)["attnlab.a"]) == found
    (package / "b" / "__init__.py").write_text("import attnlab.a\n")
    assert module_circle(tmp_path) is not None
