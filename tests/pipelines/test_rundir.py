"""The run-directory layout, the targets' units, and the checks a stage makes before it starts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import make_run

from geodbk.errors import DataError, ModelFileError, RunDirectoryError
from pipelines.rundir import (
    RunDir,
    check_thresholds,
    config_hash,
    model_inputs,
    read_json,
    require_grid,
    require_model,
    require_run,
    run_licence,
    run_licence_attrs,
    scale_lonlat,
    scaling_of,
    target_lock,
    target_spec,
    write_csv_rows,
)


def test_target_specs_convert_units_and_name_thresholds() -> None:
    down, lat = target_spec("download"), target_spec("latency")
    assert (down.column, down.log_column, down.unit) == ("avg_d_kbps", "log10_download", "Mbps")
    np.testing.assert_allclose(down.to_natural(np.array([np.log10(25_000.0)])), [25.0])
    assert down.natural_to_log10(25.0) == pytest.approx(np.log10(25_000.0))
    assert down.threshold_name(25) == "p_below_25mbps"
    assert lat.threshold_name(100.5) == "p_above_100p5ms"
    with pytest.raises(DataError, match="download"):
        target_spec("jitter")
    assert check_thresholds([10, "25"], "download") == (10.0, 25.0)
    assert check_thresholds(None, "latency")  # the target's defaults
    with pytest.raises(DataError, match="--thresholds must be positive finite ms values"):
        check_thresholds([100, -1], "latency")


def test_paths_and_what_a_stage_needs_first(tmp_path: Path) -> None:
    rd = RunDir(tmp_path / "run")
    assert rd.grid("upload", "2023Q2") == rd.root / "grids" / "upload_2023Q2.nc"
    assert rd.trend_grid("download", "2023Q1", "2023Q4").name == "download_trend_2023Q1_2023Q4.nc"
    assert rd.relative(rd.root / "grids" / "a.nc") == "grids/a.nc"
    assert rd.relative(tmp_path / "elsewhere" / "b.tif") == "b.tif"  # no absolute path
    with pytest.raises(RunDirectoryError, match=r"does not exist.*geodbk ingest --run"):
        require_run(rd.root)
    rd.root.mkdir()
    rd.tiles.write_bytes(b"")
    with pytest.raises(RunDirectoryError, match=r"region.geojson is missing"):
        require_run(rd.root)
    rd.region.write_text("{}")
    assert require_run(rd.root) == rd
    with pytest.raises(ModelFileError, match=r"geodbk train --run .* --target upload"):
        require_model(rd, "upload")
    with pytest.raises(RunDirectoryError, match=r"geodbk predict --run .* --target upload"):
        require_grid(rd, "upload")
    assert rd.trained_targets() == []
    rd.model_dir("latency").mkdir(parents=True)
    (rd.model_dir("latency") / "model.json").write_text("{}")
    assert require_model(rd, "latency") == rd.model_dir("latency")
    assert rd.trained_targets() == ["latency"]


def test_scaling_maps_the_extent_to_the_unit_square() -> None:
    meta = {"scaling": {"lon_min": -158, "lon_max": -154, "lat_min": 18, "lat_max": 22}}
    scaling = scaling_of(meta, source=Path("tiles.parquet"))
    X = scale_lonlat(np.array([-158.0, -156.0, -154.0]), np.array([18.0, 20.0, 22.0]), scaling)
    np.testing.assert_allclose(X, [[-1, -1], [0, 0], [1, 1]])
    assert model_inputs(X, {"inputs": ["x1", "x2"]}) is X  # a pooled model: lon/lat only
    with pytest.raises(DataError, match="lacks a valid 'scaling'"):
        scaling_of({"scaling": {"lon_min": 1}}, source=Path("tiles.parquet"))


def test_json_files_and_config_hashes(tmp_path: Path) -> None:
    good = tmp_path / "m.json"
    good.write_text(json.dumps({"a": 1}))
    assert read_json(good) == {"a": 1}
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(RunDirectoryError, match="does not hold a JSON object"):
        read_json(tmp_path / "list.json")
    with pytest.raises(RunDirectoryError, match="cannot read"):
        read_json(tmp_path / "missing.json")
    assert config_hash({"a": 1, "b": [2]}) == config_hash({"b": [2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2}) and len(config_hash({})) == 16


def test_a_second_lock_on_the_same_target_is_refused(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    with target_lock(rd, "download", stage="train"):
        with pytest.raises(
            DataError, match=r"being written by another geodbk stage \(geodbk train"
        ):
            with target_lock(rd, "download", stage="report"):
                pass
        with target_lock(rd, "upload", stage="report"):  # another target is free
            pass
    with target_lock(rd, "download", stage="report"):  # released
        pass


def test_run_licence_attrs_names_the_licence_as_file_attributes(tmp_path: Path) -> None:
    rd = RunDir(make_run(tmp_path / "run", n=40))
    licence = run_licence(rd)  # the licence recorded in tiles.parquet
    assert run_licence_attrs(rd) == {
        "source": licence["source"],
        "license": licence["license"],
        "license_url": licence["license_url"],
        "license_terms": licence["terms"],
    }
    assert all(run_licence_attrs(rd).values())


def test_csv_rows_keep_hash_signs_in_cells(tmp_path: Path) -> None:
    """Below ``#`` lines, a cell with ``#`` (``District #3``, one starting with ``#``) is read
    back whole by ``pandas.read_csv(comment="#")``; numbers, booleans and blanks keep their
    types."""
    frame = pd.DataFrame(
        {
            "name": ["District #3", "# 7", 'a "b", c'],
            "value": [1.5, np.nan, 2.0],
            "flag": [True, False, True],
        }
    )
    path = tmp_path / "t.csv"
    with open(path, "w", encoding="utf-8", newline="") as handle:
        handle.write("# what the file holds\n")
        write_csv_rows(handle, frame)
    back = pd.read_csv(path, comment="#")
    pd.testing.assert_frame_equal(back, frame, check_dtype=False)
    assert back["flag"].dtype == bool and back["value"].dtype == np.float64
    memory = io.StringIO()
    memory.write("# what the file holds\n")
    write_csv_rows(memory, frame)  # an in-memory handle gets the same text
    assert memory.getvalue() == path.read_text(encoding="utf-8")
    latin = tmp_path / "latin.csv"
    with open(latin, "w", encoding="latin-1", newline="") as handle:
        write_csv_rows(handle, frame.assign(name=["Mé", "b", "c"]))
    assert pd.read_csv(latin, encoding="latin-1")["name"].tolist() == ["Mé", "b", "c"]


def test_csv_rows_of_dates_and_mixed_ids_read_back_as_written(tmp_path: Path) -> None:
    """Columns that Arrow writes otherwise than pandas (dates) or cannot convert (ids of mixed
    types) are written as pandas writes them, with text quoted."""
    frame = pd.DataFrame(
        {
            "site": [1, "A-7", None],
            "surveyed": pd.to_datetime(["2023-01-01", "2023-02-01", None]),
            "mean": [1.5, np.nan, 2.0],
        }
    )
    path = tmp_path / "t.csv"
    with open(path, "w", encoding="utf-8", newline="") as handle:
        write_csv_rows(handle, frame)
    text = path.read_text(encoding="utf-8")
    assert '"2023-01-01"' in text and '"A-7"' in text
    back = pd.read_csv(path, parse_dates=["surveyed"])
    assert back["site"].tolist()[:2] == ["1", "A-7"] and pd.isna(back["site"][2])
    pd.testing.assert_series_equal(back["surveyed"], frame["surveyed"], check_dtype=False)
