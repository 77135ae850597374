"""The architecture targets (benchmarks/architecture.py): no import circle, few function-local
imports each with a reason, one definition of each contract name, no pyarrow or environment
reads in geodbk outside its I/O package geodbk.geo."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "architecture.py"
#: I/O allowed in geodbk outside geodbk.geo: (module, what) -> why.
IO_EXCEPTIONS: dict[tuple[str, str], str] = {}


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


def test_the_checks_can_fail(arch: ModuleType, tmp_path: Path) -> None:
    """A circle, an unexplained local import and a second definition are each found."""
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
