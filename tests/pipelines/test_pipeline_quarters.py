"""Time as an input (issue 10): ingest --split forecast, report by_quarter, time-aware report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pipeline_helpers import make_run
from scipy.stats import norm

from geodbk import DBKRegressor
from geodbk.geo.table import forecast_split, read_tile_table, write_tile_table
from geodbk.geo.timeaxis import TimeScaling, quarter_indices
from pipelines import cli
from pipelines.config import demo_config
from pipelines.ingest import demo_ingest_kwargs
from pipelines.report import run_report
from pipelines.rundir import RunDir, config_hash, model_inputs, target_spec

CFG = demo_config(quick=True).replace(epochs=2)
QUARTERS = ("2023Q1", "2023Q2", "2023Q3", "2023Q4")
#: Trend added to log10 download per quarter step, so that time matters.
TREND = 0.08


# --------------------------------------------------------------------------- ingest


def _ingest_argv(run: Path, quarters: str) -> list[str]:
    kw = demo_ingest_kwargs()
    return [
        "ingest", "--tiles", str(kw["tiles"][0]), "--run", str(run), "--type", "mobile",
        "--state", "SY", "--states-file", str(kw["states_file"]),
        "--urban-areas", str(kw["urban_areas"]), "--quarters", quarters, "--split", "forecast",
    ]  # fmt: skip


def test_cli_ingest_forecast_split(tmp_path: Path) -> None:
    run = tmp_path / "fc"
    assert cli.main(_ingest_argv(run, "2023Q1:2023Q4")) == 0
    table, meta = read_tile_table(run)
    q, split = table["quarter"].to_numpy(), table["split"].to_numpy()
    assert set(q) == set(QUARTERS)
    assert np.array_equal(split == "test", q == "2023Q4")  # test = all of 2023Q4, nothing else
    assert np.array_equal(split == "val", q == "2023Q3")
    assert set(q[split == "train"]) == {"2023Q1", "2023Q2"}
    s = meta["split"]
    assert s["kind"] == "forecast" and s["unit"] == "quarter"
    assert (s["test_quarter"], s["val_quarter"]) == ("2023Q4", "2023Q3")
    assert s["train_quarters"] == ["2023Q1", "2023Q2"]
    assert s["counts"]["test"] == int((q == "2023Q4").sum())
    report = json.loads((run / "ingest_report.json").read_text())
    assert report["split"] == s
    per_q = report["per_quarter"]
    for name in QUARTERS:
        row = per_q[name]
        assert row["rows"] == int((q == name).sum())
        assert row["train"] + row["val"] + row["test"] == row["rows"]
    assert per_q["2023Q4"]["test"] == per_q["2023Q4"]["rows"] and per_q["2023Q3"]["test"] == 0


def test_cli_ingest_forecast_needs_three_quarters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(_ingest_argv(tmp_path / "two", "2023Q3:2023Q4")) == 3
    err = capsys.readouterr().err
    assert "--split forecast needs at least 3 quarters" in err
    assert "2023Q3, 2023Q4" in err and "widen --quarters" in err
    assert not (tmp_path / "two" / "tiles.parquet").exists()


def test_cli_ingest_help_names_forecast(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["ingest", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "forecast" in out and "last quarter = test" in out and "the one before = val" in out


# --------------------------------------------------------------------------- report


def _multi_quarter_run(path: Path, *, split: str = "random", seed: int = 0) -> Path:
    """``make_run`` with its rows spread over 2023Q1..Q4 and a download trend over quarters.

    ``split="forecast"`` relabels the rows with :func:`forecast_split` (test = 2023Q4).
    """
    run = make_run(path, n=480, seed=seed)
    table, meta = read_tile_table(run)
    rng = np.random.default_rng(seed + 1)
    quarters = rng.choice(QUARTERS, size=len(table))
    step = quarter_indices(quarters) - quarter_indices(["2023Q1"])[0]
    table["quarter"] = quarters
    table["log10_download"] = table["log10_download"] + TREND * step
    table["avg_d_kbps"] = 10 ** table["log10_download"]
    meta["quarters"] = list(QUARTERS)
    if split == "forecast":
        labels, info = forecast_split(quarters)
        table["split"] = labels.astype(str)
        meta["split"] = {"kind": "forecast", "seed": seed, "unit": "quarter", **info}
    meta["split"]["counts"] = {
        s: int((table["split"] == s).sum()) for s in ("train", "val", "test")
    }
    write_tile_table(table, run / "tiles.parquet", meta)
    return run


def _expected(df: pd.DataFrame) -> dict[str, Any]:
    """Scores recomputed from the predictions: NLL, 95% coverage, MAE, 95% PI width."""
    if len(df) == 0:
        return {"n": 0, "nll": None, "coverage95": None, "mae": None, "width95": None}
    y, mu, sd = (df[c].to_numpy(dtype=float) for c in ("y", "mean", "std"))
    z = norm.ppf(0.975)
    return {
        "n": len(df),
        "nll": float(np.mean(0.5 * np.log(2 * np.pi * sd**2) + (y - mu) ** 2 / (2 * sd**2))),
        "coverage95": float(np.mean(np.abs(y - mu) <= z * sd)),
        "mae": float(np.mean(np.abs(y - mu))),
        "width95": float(np.mean(2 * z * sd)),
    }


def _check_by_quarter(report_dir: Path) -> dict[str, Any]:
    """by_quarter keys, n's and every score against a recomputation from predictions.parquet."""
    metrics = json.loads((report_dir / "metrics.json").read_text())
    preds = pd.read_parquet(report_dir / "predictions.parquet")
    by_q = metrics["by_quarter"]
    present = sorted(set(preds["quarter"]), key=lambda q: quarter_indices([q])[0])
    assert list(by_q) == present
    assert sum(r["n"] for r in by_q.values()) == metrics["all"]["n"] == len(preds)
    for q, r in by_q.items():
        rows = preds[preds["quarter"] == q]
        groups = {"all": rows, "urban": rows[rows["urban"]], "rural": rows[~rows["urban"]]}
        for g, df in groups.items():
            got = r if g == "all" else r[g]
            want = _expected(df)
            assert set(got) >= set(want), (q, g)
            for k, v in want.items():
                assert got[k] == (v if v is None else pytest.approx(v, rel=1e-9, abs=1e-12)), (
                    q,
                    g,
                    k,
                )
        assert r["urban"]["n"] + r["rural"]["n"] == r["n"]
    png = report_dir / "figures" / "quarter_calibration.png"
    assert png.read_bytes()[:4] == b"\x89PNG"
    return metrics


