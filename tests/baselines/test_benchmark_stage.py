"""``geodbk benchmark`` end to end on a tiny tiles.parquet: reports written, failures recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from baseline_helpers import make_tiny_run

from geodbk.errors import DataError
from pipelines.benchmark import load_benchmark_data, run_benchmark
from pipelines.cli import build_parser, main

#: A two-epoch, rank-8 budget run in this process (fast; no crash isolation needed).
TINY_BUDGET: dict[str, Any] = dict(
    epochs=2, batch_size=64, rank=8, hidden=8, threads=1, isolate=False, preset="tuned"
)


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
    # sv-rbf's scores by tests bucket as an older geodbk wrote them (coverage, pi_width)
    path = run_dir / "benchmark" / "latency.json"
    old = json.loads(path.read_text())
    bucket = {"n": 4, "nll": 1.2, "coverage": 0.75, "pi_width": 1.5, "mae": 0.3}
    split = {
        "urban": {**bucket, "n": 1, "coverage": 1.0},
        "rural": {**bucket, "n": 3, "coverage": 2 / 3},
    }
    old["models"]["sv-rbf"]["runs"][0]["by_tests"] = {"1": {**bucket, **split}}
    path.write_text(json.dumps(old))
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
    kept = report["models"]["sv-rbf"]["runs"][0]["by_tests"]["1"]
    assert kept["coverage95"] == 0.75 and kept["width95"] == 1.5
    assert kept["rural"]["coverage95"] == pytest.approx(2 / 3)
    assert not {"coverage", "pi_width"} & set(kept)


def test_benchmark_merge_keeps_a_model_another_process_wrote_meanwhile(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ``--merge`` runs of different models into one run directory at once."""
    import pipelines.benchmark as bench

    path = run_dir / "benchmark" / "upload.json"
    path.unlink(missing_ok=True)
    real_run_seeds = bench._run_seeds

    def run_seeds_while_another_process_writes(*args: Any, **kwargs: Any) -> Any:
        result = real_run_seeds(*args, **kwargs)
        # the other process finishes its model (sv-rbf) while this one trains softki
        other = json.loads(path.read_text()) if path.is_file() else {"models": {}}
        other["models"]["sv-rbf"] = {
            "status": "failed",
            "summary": None,
            "runs": [],
            "failures": [{"seed": 0, "reason": "written by the other process"}],
        }
        path.write_text(json.dumps(other))
        return result

    monkeypatch.setattr(bench, "_run_seeds", run_seeds_while_another_process_writes)
    budget = {**TINY_BUDGET, "epochs": 1}
    run_benchmark(run_dir, target="upload", models=["softki"], merge=True, **budget)
    assert set(json.loads(path.read_text())["models"]) == {"softki", "sv-rbf"}
    # without --merge the report is this run's alone
    run_benchmark(run_dir, target="upload", models=["softki"], **budget)
    assert set(json.loads(path.read_text())["models"]) == {"softki"}
    md = (run_dir / "benchmark" / "latency.md").read_text()
    assert "| sv-rbf | 75.0% (100.0% / 66.7%); 1.200 |" in md
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
        seeds=[0],
        noise="tests",
        **TINY_BUDGET,
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


def _two_quarter_run(path: Path) -> Path:
    """The tiny run with its tiles dealt into 2023Q1 and 2023Q4 and download 1.0 (log10)
    higher in 2023Q4: a time trend that only a time-aware model can follow."""
    from geodbk.geo.table import read_tile_table, write_tile_table

    run = make_tiny_run(path, n=400)
    table, meta = read_tile_table(run / "tiles.parquet")
    late = np.random.default_rng(5).random(len(table)) < 0.5
    table["quarter"] = np.where(late, "2023Q4", "2023Q1")
    table["log10_download"] = table["log10_download"] + 1.0 * late
    table["avg_d_kbps"] = 10 ** table["log10_download"]
    write_tile_table(table, run / "tiles.parquet", {**meta, "quarters": ["2023Q1", "2023Q4"]})
    return run


def test_benchmark_time_input_is_t_scaled_over_train_quarters(tmp_path: Path) -> None:
    run = _two_quarter_run(tmp_path / "run")
    pooled = load_benchmark_data(run, "download")
    timed = load_benchmark_data(run, "download", time=True)
    assert pooled["X"].shape[1] == 2 and timed["X"].shape[1] == 3
    np.testing.assert_array_equal(timed["X"][:, :2], pooled["X"])
    # 2023Q1 -> t = -1, 2023Q4 -> t = +1 (the train split's first and last quarters)
    assert set(np.unique(timed["X"][:, 2])) == {-1.0, 1.0}
    assert list(timed["time_range"]) == ["2023Q1", "2023Q4"]


