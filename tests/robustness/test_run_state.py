"""Probes of run-directory state: concurrent stages, killed stages' leftovers, SIGTERM,
read-only run directories, and config files that YAML or the user got subtly wrong."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geodbk.errors import DataError
from pipelines import cli
from pipelines.config import load_config
from pipelines.gridfile import sweep_spools
from pipelines.rundir import RunDir, target_lock

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("probe_state") / "run"
    shutil.copytree(tiny_run, r)
    return r


def test_a_second_stage_on_the_same_target_is_refused(
    run: Path, capsys: pytest.CaptureFixture
) -> None:
    grid = run / "grids" / "download.nc"
    before = grid.read_bytes()
    with target_lock(RunDir(run), "download", stage="train"):
        code = cli.main(["predict", "--run", str(run), "--target", "download"])
        err = capsys.readouterr().err
        assert code == 3 and "being written by another geodbk stage" in err
        assert f"geodbk train, pid {os.getpid()}" in err and "Traceback" not in err
        # another target is free
        assert cli.main(["predict", "--run", str(run), "--target", "upload"]) == 0
    assert grid.read_bytes() == before
    assert cli.main(["predict", "--run", str(run), "--target", "download"]) == 0  # released


def test_a_killed_stage_leaves_no_lock(run: Path) -> None:
    code = (
        "import sys, time; from pathlib import Path; from pipelines.rundir import RunDir, target_lock\n"
        "with target_lock(RunDir(Path(sys.argv[1])), 'latency', stage='train'):\n"
        "    print('locked', flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    with pytest.raises(DataError, match="another geodbk stage"):
        with target_lock(RunDir(run), "latency", stage="predict"):
            pass
    proc.kill()
    proc.wait(timeout=10)
    with target_lock(RunDir(run), "latency", stage="predict"):
        pass  # the kernel dropped the dead process's lock


def test_leftovers_of_a_killed_writer_are_swept(run: Path) -> None:
    grids = run / "grids"
    spool = grids / ".download.nc.abc123"
    spool.mkdir()
    (spool / "mean.bin").write_bytes(b"\0" * 64)
    part = grids / ".download.nc.0f0f.part.nc"
    part.write_bytes(b"partial")
    other = grids / ".upload.nc.keep"
    other.mkdir()
    removed = sweep_spools(grids / "download.nc")
    assert sorted(p.name for p in removed) == sorted([spool.name, part.name])
    assert not spool.exists() and not part.exists() and other.exists()
    shutil.rmtree(other)
    # predict sweeps them too
    spool.mkdir()
    assert cli.main(["predict", "--run", str(run), "--target", "download"]) == 0
    assert not spool.exists()


def test_sigterm_removes_the_spool_like_ctrl_c(run: Path, tmp_path: Path) -> None:
    """A predict killed with SIGTERM mid-grid exits 130 and leaves no spool behind."""
    work = tmp_path / "run"
    shutil.copytree(run, work)
    before = (work / "grids" / "download.nc").read_bytes()
    code = (
        "import sys, time\n"
        "from pipelines import cli, predict\n"
        "real = predict.predict_block\n"
        "def slow(*a, **k):\n"
        "    print('started', flush=True); time.sleep(30); return real(*a, **k)\n"
        "predict.predict_block = slow\n"
        "sys.exit(cli.main(['predict', '--run', sys.argv[1], '--target', 'download']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(work)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stdout is not None
    while proc.stdout.readline().strip() != "started":
        time.sleep(0.05)
    assert list((work / "grids").glob(".download.nc.*"))  # the spool exists mid-run
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert not list((work / "grids").glob(".download.nc.*"))
    assert (work / "grids" / "download.nc").read_bytes() == before


def test_a_read_only_run_is_named(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A run on a read-only file system (simulated: tests run as root, whom permissions do not
    stop) gets one message naming the folder, not a traceback."""
    import errno

    real_mkdir = Path.mkdir

    def read_only(self: Path, *args: object, **kwargs: object) -> None:
        if self.name == ".locks":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", read_only)
    shutil.rmtree(run / ".locks", ignore_errors=True)
    assert cli.main(["predict", "--run", str(run), "--target", "download"]) == cli.DISK_EXIT_CODE
    err = capsys.readouterr().err
    assert f"cannot write {run} (Read-only file system)" in err and "Traceback" not in err
    assert "copy the run to a writable place" in err


