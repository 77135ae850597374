"""Ingest of the real Hawaii data (../shared/data/hawaii): regression counts measured once.

Skipped when the shared data is absent (the ``realdata`` marker, see tests/conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from geodbk.geo.table import read_tile_table
from pipelines.ingest import run_ingest

pytestmark = pytest.mark.realdata


def _common(h: Path) -> dict:
    return {
        "state": "HI",
        "states_file": h / "census/cb_2018_us_state_500k.zip",
        "tracts": h / "census/tl_2010_15_tract10.zip",
        "rural_tracts": h / "census/fcc_rural_census_tracts_2010.csv",
    }


@pytest.fixture(scope="module")
def mobile_run(hawaii_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("hi_mobile")
    run_ingest(
        tiles=[hawaii_dir / "ookla/parquet/performance"],
        run=run,
        type="mobile",
        quarters="2019Q1:2023Q4",
        **_common(hawaii_dir),
    )
    return run


def test_all_20_mobile_quarters(mobile_run: Path) -> None:
    t, meta = read_tile_table(mobile_run)
    assert meta["counts"] == {
        "read": 33856,
        "kept": 31996,
        "dropped": {"non_positive_latency": 1, "outside_region": 1859},
        "urban": 18769,
        "rural": 13227,
        "tiles": 5412,
    }
    assert len(meta["quarters"]) == 20 and meta["quarters"][0] == "2019Q1"
    assert len(meta["sources"]) == 20
    assert meta["region"]["attrs"]["STUSPS"] == "HI"
    assert meta["urban_source"]["kind"] == "tracts"
    assert meta["urban_source"]["urban_units"] == 246
    assert meta["urban_source"]["rural_units"] == 105
    assert (t["quarter"] == "2020Q2").sum() < 200  # the unusually small quarter
    assert (mobile_run / "urban_areas.geojson").is_file()
    # urban tiles are faster on average
    assert t.loc[t.urban, "log10_download"].median() > t.loc[~t.urban, "log10_download"].median()


def test_raw_geojson_quarter_with_null_geometries(
    hawaii_dir: Path, mobile_run: Path, tmp_path: Path
) -> None:
    report = run_ingest(
        tiles=[hawaii_dir / "ookla/raw/hawaii-state_mobile_2020Q4.geojson"],
        run=tmp_path,
        **_common(hawaii_dir),
    )
    assert report["type"] == "mobile" and report["quarters"] == ["2020Q4"]
    assert report["sources"][0]["null_geometries_rebuilt"] == 1782
    assert report["counts"] == {
        "read": 1797,
        "kept": 1718,
        "dropped": {"outside_region": 79},
        "urban": 1052,
        "rural": 666,
        "tiles": 1718,
    }
    # the same tiles and labels as the parquet extract of that quarter
    raw, _ = read_tile_table(tmp_path)
    pq, _ = read_tile_table(mobile_run)
    pq = pq[pq["quarter"] == "2020Q4"]
    a = raw.set_index("quadkey").sort_index()
    b = pq.set_index("quadkey").sort_index()
    assert a.index.equals(b.index)
    np.testing.assert_array_equal(a["avg_d_kbps"], b["avg_d_kbps"])
    np.testing.assert_array_equal(a["urban"], b["urban"])
    np.testing.assert_allclose(a["lon"], b["lon"])


def test_parquet_and_geojson_together_count_duplicates(hawaii_dir: Path, tmp_path: Path) -> None:
    report = run_ingest(
        tiles=[
            hawaii_dir / "ookla/parquet/performance",
            hawaii_dir / "ookla/raw/hawaii-state_mobile_2020Q4.geojson",
        ],
        run=tmp_path,
        type="mobile",
        **_common(hawaii_dir),
    )
    assert report["counts"]["read"] == 35653
    assert report["counts"]["kept"] == 31996
    assert report["counts"]["dropped"] == {
        "duplicate_tile_quarter": 1797,
        "non_positive_latency": 1,
        "outside_region": 1859,
    }


def test_fixed_20_quarters_block_split_state_by_fips(hawaii_dir: Path, tmp_path: Path) -> None:
    common = _common(hawaii_dir)
    common["state"] = "15"
    report = run_ingest(
        tiles=[hawaii_dir / "ookla/parquet/performance"],
        run=tmp_path,
        type="fixed",
        split="block",
        seed=0,
        **common,
    )
    assert report["counts"] == {
        "read": 84586,
        "kept": 80589,
        "dropped": {"outside_region": 3997},
        "urban": 30145,
        "rural": 50444,
        "tiles": 8399,
    }
    assert report["split"]["counts"] == {"train": 62525, "val": 9523, "test": 8541}
    assert report["split"]["blocks"] == {"train": 133, "val": 19, "test": 16}