def test_benchmark_time_lets_every_model_follow_a_trend(tmp_path: Path) -> None:
    """--time: the quarter's jump in download is learnt by the DBK and by a baseline, which
    both beat their pooled selves on test NLL; the report records the inputs (tuned preset:
    the paper's lr 1e-3 for SV-RBF needs more than this budget)."""
    run = _two_quarter_run(tmp_path / "run")
    kw: dict[str, Any] = dict(
        target="download",
        epochs=150,
        batch_size=64,
        rank=16,
        hidden=16,
        threads=1,
        preset="tuned",
    )
    models = ["dbk-rbf", "sv-rbf"]
    pooled = run_benchmark(run, models=models, isolate=False, **kw)
    timed = run_benchmark(run, models=models, isolate=False, time=True, **kw)
    assert timed["budget"]["time"] is True and timed["inputs"] == ["x1", "x2", "t"]
    assert timed["time_range"] == ["2023Q1", "2023Q4"]
    assert pooled["inputs"] == ["x1", "x2"]
    for name in models:
        nll_pooled = pooled["models"][name]["summary"]["all"]["nll"]["mean"]
        nll_timed = timed["models"][name]["summary"]["all"]["nll"]["mean"]
        assert nll_timed < nll_pooled - 0.2, (name, nll_timed, nll_pooled)


def test_benchmark_time_needs_two_train_quarters(run_dir: Path) -> None:
    with pytest.raises(DataError, match="at least 2 quarters"):
        load_benchmark_data(run_dir, "download", time=True)


def test_benchmark_dbk_noise_options_and_baseline_refusal(tmp_path: Path) -> None:
    """tests+devices+urban: the DBKRegressor family (DBK, PP-DKL, ...) fits it; a torch
    baseline (SoftKI) is recorded as failed with the reason."""
    run = make_tiny_run(tmp_path / "run", n=260)
    report = run_benchmark(
        run,
        target="download",
        models=["dbk-rbf", "pp-dkl", "softki"],
        noise="tests+devices+urban",
        **TINY_BUDGET,
    )
    assert report["budget"]["noise"] == "tests+devices+urban"
    for name in ("dbk-rbf", "pp-dkl"):
        assert report["models"][name]["status"] == "ok", report["models"][name]["failures"]
    failed = report["models"]["softki"]
    assert failed["status"] == "failed" and "urban" in failed["failures"][0]["reason"]
    with pytest.raises(DataError, match="unknown noise"):
        run_benchmark(run, target="download", models=["dbk-rbf"], noise="tests+phones")


def test_benchmark_cli_time_flag(tmp_path: Path) -> None:
    run = _two_quarter_run(tmp_path / "run")
    options = "--target download --models sv-rbf --epochs 1 --rank 8 --threads 1 --time"
    code = main(
        ["benchmark", "--run", str(run), *options.split(), "--noise", "tests", "--no-isolate"]
    )
    assert code == 0
    report = json.loads((run / "benchmark" / "download.json").read_text())
    assert report["inputs"] == ["x1", "x2", "t"] and report["budget"]["noise"] == "tests"
    assert report["models"]["sv-rbf"]["status"] == "ok", report["models"]["sv-rbf"]["failures"]


def _repeated_tiles_run(path: Path) -> Path:
    """The tiny run's 120 tiles observed in each of 4 quarters, each tile log10 download
    offset by its own persistent N(0, 0.4²) draw plus fresh N(0, 0.1²) noise per quarter;
    rows dealt 70/15/15 into train/val/test."""
    import pandas as pd

    from geodbk.geo.table import read_tile_table, write_tile_table

    run = make_tiny_run(path, n=120)
    table, meta = read_tile_table(run / "tiles.parquet")
    rng = np.random.default_rng(11)
    offset = rng.normal(0.0, 0.4, len(table))
    quarters = ["2023Q1", "2023Q2", "2023Q3", "2023Q4"]
    parts = []
    for q in quarters:
        part = table.copy()
        part["quarter"] = q
        part["log10_download"] = table["log10_download"] + offset + rng.normal(0, 0.1, len(table))
        part["split"] = rng.choice(["train", "val", "test"], len(table), p=[0.7, 0.15, 0.15])
        parts.append(part)
    rows = pd.concat(parts, ignore_index=True)
    rows["avg_d_kbps"] = 10 ** rows["log10_download"]
    write_tile_table(
        type(table)(rows, geometry="geometry", crs=table.crs),
        run / "tiles.parquet",
        {**meta, "quarters": quarters},
    )
    return run


