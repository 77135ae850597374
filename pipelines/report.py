"""``geodbk report``: test-set accuracy and calibration, urban vs rural, with figures.

Writes ``RUN/report/TARGET/``:

- ``predictions.parquet``: every test row: ``quadkey``, ``quarter``, ``urban``, ``y`` (log10
  target), ``mean``, ``std`` (predictive, log10), plus ``lon``, ``lat``.
- ``metrics.json``: ``{"urban": {...}, "rural": {...}, "all": {...}}``, each with ``n``,
  ``mae``, ``nll``, ``crps``, ``coverage``, ``pi_width`` (log10 scale) and the same keys with
  ``_std`` (standardised by the training sd: ``nll_std = nll - ln sd_train``), plus, when the
  tiles have a ``tests`` column, ``by_tests``: buckets ``1``, ``2``, ``3-4``, ``5-8``, ``9-16``,
  ``>16`` of the number of speed tests, each with ``n``, ``nll``, ``coverage``, ``pi_width``,
  ``mae`` and ``urban`` / ``rural`` dicts of the same keys
  (:func:`pipelines.scoring.by_tests_scores`), and ``by_quarter``: every quarter of the test
  split (time order), with the same keys as a ``by_tests`` bucket
  (:func:`pipelines.scoring.by_quarter_scores`).

A time-aware model (``geodbk train --time``, metadata ``inputs`` ``[x1, x2, t]``) predicts each
test tile at its own quarter, ``t = 2 (i − i_first) / (i_last − i_first) − 1`` over the model's
training quarters (:func:`pipelines.rundir.model_inputs`); a pooled model ignores the quarter.

A tests-aware model scores each test tile as the average of its own ``tests`` speed tests
(``std² = std_f² + s2_floor + s2_meas / tests``); a constant-noise model ignores ``tests``.
- ``summary.json``: target, units, training mean/sd, the constant-mean baseline's metrics, the
  reliability curves, the service-coverage table, model and run paths, created.
- ``report.md`` / ``report.html`` and ``figures/*.png`` (see :mod:`pipelines.figures`), with
  a per-quarter table and ``figures/quarter_calibration.png``; the report names the split
  (random, block, or forecast with its test and validation quarters).

Service coverage: on every distinct tile of ``tiles.parquet`` (and on the grid cells of
``grids/TARGET.nc`` for the area share, cos(lat)-weighted), a tile or cell is *served* at a
threshold when P(speed ≥ threshold) ≥ 0.9 (latency: P(latency ≤ threshold) ≥ 0.9). A
time-aware model is scored at the latest quarter of the table (the quarter of ``grids/TARGET.nc``).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import ndtr

from geodbk import __version__
from geodbk.atomic import atomic_path, atomic_write_json, atomic_write_text
from geodbk.errors import DataError
from pipelines import figures
from pipelines.report_doc import QUARTER_HEADER, Doc, quarter_rows, split_sentence
from pipelines.rundir import (
    DEFAULT_THRESHOLDS,
    TARGETS,
    RunDir,
    TargetSpec,
    load_tiles,
    model_inputs,
    require_run,
    target_spec,
    time_scaling_of,
)
from pipelines.scoring import (
    bucket_masks,
    by_quarter_scores,
    by_tests_scores,
    clean_json,
    reliability,
    urban_rural_scores,
)

log = logging.getLogger("geodbk")

#: Probability required to call a tile served.
SERVED_PROB = 0.9

EPILOG = """\
examples:
  geodbk report --run runs/hawaii --target download
  geodbk report --run runs/hawaii                 # every trained target