def test_report_by_quarter_pooled_model(tmp_path: Path) -> None:
    run = _multi_quarter_run(tmp_path / "pooled")
    model = _save_model(run, time_aware=False)
    assert model.tests_aware
    out = run_report(run, target="download")
    metrics = _check_by_quarter(out)
    assert list(metrics["by_quarter"]) == list(QUARTERS)  # a random split tests every quarter
    summary = json.loads((out / "summary.json").read_text())
    assert summary["time"]["time_aware"] is False
    assert set(summary["time"]["quarter_status"].values()) == {"pooled"}
    assert summary["split"]["kind"] == "random"
    md = (out / "report.md").read_text()
    assert "## By quarter" in md and "figures/quarter_calibration.png" in md
    assert "Split: random rows (seed 0)" in md and "pooled over quarters" in md
    # a pooled model ignores the quarter: same tile, same prediction in every quarter
    preds = pd.read_parquet(out / "predictions.parquet")
    table, _ = read_tile_table(run)
    test = table[table["split"] == "test"]
    again = model.predict_dist(
        test[["x1", "x2"]].to_numpy(), tests=test["tests"].to_numpy(dtype=float)
    )
    assert np.allclose(preds["mean"], again.mean)


def _save_model(run: Path, *, time_aware: bool, seed: int = 0) -> DBKRegressor:
    """Fit a tiny DBKRegressor and save it with the metadata ``geodbk train`` writes.

    ``time_aware``: inputs [x1, x2, t] as ``geodbk train --time`` (``time_scaling`` = the quarter
    range of the TRAIN split, ``quarters`` = all table quarters, constant noise); otherwise the
    pooled [x1, x2] with tests-aware noise (the default for tables with ``tests``).
    """
    rd = RunDir(run)
    spec = target_spec("download")
    table, meta = read_tile_table(run)
    train = table[table["split"] == "train"]
    X2 = train[["x1", "x2"]].to_numpy(dtype=float)
    y = train[spec.log_column].to_numpy(dtype=float)
    extra: dict[str, Any] = {"inputs": ["x1", "x2"]}
    fit_kw: dict[str, Any] = {}
    if time_aware:
        ts = TimeScaling.from_quarters(train["quarter"])
        extra = {
            "inputs": ["x1", "x2", "t"],
            "time_scaling": ts.to_dict(),
            "quarters": sorted(set(table["quarter"]), key=lambda q: quarter_indices([q])[0]),
        }
        cfg = CFG.replace(noise="constant", noise_init=0.01)
    else:
        cfg = CFG.replace(noise="tests", noise_init=0.5)
        fit_kw = {"tests": train["tests"].to_numpy(dtype=float)}
    X = model_inputs(X2, extra, quarter=train["quarter"].to_numpy())
    model = DBKRegressor(**{**cfg.estimator_kwargs(), "seed": seed})
    model.fit(X, y, **fit_kw)
    config = {**cfg.to_dict(), "time": time_aware}
    metadata = {
        "target": "download",
        "column": spec.column,
        "log_column": spec.log_column,
        "unit": spec.unit,
        "target_transform": f"log10({spec.column}); natural = 10**y / 1000 Mbps",
        **extra,
        "input_scaling": meta["scaling"],
        "config": config,
        "config_hash": config_hash(config),
        "run": str(rd.root),
        "n_train": len(y),
        "n_val": 0,
        "y_train_mean": float(np.mean(y)),
        "y_train_sd": float(np.std(y)),
        "best_epoch": getattr(model, "best_epoch_", None),
        "noise": model.noise_parameters(),
        "history": [dict(r) for r in model.history_],
        "timings": {"fit_seconds": 0.0, "epochs_run": len(model.history_)},
        "tiles_metadata": {k: meta.get(k) for k in ("type", "quarters", "region", "split")},
    }
    model.save(rd.model_dir("download"), metadata=metadata)
    return DBKRegressor.load(rd.model_dir("download"))


