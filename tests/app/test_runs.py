"""The runs folder: safe paths to runs, the runs discovered, the folder's precedence, a run's
inventory and commands, and the targets' units."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest

from app.runs import (
    UnsafePathError,
    discover_runs,
    inventory,
    natural_to_log10,
    resolve_run,
    runs_root_from,
    to_natural,
)


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    (root / "demo" / "grids").mkdir(parents=True)
    (root / "nested" / "inner").mkdir(parents=True)
    (root / ".hidden").mkdir()
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", root / "escape")
    return root


def test_resolve_run_accepts_names_and_paths_inside(
    runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert resolve_run(runs, "demo") == (runs / "demo").resolve()
    assert resolve_run(runs, " demo ") == (runs / "demo").resolve()
    assert resolve_run(runs, "nested/inner") == (runs / "nested" / "inner").resolve()
    assert resolve_run(runs, str(runs / "demo")) == (runs / "demo").resolve()
    assert resolve_run(runs, "nested/../demo") == (runs / "demo").resolve()
    monkeypatch.chdir(runs.parent)
    assert resolve_run(runs, "runs/demo") == (runs / "demo").resolve()  # relative to the cwd
    assert resolve_run(runs, "not-yet-built") == (runs / "not-yet-built").resolve()


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "..",
        "../outside",
        "demo/../..",
        "/etc",
        "/etc/passwd",
        "escape",
        "escape/x",
        "a\x00b",
        ".",
    ],
)
def test_resolve_run_refuses_everything_outside(runs: Path, value: str) -> None:
    with pytest.raises(UnsafePathError):
        resolve_run(runs, value)


def test_resolve_run_refuses_absolute_path_outside_even_if_it_exists(
    runs: Path, tmp_path: Path
) -> None:
    with pytest.raises(UnsafePathError, match="not inside the runs folder"):
        resolve_run(runs, str(tmp_path / "outside"))


def test_discover_runs_lists_safe_subdirectories_runs_first(runs: Path) -> None:
    assert discover_runs(runs) == ["demo", "nested"]  # no hidden dir, no symlink escaping
    assert discover_runs(runs / "missing") == []


def test_runs_root_precedence(tmp_path: Path) -> None:
    assert runs_root_from(["--runs-dir", "x"], {"GEODBK_RUNS_DIR": "y"}) == Path("x")
    assert runs_root_from(["--runs-dir=z"], {}) == Path("z")
    assert runs_root_from([], {"GEODBK_RUNS_DIR": "y"}) == Path("y")
    assert runs_root_from([], {}) == Path.cwd() / "runs"


def test_inventory_and_commands(runs: Path) -> None:
    inv = inventory(runs / "demo")
    assert inv.exists and not inv.has_tiles and inv.available_targets() == []
    assert inv.command("predict", "upload").startswith("geodbk predict --run ")
    assert inv.command("predict", "upload").endswith("--target upload")


def test_units_round_trip() -> None:
    assert to_natural(np.log10(25_000.0), "download") == pytest.approx(25.0)
    assert to_natural(2.0, "latency") == pytest.approx(100.0)
    assert natural_to_log10(25.0, "download") == pytest.approx(math.log10(25_000))


def test_display_path_is_relative_below_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.runs import display_path

    (tmp_path / "runs" / "hi").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "runs")
    assert display_path(tmp_path / "runs" / "hi") == "hi"
    assert display_path(tmp_path / "runs") == str((tmp_path / "runs").resolve())  # not "."
    assert display_path(Path("/elsewhere/runs")) == "/elsewhere/runs"