@pytest.mark.parametrize(
    ("text", "key", "want"),
    [
        ("lr: 1e-3\n", "lr", 1e-3),
        ("epochs: '20'\n", "epochs", 20),
        ("alpha: 1E-2\n", "alpha", 0.01),
    ],
)
def test_numeric_strings_are_numbers(tmp_path: Path, text: str, key: str, want: float) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    assert getattr(load_config(path), key) == want


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"alpha: .inf\n", "'alpha' must be a finite number"),
        (b"lr: .nan\n", "'lr' must be a finite number"),
        (b"rank: 2.5\n", "'rank' must be int"),
        (b"epochs: ten\n", "'epochs' must be int"),
        ("lr: 0.001  # caf\u00e9\n".encode("latin-1"), "not UTF-8"),
    ],
)
def test_bad_config_values_are_named(tmp_path: Path, data: bytes, match: str) -> None:
    path = tmp_path / "cfg.yaml"
    path.write_bytes(data)
    with pytest.raises(DataError, match=match) as info:
        load_config(path)
    assert str(path) in str(info.value)


def _ingest_argv(run: Path, *extra: str) -> list[str]:
    from pipelines.ingest import demo_ingest_kwargs

    kw = demo_ingest_kwargs()
    return [
        "ingest", "--tiles", str(kw["tiles"][0]), "--type", "mobile", "--run", str(run),
        "--state", "SY", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q1:2023Q4", *extra,
    ]  # fmt: skip


INGEST_SET = ("region.geojson", "urban_areas.geojson", "tiles.parquet", "ingest_report.json")


def test_a_full_disk_during_ingest_leaves_the_earlier_set_whole(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import errno

    import pipelines.ingest as ingest

    r = tmp_path / "run"
    shutil.copytree(tiny_run, r)
    before = {n: (r / n).read_bytes() for n in INGEST_SET}

    def full(table: object, path: Path, metadata: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(ingest, "write_tile_table", full)
    assert cli.main(_ingest_argv(r, "--split", "block")) == cli.DISK_EXIT_CODE
    err = capsys.readouterr().err
    assert "No space left on device" in err and "free some space" in err
    assert "Traceback" not in err
    assert {n: (r / n).read_bytes() for n in INGEST_SET} == before
    assert not list(r.glob(".ingest-staging-*"))


def test_a_full_disk_during_predict_keeps_the_grid(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import errno

    from pipelines.gridfile import GridWriter

    grid = run / "grids" / "download.nc"
    before = grid.read_bytes()

    def full(self: GridWriter, rows: slice, values: object, **options: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(GridWriter, "write_rows", full)
    assert cli.main(["predict", "--run", str(run), "--target", "download"]) == cli.DISK_EXIT_CODE
    err = capsys.readouterr().err
    assert f"cannot write {grid}" in err and "Traceback" not in err
    assert grid.read_bytes() == before
    assert not list(grid.parent.glob(".download.nc.*"))


def test_a_re_ingest_marks_the_models_reports_stale(
    tiny_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    r = tmp_path / "run"
    shutil.copytree(tiny_run, r)
    manifest = json.loads((r / "ingest_manifest.json").read_text())
    assert set(manifest["files"]) == set(INGEST_SET)
    assert cli.main(["report", "--run", str(r), "--target", "download"]) == 0
    assert json.loads((r / "report/download/summary.json").read_text())["stale_model"] is None
    assert cli.main(_ingest_argv(r, "--split", "block")) == 0
    new = json.loads((r / "ingest_manifest.json").read_text())
    assert new["ingest_id"] != manifest["ingest_id"]
    with caplog.at_level("WARNING", logger="geodbk"):
        assert cli.main(["report", "--run", str(r), "--target", "download"]) == 0
    stale = json.loads((r / "report/download/summary.json").read_text())["stale_model"]
    assert "earlier ingest" in stale and "geodbk train" in stale
    assert (
        "Warning: the download model was trained on an earlier ingest"
        in (r / "report/download/report.md").read_text()
    )
    assert any("earlier ingest" in m for m in caplog.messages)


def test_a_failed_train_never_pairs_a_new_config_with_an_old_checkpoint(
    tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh train that fails before its first checkpoint puts the old pair back (the old
    state with its own config: still resumable), never the new config beside the old state."""
    from geodbk import DBKRegressor
    from pipelines.config import load_config

    r = tmp_path / "run"
    shutil.copytree(tiny_run, r)
    ckpt = r / "models" / "download" / "checkpoints"
    assert (ckpt / "last.pt").is_file()
    old = load_config(ckpt / "config.yaml")

    def fails(self: DBKRegressor, *args: object, **kwargs: object) -> None:
        raise DataError("simulated failure in the first epoch")

    monkeypatch.setattr(DBKRegressor, "fit", fails)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"rank: {old.rank * 2}\nhidden: {old.hidden}\nepochs: 2\n")
    argv = ["train", "--run", str(r), "--target", "download", "--config", str(cfg)]
    state = (ckpt / "last.pt").read_bytes()
    assert cli.main(argv) == 3
    assert load_config(ckpt / "config.yaml") == old
    assert (ckpt / "last.pt").read_bytes() == state
    assert sorted(p.name for p in ckpt.iterdir()) == ["config.yaml", "last.pt"]
