"""The architecture targets (benchmarks/architecture.py): no import circle, few function-local
imports each with a reason, one definition of each contract name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "architecture.py"


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


def test_the_checks_can_fail(arch: ModuleType, tmp_path: Path) -> None:
    """A circle, an unexplained local import and a second definition are each found."""
    for pkg in arch.PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "geodbk" / "a.py").write_text("from geodbk import b\nZ95 = 1.96\n")
    (tmp_path / "geodbk" / "b.py").write_text(
        "def f():\n    from geodbk.a import Z95\n    return Z95\n"
    )
    graph = arch.build_graph(tmp_path)
    assert arch.circles(graph) == [["geodbk.a", "geodbk.b"]]
    assert [(li.module, li.imported, li.reason) for li in graph.local] == [
        ("geodbk.b", "geodbk.a", None)
    ]
    assert graph.definitions["Z95"] == ["geodbk.a"]
