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
  (:func:`pipelines.scoring.by_tests_scores`).

A tests-aware model scores each test tile as the average of its own ``tests`` speed tests
(``std² = std_f² + s2_floor + s2_meas / tests``); a constant-noise model ignores ``tests``.
- ``summary.json``: target, units, training mean/sd, the constant-mean baseline's metrics, the
  reliability curves, the service-coverage table, model and run paths, created.
- ``report.md`` / ``report.html`` and ``figures/*.png`` (see :mod:`pipelines.figures`).

Service coverage: on every distinct tile of ``tiles.parquet`` (and on the grid cells of
``grids/TARGET.nc`` for the area share, cos(lat)-weighted), a tile or cell is *served* at a
threshold when P(speed ≥ threshold) ≥ 0.9 (latency: P(latency ≤ threshold) ≥ 0.9).
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
from pipelines.report_doc import Doc
from pipelines.rundir import (
    DEFAULT_THRESHOLDS,
    TARGETS,
    RunDir,
    TargetSpec,
    load_tiles,
    require_run,
    target_spec,
)
from pipelines.scoring import (
    bucket_masks,
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


def service_coverage(
    rd: RunDir, spec: TargetSpec, model: Any, gdf: Any, thresholds: Sequence[float], chunk: int
) -> list[dict[str, Any]]:
    """Rows ``{"threshold", "label", "tiles", "area", "urban", "rural", "n_tiles"}`` (shares)."""
    tiles = gdf.groupby("quadkey", sort=True).agg(
        x1=("x1", "first"), x2=("x2", "first"), urban=("urban", "first")
    )
    X = tiles[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True)
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
    gdf, _meta = load_tiles(rd)
    parts = split_arrays(gdf, target, source=rd.tiles)
    y_train = parts["train"][1]
    mean_train, sd_train = float(np.mean(y_train)), float(np.std(y_train))
    ok = np.isfinite(gdf[spec.log_column].to_numpy(dtype=np.float64))
    test = gdf[(gdf["split"] == "test") & ok]
    if test.empty:
        raise DataError(f"{rd.tiles} has no test rows with a finite {spec.log_column}")
    X = test[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True)
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
            "quarter": test["quarter"].astype(str).to_numpy(),
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
    bucket_curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    if tests is not None:
        metrics_doc["by_tests"] = by_tests_scores(y, mean, std, urban, tests)
        for label, bm in bucket_masks(tests).items():
            bucket_curves[label] = {
                g: reliability(y[gm], mean[gm], std[gm])
                for g, gm in (("urban", bm & urban), ("rural", bm & ~urban))
                if gm.any()
            }
    atomic_write_json(out_dir / "metrics.json", clean_json(metrics_doc))

    curves = {}
    for g, m in (("urban", urban), ("rural", ~urban), ("all", np.ones_like(urban))):
        if m.any():
            curves[g] = reliability(y[m], mean[m], std[m])
    thr = tuple(float(t) for t in (thresholds or DEFAULT_THRESHOLDS[target]))
    coverage_rows = service_coverage(rd, spec, model, gdf, thr, chunk)

    # Figure 10: held-out rows (val + test), binned.
    held = gdf[gdf["split"].isin(["val", "test"]) & ok]
    h_tests = (
        np.maximum(np.nan_to_num(held["tests"].to_numpy(dtype=np.float64), nan=1.0), 1.0)
        if has_tests
        else None
    )
    h_mean, h_std = _predict(
        model, held[["x1", "x2"]].to_numpy(dtype=np.float64, copy=True), chunk, h_tests
    )
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

    doc = _build_doc(rd, spec, md, metrics, base, coverage_rows, sd_train, emp, pred_sd)
    if "by_tests" in metrics_doc:
        _by_tests_section(doc, metrics_doc["by_tests"], md.get("noise"))
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
