"""``geodbk predict --at FILE``: quadkeys, lon/lat and points; outside-region rows; bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.geo.contract import Z95
from geodbk.geo.locations import Locations
from geodbk.quantities import describe_quantity, predict_quantity
from pipelines import cli
from pipelines.bundles import load_tile_effect
from pipelines.predict_at import OUTPUT_COLUMNS, run_predict_at, write_places
from pipelines.rundir import RunDir, model_inputs, scale_lonlat


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("at") / "run"
    shutil.copytree(tiny_run, r)
    return r


@pytest.fixture(scope="module")
def measured(run: Path) -> pd.DataFrame:
    """A few measured tiles of the training split (their history conditions the tile effect)."""
    table = pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "lon", "lat", "split"])
    train = table[table["split"] == "train"].drop_duplicates("quadkey")
    return pd.DataFrame(train[["quadkey", "lon", "lat"]].head(12)).reset_index(drop=True)


def test_quadkeys_in_a_csv_get_their_tiles_history(run: Path, measured: pd.DataFrame) -> None:
    src = run.parent / "sites.csv"
    frame = pd.DataFrame({"site_id": [f"S{i}" for i in range(len(measured))]})
    frame["quadkey"] = measured["quadkey"]
    frame.to_csv(src, index=False)
    out = run_predict_at(run, src, target="download")
    assert out == RunDir(run).predictions_at("download", "sites")
    got = pd.read_parquet(out)
    assert list(got.columns) == ["site_id", "input_quadkey", *OUTPUT_COLUMNS]
    assert got["site_id"].tolist() == frame["site_id"].tolist()
    assert got["quadkey"].tolist() == measured["quadkey"].tolist()
    assert got["tile_history"].all() and not got["outside_region"].any()
    meta = json.loads(pq.read_schema(out).metadata[b"geodbk_data_licence"])
    assert meta["license"].startswith("no third-party licence")  # the demo region: synthetic
    assert (got["quantity"] == "tile").all()
    # the same numbers as the library at the tiles' centres
    model = DBKRegressor.load(run / "models" / "download", device="cpu")
    effect = load_tile_effect(RunDir(run), "download", model)
    md = model.metadata_
    quarter = got["quarter"].iloc[0]
    X = model_inputs(
        scale_lonlat(got["lon"].to_numpy(), got["lat"].to_numpy(), md["input_scaling"]),
        md,
        quarter=quarter if md.get("time_scaling") else None,
    )
    from geodbk.geo.timeaxis import quarter_index

    q = predict_quantity(
        model,
        X,
        quantity="tile",
        effect=effect,
        tiles=got["quadkey"].to_numpy(),
        times=float(quarter_index(quarter.split(":")[-1])),
        urban=None if effect is None or not effect.grouped else _urban(run, got),
    )
    np.testing.assert_allclose(got["mean"], q.mean, rtol=1e-6)
    np.testing.assert_allclose(got["sd"], q.sd, rtol=1e-6)
    np.testing.assert_allclose(got["upper"] - got["lower"], 2 * Z95 * got["sd"], rtol=1e-9)
    np.testing.assert_allclose(got["median"], 10 ** got["mean"] / 1000, rtol=1e-9)


def _urban(run: Path, got: pd.DataFrame) -> np.ndarray:
    geom = gpd.read_file(run / "urban_areas.geojson").geometry.union_all()
    return np.asarray(shapely.intersects_xy(geom, got["lon"], got["lat"]), dtype=bool)


def test_lon_lat_with_a_place_outside_the_region(
    run: Path, measured: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    src = run.parent / "points.csv"
    lon = [*measured["lon"].head(3), 10.0]
    lat = [*measured["lat"].head(3), 50.0]
    pd.DataFrame({"id": [1, 2, 3, 4], "Longitude": lon, "Latitude": lat}).to_csv(src, index=False)
    base = ["predict", "--run", str(run), "--target", "upload", "--at", str(src)]
    with caplog.at_level("WARNING", logger="geodbk"):
        assert cli.main(base) == 0
    # the analyst is told, with the fix for places on a coast
    assert "1 of 4 places in points.csv lie outside" in caplog.text  # the file, not "lon/lat"
    assert "--region FILE" in caplog.text
    # a spreadsheet gets the same rows, its quadkeys as text, and what they are above them
    parquet = pd.read_parquet(run / "predictions" / "upload_points.parquet")
    csv_path = run / "predictions" / "upload_points.csv"
    header = [line for line in csv_path.read_text().splitlines() if line.startswith("#")]
    assert header[0].startswith("# geodbk predict --at points.csv: upload, tile:")
    assert "log10 avg_u_kbps" in header[0] and "Mbps" in header[0]
    assert any(line.startswith("# Data: ") and "Licence: " in line for line in header)
    table = pd.read_csv(csv_path, comment="#", dtype={"quadkey": str})
    assert list(table.columns) == list(parquet.columns)
    assert table["quadkey"].tolist() == parquet["quadkey"].tolist()
    np.testing.assert_allclose(table["median"], parquet["median"], rtol=1e-6)
    assert table["outside_region"].tolist() == [False, False, False, True]
    assert cli.main([*base, "--quantity", "test"]) == 0
    got = pd.read_parquet(run / "predictions" / "upload_points_test.parquet")
    assert got["outside_region"].tolist() == [False, False, False, True]
    assert got.loc[:2, "mean"].notna().all() and np.isnan(got.loc[3, ["mean", "sd"]]).all()
    assert (got["quantity"] == "test").all()


def test_a_place_outside_a_bounding_box_region_is_told_to_redraw_the_box(
    run: Path, measured: pd.DataFrame, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    boxed = tmp_path / "boxed"
    shutil.copytree(run, boxed)
    region = json.loads((boxed / "region.geojson").read_text())
    region["features"][0]["properties"]["kind"] = "bbox"  # as `ingest --bbox` writes it
    (boxed / "region.geojson").write_text(json.dumps(region))
    src = tmp_path / "points.csv"
    lon, lat = [*measured["lon"].head(2), 10.0], [*measured["lat"].head(2), 50.0]
    pd.DataFrame({"lon": lon, "lat": lat}).to_csv(src, index=False)
    with caplog.at_level("WARNING", logger="geodbk"):
        run_predict_at(boxed, src, target="download")
    # a rectangle has no coast to blame: the fix is a box that holds the places
    assert "1 of 3 places in points.csv lie outside" in caplog.text
    assert "a bounding box (--bbox)" in caplog.text and "coastal water" not in caplog.text


def test_rows_without_a_place_are_kept_without_values(
    run: Path, measured: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    """A blank lon/lat cell (a place not yet geocoded) keeps its row, flagged, not an error;
    text that is not a number is still refused."""
    src = run.parent / "geocoded.csv"
    lon, lat = measured["lon"].head(2).tolist(), measured["lat"].head(2).tolist()
    src.write_text(f"site,lon,lat\na,{lon[0]},{lat[0]}\nb,,\nc,{lon[1]},{lat[1]}\n")
    with caplog.at_level("WARNING", logger="geodbk"):
        got = pd.read_parquet(run_predict_at(run, src, target="download"))
    assert "1 of 3 rows have no place" in caplog.text
    assert got["site"].tolist() == ["a", "b", "c"]
    assert got["located"].tolist() == [True, False, True]
    assert not got["outside_region"].any()
    assert got.loc[[0, 2], "mean"].notna().all() and got.loc[1, ["mean", "sd"]].isna().all()
    assert got["quadkey"].isna().tolist() == [False, True, False]
    src.write_text("site,lon,lat\nb,,\n")
    with pytest.raises(DataError, match="no row has a place"):
        run_predict_at(run, src, target="download")


def test_points_in_a_geojson_and_the_area_quantity(run: Path, measured: pd.DataFrame) -> None:
    src = run.parent / "anchors.geojson"
    pts = gpd.GeoDataFrame(
        {"name": ["a", "b"]},
        geometry=gpd.points_from_xy(measured["lon"].head(2), measured["lat"].head(2)),
        crs=4326,
    ).to_crs(3857)  # reprojected back to lon/lat on reading
    pts.to_file(src, driver="GeoJSON")
    out = run_predict_at(run, src, target="latency", quantity="area")
    got = pd.read_parquet(out)
    np.testing.assert_allclose(got["lon"], measured["lon"].head(2), atol=1e-7)
    assert (got["quantity"] == "area").all() and got["name"].tolist() == ["a", "b"]
    tile_out = run_predict_at(run, src, target="latency", quantity="tile")
    assert out.name == f"latency_{src.stem}_area.parquet" and out.is_file()  # both kept
    assert tile_out.name == f"latency_{src.stem}.parquet"
    tile = pd.read_parquet(tile_out)
    # the parts are the tile's whatever the quantity: measured tiles keep their history
    assert got["tile_history"].all() and tile["tile_history"].all()
    np.testing.assert_allclose(got["tile_pull"], tile["tile_pull"])
    assert not np.allclose(got["mean"], tile["mean"])  # f alone, without the tiles' offsets


def test_a_quarter_outside_the_trained_ones_is_flagged_and_kept_apart(
    run: Path, measured: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    src = run.parent / "sites.csv"
    measured[["lon", "lat"]].head(3).to_csv(src, index=False)
    md = DBKRegressor.load(run / "models" / "download", device="cpu").metadata_
    last = md["time_scaling"]["last"]  # the demo's models are time-aware
    latest = pd.read_parquet(run_predict_at(run, src, target="download"))
    assert (latest["quarter_status"] == "observed").all()
    beyond = f"{int(last[:4]) + 1}{last[4:]}"
    with caplog.at_level("WARNING", logger="geodbk"):
        out = run_predict_at(run, src, target="download", quarter=beyond)
    got = pd.read_parquet(out)
    # as predict flags such a grid: the status in every row, a warning naming the policy
    assert (got["quarter"] == beyond).all()
    assert (got["quarter_status"] == f"extrapolation beyond {last}").all()
    assert f"download {beyond}: extrapolation beyond {last}" in caplog.text
    # and its own file, beside the latest quarter's
    assert out.name == f"download_sites_{beyond}.parquet"
    assert (out.parent / "download_sites.parquet").is_file()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"quadkey": [23012301230123012, 3012301230123012]}, "2 lengths"),
        ({"quadkey": ["0230123012301230", "23012301230123"]}, "lengths"),
        ({"quadkey": ["0230123012301239"]}, "not quadkeys"),
        ({"lon": ["-99.5", "east"], "lat": ["39.6", "39.7"]}, "'lon'.*not numbers"),
        ({"lon": [39.6], "lat": [-99.5]}, "swapped"),
        ({"site": ["a"]}, "no place columns"),
    ],
)
def test_bad_files_are_refused_naming_file_and_column(
    run: Path, content: dict, match: str, tmp_path: Path
) -> None:
    src = tmp_path / "bad.parquet"
    pd.DataFrame(content).to_parquet(src)
    with pytest.raises(DataError, match=match) as info:
        run_predict_at(run, src, target="download")
    assert str(src) in str(info.value)
    assert not (run / "predictions" / "download_bad.parquet").exists()


def test_cli_reports_a_missing_file_cleanly(run: Path, capsys: pytest.CaptureFixture) -> None:
    code = cli.main(
        ["predict", "--run", str(run), "--target", "download", "--at", str(run / "nope.csv")]
    )
    err = capsys.readouterr().err
    assert code == 3 and "nope.csv: no such file" in err and "Traceback" not in err
    assert json.dumps(err)  # a message, not an exception


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--tests", "0.5"], "--tests must be >= 1"),
        (["--tests", "4", "--devices", "0"], "--devices must be >= 1"),
        (["--tests", "4", "--devices", "20"], "--devices 20 is more than --tests 4"),
    ],
)
@pytest.mark.parametrize("at", [False, True])
def test_tests_and_devices_are_checked_for_grids_and_places(
    run: Path, extra: list[str], match: str, at: bool, capsys: pytest.CaptureFixture
) -> None:
    where = ["--at", str(run / "nope.csv")] if at else []
    base = ["predict", "--run", str(run), "--target", "download", "--quantity", "test"]
    assert cli.main([*base, *where, *extra]) == 3  # before any file is read or written
    assert match in capsys.readouterr().err


def test_write_places_frames_the_columns_and_keeps_the_input(
    run: Path, measured: pd.DataFrame, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lon = np.append(measured["lon"].to_numpy()[:2], 100.0)  # the last place: outside
    lat = np.append(measured["lat"].to_numpy()[:2], 0.0)
    ids = pd.DataFrame({"site": ["a", "b", "c"], "lat": [1, 2, 3]})
    places = Locations(ids=ids, lon=lon, lat=lat, source="lon/lat")
    inside = np.array([True, True, False])
    licence = {"source": "S", "license": "L", "license_url": "U", "license_terms": "T"}
    path = tmp_path / "deep" / "out.parquet"
    with caplog.at_level("INFO", logger="geodbk"):
        got = write_places(
            path,
            places,
            inside,
            {"value": np.array([1.0, 2.0, np.nan])},
            quantity="area",
            quarter="2023Q4",
            licence=licence,
            metadata={b"extra": b"1"},
        )
    assert got == path and "3 places from lon/lat, 1 outside the region" in caplog.text
    frame = pd.read_parquet(path)
    # the input's columns first, a clash renamed; then the output's, framed
    assert list(frame.columns) == [
        "site",
        "input_lat",
        "quadkey",
        "lon",
        "lat",
        "value",
        "quantity",
        "quarter",
        "located",
        "outside_region",
    ]
    assert frame["input_lat"].tolist() == [1, 2, 3] and frame["lat"].tolist() == lat.tolist()
    assert frame["outside_region"].tolist() == [False, False, True]
    assert (frame["quarter"] == "2023Q4").all() and (frame["quantity"] == "area").all()
    assert frame["quadkey"].str.len().eq(16).all()
    meta = pq.read_schema(path).metadata
    assert json.loads(meta[b"geodbk_data_licence"]) == licence and meta[b"extra"] == b"1"


def test_a_predictions_file_can_be_read_back_as_places(run: Path, measured: pd.DataFrame) -> None:
    """An output of ``predict --at`` fed back in (another quantity or target) holds both
    ``lat`` and ``input_lat``: the clash is renamed once more instead of crashing."""
    src = run.parent / "refeed.csv"
    pd.DataFrame(
        {"site": ["a", "b"], "lon": measured["lon"].head(2), "lat": measured["lat"].head(2)}
    ).to_csv(src, index=False)
    first = run_predict_at(run, src, target="download")
    assert {"input_lon", "input_lat"} <= set(pd.read_parquet(first).columns)
    again = run_predict_at(run, first, target="upload", quantity="area")
    got = pd.read_parquet(again)
    assert got.columns.is_unique
    assert got["input_input_lat"].tolist() == pd.read_parquet(first)["lat"].tolist()
    assert got["input_lat"].tolist() == pd.read_parquet(first)["input_lat"].tolist()
    assert got["mean"].notna().all()


def test_write_places_renames_every_clash_to_a_free_name(tmp_path: Path) -> None:
    ids = pd.DataFrame({"lat": [1], "input_lat": [2], "input_input_lat": [3], "mean": [4]})
    places = Locations(ids=ids, lon=np.array([-100.0]), lat=np.array([39.5]), source="lon/lat")
    path = write_places(
        tmp_path / "o.parquet",
        places,
        np.array([True]),
        {"mean": np.array([1.0])},
        quantity="tile",
        quarter="2023Q4",
        licence={},
    )
    frame = pd.read_parquet(path)
    assert list(frame.columns[:4]) == [
        "input_input_input_lat",
        "input_lat",
        "input_input_lat",
        "input_mean",
    ]
    assert frame.loc[0, "input_input_input_lat"] == 1 and frame.loc[0, "mean"] == 1.0


def test_predictions_record_their_file_and_warn_before_replacing_another(
    run: Path, measured: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    """Two place lists of one stem (``a/sites.csv``, ``b/sites.csv``, or ``sites.xlsx``) write
    one file: the output records which list it holds, and replacing another's is warned about."""
    lon, lat = measured["lon"].head(2).tolist(), measured["lat"].head(2).tolist()
    first, second = run.parent / "a" / "stores.csv", run.parent / "b" / "stores.csv"
    for folder, src in ((0, first), (1, second)):
        src.parent.mkdir(exist_ok=True)
        src.write_text(f"site,lon,lat\ns{folder},{lon[folder]},{lat[folder]}\n")
    out = run_predict_at(run, first, target="download")
    meta = json.loads(pq.read_schema(out).metadata[b"geodbk_predictions"])
    assert meta["at"] == "stores.csv" and meta["target"] == "download"
    assert meta["quantity"] == "tile" and meta["model_path"] == "models/download"
    assert "mean, sd, lower, upper: log10 avg_d_kbps" in meta["units"] and "Mbps" in meta["units"]
    assert len(meta["at_sha256"]) == 64
    # the report of the same training: its held-out check travels with the predictions
    cal = json.loads((run / "report" / "download" / "metrics.json").read_text())
    well = meta["held_out_check"]["well_measured"]
    assert well["coverage95"] == cal["map_calibration"]["tile"]["all"]["coverage95"]
    with caplog.at_level("WARNING", logger="geodbk"):
        run_predict_at(run, first, target="download")  # the same list again: no warning
    assert "replac" not in caplog.text
    with caplog.at_level("WARNING", logger="geodbk"):
        assert run_predict_at(run, second, target="download") == out
    assert "stores.parquet holds the outputs at another stores.csv" in caplog.text
    assert pd.read_parquet(out)["site"].tolist() == ["s1"]


