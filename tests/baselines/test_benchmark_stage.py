"""``geodbk benchmark`` end to end on a tiny tiles.parquet: reports written, failures recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from baseline_helpers import make_tiny_run

from pipelines.benchmark import run_benchmark
from pipelines.cli import build_parser, main


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_run(tmp_path_factory.mktemp("bench") / "run", n=260)


def test_benchmark_records_a_failure_and_keeps_going(run_dir: Path) -> None:
    report = run_benchmark(
        run_dir,
        target="download",
        models=["exact-rbf", "softki", "sv-rbf"],
        epochs=3,
        seeds=[0, 1],
        batch_size=64,
        rank=12,
        hidden=8,
        threads=1,
        isolate=False,
        overrides={"exact-rbf": {"max_n": 20}},
    )
    out = run_dir / "benchmark"
    on_disk = json.loads((out / "download.json").read_text())
    md = (out / "download.md").read_text()
    assert on_disk["models"].keys() == report["models"].keys()
    failed = on_disk["models"]["exact-rbf"]
    assert failed["status"] == "failed" and "max_n=20" in failed["failures"][0]["reason"]
    assert "failed" in md and "exact-rbf" in md
    for name in ("softki", "sv-rbf"):
        entry = on_disk["models"][name]
        assert entry["status"] == "ok" and len(entry["runs"]) == 2
        s = entry["summary"]
        for group in ("all", "urban", "rural"):
            for metric in ("mae", "nll", "crps", "coverage95", "width95", "width_sd", "width_iqr"):
                assert s[group][metric]["mean"] is not None, (name, group, metric)
        assert s["all"]["nll"]["sd"] >= 0
        assert s["seconds_per_epoch"]["mean"] > 0 and s["predict_points_per_second"]["mean"] > 0
        assert s["peak_rss_mb"]["mean"] is not None
    assert on_disk["rows"]["test"] == on_disk["rows"]["test_urban"] + on_disk["rows"]["test_rural"]
    assert on_disk["machine"]["nproc"] >= 1


def test_benchmark_merge_keeps_other_models(run_dir: Path) -> None:
    run_benchmark(
        run_dir,
        target="latency",
        models=["softki", "sv-rbf"],
        epochs=1,
        rank=8,
        batch_size=64,
        isolate=False,
    )
    report = run_benchmark(
        run_dir,
        target="latency",
        models=["softki"],
        epochs=2,
        rank=8,
        batch_size=64,
        isolate=False,
        merge=True,
    )
    assert set(report["models"]) == {"softki", "sv-rbf"}
    assert report["models"]["softki"]["budget"]["epochs"] == 2
    assert report["models"]["sv-rbf"]["budget"]["epochs"] == 1
    fresh = run_benchmark(
        run_dir, target="latency", models=["softki"], epochs=1, rank=8, batch_size=64, isolate=False
    )
    assert set(fresh["models"]) == {"softki"}


def test_benchmark_cli_isolated_worker(run_dir: Path) -> None:
    """Through the CLI, the model runs in its own spawned worker process."""
    code = main(
        [
            "benchmark",
            "--run",
            str(run_dir),
            "--target",
            "upload",
            "--models",
            "softki",
            "--epochs",
            "2",
            "--seeds",
            "0",
            "--rank",
            "8",
            "--batch-size",
            "64",
            "--threads",
            "1",
        ]
    )
    assert code == 0
    report = json.loads((run_dir / "benchmark" / "upload.json").read_text())
    assert report["models"]["softki"]["status"] == "ok"
    assert report["models"]["softki"]["runs"][0]["peak_rss_mb"] is not None


def test_benchmark_cli_rejects_unknown_model(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["benchmark", "--run", str(run_dir), "--target", "download", "--models", "nope"]) == 3
    )
    assert "unknown model" in capsys.readouterr().err


def test_benchmark_help_has_examples() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "stage")
    text = sub.choices["benchmark"].format_help()  # type: ignore[union-attr]
    assert "examples:" in text and "--models" in text and "--seeds" in text


def test_missing_run_is_a_run_directory_error(tmp_path: Path) -> None:
    assert (
        main(
            [
                "benchmark",
                "--run",
                str(tmp_path / "none"),
                "--target",
                "download",
                "--models",
                "softki",
            ]
        )
        == 5
    )


def test_benchmark_tests_aware_noise_option(tmp_path: Path) -> None:
    """--noise tests: every model fits per-tile noise (none is recorded as failed any more)."""
    run = make_tiny_run(tmp_path / "run", n=260)
    models = ["dbk-rbf", "exact-rbf", "svdbk", "cagp", "solve-gp", "softki"]
    report = run_benchmark(
        run,
        target="download",
        models=models,
        epochs=2,
        seeds=[0],
        batch_size=64,
        rank=8,
        hidden=8,
        threads=1,
        isolate=False,
        noise="tests",
    )
    assert report["budget"]["noise"] == "tests"
    for name in models:
        entry = report["models"][name]
        assert entry["status"] == "ok", (name, entry["failures"])
        assert entry["summary"]["all"]["nll"]["mean"] is not None


def test_benchmark_cli_noise_tests(run_dir: Path) -> None:
    """``geodbk benchmark --noise tests`` through the CLI for a torch baseline (in process)."""
    code = main(
        [
            "benchmark",
            "--run",
            str(run_dir),
            "--target",
            "download",
            "--models",
            "cagp",
            "--epochs",
            "2",
            "--rank",
            "8",
            "--threads",
            "1",
            "--noise",
            "tests",
            "--no-isolate",
        ]
    )
    assert code == 0
    report = json.loads((run_dir / "benchmark" / "download.json").read_text())
    assert report["budget"]["noise"] == "tests"
    assert report["models"]["cagp"]["status"] == "ok", report["models"]["cagp"]["failures"]
    # coverage and NLL by tests bucket, recorded per run and tabled in the Markdown report
    by_tests = report["models"]["cagp"]["runs"][0]["by_tests"]
    assert list(by_tests) == ["1", "2", "3-4", "5-8", "9-16", ">16"]
    n_test = report["rows"]["test"]
    assert sum(b["n"] for b in by_tests.values()) == n_test
    md = (run_dir / "benchmark" / "download.md").read_text()
    assert "## by tests bucket" in md and "| cagp |" in md.split("## by tests bucket")[1]
