"""Atomic writes: a file is replaced whole or not at all, and no temporary file is left."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from geodbk.atomic import atomic_path, atomic_write_json, atomic_write_text


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "out.json"
    atomic_write_json(target, {"a": 1})
    atomic_write_json(target, {"b": [1, 2]})
    assert json.loads(target.read_text()) == {"b": [1, 2]}
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.json"]


def test_failed_atomic_write_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "table.parquet"
    atomic_write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half-written")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]


def test_atomic_temp_path_keeps_extension(tmp_path: Path) -> None:
    with atomic_path(tmp_path / "grid.nc") as tmp:
        assert tmp.suffix == ".nc"
        assert tmp.parent == tmp_path
        tmp.write_bytes(b"x")
    assert (tmp_path / "grid.nc").read_bytes() == b"x"


def test_atomic_json_rejects_nan(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        atomic_write_json(tmp_path / "m.json", {"nll": float("nan")})
    assert not any(tmp_path.iterdir())
