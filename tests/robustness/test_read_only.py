"""Probes of a read-only run directory in every stage that writes one: each stops with exit 6
and one message naming the run and the fix, no traceback (the cleanup of a temporary file must
not raise on top of the first error), and the run unchanged. The read-only file system is
simulated (probe_helpers.make_read_only); a real read-only mount gave the same answers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from probe_helpers import DISK, copy_run, make_read_only, probe

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tiny_run, tmp_path_factory.mktemp("probe_read_only") / "run")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("places") / "places.csv"
    pd.DataFrame({"lon": [-99.9, -99.8], "lat": [39.5, 39.6]}).to_csv(path, index=False)
    return path


def _ingest(run: Path) -> list[str]:
    from pipelines.ingest import demo_ingest_kwargs

    kw = demo_ingest_kwargs()
    return [
        "ingest", "--tiles", str(kw["tiles"][0]), "--type", "mobile", "--run", str(run),
        "--state", "SY", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q1:2023Q4",
    ]  # fmt: skip


STAGES = {
    "ingest": lambda r, p: _ingest(r),
    "train": lambda r, p: ["train", "--run", str(r), "--target", "download", "--epochs", "1"],
    "predict": lambda r, p: ["predict", "--run", str(r), "--target", "download"],
    "predict --at": lambda r, p: ["predict", "--run", str(r), "--target", "upload", "--at", str(p)],
    "service": lambda r, p: ["service", "--run", str(r)],
    "service --at": lambda r, p: ["service", "--run", str(r), "--at", str(p)],
    "summarize": lambda r, p: [
        "summarize",
        "--run",
        str(r),
        "--target",
        "latency",
        "--areas",
        str(COUNTIES),
    ],
    "export": lambda r, p: ["export", "--run", str(r), "--all"],
    "report": lambda r, p: ["report", "--run", str(r), "--target", "download"],
    "benchmark": lambda r, p: [
        "benchmark",
        "--run",
        str(r),
        "--target",
        "download",
        "--models",
        "dbk-rbf",
        "--epochs",
        "1",
        "--no-isolate",
    ],
    "demo": lambda r, p: ["demo", "--quick", "--run", str(r / "demo")],
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_read_only_run_is_one_message(
    run: Path,
    places: Path,
    stage: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_read_only(monkeypatch, run)
    folder = run / stage if stage in ("demo", "benchmark") else run  # the folder it makes
    names = (f"cannot write {folder} (Read-only file system)", "copy the run to a writable place")
    probe(STAGES[stage](run, places), run=run, code=DISK, names=names, capsys=capsys)


@pytest.mark.parametrize(
    ("stage", "folder"),
    [("train", "models/download"), ("export", "exports"), ("report", "report")],
)
def test_a_read_only_output_folder_is_one_message(
    run: Path,
    places: Path,
    stage: str,
    folder: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Only the stage's output folder is read-only: the lock is taken, the first write fails,
    and removing its temporary file (which fails too) must not hide that first error."""
    make_read_only(monkeypatch, run / folder)
    names = (f"cannot write {run / folder}", "(Read-only file system)", "writable place")
    probe(STAGES[stage](run, places), run=run, code=DISK, names=names, capsys=capsys)
