"""Probes of a full disk (ENOSPC) in every stage that writes outputs: exit 6, one message naming
the file that could not be written and the fix, no traceback, and the earlier outputs unchanged
(no partial or temporary file left). The full disk is simulated where each writer meets it: the
grid writer's room check, a parquet, PNG or JSON write, GDAL's "Write failed", a checkpoint
(a real full tmpfs gave the same answers; ingest's probe is in test_run_state.py)."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from probe_helpers import DISK, copy_run, disk_full, probe

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"
FIX = "free some space"


@pytest.fixture
def run(tiny_run: Path, tmp_path: Path) -> Path:
    return copy_run(tiny_run, tmp_path / "run")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("places") / "places.csv"
    pd.DataFrame({"lon": [-99.9, -99.8], "lat": [39.5, 39.6]}).to_csv(path, index=False)
    return path


def _parquet_fills_the_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every parquet write starts its file, then meets a full disk."""
    import pyarrow.parquet as pq

    def full(table: Any, where: Any, *args: Any, **kwargs: Any) -> None:
        Path(where).write_bytes(b"PAR1")
        raise disk_full()

    monkeypatch.setattr(pq, "write_table", full)


@pytest.mark.parametrize(
    ("stage", "out"),
    [("predict", "grids/download.nc"), ("service", "service/classes.nc")],
)
def test_a_grid_is_refused_when_the_disk_has_no_room_for_it(
    run: Path, stage: str, out: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """HDF5 cannot report a full disk (its write errors are swallowed and the process may
    crash), so the grid writer checks the room for each block itself."""
    from pipelines import gridfile

    monkeypatch.setattr(gridfile, "free_bytes", lambda folder: 4096)
    argv = ["predict", "--run", str(run), "--target", "download"]
    if stage == "service":
        argv = ["service", "--run", str(run)]
    names = (f"cannot write {run / out} (No space left on device)", FIX)
    probe(argv, run=run, code=DISK, names=names, capsys=capsys)


@pytest.mark.parametrize(
    ("stage", "out"),
    [
        ("predict --at", "predictions/upload_places.parquet"),
        ("service --at", "service/classes_places.parquet"),
        ("summarize", "summaries/latency_synthetic_counties.parquet"),
    ],
)
def test_a_parquet_output_meets_a_full_disk(
    run: Path,
    places: Path,
    stage: str,
    out: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    argv = {
        "predict --at": ["predict", "--run", str(run), "--target", "upload", "--at", str(places)],
        "service --at": ["service", "--run", str(run), "--at", str(places)],
        "summarize": [
            "summarize",
            "--run",
            str(run),
            "--target",
            "latency",
            "--areas",
            str(COUNTIES),
            "--samples",
            "20",
        ],
    }[stage]
    _parquet_fills_the_disk(monkeypatch)
    names = (f"cannot write {run / out} (No space left on device)", FIX)
    probe(argv, run=run, code=DISK, names=names, capsys=capsys)


def test_a_report_half_written_keeps_the_earlier_report(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The disk fills after the predictions, the metrics and two figures: the report folder
    is written as one set, so none of them replaces its earlier version."""
    from matplotlib.figure import Figure

    real = Figure.savefig
    saved: list[object] = []

    def fills_up(self: Figure, fname: Any, *args: Any, **kwargs: Any) -> None:
        if len(saved) == 2:
            Path(fname).write_bytes(b"\x89PNG")
            raise disk_full()
        saved.append(fname)
        real(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", fills_up)
    names = (f"cannot write {run / 'report' / 'download' / 'figures'}", "No space left", FIX)
    probe(
        ["report", "--run", str(run), "--target", "download"],
        run=run,
        code=DISK,
        names=names,
        capsys=capsys,
    )
    assert len(saved) == 2


def test_a_geotiff_write_gdal_cannot_finish_keeps_the_earlier_pair(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """GDAL says only "Write failed" (a RasterioIOError without errno); the file system then
    has no room left, which names the cause."""
    import rasterio.errors
    from rioxarray.raster_array import RasterArray

    def fails(self: Any, raster_path: Any, *args: Any, **kwargs: Any) -> None:
        Path(raster_path).write_bytes(b"II*\x00")
        raise rasterio.errors.RasterioIOError("Write failed. See previous exception for details.")

    class Full:
        f_flag, f_bavail, f_frsize = 0, 0, 4096

    real_statvfs = os.statvfs
    monkeypatch.setattr(RasterArray, "to_raster", fails)
    monkeypatch.setattr(
        os, "statvfs", lambda p: Full() if Path(p).is_relative_to(run) else real_statvfs(p)
    )
    names = (f"cannot write {run / 'exports' / 'download.tif'} (No space left on device)", FIX)
    probe(
        ["export", "--run", str(run), "--target", "download"],
        run=run,
        code=DISK,
        names=names,
        capsys=capsys,
    )


def _fails_on(monkeypatch: pytest.MonkeyPatch, method: str, prefix: str) -> None:
    """``Path.<method>`` meets a full disk for hidden temporary files named ``prefix*``."""
    real = getattr(Path, method)

    def full(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name.startswith(prefix):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, method, full)


def test_a_full_disk_at_the_first_checkpoint_keeps_model_and_checkpoint(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The old checkpoint and its config come back: nothing of the failed training stays."""
    _fails_on(monkeypatch, "write_bytes", ".last.pt.")
    ckpt = run / "models" / "download" / "checkpoints"
    names = (f"cannot write {ckpt / 'last.pt'} (No space left on device)", FIX)
    argv = ["train", "--run", str(run), "--target", "download", "--epochs", "2"]
    probe(argv, run=run, code=DISK, names=names, capsys=capsys)


def test_a_full_disk_while_saving_the_model_keeps_the_old_bundle(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Weights and model.json are both written before either replaces the old pair; the new
    training's checkpoints stay (resumable with --resume once there is room)."""
    _fails_on(monkeypatch, "write_text", ".model.json.")
    model = run / "models" / "download"
    names = (f"cannot write {model / 'model.json'} (No space left on device)", FIX)
    argv = ["train", "--run", str(run), "--target", "download", "--epochs", "2"]
    probe(
        argv,
        run=run,
        code=DISK,
        names=names,
        capsys=capsys,
        changes=("models/download/checkpoints/",),
    )
    from pipelines.config import load_config

    assert load_config(model / "checkpoints" / "config.yaml").epochs == 2  # the new pair
    assert (model / "checkpoints" / "last.pt").is_file()


def test_service_failing_after_its_grid_keeps_the_earlier_set(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The disk fills while the headline is written, after the grid and both rasters: the
    service folder is written as one set, so none of them replaces its earlier version."""
    from pipelines import service

    def full(*args: Any, **kwargs: Any) -> None:
        raise disk_full(run / "service" / "headline.json")

    monkeypatch.setattr(service, "write_headline", full)
    argv = ["service", "--run", str(run), "--max-cells", "3000"]
    names = (f"cannot write {run / 'service' / 'headline.json'}", FIX)
    probe(argv, run=run, code=DISK, names=names, capsys=capsys)