def _time_checks(run: Path, out: Path, model: DBKRegressor) -> pd.DataFrame:
    """The report predicted every test row at its own quarter's t, not at a fixed t."""
    preds = pd.read_parquet(out / "predictions.parquet")
    md = model.metadata_
    table, _ = read_tile_table(run)
    test = table[table["split"] == "test"].reset_index(drop=True)
    assert len(test) == len(preds) and (test["quadkey"].to_numpy() == preds["quadkey"]).all()
    X2 = test[["x1", "x2"]].to_numpy(dtype=float)
    own = model.predict_dist(model_inputs(X2, md, quarter=test["quarter"].to_numpy()))
    assert np.allclose(preds["mean"], own.mean, rtol=0, atol=1e-9)
    assert np.allclose(preds["std"], own.std, rtol=0, atol=1e-9)
    fixed = model.predict_dist(np.column_stack([X2, np.zeros(len(X2))]))  # t fixed at 0
    assert np.abs(fixed.mean - preds["mean"].to_numpy()).max() > 1e-4
    return preds


def test_report_time_aware_model_mixed_quarters(tmp_path: Path) -> None:
    run = _multi_quarter_run(tmp_path / "timed")
    model = _save_model(run, time_aware=True)
    out = run_report(run, target="download")
    preds = _time_checks(run, out, model)
    assert len(set(preds["quarter"])) == 4
    metrics = _check_by_quarter(out)
    assert list(metrics["by_quarter"]) == list(QUARTERS)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["time"]["time_aware"] is True
    assert summary["time"]["time_scaling"] == {"first": "2023Q1", "last": "2023Q4"}
    assert set(summary["time"]["quarter_status"].values()) == {"observed"}
    assert summary["time"]["service_coverage_quarter"] == "2023Q4"
    assert "Model inputs x1, x2, t (time-aware)" in (out / "report.md").read_text()


def test_report_time_aware_forecast_single_test_quarter(tmp_path: Path) -> None:
    run = _multi_quarter_run(tmp_path / "forecast", split="forecast", seed=2)
    model = _save_model(run, time_aware=True, seed=2)
    assert model.metadata_["time_scaling"] == {"first": "2023Q1", "last": "2023Q2"}
    out = run_report(run, target="download")
    preds = _time_checks(run, out, model)
    assert set(preds["quarter"]) == {"2023Q4"}
    metrics = _check_by_quarter(out)  # one quarter: the figure still renders
    assert list(metrics["by_quarter"]) == ["2023Q4"]
    q = metrics["by_quarter"]["2023Q4"]
    for k in ("n", "nll", "coverage95", "mae", "width95"):
        assert q[k] == pytest.approx(metrics["all"][k], rel=1e-12), k
    summary = json.loads((out / "summary.json").read_text())
    assert summary["time"]["quarter_status"] == {"2023Q4": "extrapolation beyond 2023Q2"}
    md = (out / "report.md").read_text()
    assert (
        "Split: forecast — test quarter 2023Q4, validation quarter 2023Q3, training quarters "
        "2023Q1–2023Q2" in md
    )
    assert "extrapolation beyond 2023Q2" in md and "2023Q4 lie outside it" in md
    assert "Split: forecast" in (out / "report.html").read_text()
