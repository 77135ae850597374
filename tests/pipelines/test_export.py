"""``geodbk export``: band order and descriptions, output paths, and many runs in one call."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr

from pipelines import cli
from pipelines.export import (
    band_descriptions,
    band_tags,
    band_units,
    export_paths,
    grid_period,
    grid_variables,
    run_export,
)
from pipelines.rundir import RunDir


def test_export_all_on_many_runs_in_one_call(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs = []
    for name in ("a", "b"):
        shutil.copytree(tiny_run, tmp_path / name)
        runs.append(tmp_path / name)
        for f in (tmp_path / name / "exports").glob("*"):
            f.unlink()
    caplog.set_level("INFO", logger="geodbk")
    argv = ["export", "--run", str(runs[0]), "--all", "--format", "gtiff", str(runs[1])]
    assert cli.main(argv) == 0
    expected = [f"{t}.{ext}" for t in ("download", "latency", "upload") for ext in ("json", "tif")]
    for r in runs:
        assert sorted(p.name for p in (r / "exports").iterdir()) == expected
    assert sum("wrote" in rec.message for rec in caplog.records) == 6


def _grid(**attrs: object) -> xr.Dataset:
    cells = np.zeros((2, 3))
    return xr.Dataset(
        {
            "mean": (
                ("y", "x"),
                cells,
                {"quantity": "tile: what the tile here typically gets (local layer)"},
            ),
            "in_region": (("y", "x"), cells.astype(bool)),
            "std_f": (("y", "x"), cells.astype(np.float32), {"quantity": "area: latent mean f(x)"}),
            "legacy": (("y", "x"), cells),
            "count": (("y", "x"), cells.astype(np.int16)),
            "profile": (("x",), np.zeros(3)),
        },
        attrs=attrs,
    )


def test_bands_are_the_float_maps_described_with_their_quantity_and_period() -> None:
    pooled = _grid()
    bands = grid_variables(pooled)
    assert bands == ["mean", "std_f", "legacy"]  # no mask, integer or 1-D variable
    assert grid_period(pooled) is None
    assert band_descriptions(pooled, bands) == [
        "mean: tile: what the tile here typically gets (local layer)",
        "std_f: area: latent mean f(x)",
        "legacy",
    ]
    quarter = _grid(time_aware=1, quarter="2023Q4")
    assert band_descriptions(quarter, ["mean", "legacy"]) == [
        "mean: tile: what the tile here typically gets (local layer), 2023Q4",
        "legacy: 2023Q4",
    ]
    trend = _grid(product="trend", first_quarter="2019Q4", last_quarter="2023Q4", time_aware=1)
    assert grid_period(trend) == "change per year 2019Q4→2023Q4"
    assert grid_period(_grid(time_aware=0, quarter="2023Q4")) is None
    flags = _grid(time_aware=1, quarter="2023Q4").assign(
        tile_history=(
            ("y", "x"),
            np.zeros((2, 3)),
            {"quantity": "tile: what the tile here typically gets (local layer)"},
        ),
        cls=(("y", "x"), np.zeros((2, 3)), {"quantity": "tile", "flag_values": [0, 1]}),
    )
    assert band_descriptions(flags, ["tile_history", "cls"]) == [
        "tile_history: flag, 2023Q4",
        "cls: flag, 2023Q4",
    ]


def test_export_paths_name_the_quarter_or_the_trend(tmp_path: Path) -> None:
    rd = RunDir(tmp_path)
    assert export_paths(rd, "upload") == (rd.export_tif("upload"), rd.export_sidecar("upload"))
    tif, sidecar = export_paths(rd, "upload", quarter="2023Q2")
    assert (tif.name, sidecar.name) == ("upload_2023Q2.tif", "upload_2023Q2.json")
    tif, _ = export_paths(rd, "latency", quarter="2023Q2", trend=("2022Q1", "2023Q1"))
    assert tif == tmp_path / "exports" / "latency_trend_2022Q1_2023Q1.tif"


def test_bands_carry_their_units_and_flags_no_quantity(tiny_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (tif,) = run_export(run, target="download")
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        bands = grid_variables(ds)
        units = band_units(ds, bands)
        quantity = {b: ds[b].attrs.get("quantity") for b in bands}
    assert "tile_history" in bands and quantity["tile_history"]  # the grid labels the flag
    with rasterio.open(tif) as src:
        assert src.units == tuple(units)
        by_name = dict(zip(bands, src.units, strict=True))
        described = dict(zip(bands, src.descriptions, strict=True))
    assert by_name["mean"].startswith("log10") and by_name["mean_natural"] == "Mbps"
    assert all(by_name[b] == "1" for b in bands if b.startswith("p_below_"))
    assert by_name["tile_history"] == "1"
    assert described["tile_history"].startswith("tile_history: flag")
    assert str(quantity["tile_history"]) not in described["tile_history"]
    assert str(quantity["mean"]) in described["mean"]


def test_bands_carry_what_each_value_is(tiny_run: Path, tmp_path: Path) -> None:
    """The grid's ``long_name`` of each band reaches the GeoTIFF (band tags, which QGIS and
    ``gdalinfo`` show) and the sidecar: ``mean_natural`` is the predictive median, not a mean,
    and ``p_below_25mbps`` is a probability of being below its threshold."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (tif,) = run_export(run, target="download")
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        bands = grid_variables(ds)
        long_names = {b: ds[b].attrs["long_name"] for b in bands}
        tags = band_tags(ds, bands)
    assert "median" in long_names["mean_natural"]
    with rasterio.open(tif) as src:
        got = {b: src.tags(i) for i, b in enumerate(bands, start=1)}
    assert got == dict(zip(bands, tags, strict=True))
    assert all(got[b]["long_name"] == long_names[b] for b in bands)
    assert got["p_below_25mbps"]["threshold"] == "25"
    assert "quantity" in got["mean"] and "grid_mapping" not in got["mean"]
    sidecar = json.loads((run / "exports" / "download.json").read_text())
    assert sidecar["long_names"] == long_names