def test_csv_keeps_ids_with_hash_quotes_commas_and_line_breaks(
    run: Path, measured: pd.DataFrame
) -> None:
    """The CSV read as its header says (``comment="#"``) has every row and every id whole: a
    ``#`` in a cell (``Suite #4``, an id starting with ``#``) does not start a comment there;
    a place outside the region keeps its row."""
    src = run.parent / "hashes.csv"
    ids = ["Suite #4", "# 12 Main St", 'Café "Nord", Inc.', "line\nbreak", "日本語"]
    lon = [*measured["lon"].head(4), 10.0]
    lat = [*measured["lat"].head(4), 50.0]
    pd.DataFrame({"site": ids, "lon": lon, "lat": lat}).to_csv(src, index=False)
    assert cli.main(["predict", "--run", str(run), "--target", "upload", "--at", str(src)]) == 0
    parquet = pd.read_parquet(run / "predictions" / "upload_hashes.parquet")
    table = pd.read_csv(
        run / "predictions" / "upload_hashes.csv", comment="#", dtype={"quadkey": str}
    )
    assert table["site"].tolist() == ids == parquet["site"].tolist()
    np.testing.assert_array_equal(table["mean"], parquet["mean"])
    assert table["outside_region"].tolist() == [False, False, False, False, True]


