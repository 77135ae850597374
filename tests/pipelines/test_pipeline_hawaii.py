"""Real Hawaii mobile data: ingest with the FCC rural list, train download, report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.config import TrainConfig
from pipelines.ingest import run_ingest
from pipelines.report import run_report
from pipelines.train import run_train


@pytest.mark.slow
@pytest.mark.realdata
def test_hawaii_download_beats_constant_and_is_calibrated(hawaii_dir: Path, tmp_path: Path) -> None:
    census = hawaii_dir / "census"
    run = tmp_path / "hawaii"
    run_ingest(
        run=run,
        tiles=[hawaii_dir / "ookla" / "parquet"],
        type="mobile",
        state="HI",
        states_file=census / "cb_2018_us_state_500k.zip",
        tracts=census / "tl_2010_15_tract10.zip",
        rural_tracts=census / "fcc_rural_census_tracts_2010.csv",
    )
    cfg = TrainConfig(rank=512, hidden=128, epochs=100, patience=20, device="cpu")
    run_train(run, target="download", config=cfg, progress=False)
    out = run_report(run, target="download")
    summary = json.loads((out / "summary.json").read_text())
    metrics, base = summary["metrics"], summary["baseline_constant_mean"]
    # The test NLL over all test rows beats N(train mean, train sd); the spatial signal in five
    # years of Hawaii mobile tiles is weak, so the margin is small (docs/benchmarks/pipelines.md).
    assert metrics["all"]["nll"] < base["all"]["nll"]
    assert metrics["all"]["mae"] < base["all"]["mae"]
    for group in ("urban", "rural"):
        assert 0.93 <= metrics[group]["coverage95"] <= 0.97, (group, metrics[group]["coverage95"])