def _fresh_copy(tiny_run: Path, dest: Path) -> Path:
    """A copy of the tiny run without its exports."""
    shutil.copytree(tiny_run, dest)
    shutil.rmtree(dest / "exports", ignore_errors=True)
    return dest


@pytest.mark.parametrize("fmt", ["gtiff", "netcdf"])
def test_quarter_all_names_every_missing_quarter_before_writing(
    tiny_run: Path, tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _fresh_copy(tiny_run, tmp_path / "run")
    for q in ("2023Q2", "2023Q3"):
        (run / "grids" / f"download_{q}.nc").unlink()
    argv = ["export", "--run", str(run), "--target", "download", "--format", fmt]
    assert cli.main([*argv, "--quarter", "all"]) == 5
    err = capsys.readouterr().err
    assert "2023Q2, 2023Q3" in err and "--quarter 2023Q2:2023Q3` first" in err
    assert not (run / "exports").exists() or not any((run / "exports").iterdir())
    # without --quarter, netcdf stacks the quarters that have a grid
    if fmt == "netcdf":
        assert cli.main(argv) == 0
        with xr.open_dataset(run / "exports" / "download_quarters.nc") as ds:
            assert list(ds["quarter"].values) == ["2023Q1", "2023Q4"]


def test_many_runs_are_all_checked_before_any_is_written(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _fresh_copy(tiny_run, tmp_path / "good")
    partial = _fresh_copy(tiny_run, tmp_path / "partial")
    (partial / "grids" / "upload.nc").unlink()
    for second, code in ((partial, 5), (tmp_path / "nothere", 5)):
        assert cli.main(["export", "--run", str(good), "--all", str(second)]) == code
        assert str(second) in capsys.readouterr().err
        assert not (good / "exports").exists() or not any((good / "exports").iterdir())


def _edit_model(run: Path, target: str, **changes: object) -> None:
    """Change ``models/TARGET/model.json``'s metadata as a retrain or re-ingest would."""
    path = run / "models" / target / "model.json"
    doc = json.loads(path.read_text())
    md = doc.get("metadata", doc)
    for key, value in changes.items():
        if key == "ingest_id":
            md["tiles_metadata"]["ingest_id"] = value
        else:
            md[key] = value
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"config_hash": "0123456789abcdef"}, "config hash"),
        ({"created": "2999-01-01T00:00:00+00:00"}, "the model now was trained at 2999-01-01"),
    ],
)
@pytest.mark.parametrize("fmt", ["gtiff", "netcdf"])
def test_a_grid_older_than_its_model_is_refused(
    tiny_run: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, object],
    reason: str,
    fmt: str,
) -> None:
    run = _fresh_copy(tiny_run, tmp_path / "run")
    _edit_model(run, "download", **change)
    argv = ["export", "--run", str(run), "--format", fmt]
    assert cli.main([*argv, "--target", "download"]) == 5
    err = capsys.readouterr().err
    assert "download" in err and reason in err
    assert f"geodbk predict --run {run} --target download" in err
    assert not (run / "exports").exists() or not any((run / "exports").iterdir())
    assert cli.main([*argv, "--target", "upload"]) == 0  # its grid is of its model


