"""No output records an absolute local path: outputs are handed on, and a path says where
someone's files were. Paths in outputs are relative to the run directory (or a file name)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_no_file_of_a_complete_run_holds_an_absolute_local_path(tiny_run: Path) -> None:
    needles = {str(tiny_run.resolve()).encode(), str(REPO_ROOT).encode()}
    files = [p for p in tiny_run.rglob("*") if p.is_file()]
    assert len(files) > 20  # tiles, region, models, grids, exports, reports
    found = [
        (p.relative_to(tiny_run).as_posix(), n.decode())
        for p in files
        for n in needles
        if n in p.read_bytes()
    ]
    assert not found, found
