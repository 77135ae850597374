"""The embedded synthetic region: regenerating gives the same contents as data/; its statistics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk.geo import synthetic

DATA = Path(__file__).resolve().parents[2] / "data"
#: Coordinates may differ in the last bits between CPUs (numpy's vectorised sinh/arctan pick
#: different SIMD kernels), so geometry and float columns are compared to this tolerance.
COORD_ATOL = 1e-9
FLOAT_RTOL = 1e-9


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    synthetic.main(["--out", str(out)])
    return out


def _files(root: Path) -> list[Path]:
    return sorted(
        p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name != "README.md"
    )


def assert_same_table(ours: pa.Table, committed: pa.Table, *, what: str) -> None:
    """Equal schema (names, types, nullability), row count and values: exact for strings and
    integers, to ``FLOAT_RTOL`` for floats; the WKT ``tile`` column compared as geometries."""
    assert ours.schema.equals(committed.schema, check_metadata=False), what
    assert ours.num_rows == committed.num_rows, what
    for name in ours.column_names:
        a, b = ours.column(name), committed.column(name)
        if name == "tile":
            ga = shapely.from_wkt(np.asarray(a.to_pylist(), dtype=object))
            gb = shapely.from_wkt(np.asarray(b.to_pylist(), dtype=object))
            assert shapely.equals_exact(ga, gb, tolerance=COORD_ATOL).all(), (what, name)
        elif pa.types.is_floating(a.type):
            np.testing.assert_allclose(
                a.to_numpy(), b.to_numpy(), rtol=FLOAT_RTOL, atol=0, err_msg=f"{what}: {name}"
            )
        else:
            assert a.equals(b), (what, name)


def _assert_same_json(ours: Any, committed: Any, *, where: str) -> None:
    """Equal JSON trees, numbers to ``COORD_ATOL``."""
    if isinstance(ours, dict):
        assert isinstance(committed, dict) and ours.keys() == committed.keys(), where
        for key in ours:
            _assert_same_json(ours[key], committed[key], where=f"{where}/{key}")
    elif isinstance(ours, list):
        assert isinstance(committed, list) and len(ours) == len(committed), where
        for i, (a, b) in enumerate(zip(ours, committed, strict=True)):
            _assert_same_json(a, b, where=f"{where}[{i}]")
    elif isinstance(ours, float) or isinstance(committed, float):
        assert ours == pytest.approx(committed, rel=0, abs=COORD_ATOL), where
    else:
        assert ours == committed, where


def test_regeneration_has_the_contents_of_data(regenerated: Path) -> None:
    files = _files(regenerated)
    assert files == _files(DATA)
    for rel in files:
        ours, committed = regenerated / rel, DATA / rel
        if rel.suffix == ".parquet":
            assert_same_table(pq.read_table(ours), pq.read_table(committed), what=str(rel))
        else:
            _assert_same_json(
                json.loads(ours.read_text()), json.loads(committed.read_text()), where=str(rel)
            )


def test_comparison_catches_a_changed_value(regenerated: Path) -> None:
    rel = next(p for p in _files(DATA) if p.suffix == ".parquet")
    table = pq.read_table(DATA / rel)
    tests = table.column("tests").to_numpy().copy()
    tests[0] += 1
    changed = table.set_column(table.schema.get_field_index("tests"), "tests", pa.array(tests))
    with pytest.raises(AssertionError):
        assert_same_table(pq.read_table(regenerated / rel), changed, what=str(rel))
    wkt = table.column("tile").to_pylist()
    wkt[0] = wkt[1]
    moved = table.set_column(table.schema.get_field_index("tile"), "tile", pa.array(wkt))
    with pytest.raises(AssertionError):
        assert_same_table(pq.read_table(regenerated / rel), moved, what=str(rel))


def test_data_size_and_schema() -> None:
    total = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert total < 5_000_000
    q4 = pd.read_parquet(
        DATA
        / "ookla/parquet/performance/type=mobile/year=2023/quarter=4/2023-10-01_performance_mobile_tiles.parquet"
    )
    assert list(q4.columns) == [
        "quadkey", "tile", "tile_x", "tile_y", "avg_d_kbps", "avg_u_kbps", "avg_lat_ms",
        "avg_lat_down_ms", "avg_lat_up_ms", "tests", "devices",
    ]  # fmt: skip
    assert 2000 <= len(q4) <= 4000
    assert 0.4 < (q4["tests"] <= 2).mean() < 0.65
    assert (q4["devices"] <= q4["tests"]).all()
    assert q4["quadkey"].str.len().eq(16).all()


def test_noise_shrinks_with_tests_and_speeds_improve() -> None:
    base = DATA / "ookla/parquet/performance/type=mobile/year=2023"
    frames = {
        q: pd.read_parquet(next((base / f"quarter={q}").glob("*.parquet"))) for q in (1, 2, 3, 4)
    }
    med = [np.median(np.log10(frames[q]["avg_d_kbps"])) for q in (1, 2, 3, 4)]
    assert med[3] > med[0]
    # same tiles in two quarters: the quarter-to-quarter difference is noisier with few tests
    a, b = frames[3].set_index("quadkey"), frames[4].set_index("quadkey")
    both = a.merge(b, left_index=True, right_index=True, suffixes=("_a", "_b"))
    diff = np.log10(both["avg_d_kbps_b"]) - np.log10(both["avg_d_kbps_a"])
    few = (both["tests_a"] <= 2) & (both["tests_b"] <= 2)
    many = (both["tests_a"] >= 20) & (both["tests_b"] >= 20)
    assert diff[few].std() > 1.8 * diff[many].std()