def test_a_model_of_an_earlier_ingest_is_warned_about(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = _fresh_copy(tiny_run, tmp_path / "run")
    _edit_model(run, "download", ingest_id="an-earlier-ingest")
    caplog.set_level("WARNING", logger="geodbk")
    assert cli.main(["export", "--run", str(run), "--target", "download"]) == 0
    assert any("re-ingested" in r.message and r.levelname == "WARNING" for r in caplog.records)
    assert (run / "exports" / "download.tif").is_file()


def test_a_grid_without_its_models_time_is_judged_by_the_clocks() -> None:
    from pipelines.export import stale_grid_reason

    md = {"config_hash": "abc", "created": "2026-01-02T00:00:00+00:00"}
    old_grid = {"model_config_hash": "abc", "created": "2026-01-01T00:00:00+00:00"}
    assert "after the grid was written" in str(stale_grid_reason(old_grid, md))
    current = {**old_grid, "model_created": md["created"]}
    assert stale_grid_reason(current, md) is None  # the record, not the clocks, decides
    retrained = {**current, "created": "2026-01-03T00:00:00+00:00", "model_created": "2025"}
    assert "trained at 2025" in str(stale_grid_reason(retrained, md))


def test_a_geotiff_of_another_quantity_is_replaced_with_a_warning(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After `predict --quantity area`, exporting again replaces the tile quantity's GeoTIFF
    that may have been handed on; the export says so, naming both quantities."""
    run = _fresh_copy(tiny_run, tmp_path / "run")
    argv = ["export", "--run", str(run), "--target", "download"]
    caplog.set_level("WARNING", logger="geodbk")
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0
    assert "holds the tile quantity's map" not in caplog.text  # the same quantity again
    predict = ["predict", "--run", str(run), "--target", "download", "--no-progress"]
    assert cli.main([*predict, "--quantity", "area"]) == 0
    caplog.clear()
    assert cli.main(argv) == 0
    warned = [r.message for r in caplog.records if "download.tif holds" in r.message]
    assert len(warned) == 1, caplog.text
    assert "the tile quantity's map; it is replaced by the area quantity's" in warned[0]
    assert f"geodbk predict --run {run} --target download --quantity tile" in warned[0]
    with rasterio.open(run / "exports" / "download.tif") as src:
        assert src.tags()["geodbk_quantity"] == "area"


def test_a_quarters_stack_of_other_quarters_is_replaced_with_a_warning(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`export --format netcdf --quarter Q` after a stack of every quarter replaces it with
    one time step; the export says so, naming the quarters of both."""
    run = _fresh_copy(tiny_run, tmp_path / "run")
    argv = ["export", "--run", str(run), "--target", "download", "--format", "netcdf"]
    caplog.set_level("WARNING", logger="geodbk")
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0
    assert "download_quarters.nc holds" not in caplog.text  # the same stack again
    assert cli.main([*argv, "--quarter", "2023Q4"]) == 0
    warned = [r.message for r in caplog.records if "download_quarters.nc holds" in r.message]
    assert len(warned) == 1, caplog.text
    assert "stack of 2023Q1–2023Q4 (tile quantity)" in warned[0]
    assert "replaced by that of 2023Q4 (tile quantity" in warned[0]
    with xr.open_dataset(run / "exports" / "download_quarters.nc") as ds:
        assert list(ds["quarter"].values) == ["2023Q4"]


def test_a_tile_map_carries_the_held_out_check_of_its_own_training(
    tiny_run: Path, tmp_path: Path
) -> None:
    """The demo exports after its reports: the tile map's sidecar and tags say how often its
    interval held held-out tiles' levels, as the report measured; a report of another
    training is not carried."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    metrics = json.loads((run / "report" / "download" / "metrics.json").read_text())
    sidecar = json.loads((run / "exports" / "download.json").read_text())
    check = sidecar["held_out_check"]
    well = metrics["map_calibration"]["tile"]["all"]
    assert check["well_measured"]["coverage95"] == well["coverage95"]
    assert check["well_measured"]["tiles"] == well["tiles"]
    assert check["less_measured"]["min_tests"] == 5
    with rasterio.open(run / "exports" / "download.tif") as src:
        tags = src.tags()
    assert (
        f"{100 * well['coverage95']:.1f}% of {well['tiles']} test tiles with 30+ tests"
        in (tags["geodbk_held_out_check"])
    )
    assert float(tags["geodbk_held_out_well_measured_coverage95"]) == pytest.approx(
        well["coverage95"], abs=1e-4
    )
    # the report of another training: nothing carried
    summary_path = run / "report" / "download" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps({**summary, "model_created": "another training"}))
    run_export(run, target="download")
    assert json.loads((run / "exports" / "download.json").read_text())["held_out_check"] is None
    with rasterio.open(run / "exports" / "download.tif") as src:
        assert not any(k.startswith("geodbk_held_out") for k in src.tags())