def test_benchmark_tile_effect(tmp_path: Path) -> None:
    """--tile-effect: DBK-RBF, PP-DKL and a torch baseline (SoftKI; constant noise) gain from
    each tile's other quarters; the fitted parameters are in the report."""
    run = _repeated_tiles_run(tmp_path / "run")
    models = ["dbk-rbf", "pp-dkl", "softki"]
    kw = {**TINY_BUDGET, "epochs": 4}
    plain = run_benchmark(run, target="download", models=models, **kw)
    tiled = run_benchmark(run, target="download", models=models, tile_effect=True, **kw)
    assert tiled["budget"]["tile_effect"] is True
    for name in models:
        entry = tiled["models"][name]
        assert entry["status"] == "ok", entry["failures"]
        params = entry["runs"][0]["tile_effect"]
        assert params["components"] == ["noise"] and params["val_nll"] < params["val_nll_without"]
        nll = entry["summary"]["all"]["nll"]["mean"]
        assert nll < plain["models"][name]["summary"]["all"]["nll"]["mean"] - 0.2, name
    options = "--target download --models dbk-rbf --epochs 1 --rank 8 --threads 1"
    assert (
        main(["benchmark", "--run", str(run), *options.split(), "--tile-effect", "--no-isolate"])
        == 0
    )
    report = json.loads((run / "benchmark" / "download.json").read_text())
    assert report["models"]["dbk-rbf"]["runs"][0]["tile_effect"]["rho"] > 0


