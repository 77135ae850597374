"""The embedded synthetic region: regenerating gives identical files; its statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from geodbk.geo import synthetic

DATA = Path(__file__).resolve().parents[2] / "data"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic")
    synthetic.main(["--out", str(out)])
    return out


def test_regeneration_is_identical_to_data(regenerated: Path) -> None:
    ours = sorted(p.relative_to(regenerated) for p in regenerated.rglob("*") if p.is_file())
    committed = sorted(
        p.relative_to(DATA) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"
    )
    assert ours == committed
    for rel in ours:
        assert (regenerated / rel).read_bytes() == (DATA / rel).read_bytes(), rel


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
