"""Probes of concurrent writers and of what killed ones leave behind, in every stage that
writes a target's outputs: a second stage on the same run and target is refused (exit 3, naming
the first one and its pid; run unchanged), and the next run of a stage removes what a killed
one left (spools, ``.part`` files, staging folders, set-aside checkpoints)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
from probe_helpers import BAD_INPUT, copy_run, probe, run_stage

from pipelines.rundir import RunDir, target_lock

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tiny_run, tmp_path_factory.mktemp("probe_locks") / "run")


@pytest.fixture(scope="module")
def places(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("places") / "places.csv"
    pd.DataFrame({"lon": [-99.9, -99.8], "lat": [39.5, 39.6]}).to_csv(path, index=False)
    return path


STAGES = {
    "train": lambda r, p: ["train", "--run", str(r), "--target", "download", "--epochs", "1"],
    "predict": lambda r, p: ["predict", "--run", str(r), "--target", "download"],
    "predict --at": lambda r, p: [
        "predict",
        "--run",
        str(r),
        "--target",
        "download",
        "--at",
        str(p),
    ],
    "report": lambda r, p: ["report", "--run", str(r), "--target", "download"],
    "export": lambda r, p: ["export", "--run", str(r), "--target", "download"],
    "summarize": lambda r, p: [
        "summarize",
        "--run",
        str(r),
        "--target",
        "download",
        "--areas",
        str(COUNTIES),
    ],
    "service": lambda r, p: ["service", "--run", str(r)],
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_a_second_writer_of_the_same_target_is_refused(
    run: Path, places: Path, stage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    lock = "service" if stage == "service" else "download"
    names = ("is being written by another geodbk stage", f"geodbk train, pid {os.getpid()}", "wait")
    with target_lock(RunDir(run), lock, stage="train"):
        probe(STAGES[stage](run, places), run=run, code=BAD_INPUT, names=names, capsys=capsys)


def _leftovers(folder: Path, names: list[str]) -> list[Path]:
    made = []
    for name in names:
        path = folder / name
        if name.endswith("/"):
            path.mkdir(parents=True)
            (path / "part.bin").write_bytes(b"\0" * 64)
        else:
            path.write_bytes(b"partial")
        made.append(path)
    return made


@pytest.mark.parametrize(
    ("stage", "folder", "names"),
    [
        (
            "export",
            "exports",
            [
                ".download.tif.0123456789abcdef0123456789abcdef.part.tif",
                ".download.tif.1a.part.tif.plain.tif",
            ],
        ),
        ("report", "report", [".download.staging-k1ll3d/"]),
        ("service", "service", [".classes.nc.0f0f.part.nc", ".p_unserved.tif.0f0f.part.tif"]),
    ],
)
def test_the_next_run_removes_what_a_killed_one_left(
    run: Path, places: Path, stage: str, folder: str, names: list[str]
) -> None:
    made = _leftovers(run / folder, names)
    argv = STAGES[stage](run, places)
    assert run_stage([*argv, "--headline-samples", "0"] if stage == "service" else argv) == 0
    assert not [p.name for p in made if p.exists()]


def test_the_next_ingest_removes_a_killed_ingest_s_staging(run: Path) -> None:
    from pipelines.ingest import demo_ingest_kwargs

    (leftover,) = _leftovers(run, [".ingest-staging-k1ll3d/"])
    kw = demo_ingest_kwargs()
    argv = [
        "ingest", "--tiles", str(kw["tiles"][0]), "--type", "mobile", "--run", str(run),
        "--state", "SY", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q1:2023Q4",
    ]  # fmt: skip
    assert run_stage(argv) == 0
    assert not leftover.exists()


def test_a_killed_train_s_set_aside_checkpoint_is_swept(tmp_path: Path) -> None:
    """A train killed mid-fit leaves its new config alone (a consistent, empty state) and the
    old pair set aside; the next train removes what was set aside."""
    from pipelines.train import CheckpointStash

    (tmp_path / "last.pt").write_bytes(b"old state")
    (tmp_path / "config.yaml").write_text("rank: 8\n")
    stash = CheckpointStash(tmp_path, active=True)
    stash.__enter__()  # killed: __exit__ never runs
    (tmp_path / "config.yaml").write_text("rank: 16\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".previous-config.yaml",
        ".previous-last.pt",
        "config.yaml",
    ]
    CheckpointStash.sweep(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]