@pytest.mark.parametrize(
    ("stage", "blocked", "option"),
    [
        ("benchmark", ("geopandas", "shapely", "pyproj", "rioxarray", "rasterio"), "--models"),
        ("train", ("rioxarray", "rasterio", "xarray"), "--no-local-layer"),
    ],
)
def test_a_stage_runs_without_the_geo_stack(
    stage: str, blocked: tuple[str, ...], option: str
) -> None:
    """benchmarks/stage_only.py parses ``geodbk STAGE``'s options where the packages the stage
    does not need cannot be imported (the lent GPU machine: no raster stack, and for the
    benchmark no geopandas, shapely or pyproj either)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "import runpy, sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {blocked!r}:\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        f"sys.argv = ['stage_only.py', {stage!r}, '--help']\n"
        "runpy.run_path('benchmarks/stage_only.py', run_name='__main__')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(root)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "--tile-effect" in out.stdout and option in out.stdout


def test_benchmark_report_names_the_split_it_scored(tmp_path: Path) -> None:
    """The JSON records the tile table's split (kind, seed) and the ingest it came from, and the
    Markdown says which split the test metrics are on, so that reports of runs ingested with
    different ``--split`` cannot be mistaken for one another."""
    run = make_tiny_run(tmp_path / "run", n=120, seed=4)
    run_benchmark(run, target="download", models=["sv-rbf"], seeds=[0], **TINY_BUDGET)
    report = json.loads((run / "benchmark" / "download.json").read_text())
    tiles = report["tiles_metadata"]
    assert tiles["split"]["kind"] == "random" and tiles["split"]["seed"] == 4
    assert tiles.keys() == {"type", "quarters", "region", "split", "ingest_id"}
    md = (run / "benchmark" / "download.md").read_text()
    assert "Split: random rows (seed 4)" in md


def test_benchmark_markdown_defines_its_metrics_as_the_report_does(tmp_path: Path) -> None:
    """The tables' NLL, NLL (std) and coverage are defined where they are shown, in the terms
    of ``geodbk report`` (nats per test row, NLL_std = NLL − ln sd, share inside the 95%
    interval), with the column the log10 target comes from."""
    run = make_tiny_run(tmp_path / "run", n=120, seed=5)
    run_benchmark(run, target="download", models=["sv-rbf"], seeds=[0], **TINY_BUDGET)
    md = (run / "benchmark" / "download.md").read_text()
    assert "log10 of `avg_d_kbps`" in md
    assert "nats per test row" in md
    assert "NLL (std) = NLL − ln sd_train" in md
    assert "share of test rows inside the central 95% prediction interval" in md


@pytest.mark.parametrize("flag", ["set", "sweep"])
def test_benchmark_refuses_a_seed_option_that_would_override_seeds(
    run_dir: Path, flag: str
) -> None:
    """``--set MODEL.seed`` trained every run of ``--seeds`` with the one seed (recorded under
    the --seeds values, with an sd of 0), and ``--sweep MODEL.seed`` picked the best seed by
    validation NLL; both stop before any training, pointing to --seeds."""
    given = {"sv-rbf": {"seed": 3}}
    options = {"overrides": given} if flag == "set" else {"sweeps": {"sv-rbf": {"seed": [0, 3]}}}
    with pytest.raises(DataError, match=rf"--{flag} sv-rbf.seed: .*--seeds"):
        run_benchmark(
            run_dir, target="download", models=["sv-rbf"], seeds=[0, 1], **options, **TINY_BUDGET
        )


def test_benchmark_merge_refuses_a_report_of_another_ingest(tmp_path: Path) -> None:
    """--merge into a report scored on the tiles of another ingest (another split, say) would
    put models scored on different test rows in one table: it stops before training."""
    run = make_tiny_run(tmp_path / "run", n=120, seed=6)
    run_benchmark(run, target="download", models=["sv-rbf"], seeds=[0], **TINY_BUDGET)
    path = run / "benchmark" / "download.json"
    report = json.loads(path.read_text())
    report["tiles_metadata"]["ingest_id"] = "an-earlier-ingest"
    report["tiles_metadata"]["split"] = {"kind": "tile", "seed": 1}
    path.write_text(json.dumps(report))
    with pytest.raises(DataError, match=r"an-earlier-ingest.*split: tile.*without --merge"):
        run_benchmark(
            run, target="download", models=["dbk-rbf"], seeds=[0], merge=True, **TINY_BUDGET
        )
    del report["tiles_metadata"]  # a report from before the split was recorded: merged as before
    path.write_text(json.dumps(report))
    run_benchmark(run, target="download", models=["dbk-rbf"], seeds=[0], merge=True, **TINY_BUDGET)
    assert json.loads(path.read_text())["models"].keys() == {"sv-rbf", "dbk-rbf"}


def test_a_model_too_large_for_the_train_rows_is_refused_once(run_dir: Path) -> None:
    """An exact GP above its max_n is refused for every seed alike: recorded once (seed None)
    before any seed is trained, with the --set that raises the limit."""
    report = run_benchmark(
        run_dir,
        target="download",
        models=["exact-rbf"],
        seeds=[0, 1],
        overrides={"exact-rbf": {"max_n": 20}},
        **TINY_BUDGET,
    )
    failures = report["models"]["exact-rbf"]["failures"]
    assert [f["seed"] for f in failures] == [None]
    assert "exceed max_n=20" in failures[0]["reason"]
    assert "--set exact-rbf.max_n=" in failures[0]["reason"]


def test_merged_models_of_another_budget_are_flagged(tmp_path: Path) -> None:
    """The Markdown's Budget line is the last command's; a model kept by --merge from a run
    with another budget says which options differed (they were in the JSON only)."""
    run = make_tiny_run(tmp_path / "run", n=120, seed=7)
    run_benchmark(run, target="download", models=["sv-rbf"], seeds=[0], **TINY_BUDGET)
    budget = {**TINY_BUDGET, "rank": 12, "epochs": 1}
    run_benchmark(run, target="download", models=["dbk-rbf"], seeds=[0, 1], merge=True, **budget)
    md = (run / "benchmark" / "download.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| sv-rbf | ok"))
    assert "budget: epochs=2, rank=8, seeds=[0]" in row
    assert "budget:" not in next(
        line for line in md.splitlines() if line.startswith("| dbk-rbf | ok")
    )


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"seeds": [0, 0]}, r"--seeds names 0 twice"),
        ({"models": ["sv-rbf", "sv-rbf"]}, r"--models names sv-rbf twice"),
    ],
)
def test_benchmark_refuses_a_seed_or_model_named_twice(
    run_dir: Path, option: dict[str, Any], match: str
) -> None:
    """``--seeds 0,0`` trained two identical runs, reported as two seeds with sd 0 ("every seed");
    ``--models a,a`` trained a twice and kept the second. Both stop before training."""
    kwargs = {"models": ["sv-rbf"], "seeds": [0], **option}
    with pytest.raises(DataError, match=match):
        run_benchmark(run_dir, target="download", **kwargs, **TINY_BUDGET)
