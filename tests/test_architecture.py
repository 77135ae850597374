"""The architecture targets (benchmarks/architecture.py): no import circle, few function-local
imports each with a reason, one definition of each contract name, no pyarrow or environment
reads in geodbk outside its I/O package geodbk.geo, and tests that mirror the packages (each
module has a test file named after it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "architecture.py"
#: I/O allowed in geodbk outside geodbk.geo: (module, what) -> why.
IO_EXCEPTIONS: dict[tuple[str, str], str] = {}
#: Modules (or packages: every module below) without a test file named after them -> why.
TEST_EXCEPTIONS: dict[str, str] = {}


def _untested(
    untested: dict[str, Path], exceptions: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """``(missing, unused)``: the modules of ``untested`` no exception covers (with the test
    file each should have), and the exceptions that cover none of them (no longer needed)."""

    def covers(key: str, module: str) -> bool:
        return module == key or module.startswith(key + ".")

    missing = {m: str(t) for m, t in untested.items() if not any(covers(k, m) for k in exceptions)}
    unused = [k for k in exceptions if not any(covers(k, m) for m in untested)]
    return missing, unused


@pytest.fixture(scope="module")
def arch() -> ModuleType:
    spec = importlib.util.spec_from_file_location("architecture_targets", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_import_graph_has_no_circle(arch: ModuleType) -> None:
    assert arch.circles(arch.build_graph()) == []


def test_function_local_imports_are_few_and_explained(arch: ModuleType) -> None:
    local = arch.build_graph().local
    assert len(local) <= arch.MAX_LOCAL_IMPORTS
    assert [f"{li.module}:{li.line}" for li in local if not li.reason] == []


def test_contract_names_are_defined_once(arch: ModuleType) -> None:
    definitions = arch.build_graph().definitions
    for name in arch.CONTRACT_NAMES:
        assert definitions[name] == ["geodbk.geo.contract"], name


def test_no_io_outside_the_io_package(arch: ModuleType) -> None:
    """No module of geodbk outside geodbk.geo imports pyarrow, reads the environment or imports
    a geodbk.geo module that imports pyarrow, except the listed ones."""
    uses = {(u.module, u.what) for u in arch.io_outside_io_package(arch.build_graph())}
    assert uses - set(IO_EXCEPTIONS) == set()
    assert set(IO_EXCEPTIONS) - uses == set(), "an exception no longer needed"


def test_every_module_has_a_test_file_named_after_it(arch: ModuleType) -> None:
    """``geodbk/x.py`` -> ``tests/test_x.py``, ``geodbk/geo/y.py`` -> ``tests/geo/test_y.py``,
    ``pipelines/z.py`` -> ``tests/pipelines/test_z.py``, ``app/w.py`` and ``app/tabs/v.py`` ->
    ``tests/app/test_w.py``, ``tests/app/test_v.py`` (:func:`mirrored_test`), except the listed
    modules; each exception still covers a module without one, and no two test files that the
    rule names share a base name (pytest could not collect both)."""
    graph = arch.build_graph()
    missing, unused = _untested(arch.modules_without_tests(graph), TEST_EXCEPTIONS)
    assert missing == {}
    assert unused == [], "an exception no longer needed"
    names = [
        arch.mirrored_test(m, graph.modules).name
        for m, path in graph.modules.items()
        if path.name != "__init__.py"
    ]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_the_checks_can_fail(arch: ModuleType, tmp_path: Path) -> None:
    """A circle, an unexplained local import, a second definition, I/O outside the I/O package
    and a module without its test file are each found."""
    for pkg in arch.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "geodbk" / "a.py").write_text("from geodbk import b\nZ95 = 1.96\n")
    (tmp_path / "geodbk" / "b.py").write_text(
        "def f():\n    from geodbk.a import Z95\n    return Z95\n"
    )
    (tmp_path / "geodbk" / "geo").mkdir()
    (tmp_path / "geodbk" / "geo" / "__init__.py").write_text("")
    (tmp_path / "geodbk" / "geo" / "io.py").write_text("import pyarrow.parquet as pq\n")
    (tmp_path / "geodbk" / "c.py").write_text(
        "import os\nfrom geodbk.geo.io import pq\n\n\ndef f():\n"
        "    import pyarrow\n    return os.environ.get('X'), pyarrow\n"
    )
    graph = arch.build_graph(tmp_path)
    assert arch.circles(graph) == [["geodbk.a", "geodbk.b"]]
    assert [(li.module, li.imported, li.reason) for li in graph.local] == [
        ("geodbk.b", "geodbk.a", None)
    ]
    assert graph.definitions["Z95"] == ["geodbk.a"]
    assert [(u.module, u.line, u.what) for u in arch.io_outside_io_package(graph)] == [
        ("geodbk.c", 2, "geodbk.geo.io (pyarrow)"),
        ("geodbk.c", 6, "pyarrow"),
        ("geodbk.c", 7, "os.environ"),
    ]
    # geodbk.a has its test; pipelines.a takes the package prefix (geodbk.a has test_a.py);
    # app/tabs is flattened into tests/app; a leading underscore is dropped
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("")
    (tmp_path / "pipelines" / "a.py").write_text("")
    (tmp_path / "app" / "tabs").mkdir()
    (tmp_path / "app" / "tabs" / "__init__.py").write_text("")
    (tmp_path / "app" / "tabs" / "_map_tab.py").write_text("")
    untested = arch.modules_without_tests(arch.build_graph(tmp_path), tmp_path)
    assert untested == {
        "app.tabs._map_tab": Path("tests/app/test_map_tab.py"),
        "geodbk.b": Path("tests/test_b.py"),
        "geodbk.c": Path("tests/test_c.py"),
        "geodbk.geo.io": Path("tests/geo/test_io.py"),
        "pipelines.a": Path("tests/pipelines/test_pipeline_a.py"),
    }
    # a package's exception covers its modules; one that covers no module is no longer needed
    exceptions = {"geodbk.geo": "why", "app.tabs._map_tab": "why", "pipelines.b": "why"}
    assert _untested(untested, exceptions) == (
        {
            "geodbk.b": "tests/test_b.py",
            "geodbk.c": "tests/test_c.py",
            "pipelines.a": "tests/pipelines/test_pipeline_a.py",
        },
        ["pipelines.b"],
    )
