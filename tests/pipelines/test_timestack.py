"""``geodbk export --format netcdf``: the quarters' grids along a CF time dimension."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from geodbk.errors import DataError
from pipelines import cli
from pipelines.timestack import quarter_bounds, write_time_stack


@pytest.fixture
def run(tiny_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))


def _days(d: dt.date) -> float:
    return float((d - dt.date(1970, 1, 1)).days)


def test_quarter_bounds() -> None:
    assert quarter_bounds("2023Q2") == (_days(dt.date(2023, 4, 1)), _days(dt.date(2023, 7, 1)))
    assert quarter_bounds("2023Q4")[1] == _days(dt.date(2024, 1, 1))
    pooled = quarter_bounds("pooled 2019Q1:2023Q4")
    assert pooled == (_days(dt.date(2019, 1, 1)), _days(dt.date(2024, 1, 1)))


def test_every_quarter_is_one_time_step(run: Path) -> None:
    assert (
        cli.main(["export", "--run", str(run), "--target", "download", "--format", "netcdf"]) == 0
    )
    out = run / "exports" / "download_quarters.nc"
    grids = {q: run / "grids" / f"download_{q}.nc" for q in ("2023Q1", "2023Q2", "2023Q3")}
    grids["2023Q4"] = run / "grids" / "download.nc"  # the latest quarter's grid
    with xr.open_dataset(out) as ds:
        assert ds["mean"].dims == ("time", "y", "x")
        assert list(ds["quarter"].values) == list(grids)
        assert ds["time"].dtype.kind == "M"  # decoded as dates
        assert str(ds["time"].values[0])[:10] == "2023-02-15"
        assert ds["in_region"].dtype == bool
        assert ds.attrs["Conventions"] == "CF-1.8" and "license" in ds.attrs
        for t, path in enumerate(grids.values()):
            with xr.open_dataset(path) as grid:
                for name in ("mean", "tile_sd", "p_below_25mbps", "in_region"):
                    np.testing.assert_array_equal(ds[name].isel(time=t).values, grid[name].values)
                assert ds["quarter_status"].values[t] == grid.attrs["quarter_status"]


def test_a_quarter_range_and_its_missing_grid(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["export", "--run", str(run), "--target", "upload", "--format", "netcdf"]
    assert cli.main([*argv, "--quarter", "2023Q2:2023Q3"]) == 0
    with xr.open_dataset(run / "exports" / "upload_quarters.nc") as ds:
        assert list(ds["quarter"].values) == ["2023Q2", "2023Q3"]
    (run / "grids" / "upload_2023Q1.nc").unlink()
    assert cli.main([*argv, "--quarter", "2023Q1:2023Q2"]) == 5
    err = capsys.readouterr().err
    assert "geodbk predict" in err and "--quarter 2023Q1" in err and "Traceback" not in err


def test_a_trend_is_refused(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["export", "--run", str(run), "--target", "upload", "--format", "netcdf"]
    assert cli.main([*argv, "--trend", "2023Q1:2023Q4"]) == 3
    assert "--format gtiff or cog" in capsys.readouterr().err
    assert not (run / "exports" / "upload_quarters.nc").exists()


def test_grids_of_different_shapes_are_refused(run: Path, tmp_path: Path) -> None:
    first = run / "grids" / "latency_2023Q1.nc"
    with xr.open_dataset(first) as ds:
        ds.isel(y=slice(0, 10)).load().to_netcdf(tmp_path / "cut.nc", engine="h5netcdf")
    out = tmp_path / "stack.nc"
    with pytest.raises(DataError, match="different shapes"):
        write_time_stack(out, [first, tmp_path / "cut.nc"], attrs={})
    assert not out.exists() and not list(tmp_path.glob(".stack.nc.*"))


def _relabel(grid: Path, **attrs: object) -> None:
    """Rewrite ``grid`` with ``attrs`` set, as another ``predict --quantity`` would have."""
    with xr.open_dataset(grid) as ds:
        ds = ds.load()
    ds.attrs.update(attrs)
    ds.to_netcdf(grid, engine="h5netcdf")


def test_grids_of_different_quantities_are_refused(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A quarter mapped with another --quantity (or --tests) would sit in the stack under the
    latest grid's quantity label: the stack is refused, naming the grid and the fix."""
    odd = run / "grids" / "download_2023Q2.nc"
    _relabel(odd, quantity="test", tests=1.0)
    argv = ["export", "--run", str(run), "--target", "download", "--format", "netcdf"]
    assert cli.main(argv) == 3
    err = capsys.readouterr().err
    assert "download_2023Q2.nc" in err and "test quantity" in err and "tile quantity" in err
    assert "--quarter 2023Q2 --quantity tile" in err and "Traceback" not in err
    assert not (run / "exports" / "download_quarters.nc").exists()
    assert cli.main([*argv, "--quarter", "2023Q3:2023Q4"]) == 0  # the others agree
    _relabel(odd, quantity="tile", tests=4.0)  # tests matter to the test quantity only
    assert cli.main(argv) == 0
    with pytest.raises(DataError, match="tests=4"):
        _relabel(odd, quantity="test", tests=4.0)
        _relabel(run / "grids" / "download_2023Q3.nc", quantity="test", tests=1.0)
        write_time_stack(run / "s.nc", [odd, run / "grids" / "download_2023Q3.nc"], attrs={})


def test_a_pooled_grid_is_one_time_step_over_its_quarters(tmp_path: Path) -> None:
    from pipeline_helpers import make_run

    from pipelines.config import TrainConfig
    from pipelines.predict import run_predict
    from pipelines.train import run_train

    r = make_run(tmp_path / "pooled")
    cfg = TrainConfig(rank=16, hidden=8, epochs=2, batch_size=128, device="cpu")
    run_train(r, target="download", config=cfg, progress=False)
    run_predict(r, target="download", resolution=0.05, extent="region")
    assert cli.main(["export", "--run", str(r), "--target", "download", "--format", "netcdf"]) == 0
    with (
        xr.open_dataset(r / "exports" / "download_quarters.nc") as ds,
        xr.open_dataset(r / "grids" / "download.nc") as grid,
    ):
        assert ds.sizes["time"] == 1
        assert ds["quarter"].values[0] == grid.attrs["quarter"]
        assert str(grid.attrs["quarter"]).startswith("pooled")
        np.testing.assert_array_equal(ds["mean"].isel(time=0).values, grid["mean"].values)
    argv = ["export", "--run", str(r), "--target", "download", "--format", "netcdf"]
    assert cli.main([*argv, "--quarter", "2023Q1"]) == 3  # a pooled model has no quarters