exit codes: 0 ok, 2 usage, 3 bad data, 4 missing/bad model, 5 missing run directory.
"""


def register(subparsers: Any) -> None:
    """Add the ``report`` sub-command."""
    p = subparsers.add_parser(
        "report",
        help="test metrics urban/rural, calibration and coverage figures (report/TARGET/)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument(
        "--target",
        choices=list(TARGETS),
        default=None,
        help="one target (default: every trained target)",
    )
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=None,
        help="service thresholds in Mbps or ms (default: FCC 25/100, 3/20; 100 ms)",
    )
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    rd = require_run(args.run)
    targets = [args.target] if args.target else rd.trained_targets()
    if not targets:
        from geodbk.errors import ModelFileError

        raise ModelFileError(
            f"no trained model in {rd.root / 'models'}; run `geodbk train --run {rd.root} "
            "--target download` first"
        )
    for t in targets:
        run_report(rd.root, target=t, thresholds=args.thresholds)
    return 0


def _predict(
    model: Any, X: np.ndarray, chunk: int, tests: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and predictive sd; tests-aware models use ``tests`` per row (None: one test)."""
    if tests is not None and getattr(model, "tests_aware", False):
        pred = model.predict(X, chunk_size=chunk, tests=tests)
    else:
        pred = model.predict(X, chunk_size=chunk)
    return np.asarray(pred.mean, dtype=np.float64), np.asarray(pred.std, dtype=np.float64)


def _served_prob(spec: TargetSpec, mean: np.ndarray, std: np.ndarray, thr: float) -> np.ndarray:
    """P(on the good side of ``thr``): P(speed ≥ thr) or P(latency ≤ thr)."""
    p_below = ndtr((spec.natural_to_log10(thr) - mean) / std)
    return np.asarray(1.0 - p_below if spec.higher_is_better else p_below)


def _grid_area_share(rd: RunDir, spec: TargetSpec, thr: float) -> float | None:
    """Area-weighted share of in-region grid cells served at ``thr`` (None without a grid)."""
    path = rd.grid(spec.name)
    if not path.is_file():
        return None
    import xarray as xr

    name = spec.threshold_name(thr)
    with xr.open_dataset(path) as ds:
        if name not in ds:
            return None
        served = 0.0
        total = 0.0
        step = 512
        for start in range(0, ds.sizes["y"], step):
            block = ds.isel(y=slice(start, start + step))
            p_bad = block[name].values
            inside = np.isfinite(p_bad)
            w = np.cos(np.deg2rad(block["y"].values))[:, None] * np.ones_like(p_bad)
            served += float(w[inside & (p_bad <= 1 - SERVED_PROB)].sum())
            total += float(w[inside].sum())
    return served / total if total > 0 else None


def latest_quarter(gdf: Any) -> str:
    """The latest quarter of a tile table (``2023Q4``): the quarter of the current map."""
    from geodbk.geo.timeaxis import format_quarter, quarter_indices

    return format_quarter(int(quarter_indices(gdf["quarter"].astype(str)).max()))


