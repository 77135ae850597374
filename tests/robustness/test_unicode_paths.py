"""Probes of a run directory whose path holds non-ASCII text (``rün ✓ 東京``) in every stage
that writes one: each succeeds, and its outputs read back. (NetCDF3 wrote paths and attributes
as ASCII and broke ``predict``; predict and export are probed in test_predict_inputs.py.)
``demo`` runs these same stages; ``download`` writes a cache, not a run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from probe_helpers import copy_run, run_stage

REPO = Path(__file__).resolve().parents[2]
COUNTIES = REPO / "data" / "census" / "synthetic_counties.geojson"
NAME = "rün ✓ 東京"


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_run(tiny_run, tmp_path_factory.mktemp("probe_unicode") / NAME)


@pytest.fixture(scope="module")
def places(run: Path) -> Path:
    path = run.parent / "lieux ✓.csv"
    pd.DataFrame({"lon": [-99.9, -99.8], "lat": [39.5, 39.6]}).to_csv(path, index=False)
    return path


def test_ingest_writes_a_run_at_a_unicode_path(run: Path) -> None:
    from pipelines.ingest import demo_ingest_kwargs

    kw = demo_ingest_kwargs()
    new = run.parent / f"{NAME} 2"
    argv = [
        "ingest", "--tiles", str(kw["tiles"][0]), "--type", "mobile", "--run", str(new),
        "--state", "SY", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", "2023Q1:2023Q4",
    ]  # fmt: skip
    assert run_stage(argv) == 0
    report = json.loads((new / "ingest_report.json").read_text(encoding="utf-8"))
    assert report["counts"]["kept"] > 0 and (new / "tiles.parquet").is_file()


def test_train_at_a_unicode_path(run: Path) -> None:
    argv = ["train", "--run", str(run), "--target", "upload", "--epochs", "1", "--no-progress"]
    assert run_stage(argv) == 0
    assert json.loads((run / "models" / "upload" / "model.json").read_text())["format"]


def test_predict_at_places_at_a_unicode_path(run: Path, places: Path) -> None:
    assert (
        run_stage(["predict", "--run", str(run), "--target", "latency", "--at", str(places)]) == 0
    )
    out = pd.read_parquet(run / "predictions" / "latency_lieux ✓.parquet")
    assert len(out) == 2 and out["mean"].notna().all()


def test_service_at_a_unicode_path(run: Path) -> None:
    import xarray as xr

    assert run_stage(["service", "--run", str(run), "--headline-samples", "0"]) == 0
    with xr.open_dataset(run / "service" / "classes.nc") as ds:
        assert ds.attrs["Conventions"].startswith("CF-")
    assert (run / "service" / "service_class.tif").stat().st_size > 0


def test_summarize_at_a_unicode_path(run: Path) -> None:
    argv = [
        "summarize", "--run", str(run), "--target", "download", "--areas", str(COUNTIES),
        "--samples", "20",
    ]  # fmt: skip
    assert run_stage(argv) == 0
    out = pd.read_csv(run / "summaries" / "download_synthetic_counties.csv", comment="#")
    assert len(out) > 0


def test_report_at_a_unicode_path(run: Path) -> None:
    assert run_stage(["report", "--run", str(run), "--target", "download"]) == 0
    summary = json.loads((run / "report" / "download" / "summary.json").read_text())
    assert summary["run"] == NAME


def test_benchmark_at_a_unicode_path(run: Path) -> None:
    argv = [
        "benchmark", "--run", str(run), "--target", "latency", "--models", "dbk-rbf",
        "--epochs", "1", "--rank", "16", "--hidden", "8", "--no-isolate",
    ]  # fmt: skip
    assert run_stage(argv) == 0
    report = json.loads((run / "benchmark" / "latency.json").read_text())
    assert report["models"]["dbk-rbf"]["status"] == "ok"
