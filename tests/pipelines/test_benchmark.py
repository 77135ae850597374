"""The report's ``metrics.json`` and the benchmark's JSON name each metric alike: the names of
:mod:`geodbk.metrics`, with the same value on the same predictions."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from geodbk.metrics import (
    COVERAGE95,
    NLL,
    STD_SUFFIX,
    SUMMARY_KEYS,
    WIDTH95,
    WIDTH_IQR,
    WIDTH_SD,
)
from pipelines.benchmark import group_metrics, run_benchmark
from pipelines.scoring import group_scores

#: Keys only the report writes per group: the row count and the standardised scores (the
#: benchmark keeps ``nll_std`` alone of these).
REPORT_ONLY = {"n"} | {k + STD_SUFFIX for k in SUMMARY_KEYS if k != NLL}
#: Keys only the benchmark writes per group: the spread of the per-point interval widths.
BENCHMARK_ONLY = {WIDTH_SD, WIDTH_IQR}


def test_both_sides_score_the_same_predictions_under_the_same_keys() -> None:
    rng = np.random.default_rng(0)
    y, mu = rng.normal(size=400), rng.normal(size=400)
    sd = rng.uniform(0.5, 2.0, size=400)
    sd_train = 1.7
    report = group_scores(y, mu, sd, sd_train=sd_train)
    bench = group_metrics(y, mu, sd**2, log_sd_train=math.log(sd_train))
    assert set(report) - set(bench) == REPORT_ONLY
    assert set(bench) - set(report) == BENCHMARK_ONLY
    for key in set(report) & set(bench):
        assert report[key] == pytest.approx(bench[key], rel=1e-12), key
    assert {COVERAGE95, WIDTH95, NLL + STD_SUFFIX} <= set(report) & set(bench)


def test_the_written_files_use_the_same_keys(tiny_run: Path, tmp_path: Path) -> None:
    """The demo run's report against a one-epoch benchmark of the same tiles."""
    report = json.loads((tiny_run / "report" / "download" / "metrics.json").read_text())
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy2(tiny_run / "tiles.parquet", run / "tiles.parquet")
    run_benchmark(
        run,
        target="download",
        models=["dbk-rbf"],
        seeds=[0],
        epochs=1,
        rank=8,
        hidden=8,
        threads=1,
        isolate=False,
    )
    entry = json.loads((run / "benchmark" / "download.json").read_text())["models"]["dbk-rbf"]
    assert entry["status"] == "ok", entry["failures"]
    first = entry["runs"][0]
    for group in ("all", "urban", "rural"):
        written, benched = set(report[group]), set(first["metrics"][group])
        assert written - benched == REPORT_ONLY, group
        assert benched - written == BENCHMARK_ONLY, group
        assert set(entry["summary"][group]) <= benched, group
    buckets = report["by_tests"]
    assert first["by_tests"] is not None and first["by_tests"].keys() == buckets.keys()
    for label, scores in buckets.items():
        assert first["by_tests"][label].keys() == scores.keys(), label
        for group in ("urban", "rural"):
            assert first["by_tests"][label][group].keys() == scores[group].keys(), label


def test_the_machine_record_names_the_device_the_models_ran_on() -> None:
    """``--device auto`` is recorded as asked and as resolved (``cpu`` without CUDA), and a
    CUDA request on a machine without CUDA as the CPU it fell back to."""
    import torch

    from pipelines.benchmark import machine_info

    info = machine_info(1, "auto")
    assert info["device"] == "auto"
    assert info["device_used"] == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        assert machine_info(1, "cuda")["device_used"] == "cpu"
