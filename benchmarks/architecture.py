"""Print the architecture targets of geodbk: the import graph, function-local imports, single
definitions of the run-directory contract's names, I/O outside the I/O package, and lines of
code.

The import graph has one node per module of ``geodbk``, ``pipelines`` and ``app`` and an edge
for every import of another project module, at module level or inside a function (imports under
``if TYPE_CHECKING:`` are left out: they never run). A circle is a strongly connected set of
more than one module. A function-local import must carry a ``# local:`` comment that says why
(an optional heavy dependency loaded only when used). The modules of ``geodbk`` outside its I/O
package ``geodbk.geo`` do math: an import of pyarrow, a read of the environment (``os.environ``,
``os.getenv``) or an import of an I/O-package module that imports pyarrow is listed. The tests
mirror the packages: every module has a test file named after it (:func:`mirrored_test`), and
the modules without one are listed::

    python benchmarks/architecture.py            # the report
    python benchmarks/architecture.py --json     # the same as JSON
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("geodbk", "pipelines", "app")
#: Names the contract defines once (``geodbk/geo/contract.py``); a second module-level
#: assignment of one of them anywhere is a second definition.
CONTRACT_NAMES = ("TARGETS", "TARGET_INFO", "Z95", "DEFAULT_THRESHOLDS")
#: Most function-local project imports allowed, each with a ``# local:`` reason.
MAX_LOCAL_IMPORTS = 10
#: The package that reads and writes files; the rest of ``geodbk`` does no I/O.
IO_PACKAGE = "geodbk.geo"
#: Names of ``os`` that read or change the environment.
ENV_NAMES = ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
#: The test folder of each package: ``geodbk/geo/y.py`` -> ``tests/geo/test_y.py`` (the
#: subpackages of ``geodbk`` have folders of their own), ``pipelines/z.py`` ->
#: ``tests/pipelines/test_z.py``, ``app/w.py`` and ``app/tabs/v.py`` -> ``tests/app/test_w.py``,
#: ``tests/app/test_v.py``.
TEST_FOLDERS = {"geodbk": "tests", "pipelines": "tests/pipelines", "app": "tests/app"}
#: The prefix a module's test file takes when a package earlier in :data:`PACKAGES` has a
#: module of the same name: pytest imports test files by their base name, so
#: ``tests/test_service.py`` (``geodbk/service.py``) and ``tests/pipelines/test_service.py``
#: could not both be collected; ``pipelines/service.py`` -> ``test_pipeline_service.py``.
TEST_PREFIXES = {"pipelines": "pipeline_", "app": "app_"}


@dataclass
class LocalImport:
    """A project import inside a function: where, what, and the reason given (if any)."""

    module: str
    line: int
    imported: str
    reason: str | None


@dataclass
class IOUse:
    """I/O in a module of ``geodbk`` outside :data:`IO_PACKAGE`: where and what."""

    module: str
    line: int
    what: str


@dataclass
class Graph:
    """The project's import graph and what the targets count."""

    modules: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    local: list[LocalImport] = field(default_factory=list)
    definitions: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    #: Modules that import pyarrow, with the line of the first such import.
    pyarrow: dict[str, int] = field(default_factory=dict)
    #: Environment reads (``os.environ``, ``os.getenv``...): (module, line, name).
    environment: list[tuple[str, int, str]] = field(default_factory=list)
    #: Project imports as (module, line, imported module).
    imports: list[tuple[str, int, str]] = field(default_factory=list)


def module_name(path: Path, root: Path) -> str:
    """``geodbk/geo/table.py`` -> ``geodbk.geo.table``; a package's ``__init__`` -> its name."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` (or its longest prefix that is one), else ``None``."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path) -> list[str]:
    """The dotted names an import statement reaches (``from a import b`` -> ``a.b``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _reason(lines: list[str], node: ast.stmt) -> str | None:
    """The ``# local: ...`` comment on the import's lines or the line above."""
    for text in lines[max(node.lineno - 2, 0) : node.end_lineno or node.lineno]:
        if "# local:" in text:
            return text.split("# local:", 1)[1].strip()
    return None


def build_graph(root: Path = ROOT) -> Graph:
    """Parse every module of :data:`PACKAGES` under ``root`` into a :class:`Graph`."""
    modules = {
        module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))
    }
    graph = Graph(modules)
    for module, path in modules.items():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in CONTRACT_NAMES:
                    graph.definitions[target.id].append(module)
        _walk(tree, module, path, lines, graph, in_function=False)
    return graph


def _walk(
    node: ast.AST, module: str, path: Path, lines: list[str], graph: Graph, *, in_function: bool
) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            continue
        if isinstance(child, ast.Attribute) and _is_os(child.value) and child.attr in ENV_NAMES:
            graph.environment.append((module, child.lineno, f"os.{child.attr}"))
        if isinstance(child, ast.Import | ast.ImportFrom):
            targets = _targets(child, module, path)
            if any(t == "pyarrow" or t.startswith("pyarrow.") for t in targets):
                graph.pyarrow.setdefault(module, child.lineno)
            if isinstance(child, ast.ImportFrom) and child.module == "os" and not child.level:
                for alias in child.names:
                    if alias.name in ENV_NAMES:
                        graph.environment.append((module, child.lineno, f"os.{alias.name}"))
            reached = {_resolve(t, graph.modules) for t in targets}
            for other in sorted(r for r in reached if r and r != module):
                graph.edges[module].add(other)
                graph.imports.append((module, child.lineno, other))
                if in_function:
                    reason = _reason(lines, child)
                    graph.local.append(LocalImport(module, child.lineno, other, reason))
            continue
        inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
        _walk(child, module, path, lines, graph, in_function=inner)


