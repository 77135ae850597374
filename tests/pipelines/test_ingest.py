"""The ingest stage on the embedded synthetic region, its CLI and its failure modes."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo.regions import Region
from geodbk.geo.table import read_tile_table
from pipelines import cli
from pipelines.ingest import DEMO_INGEST, demo_ingest_kwargs, run_ingest

REPO = Path(__file__).resolve().parents[2]


def _demo_kwargs() -> dict:
    kw = demo_ingest_kwargs()
    assert kw["tiles"] == [REPO / t for t in DEMO_INGEST["tiles"]]
    assert kw["states_file"] == REPO / DEMO_INGEST["states_file"]
    return kw


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    run = tmp_path_factory.mktemp("demo")
    report = run_ingest(run=run, **_demo_kwargs())
    return run, report


def test_demo_ingest_outputs_and_counts(demo_run: tuple[Path, dict]) -> None:
    run, _ = demo_run
    for name in ("tiles.parquet", "region.geojson", "urban_areas.geojson", "ingest_report.json"):
        assert (run / name).is_file(), name
    t, meta = read_tile_table(run / "tiles.parquet")
    assert meta["counts"] == {
        "read": 11969,
        "kept": 10748,
        "dropped": {"outside_region": 1221},
        "urban": 4060,
        "rural": 6688,
        "tiles": 8050,
    }
    assert meta["quarters"] == ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    assert meta["type"] == "mobile"
    assert meta["split"]["kind"] == "random" and meta["split"]["seed"] == 0
    assert meta["split"]["counts"] == {"train": 8598, "val": 1075, "test": 1075}
    assert meta["region"]["attrs"]["STUSPS"] == "SY"
    assert len(meta["sources"]) == 4
    assert t["x1"].between(-1, 1).all() and t["x2"].between(-1, 1).all()
    assert {"tile_x", "tile_y", "avg_lat_down_ms"} <= set(t.columns)
    on_disk = json.loads((run / "ingest_report.json").read_text())
    assert on_disk["counts"] == meta["counts"]
    assert on_disk["per_quarter"]["2023Q4"]["rows"] == 2703
    # urban tiles are faster than rural ones in the synthetic model
    med = t.groupby("urban")["log10_download"].median()
    assert med[True] > med[False] + 0.3


def test_rerun_is_reproducible(demo_run: tuple[Path, dict], tmp_path: Path) -> None:
    run, _ = demo_run
    run_ingest(run=tmp_path, **_demo_kwargs())
    a, _ = read_tile_table(run)
    b, _ = read_tile_table(tmp_path)
    assert a.drop(columns="geometry").equals(b.drop(columns="geometry"))


def test_block_split_and_bbox(tmp_path: Path) -> None:
    kw = _demo_kwargs()
    kw.update(state=None, states_file=None, bbox=(-100.2, 39.3, -99.4, 39.9), split="block", seed=4)
    kw["block_size"] = 0.05
    report = run_ingest(run=tmp_path, **kw)
    t, meta = read_tile_table(tmp_path)
    assert meta["split"]["kind"] == "block" and meta["split"]["block_size_deg"] == 0.05
    assert meta["region"]["kind"] == "bbox"
    assert report["counts"]["dropped"]["outside_region"] > 0
    assert 0.07 < (t["split"] == "test").mean() < 0.2


def test_empty_result_is_clear_and_leaves_old_table(
    demo_run: tuple[Path, dict], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run_ingest(run=run, **_demo_kwargs())
    before = (run / "tiles.parquet").read_bytes()
    kw = _demo_kwargs()
    kw.update(state=None, states_file=None, bbox=(10, 10, 11, 11))
    with pytest.raises(DataError, match=r"no usable tiles left.*outside_region: 11969"):
        run_ingest(run=run, **kw)
    assert (run / "tiles.parquet").read_bytes() == before
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no temp files left


def test_cli_ingest_and_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kw = _demo_kwargs()
    argv = [
        "ingest", "--tiles", str(kw["tiles"][0]), "--run", str(tmp_path / "r"), "--type", "mobile",
        "--state", "Synthetica", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q4",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    _, meta = read_tile_table(tmp_path / "r")
    assert meta["quarters"] == ["2023Q4"] and meta["counts"]["kept"] == 2703
    bad = ["ingest", "--tiles", str(tmp_path / "missing"), "--run", str(tmp_path / "x")]
    assert cli.main(bad) == 3
    assert "no such file or folder" in capsys.readouterr().err


def test_demo_kwargs_missing_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"python -m geodbk\.geo\.synthetic"):
        demo_ingest_kwargs(tmp_path)


def test_cli_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["ingest", "--help"])
    out = capsys.readouterr().out
    assert "examples:" in out and "--rural-tracts" in out and "--split" in out


def test_a_region_across_the_antimeridian_is_logged_with_its_frame(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pipelines.ingest import _log_frame

    hawaii = Region("Hawaii", shapely.box(-178.4, 18.9, -154.8, 28.5), kind="bbox")
    with caplog.at_level("INFO", logger="geodbk"):
        _log_frame(hawaii)
    assert not caplog.records
    halves = [shapely.box(172.4, 51.2, 180.0, 53.0), shapely.box(-180.0, 51.2, -129.9, 71.4)]
    alaska = Region("Alaska", shapely.MultiPolygon(halves), kind="state")
    with caplog.at_level("INFO", logger="geodbk"):
        _log_frame(alaska)
    (record,) = caplog.records
    assert "Alaska" in record.message and "180° meridian" in record.message
    assert "172.40 to 230.10" in record.message


def test_a_block_split_far_from_its_shares_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from pipelines.ingest import _check_split_sizes

    uneven = pd.Series(["train"] * 60 + ["val"] * 14 + ["test"] * 26)
    with caplog.at_level("WARNING", logger="geodbk"):
        _check_split_sizes(uneven, split="block", block_size=0.1)
    assert "test holds 26% of the rows (aimed at 10%)" in caplog.text
    assert "val holds" not in caplog.text
    caplog.clear()
    even = pd.Series(["train"] * 80 + ["val"] * 11 + ["test"] * 9)
    with caplog.at_level("WARNING", logger="geodbk"):
        _check_split_sizes(even, split="block", block_size=0.1)
    assert "holds" not in caplog.text


@pytest.mark.parametrize("split", ["random", "tile", "block"])
def test_a_split_that_leaves_val_or_test_empty_is_refused(split: str) -> None:
    from pipelines.ingest import _check_split_sizes

    tiny = pd.Series(["train"] * 8)  # a table too small for a tenth of anything
    fix = "smaller --block-size" if split == "block" else "ingest a larger region"
    with pytest.raises(DataError, match=f"val and test split would be empty.*{fix}"):
        _check_split_sizes(tiny, split=split, block_size=0.1)
    _check_split_sizes(pd.Series(["train"] * 8 + ["val", "test"]), split=split, block_size=0.1)


def test_tiles_a_coarse_boundary_cuts_off_are_warned_about(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A region whose edge passes between the western tiles' centres and their western edges
    (a generalised coastline) drops those tiles, and says how to keep them."""
    import geopandas as gpd
    from geo_helpers import make_tiles

    from geodbk.geo import quadkey as qk

    tiles = make_tiles(200)
    path = tmp_path / "tiles_2023Q4.parquet"
    tiles.to_parquet(path)
    lon, lat = qk.quadkey_centroid(tiles["quadkey"].to_numpy())
    west, east = float(lon.min()), float(lon.max())
    edge = west + 0.25 * (float(lon[lon > west].min()) - west)  # a quarter tile east of centres
    box = shapely.box(edge, float(lat.min()) - 0.01, east + 0.01, float(lat.max()) + 0.01)
    region = tmp_path / "region.geojson"
    gpd.GeoDataFrame(geometry=[box], crs="EPSG:4326").to_file(region)
    with caplog.at_level("WARNING", logger="geodbk"):
        report = run_ingest(run=tmp_path / "run", tiles=[path], region=region)
    cut = int((lon == west).sum())
    assert report["counts"]["dropped"] == {"outside_region": cut}
    assert f"{cut} rows" in caplog.text and "pass a detailed boundary as --region" in caplog.text
