"""The import graph of ``ope_cli`` is acyclic: every import counts, at module level, inside
functions (lazy imports) and under ``if TYPE_CHECKING``, so a cycle cannot hide. And the
package's functions stay small: none is longer than ``MAX_LINES``, and no long argument
list is let through with a ``noqa: PLR0913``, in the package, its studies and examples
(ruff's own per-file ignores are in pyproject.toml, which holds none for argument counts).
Every module has a test module a newcomer can find by its name."""

from __future__ import annotations

import ast
from pathlib import Path

import ope_cli

PACKAGE = Path(ope_cli.__file__).parent
MAX_LINES = 60  # of a function, its def line to its last line, docstring included


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The ``ope_cli`` modules that ``path`` imports anywhere (relative imports resolved;
    ``from package import name`` counts as the submodule when ``name`` is one)."""
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}".rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name in modules and name != this}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(path) for path in paths}
    return {module_name(path): imported_modules(path, modules) for path in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, colouring nodes)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return [*path[path.index(successor) :], successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_covers_the_package():
    graph = import_graph()
    assert "ope_cli.estimation.pipeline" in graph and "ope_cli.data.episodes" in graph
    assert "ope_cli.data.episodes" in graph["ope_cli.estimation.pipeline"]


def test_find_cycle_sees_a_lazy_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_ope_cli():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function (methods and nested ones too) of ``source`` longer
    than ``limit`` lines, from its def line (decorators not counted) to its last line."""
    return [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_long_functions_sees_a_long_method():
    body = "".join(f"        x{i} = {i}\n" for i in range(3))
    source = f"class A:\n    def f(self):\n{body}\n\ndef g():\n    pass\n"
    assert long_functions(source, limit=3) == [("f", 4)]
    assert long_functions(source, limit=4) == []


def test_no_function_in_ope_cli_is_longer_than_the_limit():
    found = [
        f"{path.relative_to(PACKAGE.parent)}: {name} ({lines} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for name, lines in long_functions(path.read_text())
    ]
    assert not found, f"functions over {MAX_LINES} lines: " + ", ".join(found)


def test_no_suppression_of_long_argument_lists():
    root = PACKAGE.parent
    paths = [
        p for folder in ("ope_cli", "studies", "examples") for p in (root / folder).rglob("*.py")
    ]
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(paths)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "noqa: PLR0913" in line
    ]
    assert not found, "noqa: PLR0913 (pass a record instead): " + ", ".join(found)
    settings = (root / "pyproject.toml").read_text()
    assert "PLR0913" in settings.split("[tool.ruff.lint.per-file-ignores]")[0]  # selected
    assert "PLR0913" not in settings.split("[tool.ruff.lint.per-file-ignores]")[1].split("[")[0]


def ope_cli_imports(path: Path) -> set[str]:
    """What ``path`` takes from ``ope_cli``: "ope_cli" for ``import ope_cli``, the module
    for any deeper import, "ope_cli:NAME" for ``from ope_cli import NAME``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "ope_cli")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ope_cli":
            if node.module == "ope_cli":
                found.update(f"ope_cli:{alias.name}" for alias in node.names)
            else:
                found.add(node.module)
    return found


def test_ope_cli_imports_sees_internals(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import ope_cli\nfrom ope_cli import evaluate\nfrom ope_cli.data import steps")
    assert ope_cli_imports(path) == {"ope_cli", "ope_cli:evaluate", "ope_cli.data"}


def test_examples_use_only_the_public_api():
    """examples/ is what a user writes: ``import ope_cli`` and the names of ``__all__``;
    measurements that reach inside the package live in studies/."""
    public = {"ope_cli", *(f"ope_cli:{name}" for name in ope_cli.__all__)}
    examples = sorted((PACKAGE.parent / "examples").glob("*.py"))
    assert examples
    for path in examples:
        assert ope_cli_imports(path) <= public, (path.name, ope_cli_imports(path) - public)


# Modules tested by a test module named otherwise: the behavior and Q models are what
# ``ope fit-behavior`` and ``ope fit-q`` fit, ``inspection`` is ``ope inspect``, and the
# package's own __init__ is the public API's lazy names.
TESTED_WITH = {
    "ope_cli": "test_api.py",
    "behavior_models": "test_fit_behavior.py",
    "q_models": "test_fit_q.py",
    "inspection": "test_inspect.py",
}


def covering_test_module(path: Path, tests: set[str]) -> str | None:
    """The test module of ``path`` (a module of the package) among ``tests`` (file names):
    test_<module>.py, else that of its nearest package that has one (test_sources.py for
    data/sources/parquet.py), ``TESTED_WITH``'s where it names one; None if none."""
    parts = (PACKAGE.name, *path.relative_to(PACKAGE).with_suffix("").parts)
    names = reversed(parts[:-1] if parts[-1] == "__init__" else parts)
    for name in names:
        for candidate in (f"test_{name}.py", TESTED_WITH.get(name)):
            if candidate in tests:
                return candidate
    return None


def defines_functions(path: Path) -> bool:
    """Whether ``path`` defines a function or method (not only records and constants)."""
    tree = ast.parse(path.read_text(), str(path))
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))


def test_tests_of_finds_the_package_test_module():
    sources = PACKAGE / "data" / "sources" / "parquet.py"
    assert (
        covering_test_module(sources, {"test_sources.py", "test_parquet.py"}) == "test_parquet.py"
    )
    assert covering_test_module(sources, {"test_sources.py", "test_data.py"}) == "test_sources.py"
    linear = PACKAGE / "models" / "q_models" / "linear.py"
    assert covering_test_module(linear, {"test_fit_q.py", "test_models.py"}) == "test_fit_q.py"
    assert covering_test_module(PACKAGE / "outputs.py", {"test_sources.py"}) is None


def test_every_module_has_a_test_module():
    """Where a newcomer looks for the tests of a module: test_<module>.py, or that of its
    package (a package of small modules, such as the sources, shares one). Modules of
    records and constants alone (config.py, a package's __init__) are tested where they
    are used."""
    tests = {path.name for path in Path(__file__).parent.glob("test_*.py")}
    untested = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__main__.py"
        and defines_functions(path)
        and covering_test_module(path, tests) is None
    ]
    assert not untested, "modules without a test module: " + ", ".join(untested)