def _is_os(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "os"


def _in_io_package(module: str) -> bool:
    return module == IO_PACKAGE or module.startswith(IO_PACKAGE + ".")


def io_outside_io_package(graph: Graph) -> list[IOUse]:
    """I/O in the modules of ``geodbk`` outside :data:`IO_PACKAGE`: pyarrow imports,
    environment reads, and imports of an I/O-package module that imports pyarrow."""
    math = {m for m in graph.modules if m.split(".")[0] == "geodbk" and not _in_io_package(m)}
    uses = [IOUse(m, line, "pyarrow") for m, line in graph.pyarrow.items() if m in math]
    uses += [IOUse(m, line, name) for m, line, name in graph.environment if m in math]
    uses += [
        IOUse(m, line, f"{other} (pyarrow)")
        for m, line, other in graph.imports
        if m in math and _in_io_package(other) and other in graph.pyarrow
    ]
    return sorted(uses, key=lambda u: (u.module, u.line, u.what))


def mirrored_test(module: str, modules: dict[str, Path]) -> Path:
    """The test file of ``module`` (a module of ``modules``), relative to the repository root:
    ``geodbk.geo.table`` -> ``tests/geo/test_table.py``, ``pipelines.service`` ->
    ``tests/pipelines/test_pipeline_service.py`` (``geodbk.service`` has ``test_service.py``).
    A leading underscore is dropped (``geodbk._version`` -> ``tests/test_version.py``)."""
    package, *inner, name = module.split(".")
    stem = name.lstrip("_")
    folder = Path(TEST_FOLDERS[package], *(inner if package == "geodbk" else []))
    earlier = PACKAGES[: PACKAGES.index(package)]
    taken = any(
        m.split(".")[0] in earlier and m.rpartition(".")[2].lstrip("_") == stem for m in modules
    )
    return folder / f"test_{TEST_PREFIXES[package] if taken else ''}{stem}.py"


def modules_without_tests(graph: Graph, root: Path = ROOT) -> dict[str, Path]:
    """The modules (packages' ``__init__`` left out) whose :func:`mirrored_test` is missing
    under ``root``, each with the test file it should have."""
    return {
        module: test
        for module, path in sorted(graph.modules.items())
        if path.name != "__init__.py"
        and not (root / (test := mirrored_test(module, graph.modules))).is_file()
    }


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected sets of more than one module (each a circle of imports)."""
    names = sorted(graph.modules)
    index = {n: i for i, n in enumerate(names)}
    rows = [index[a] for a, outs in graph.edges.items() for _ in outs]
    cols = [index[b] for outs in graph.edges.values() for b in outs]
    matrix = csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(names), len(names)))
    _, labels = connected_components(matrix, directed=True, connection="strong")
    groups: dict[int, list[str]] = defaultdict(list)
    for name, label in zip(names, labels, strict=True):
        groups[int(label)].append(name)
    return sorted(g for g in groups.values() if len(g) > 1)


def lines_of_code(root: Path = ROOT) -> dict[str, int]:
    """Lines of the ``.py`` files of each package."""
    return {
        pkg: sum(
            len(p.read_text(encoding="utf-8").splitlines()) for p in (root / pkg).rglob("*.py")
        )
        for pkg in PACKAGES
    }


def report(root: Path = ROOT) -> dict[str, object]:
    """The targets as a JSON-able dict."""
    graph = build_graph(root)
    loc = lines_of_code(root)
    return {
        "modules": len(graph.modules),
        "circles": circles(graph),
        "local_imports": [
            {"module": li.module, "line": li.line, "imports": li.imported, "reason": li.reason}
            for li in graph.local
        ],
        "local_imports_without_reason": sum(li.reason is None for li in graph.local),
        "max_local_imports": MAX_LOCAL_IMPORTS,
        "definitions": {name: graph.definitions.get(name, []) for name in CONTRACT_NAMES},
        "io_outside_io_package": [
            {"module": u.module, "line": u.line, "what": u.what}
            for u in io_outside_io_package(graph)
        ],
        "modules_without_tests": {
            module: str(test) for module, test in modules_without_tests(graph, root).items()
        },
        "lines_of_code": {**loc, "total": sum(loc.values())},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    result = report()
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    local = result["local_imports"]
    assert isinstance(local, list)
    print(f"modules: {result['modules']}")
    print(f"import circles (function-local imports counted): {result['circles'] or 'none'}")
    print(f"function-local project imports: {len(local)} (at most {MAX_LOCAL_IMPORTS})")
    for li in local:
        print(f"  {li['module']}:{li['line']} -> {li['imports']}: {li['reason'] or 'NO REASON'}")
    for name, where in dict(result["definitions"]).items():  # type: ignore[call-overload]
        print(f"definitions of {name}: {len(where)} ({', '.join(where)})")
    io = result["io_outside_io_package"]
    assert isinstance(io, list)
    print(f"I/O in geodbk outside {IO_PACKAGE}: {len(io)}")
    for u in io:
        print(f"  {u['module']}:{u['line']}: {u['what']}")
    untested = result["modules_without_tests"]
    assert isinstance(untested, dict)
    print(f"modules without a test file named after them: {len(untested)}")
    for module, test in untested.items():
        print(f"  {module}: {test}")
    print(f"lines of code: {result['lines_of_code']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
