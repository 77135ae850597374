"""Ookla tile readers: every format, quarters, types, drop reasons and clear errors."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from geo_helpers import make_tiles, write_geo, write_hive

from geodbk.errors import DataError
from geodbk.geo import ookla
from geodbk.geo import quadkey as qk


def test_quarter_and_type_from_path() -> None:
    assert ookla.quarter_from_path("a/type=mobile/year=2021/quarter=3/x.parquet") == "2021Q3"
    assert ookla.quarter_from_path("2023-10-01_performance_mobile_tiles.parquet") == "2023Q4"
    assert ookla.quarter_from_path("hawaii-state_mobile_2020Q4.geojson") == "2020Q4"
    assert ookla.quarter_from_path("tiles.csv") is None
    assert ookla.type_from_path("p/type=fixed/year=2020/quarter=1/f.parquet") == "fixed"
    assert ookla.type_from_path("hawaii-state_mobile_2020Q4.geojson") == "mobile"
    assert ookla.type_from_path("tiles.csv") is None


def test_parse_quarters() -> None:
    assert ookla.parse_quarters("2019Q3:2020Q2") == ["2019Q3", "2019Q4", "2020Q1", "2020Q2"]
    assert ookla.parse_quarters(["2023q4", "2023-Q1"]) == ["2023Q1", "2023Q4"]
    assert ookla.parse_quarters(None) is None
    with pytest.raises(DataError, match="2023Q4"):
        ookla.parse_quarters("2023Q5")
    with pytest.raises(DataError, match="empty"):
        ookla.parse_quarters("2023Q4:2023Q1")


def test_hive_many_quarters_and_type_filter(tmp_path: Path) -> None:
    root = tmp_path / "parquet"
    for q in (1, 2, 3):
        write_hive(root, make_tiles(30, seed=q), kind="mobile", year=2022, q=q)
    write_hive(root, make_tiles(20, seed=9), kind="fixed", year=2022, q=1)
    with pytest.raises(DataError, match="--type"):
        ookla.read_tiles([root])
    res = ookla.read_tiles([root], type="mobile", quarters="2022Q2:2022Q3")
    assert res.type == "mobile"
    assert sorted(res.frame["quarter"].unique()) == ["2022Q2", "2022Q3"]
    assert len(res.frame) == 60 and res.read == 60
    assert res.frame.crs == "EPSG:4326"
    fixed = ookla.read_tiles([root], type="fixed")
    assert len(fixed.frame) == 20 and fixed.type == "fixed"


def test_rows_outside_a_box_are_dropped_as_each_file_is_read(tmp_path: Path) -> None:
    root = tmp_path / "parquet"
    for q in (1, 2):  # each quarter's file: tiles near Honolulu and near Hilo
        both = pd.concat([make_tiles(30, seed=q), make_tiles(20, seed=q, lon=-155.1, lat=19.7)])
        write_hive(root, both, kind="mobile", year=2022, q=q)
    whole = ookla.read_tiles([root])
    box = (-158.5, 21.0, -157.5, 21.8)  # Honolulu's
    cut = ookla.read_tiles([root], within=box)
    inside = whole.frame["lon"].between(box[0], box[2]) & whole.frame["lat"].between(box[1], box[3])
    # the same rows as the whole read cut afterwards; the rest counted, none lost unseen
    assert cut.frame["quadkey"].tolist() == whole.frame.loc[inside, "quadkey"].tolist()
    assert len(cut.frame) == 60 and cut.read == whole.read == 100
    assert cut.dropped == {"outside_region": 40}
    assert [src["dropped"] for src in cut.sources] == [{"outside_region": 20}] * 2


def test_geometry_and_centroid_from_quadkey(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    path = tmp_path / "2023-10-01_performance_mobile_tiles.parquet"
    tiles_df.to_parquet(path)
    res = ookla.read_tiles([path])
    f = res.frame
    assert f["quarter"].unique().tolist() == ["2023Q4"]
    lon, _ = qk.quadkey_centroid(f["quadkey"].to_numpy())
    np.testing.assert_allclose(f["lon"], lon)
    np.testing.assert_allclose((f.bounds.minx + f.bounds.maxx) / 2, lon, atol=1e-9)
    assert f["tests"].dtype == np.int64


def test_geojson_null_geometries_rebuilt(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    path = write_geo(tmp_path / "state_mobile_2020Q4.geojson", tiles_df, null_every=2)
    res = ookla.read_tiles([path])
    assert len(res.frame) == len(tiles_df)
    assert res.sources[0]["null_geometries_rebuilt"] == 30
    assert res.frame.geometry.notna().all()


def test_shapefile_zip_any_crs(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    shp_dir = tmp_path / "shp"
    shp_dir.mkdir()
    df = tiles_df.copy()
    df["avg_lat_down_ms"] = 30
    write_geo(shp_dir / "gps_mobile_tiles.shp", df, crs="EPSG:3857")
    zpath = tmp_path / "2021-04-01_performance_mobile_tiles.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in shp_dir.iterdir():
            zf.write(f, f.name)
    res = ookla.read_tiles([zpath])
    assert len(res.frame) == len(df)
    assert res.frame["quarter"].iloc[0] == "2021Q2"
    assert "avg_lat_down_ms" in res.frame.columns  # 10-character dBASE name mapped back


def test_csv_with_quarter_column(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    df = tiles_df.drop(columns="tile")
    df["quarter"] = ["2020Q1", "2020-Q2"] * 30
    path = tmp_path / "tiles.csv"
    df.to_csv(path, index=False)
    res = ookla.read_tiles([path])
    assert res.frame["quadkey"].str.len().eq(16).all()  # leading zeros kept
    assert sorted(res.frame["quarter"].unique()) == ["2020Q1", "2020Q2"]


@pytest.mark.parametrize("name", ["tiles_2023Q4.csv.gz", "tiles_2023Q4.csv.zip", "tiles.xlsx"])
def test_compressed_csv_and_excel_tiles_are_read_like_a_csv(
    tmp_path: Path, tiles_df: pd.DataFrame, name: str
) -> None:
    df = tiles_df.drop(columns="tile").assign(quarter="2023Q4")
    folder = tmp_path / "in"
    folder.mkdir()
    path = folder / name
    if name.endswith(".xlsx"):
        df.to_excel(path, index=False)
    else:
        df.to_csv(path, index=False)
    [found] = ookla.discover_tile_files([folder])  # a folder scan finds it too
    assert found.path == path
    res = ookla.read_tiles([path])
    assert len(res.frame) == len(df)
    assert res.frame["quadkey"].tolist() == df["quadkey"].tolist()  # leading zeros kept
    np.testing.assert_allclose(res.frame["tests"], df["tests"])
    other = tmp_path / "tiles.gz"
    other.write_bytes(b"")
    with pytest.raises(DataError, match=r"unsupported tile file type '\.gz'"):
        ookla.discover_tile_files([other])


def test_optional_columns_kept_and_filled(tmp_path: Path) -> None:
    root = tmp_path / "p"
    old = make_tiles(10, seed=1)
    new = make_tiles(10, seed=2)
    new["tile_x"] = qk.quadkey_centroid(new["quadkey"].to_numpy())[0]
    new["tile_y"] = qk.quadkey_centroid(new["quadkey"].to_numpy())[1]
    new["avg_lat_down_ms"] = 40
    write_hive(root, old, kind="mobile", year=2023, q=2)
    write_hive(root, new, kind="mobile", year=2023, q=3)
    f = ookla.read_tiles([root]).frame
    assert f["tile_x"].notna().all()
    np.testing.assert_allclose(f["tile_x"], f["lon"])
    assert f["avg_lat_down_ms"].isna().sum() == 10


def test_bad_rows_counted_by_reason(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    df = tiles_df.copy()
    df.loc[0, "quadkey"] = "01234"
    df.loc[1, "avg_d_kbps"] = 0
    df.loc[2, "avg_u_kbps"] = -5
    df.loc[3, "avg_lat_ms"] = 0
    df.loc[4, "tests"] = 0
    df.loc[5, "devices"] = 0
    df["avg_d_kbps"] = df["avg_d_kbps"].astype(float)
    df.loc[6, "avg_d_kbps"] = np.nan
    df = pd.concat([df, df.iloc[[10]]], ignore_index=True)  # a duplicate tile-quarter
    path = tmp_path / "2023-01-01_performance_fixed_tiles.parquet"
    df.to_parquet(path)
    res = ookla.read_tiles([path])
    assert res.dropped == {
        "bad_quadkey": 1,
        "non_positive_download": 1,
        "non_positive_upload": 1,
        "non_positive_latency": 1,
        "tests_below_1": 1,
        "devices_below_1": 1,
        "missing_value": 1,
        "duplicate_tile_quarter": 1,
    }
    assert res.read == 61 and len(res.frame) == 61 - 8
    assert res.type == "fixed"


def test_missing_column_names_file_and_fix(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    path = tmp_path / "2023-01-01_performance_mobile_tiles.parquet"
    tiles_df.drop(columns=["tests"]).to_parquet(path)
    with pytest.raises(
        DataError, match=r"performance_mobile_tiles.parquet: missing column\(s\) tests"
    ):
        ookla.read_tiles([path])


def test_unreadable_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "2023-01-01_performance_mobile_tiles.parquet"
    bad.write_bytes(b"not a parquet file")
    with pytest.raises(DataError, match="cannot read this parquet file"):
        ookla.read_tiles([bad])
    with pytest.raises(DataError, match="no such file"):
        ookla.read_tiles([tmp_path / "nope.parquet"])
    odd = tmp_path / "x.txt"
    odd.write_text("x")
    with pytest.raises(DataError, match="unsupported"):
        ookla.read_tiles([odd])
    with pytest.raises(DataError, match="no tile files"):
        ookla.read_tiles([_empty(tmp_path)])


def _empty(tmp_path: Path) -> Path:
    d = tmp_path / "empty"
    d.mkdir()
    return d


def test_unknown_quarter_is_an_error(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    path = tmp_path / "tiles.csv"
    tiles_df.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"which quarter.*--quarters 2023Q4"):
        ookla.read_tiles([path])
    with pytest.raises(DataError, match="which quarter"):  # a range names no one quarter
        ookla.read_tiles([path], quarters="2023Q3:2023Q4")
    got = ookla.read_tiles([path], quarters="2023Q4")  # one quarter asked for: the file's
    assert len(got.frame) == len(tiles_df) and set(got.frame["quarter"]) == {"2023Q4"}


def test_spreadsheet_numbers_with_thousands_separators_are_read(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile")
    df["avg_d_kbps"] = [f"{v:,}" for v in df["avg_d_kbps"]]
    path = tmp_path / "tiles_2023Q4.csv"
    df.to_csv(path, index=False)
    got = ookla.read_tiles([path])
    assert len(got.frame) == len(df) and not got.dropped
    assert got.frame["avg_d_kbps"].tolist() == tiles_df["avg_d_kbps"].tolist()
    df["tests"] = "many"
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"tiles_2023Q4\.csv: column 'tests' holds 60 of 60"):
        ookla.read_tiles([path])


def test_a_type_column_selects_rows_or_asks_for_a_type(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile")
    df["type"] = ["mobile"] * 20 + ["Fixed"] * 40
    path = tmp_path / "both_2023Q4.parquet"
    df.to_parquet(path)
    got = ookla.read_tiles([path], type="mobile")
    assert len(got.frame) == 20 and got.dropped == {"other_type": 40}
    with pytest.raises(DataError, match="holds both mobile and fixed rows; pass --type"):
        ookla.read_tiles([path])
    df["type"] = "fixed"
    df.to_parquet(path)
    assert ookla.read_tiles([path]).type == "fixed"


def test_a_quarter_column_is_never_replaced_by_the_name_or_quarters(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile")
    df["quarter"] = ["Q3 2022"] * 30 + ["Q4 2023"] * 30
    path = tmp_path / "maui_mobile_2022Q3-2023Q4.parquet"  # a range: the name names no quarter
    df.to_parquet(path)
    assert ookla.quarter_from_path(path) is None
    got = ookla.read_tiles([path])
    assert got.frame["quarter"].value_counts().to_dict() == {"2022Q3": 30, "2023Q4": 30}
    got = ookla.read_tiles([path], quarters="2023Q4")
    assert len(got.frame) == 30 and got.dropped == {"outside_quarters": 30}
    df["quarter"] = "autumn"
    df.to_parquet(path)
    with pytest.raises(DataError, match=r"column 'quarter' holds 60 of 60 .*'autumn'.*Q4 2023"):
        ookla.read_tiles([path], quarters="2023Q4")


def test_quarters_stands_for_one_file_only(tmp_path: Path, tiles_df: pd.DataFrame) -> None:
    for name in ("maui_q3.parquet", "maui_q4.parquet"):
        tiles_df.drop(columns="tile").to_parquet(tmp_path / name)
    with pytest.raises(DataError, match=r"name no quarter .*--quarters 2023Q4 can stand for one"):
        ookla.read_tiles([tmp_path], quarters="2023Q4")


def test_csv_quadkeys_written_as_numbers_are_padded_or_refused(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile")
    keys = df["quadkey"].str.lstrip("0")
    df["quadkey"] = keys.where(np.arange(len(df)) % 2 == 0, keys + ".0")  # as floats, half
    path = tmp_path / "tiles_2023Q4.csv"
    df.to_csv(path, index=False)
    got = ookla.read_tiles([path])
    assert sorted(got.frame["quadkey"]) == sorted(tiles_df["quadkey"]) and not got.dropped
    df["quadkey"] = [f"{int(k):.5E}" for k in keys]  # a spreadsheet's scientific notation
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"scientific notation.*formatted as text"):
        ookla.read_tiles([path])


def test_parquet_columns_in_upper_case_and_their_newer_columns(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile").rename(columns=str.upper)
    df["AVG_LAT_DOWN_MS"] = 12
    path = tmp_path / "tiles_2023Q4.parquet"
    df.to_parquet(path)
    got = ookla.read_tiles([path])
    assert len(got.frame) == len(df) and (got.frame["avg_lat_down_ms"] == 12).all()


def test_a_date_column_gives_quarters_unless_the_path_names_one(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile")
    df["date"] = ["2023-02-01"] * 30 + ["2023-11-01"] * 30
    loose = tmp_path / "loose.parquet"
    df.to_parquet(loose)
    got = ookla.read_tiles([loose], quarters="2023Q4")  # the dates, not --quarters
    assert len(got.frame) == 30 and got.dropped == {"outside_quarters": 30}
    named = tmp_path / "tiles_2024Q1.parquet"  # a date such as the export's: the name wins
    df.to_parquet(named)
    assert set(ookla.read_tiles([named]).frame["quarter"]) == {"2024Q1"}


def test_a_hive_partitions_quarter_number_in_the_file_is_its_paths(
    tmp_path: Path, tiles_df: pd.DataFrame
) -> None:
    df = tiles_df.drop(columns="tile").assign(quarter=4)
    path = write_hive(tmp_path, df, kind="mobile", year=2023, q=4)
    assert set(ookla.read_tiles([path]).frame["quarter"]) == {"2023Q4"}