def test_csv_header_names_the_text_columns_that_keep_leading_zeros(
    run: Path, measured: pd.DataFrame
) -> None:
    """A code such as ``007`` (a GEOID, a FIPS code) is text in the parquet; the CSV's header
    names it with ``quadkey`` as a text column, and reading it so keeps its zeros."""
    src = run.parent / "codes.parquet"
    frame = measured[["lon", "lat"]].head(2).assign(code=["007", "010"], n=[1, 2])
    frame.to_parquet(src)
    assert cli.main(["predict", "--run", str(run), "--target", "upload", "--at", str(src)]) == 0
    csv_path = run / "predictions" / "upload_codes.csv"
    header = next(x for x in csv_path.read_text().splitlines() if x.startswith("# Text columns"))
    assert '"code": str' in header and '"quadkey": str' in header and '"n": str' not in header
    spec = header.split("dtype=", 1)[1].split(")", 1)[0]
    table = pd.read_csv(csv_path, comment="#", dtype=json.loads(spec.replace(": str", ': "str"')))
    assert table["code"].tolist() == ["007", "010"]


def test_csv_names_the_tests_of_the_test_quantity(run: Path, measured: pd.DataFrame) -> None:
    """``--quantity test --tests 4``: the CSV's first line names the four tests the values are
    of, as ``geodbk predict`` labels a grid's quantity, not ``one speed test``."""
    src = run.parent / "four.csv"
    measured[["lon", "lat"]].head(3).to_csv(src, index=False)
    base = ["predict", "--run", str(run), "--target", "upload", "--at", str(src)]
    assert cli.main([*base, "--quantity", "test", "--tests", "4"]) == 0
    first = (run / "predictions" / "upload_four_test.csv").read_text().splitlines()[0]
    model = DBKRegressor.load(run / "models" / "upload", device="cpu")
    assert f"upload, test: {describe_quantity(model, 4.0)}, " in first
    assert "one speed test" not in first


def test_predictions_of_other_tests_are_replaced_with_a_warning(
    run: Path, measured: pd.DataFrame, caplog: pytest.LogCaptureFixture
) -> None:
    """The test quantity of 4 tests, then of 8 at the same places: one file, the new one
    replaces the old with a warning naming both."""
    src = run.parent / "tests_sites.csv"
    measured[["lon", "lat"]].head(2).to_csv(src, index=False)
    argv = ["predict", "--run", str(run), "--target", "download", "--at", str(src)]
    argv += ["--quantity", "test"]
    with caplog.at_level("WARNING", logger="geodbk"):
        assert cli.main([*argv, "--tests", "4"]) == 0
        assert cli.main([*argv, "--tests", "4"]) == 0
        assert "holds the outputs" not in caplog.text
        assert cli.main([*argv, "--tests", "8"]) == 0
    assert "download_tests_sites_test.parquet holds the outputs of 4 tests" in caplog.text
    assert "replaced by those of 8 tests" in caplog.text