def service_coverage(
    rd: RunDir,
    spec: TargetSpec,
    model: Any,
    gdf: Any,
    thresholds: Sequence[float],
    chunk: int,
    *,
    metadata: dict[str, Any] | None = None,
    quarter: str | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{"threshold", "label", "tiles", "area", "urban", "rural", "n_tiles"}`` (shares).

    A time-aware model (``metadata["inputs"]`` holds ``t``) predicts every distinct tile at
    ``quarter`` (default: the table's latest, as ``grids/TARGET.nc``); a pooled one ignores it.
    """
    tiles = gdf.groupby("quadkey", sort=True).agg(
        x1=("x1", "first"), x2=("x2", "first"), urban=("urban", "first")
    )
    X2 = tiles[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True)
    md = metadata or {}
    if time_scaling_of(md) is not None and quarter is None:
        quarter = latest_quarter(gdf)
    X = model_inputs(X2, md, quarter=quarter)
    urban = tiles["urban"].to_numpy(dtype=bool)
    mean, std = _predict(model, X, chunk)
    rows = []
    rel = "≥" if spec.higher_is_better else "≤"
    for t in thresholds:
        served = _served_prob(spec, mean, std, t) >= SERVED_PROB
        rows.append(
            {
                "threshold": float(t),
                "label": f"{rel} {t:g} {spec.unit}",
                "n_tiles": len(served),
                "tiles": float(served.mean()) if len(served) else None,
                "area": _grid_area_share(rd, spec, t),
                "urban": float(served[urban].mean()) if urban.any() else None,
                "rural": float(served[~urban].mean()) if (~urban).any() else None,
            }
        )
    return rows


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def table2_rows(
    models: dict[str, dict[str, dict[str, Any]]], *, suffix: str = ""
) -> list[list[str]]:
    """Rows in the seed's Table 2 layout: model | urban MAE NLL Cov | rural MAE NLL Cov."""
    rows = []
    for name, m in models.items():
        row = [name]
        for g in ("urban", "rural"):
            row += [
                _fmt(m[g].get("mae" + suffix)),
                _fmt(m[g].get("nll" + suffix)),
                _fmt(m[g].get("coverage"), pct=True),
            ]
        rows.append(row)
    return rows


def run_report(run: str | Path, *, target: str, thresholds: Sequence[float] | None = None) -> Path:
    """Score the test split of ``target`` and write ``RUN/report/TARGET/``; return that folder.

    Parameters
    ----------
    run
        Run directory with ``tiles.parquet`` and a trained ``models/TARGET``.
    target
        ``download``, ``upload`` or ``latency``.
    thresholds
        Service-coverage thresholds in natural units (default: the FCC benchmarks).
    """
    from pipelines.predict import grid_bounds, read_region
    from pipelines.train import load_model, split_arrays

    rd = require_run(run)
    spec = target_spec(target)
    model = load_model(rd, target)
    md: dict[str, Any] = dict(getattr(model, "metadata_", None) or {})
    chunk = int(md.get("config", {}).get("predict_chunk_size", 65536))
    gdf, tiles_meta = load_tiles(rd)
    parts = split_arrays(gdf, target, source=rd.tiles)
    y_train = parts["train"][1]
    mean_train, sd_train = float(np.mean(y_train)), float(np.std(y_train))
    ok = np.isfinite(gdf[spec.log_column].to_numpy(dtype=np.float64))
    test = gdf[(gdf["split"] == "test") & ok]
    if test.empty:
        raise DataError(f"{rd.tiles} has no test rows with a finite {spec.log_column}")
    quarters = test["quarter"].astype(str).to_numpy()
    X = model_inputs(test[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True), md, quarter=quarters)
    y = test[spec.log_column].to_numpy(dtype=np.float64)
    urban = test["urban"].to_numpy(dtype=bool)
    has_tests = "tests" in test.columns
    tests = (
        np.maximum(np.nan_to_num(test["tests"].to_numpy(dtype=np.float64), nan=1.0), 1.0)
        if has_tests
        else None
    )
    mean, std = _predict(model, X, chunk, tests)
    out_dir = rd.report_dir(target)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)

    preds = pd.DataFrame(
        {
            "quadkey": test["quadkey"].astype(str).to_numpy(),
            "quarter": quarters,
            "urban": urban,
            "y": y,
            "mean": mean,
            "std": std,
            "lon": test["lon"].to_numpy(dtype=np.float64),
            "lat": test["lat"].to_numpy(dtype=np.float64),
            **({"tests": tests} if tests is not None else {}),
        }
    )
    with atomic_path(out_dir / "predictions.parquet") as tmp:
        preds.to_parquet(tmp, index=False)

    metrics = urban_rural_scores(y, mean, std, urban, sd_train=sd_train)
    base = urban_rural_scores(
        y, np.full_like(y, mean_train), np.full_like(y, sd_train), urban, sd_train=sd_train
    )
    metrics_doc: dict[str, Any] = dict(metrics)
    by_quarter = by_quarter_scores(y, mean, std, urban, quarters)
    bucket_curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    if tests is not None:
        metrics_doc["by_tests"] = by_tests_scores(y, mean, std, urban, tests)
        for label, bm in bucket_masks(tests).items():
            bucket_curves[label] = {
                g: reliability(y[gm], mean[gm], std[gm])
                for g, gm in (("urban", bm & urban), ("rural", bm & ~urban))
                if gm.any()
            }
    metrics_doc["by_quarter"] = by_quarter
    atomic_write_json(out_dir / "metrics.json", clean_json(metrics_doc))

    curves = {}
    for g, m in (("urban", urban), ("rural", ~urban), ("all", np.ones_like(urban))):
        if m.any():
            curves[g] = reliability(y[m], mean[m], std[m])
    thr = tuple(float(t) for t in (thresholds or DEFAULT_THRESHOLDS[target]))
    ts = time_scaling_of(md)
    current = latest_quarter(gdf) if ts is not None else None
    coverage_rows = service_coverage(rd, spec, model, gdf, thr, chunk, metadata=md, quarter=current)

    # Figure 10: held-out rows (val + test), binned.
    held = gdf[gdf["split"].isin(["val", "test"]) & ok]
    h_tests = (
        np.maximum(np.nan_to_num(held["tests"].to_numpy(dtype=np.float64), nan=1.0), 1.0)
        if has_tests
        else None
    )
    h_X = model_inputs(
        held[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True),
        md,
        quarter=held["quarter"].astype(str).to_numpy(),
    )
    h_mean, h_std = _predict(model, h_X, chunk, h_tests)
    region = read_region(rd)
    emp, pred_sd, extent = figures.binned_sd(
        held["lon"].to_numpy(dtype=np.float64),
        held["lat"].to_numpy(dtype=np.float64),
        held[spec.log_column].to_numpy(dtype=np.float64) - h_mean,
        h_std,
        grid_bounds(rd, region.bounds, extent="tiles"),
    )
    label = f"log10 {spec.column}"
    figures.pi_width_violin(3.92 * std, urban, fig_dir / "pi_width_violin.png", label=label)
    figures.reliability_diagram(curves, fig_dir / "reliability.png")
    if bucket_curves:
        figures.reliability_by_tests(bucket_curves, fig_dir / "reliability_by_tests.png")
    figures.sd_maps(emp, pred_sd, extent, fig_dir / "sd_maps.png", region=region, label=label)
    figures.service_coverage_figure(coverage_rows, fig_dir / "service_coverage.png", target=target)
    extrapolated = [q for q in by_quarter if ts is not None and ts.is_extrapolation(q)]
    figures.quarter_calibration(
        by_quarter, fig_dir / "quarter_calibration.png", extrapolated=extrapolated
    )
    split_info = tiles_meta.get("split") if isinstance(tiles_meta.get("split"), dict) else {}
    time_info: dict[str, Any] = {
        "time_aware": ts is not None,
        "inputs": md.get("inputs", ["x1", "x2"]),
        "time_scaling": ts.to_dict() if ts is not None else None,
        "quarter_status": {q: (ts.describe(q) if ts is not None else "pooled") for q in by_quarter},
        "service_coverage_quarter": current,
    }

    summary = {
        "target": target,
        "units": {"log10": label, "natural": spec.unit},
        "run": str(rd.root),
        "model": str(rd.model_dir(target)),
        "config_hash": md.get("config_hash"),
        "best_epoch": md.get("best_epoch"),
        "y_train_mean": mean_train,
        "y_train_sd": sd_train,
        "metrics": metrics,
        "by_tests": metrics_doc.get("by_tests"),
        "by_quarter": by_quarter,
        "split": split_info,
        "time": time_info,
        "noise": md.get("noise"),
        "baseline_constant_mean": base,
        "reliability": {
            g: {"levels": lv.tolist(), "coverage": cv.tolist()} for g, (lv, cv) in curves.items()
        },
        "service_coverage": coverage_rows,
        "served_probability": SERVED_PROB,
        "sd_map": {
            "cells_long_side": 40,
            "min_count": 3,
            "rows": "val+test",
            "n_cells": int(np.isfinite(emp).sum()),
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
    }
    atomic_write_json(out_dir / "summary.json", clean_json(summary))

    doc = _build_doc(
        rd, spec, md, metrics, base, coverage_rows, sd_train, emp, pred_sd, split_info, time_info
    )
    if "by_tests" in metrics_doc:
        _by_tests_section(doc, metrics_doc["by_tests"], md.get("noise"))
    _by_quarter_section(doc, by_quarter, time_info)
    atomic_write_text(out_dir / "report.md", doc.markdown())
    atomic_write_text(out_dir / "report.html", doc.html())
    log.info(
        "wrote %s (predictions.parquet, metrics.json, summary.json, report.md, "
        "report.html, figures/*.png)",
        out_dir,
    )
    return out_dir


def _by_tests_section(doc: Doc, by_tests: dict[str, Any], noise: Any) -> None:
    """Table and per-bucket reliability figure of the scores by number of speed tests."""
    doc.heading("By number of speed tests per tile")
    if isinstance(noise, dict) and noise.get("noise") == "tests":
        doc.para(
            "Tests-aware noise: each test tile is predicted as the average of its own number "
            f"of tests, s2 = {noise['s2_floor']:.4f} + {noise['s2_meas']:.4f} / "
            f"tests^{noise['power']:.2f} (log10 units²)."
        )
    else:
        doc.para("Constant noise: the same observation variance for every tile.")
    rows = []
    for label, r in by_tests.items():
        row = [label, r["n"], _fmt(r["nll"]), _fmt(r["coverage"], pct=True), _fmt(r["pi_width"])]
        for g in ("urban", "rural"):
            row += [_fmt(r[g]["nll"]), _fmt(r[g]["coverage"], pct=True)]
        rows.append(row)
    doc.table(
        [
            "tests",
            "n",
            "NLL",
            "coverage",
            "PI width",
            "urban NLL",
            "urban cov.",
            "rural NLL",
            "rural cov.",
        ],
        rows,
    )
    doc.image("figures/reliability_by_tests.png", "reliability diagram per tests bucket")


def _time_sentence(time_info: dict[str, Any]) -> str:
    """How the model treats time: pooled over quarters, or the input t over a quarter range."""
    ts = time_info.get("time_scaling")
    if not time_info.get("time_aware") or not isinstance(ts, dict):
        return (
            "Model inputs x1, x2 (pooled over quarters): every quarter gets the same prediction "
            "at a tile."
        )
    beyond = [q for q, st in time_info.get("quarter_status", {}).items() if st != "observed"]
    extra = (
        f"; test quarter(s) {', '.join(beyond)} lie outside it (extrapolation, t outside [-1, 1])"
        if beyond
        else ""
    )
    return (
        f"Model inputs x1, x2, t (time-aware): t scaled to [-1, 1] over the training quarters "
        f"{ts['first']}–{ts['last']}; each test tile is predicted at its own quarter{extra}."
    )


def _by_quarter_section(
    doc: Doc, by_quarter: dict[str, dict[str, Any]], time_info: dict[str, Any]
) -> None:
    """Table and figure of the test scores per quarter."""
    doc.heading("By quarter")
    doc.para(
        "Test rows of each quarter, log10 scale; coverage = share inside the 95% prediction "
        "interval (a calibrated model stays within 95% ± 2%). Status: observed (inside the "
        "time-aware model's training quarters), extrapolation, or pooled (no time input)."
    )
    doc.table(QUARTER_HEADER, quarter_rows(by_quarter, time_info.get("quarter_status", {})))
    doc.image("figures/quarter_calibration.png", "coverage and NLL per quarter")


def _build_doc(
    rd: RunDir,
    spec: TargetSpec,
    md: dict[str, Any],
    metrics: dict[str, Any],
    base: dict[str, Any],
    coverage_rows: list[dict[str, Any]],
    sd_train: float,
    emp: np.ndarray,
    pred_sd: np.ndarray,
    split_info: dict[str, Any] | None = None,
    time_info: dict[str, Any] | None = None,
) -> Doc:
    cfg = md.get("config", {})
    timings = md.get("timings", {})
    doc = Doc(f"geodbk report: {spec.name} ({rd.root.name})")
    doc.bullets(
        [
            f"Run `{rd.root}`; model `{rd.model_dir(spec.name)}` "
            f"(config hash {md.get('config_hash')}), geodbk {__version__}.",
            f"DBK-{cfg.get('expansion', 'rbf').upper()} trained with {cfg.get('objective', '?')}: "
            f"r={cfg.get('rank')}, h={cfg.get('hidden')}, α={cfg.get('alpha')}, β={cfg.get('beta')}, "
            f"batch {cfg.get('batch_size')}, lr {cfg.get('lr')}, up to {cfg.get('epochs')} epochs; "
            f"best epoch {md.get('best_epoch')} of {timings.get('epochs_run')} "
            f"({_fmt(timings.get('fit_seconds'))} s).",
            f"Target log10 of `{spec.column}`; training sd {sd_train:.3f}. "
            f"Test rows: {metrics['urban']['n']} urban, {metrics['rural']['n']} rural.",
            split_sentence(split_info),
            _time_sentence(time_info or {}),
        ]
    )
    models = {"DBK (this model)": metrics, "constant mean (train mean, sd)": base}
    header = [
        "model",
        "urban MAE",
        "urban NLL",
        "urban cov.",
        "rural MAE",
        "rural NLL",
        "rural cov.",
    ]
    doc.heading("Test accuracy and calibration (layout of the seed's Table 2)")
    doc.para("log10 scale; coverage = share of test rows inside the 95% prediction interval.")
    doc.table(header, table2_rows(models))
    doc.para("Standardised scale (target divided by the training sd; NLL_std = NLL − ln sd).")
    doc.table(header, table2_rows(models, suffix="_std"))
    doc.heading("All metrics (log10 scale)", 3)
    doc.table(
        ["group", "n", "MAE", "NLL", "CRPS", "coverage", "mean 95% PI width"],
        [
            [
                g,
                metrics[g]["n"],
                _fmt(metrics[g]["mae"]),
                _fmt(metrics[g]["nll"]),
                _fmt(metrics[g]["crps"]),
                _fmt(metrics[g]["coverage"], pct=True),
                _fmt(metrics[g]["pi_width"]),
            ]
            for g in ("urban", "rural", "all")
        ],
    )
    doc.heading("Interval widths")
    doc.image("figures/pi_width_violin.png", "95% PI widths by urban/rural")
    doc.heading("Reliability")
    doc.para("Empirical coverage of central predictive intervals at nominal levels 50–99%.")
    doc.image("figures/reliability.png", "reliability diagram")
    doc.heading("Empirical vs predicted sd (seed Figure 10)")
    doc.para(
        "Tiles of the held-out splits (val + test) are binned on a raster with 40 cells along "
        "the longer side of the region box cut to the tiles. Empirical sd of a cell = "
        "sqrt(mean((y − mean)²)) of its rows around the model mean; predicted sd = "
        "sqrt(mean(std²)); cells with < 3 rows blank. "
        f"{int(np.isfinite(emp).sum())} cells shown."
    )
    doc.image("figures/sd_maps.png", "empirical vs predicted sd maps")
    doc.heading("Service coverage")
    doc.para(
        f"Share of distinct tiles, of region area (grid cells, cos-lat weighted) and of urban / "
        f"rural tiles where the {spec.name} is on the good side of the threshold with "
        f"probability ≥ {SERVED_PROB:.0%}."
    )
    doc.table(
        ["threshold", "tiles", "area", "urban tiles", "rural tiles"],
        [
            [
                r["label"],
                _fmt(r["tiles"], True),
                _fmt(r["area"], True),
                _fmt(r["urban"], True),
                _fmt(r["rural"], True),
            ]
            for r in coverage_rows
        ],
    )
    doc.image("figures/service_coverage.png", "service coverage")
    return doc
