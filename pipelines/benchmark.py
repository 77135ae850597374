"""``geodbk benchmark``: train several models on the same split and budget, report side by side.

Reads ``RUN/tiles.parquet`` (inputs ``x1, x2``, plus the scaled quarter ``t`` with ``--time``;
target ``log10_<TARGET>``, columns ``split`` and ``urban``; ``tests``/``devices`` for the
tests-aware noise models), trains every requested model for every seed with the same epoch
budget, batch size, rank and backbone width, and writes ``RUN/benchmark/TARGET.json`` and
``TARGET.md`` atomically.

Per model (mean ± sd over seeds), on the test split and its urban / rural parts: MAE, NLL (log10
units; ``nll_std`` = NLL on the standardised target = NLL - ln sd_train), CRPS, 95% coverage,
mean 95% interval width and the sd / IQR of the per-tile interval widths; training seconds per
epoch and in total, prediction points per second (all rows of the table) and peak memory (CPU:
peak RSS of the model's worker process minus its RSS just before training — torch's CPU
allocations bypass tracemalloc, and tracing Python allocations slowed training several-fold, so
it is not used; CUDA: ``torch.cuda.max_memory_allocated``).

Each (model, seed) runs in its own spawned worker process, so an out-of-memory kill, a crash,
a divergence (NaN loss), a refusal (exact GP above its size limit) or any exception is recorded
in the table with its reason and never stops the other models.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import fcntl
import inspect
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from geodbk.atomic import atomic_write_json, atomic_write_text
from geodbk.baselines.registry import (
    CAGP_LR_GRID,
    CONSTRUCTORS,
    PP_DKL_BETA_GRID,
    build_model,
    check_preset,
    model_kwargs,
    parse_model_list,
)
from geodbk.device import resolve_device
from geodbk.errors import DataError, RunDirectoryError
from geodbk.geo.contract import TARGETS, Z95, target_info
from geodbk.geo.splits import split_sentence
from geodbk.geo.timeaxis import quarter_indices
from geodbk.metrics import (
    COVERAGE95,
    CRPS,
    MAE,
    NLL,
    STD_SUFFIX,
    WIDTH95,
    WIDTH_IQR,
    WIDTH_SD,
    canonical_keys,
    summary,
)
from geodbk.tile_effect import (
    choose_objective,
    fit_tile_effect,
    predict_with_tile_effect,
    urban_groups,
)
from geodbk.validation import counts_or_one
from pipelines.benchmark_protocols import PROTOCOLS, apply_protocol, format_stat, table2_lines
from pipelines.cli import FITTING, call_with_options, stage_parser
from pipelines.config import NOISE_MODELS, URBAN_SUFFIX
from pipelines.scoring import by_tests_scores, clean_json
from pipelines.training_data import noise_columns, time_axis, urban_classes, urban_groups_supported

log = logging.getLogger("geodbk.benchmark")

GROUPS = ("all", "urban", "rural")
#: What the ``paper`` preset sweeps by default, as each model's paper tunes it: model ->
#: (option, grid), chosen by validation NLL. Both options act through training only, so a model
#: given ``epochs`` 0 (initialised, not trained) is not swept.
PAPER_SWEEPS: dict[str, tuple[str, tuple[float, ...]]] = {
    "pp-dkl": ("beta", PP_DKL_BETA_GRID),
    "cagp": ("lr", CAGP_LR_GRID),
}
#: The metrics each model's ``summary`` averages over seeds (:mod:`geodbk.metrics` names).
METRICS = (MAE, NLL, NLL + STD_SUFFIX, CRPS, COVERAGE95, WIDTH95, WIDTH_SD, WIDTH_IQR)

#: What ``geodbk benchmark --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Train several Gaussian-process models on the same split and budget and compare them.

Reads RUN/tiles.parquet, trains every model of --models for every seed with the same epoch
budget, batch size, rank and backbone width, and writes RUN/benchmark/TARGET.json and
TARGET.md: per model (mean and sd over seeds), on the test split and its urban and rural
parts, MAE, NLL, CRPS, 95% coverage and interval width, training time, prediction speed and
peak memory. Each model and seed runs in its own process, so a crash, an out-of-memory kill,
a divergence or a refusal is recorded with its reason and never stops the others.
Details: docs/cli.md, "geodbk benchmark".
"""

EPILOG = """examples:
  geodbk benchmark --run runs/hawaii-mobile --target download --models all --epochs 20 --seeds 0
  geodbk benchmark --run runs/demo --target upload --models dbk-rbf,sv-dkl,cagp --seeds 0,1,2
  geodbk benchmark --run runs/demo --target download --models dbk-rbf,softki --threads 1 --timeout 600
  geodbk benchmark --run runs/hawaii-mobile --target download --models dbk-rbf --time \\
      --noise tests+devices+urban --merge     # time-aware DBK with the class floor
  geodbk benchmark --run runs/hawaii-mobile --target upload --protocol seed-table2 --threads 1

model names: dbk-rbf, dbk-silu, exact-dbk, exact-rbf, sv-rbf, sv-dkl, pp-dkl, vbll, svdbk,
svdbk-exact, cagp, solve-gp, softki (or 'all')
exit codes: 0 ok (a model that failed is recorded in the table with its reason), 2 usage,
3 bad option or data (unknown model, --set key), 5 missing run directory or tile table.
"""


# ---------------------------------------------------------------------------------- data
def load_benchmark_data(
    run: Path, target: str, *, time: bool = False, tiles: bool = False
) -> dict[str, np.ndarray]:
    """Inputs, target, split, urban flag and noise covariates from ``RUN/tiles.parquet``.

    Only rows with a finite target and inputs are kept. ``X`` is ``[x1, x2]``, or ``[x1, x2, t]``
    with ``time`` (``t``: the quarter scaled to [-1, 1] over the train split's quarters, exactly
    as ``geodbk train --time``; the range is returned as ``time_range = [first, last]``).
    ``tests`` and ``devices`` (when the table has them) are counts, missing or below 1 set to 1.
    With ``tiles`` (the tile effect) ``quadkey`` (str) and ``time_step`` (the quarter index,
    float) are returned too.
    """

    path = Path(run) / "tiles.parquet"
    if not path.is_file():
        raise RunDirectoryError(
            f"{path} not found: run `geodbk ingest --run {run} --tiles ...` first"
        )
    if target not in TARGETS:
        raise DataError(f"unknown target {target!r}; choose from {', '.join(TARGETS)}")
    try:
        # local: the geo stack (geopandas, shapely) is absent on GPU machines; pandas reads
        from geodbk.geo.table import read_tile_table

        table, _ = read_tile_table(path)
    except ImportError:  # pragma: no cover - geo layer absent
        import pandas as pd

        table = pd.read_parquet(path)
    col = f"log10_{target}"
    needed = ("x1", "x2", col, "split", "urban", *(("quarter",) if time or tiles else ()))
    needed += ("quadkey",) if tiles else ()
    missing = [c for c in needed if c not in table.columns]
    if missing:
        flags = " or ".join(f for f, on in (("--time", time), ("--tile-effect", tiles)) if on)
        fix = "re-run geodbk ingest" + (f" (or benchmark without {flags})" if flags else "")
        raise DataError(f"{path} lacks column(s) {', '.join(missing)}; {fix}")
    X = table[["x1", "x2"]].to_numpy(dtype=np.float64)
    y = table[col].to_numpy(dtype=np.float64)
    split = table["split"].astype(str).to_numpy()
    urban = table["urban"].to_numpy(dtype=bool)
    keep = np.isfinite(y) & np.isfinite(X).all(axis=1)
    data = {"X": X[keep], "y": y[keep], "split": split[keep], "urban": urban[keep]}
    if time:
        quarter = table["quarter"].astype(str).to_numpy()[keep]
        scaling, _ = time_axis(quarter, data["split"], source=path)
        data["X"] = np.column_stack([data["X"], scaling.scale(quarter)])
        data["time_range"] = np.array([scaling.first, scaling.last])
    if tiles:
        data["quadkey"] = table["quadkey"].astype(str).to_numpy()[keep]
        data["time_step"] = quarter_indices(table["quarter"].astype(str)[keep]).astype(float)
    for column in ("tests", "devices"):
        if column in table.columns:
            data[column] = counts_or_one(table[column].to_numpy(dtype=np.float64))[keep]
    for s in ("train", "test"):
        if not (data["split"] == s).any():
            raise DataError(f"{path} has no '{s}' rows with a finite {col}")
    return data


#: The tile table's metadata a benchmark report records (as ``model.json`` does).
TILES_METADATA_KEYS = ("type", "quarters", "region", "split", "ingest_id")


def tiles_metadata(run: Path) -> dict[str, Any]:
    """The ``geodbk`` metadata of ``RUN/tiles.parquet`` that says which data and split a
    benchmark scored: :data:`TILES_METADATA_KEYS` (``None`` where the table lacks one).

    Read from the parquet footer with pyarrow alone when the geo stack is absent.
    """
    path = Path(run) / "tiles.parquet"
    try:
        # local: the geo stack is absent on GPU machines; pyarrow reads the footer there
        from geodbk.geo.table import read_table_metadata

        meta = read_table_metadata(path)
    except ImportError:  # pragma: no cover - geo layer absent
        import pyarrow.parquet as pq

        raw = (pq.read_schema(path).metadata or {}).get(b"geodbk")
        meta = json.loads(raw) if raw else {}
    return {key: meta.get(key) for key in TILES_METADATA_KEYS}


def check_noise_model(noise: str) -> str:
    """Return ``noise`` if it is one of :data:`NOISE_MODELS`, else raise a ``DataError``."""
    if noise not in NOISE_MODELS:
        raise DataError(f"unknown noise {noise!r}; choose from {', '.join(NOISE_MODELS)}")
    return noise


def noise_options(
    name: str, model: Any, noise: str, data: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Set ``model``'s observation noise to ``noise``; return its covariates for all rows.

    ``noise`` is one of :data:`NOISE_MODELS`. ``tests`` (every registry model) fits
    ``s2_i = s2_floor + s2_meas / tests_i``; ``tests+devices`` adds ``s2_dev / devices_i`` and
    ``+urban`` learns the floor per urban/rural class. Those two are options of the
    ``DBKRegressor`` family (DBK-RBF/SiLU, exact DBK, SV-RBF, SV-DKL, PP-DKL, VBLL); the torch
    baselines (CaGP, SOLVE-GP, SoftKI, exact RBF, SVDBK) raise ``ValueError`` with the reason,
    which the benchmark records as a failure.

    Returns
    -------
    dict
        ``{"tests": (n,), "devices"?: (n,), "urban"?: (n,)}`` aligned with ``data["X"]`` (``{}``
        for ``constant``).
    """
    if check_noise_model(noise) == "constant":
        return {}

    params_available = model.get_params()
    if "noise" not in params_available:
        raise ValueError(f"{name} has no tests-aware noise option (constant noise only)")
    columns = noise_columns(noise)  # tests, devices?, urban?
    missing = [c for c in columns if c not in data]
    if missing:
        raise DataError(
            f"--noise {noise} needs the column(s) {', '.join(missing)} in tiles.parquet; "
            "re-ingest Ookla tiles or use --noise constant"
        )
    params: dict[str, Any] = {"noise": noise.removesuffix(URBAN_SUFFIX)}
    if noise.endswith(URBAN_SUFFIX):
        if "noise_urban" not in params_available:
            raise ValueError(f"{name} has no noise floor per urban/rural class (+urban)")
        if urban_classes(data["urban"], data["split"]) < 2:
            raise DataError("--noise ...+urban needs urban and rural tiles in the train split")
        params["noise_urban"] = True
    model.set_params(**params)._validate()  # a baseline without tests+devices raises here
    return {c: data[c] for c in columns}


# ---------------------------------------------------------------------------------- metrics
def group_metrics(
    y: np.ndarray, mean: np.ndarray, var: np.ndarray, *, log_sd_train: float
) -> dict[str, float]:
    """:func:`geodbk.metrics.summary` plus ``nll_std`` and the spread (``width_sd``,
    ``width_iqr``) of the 95% PI widths; ``{}`` for no rows."""

    if y.shape[0] == 0:
        return {}
    out = summary(y, mean, var)
    widths = 2.0 * Z95 * np.sqrt(var)
    q75, q25 = np.percentile(widths, [75, 25])
    out.update(
        {
            NLL + STD_SUFFIX: out[NLL] - log_sd_train,
            WIDTH_SD: float(np.std(widths)),
            WIDTH_IQR: float(q75 - q25),
        }
    )
    return out


def _rss_mb() -> float:
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            pages = int(handle.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):  # pragma: no cover - not Linux
        return float("nan")


def _peak_rss_mb() -> float:
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 1024.0 if sys.platform != "darwin" else peak / 2**20
    except (ImportError, OSError):  # pragma: no cover
        return float("nan")


# ---------------------------------------------------------------------------------- one run
def run_one(
    name: str,
    seed: int,
    data: dict[str, np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    rank: int,
    hidden: int,
    device: str,
    threads: int | None,
    overrides: dict[str, Any] | None = None,
    noise: str = "constant",
    tile_effect: bool = False,
    fewer_tests_lower: bool = True,
    preset: str = "tuned",
) -> dict[str, Any]:
    """Train and score one (model, seed); return metrics and costs (raises on failure).

    ``preset`` (``"paper"`` or ``"tuned"``, :data:`geodbk.baselines.registry.PRESETS`) picks
    the model's settings; ``overrides`` win over it. The result records the model's
    ``hyperparameters`` as trained (:func:`model_hyperparameters`) and its ``val_nll`` (NLL of
    the kept model on the val split, ``None`` without one).

    ``noise`` (see :func:`noise_options`) other than ``constant`` fits a tests-aware observation
    noise, e.g. s2_i = s2_floor + s2_meas / tests_i, and scores each test tile as the average of
    its own ``tests`` (and ``devices``, class). ``data["X"]`` has a third column ``t`` for a
    time-aware benchmark (:func:`load_benchmark_data` with ``time=True``). ``tile_effect``
    adds the per-tile offset (:func:`geodbk.tile_effect.fit_tile_effect`, chosen on the val
    split) to the trained model before the test rows are scored; it needs the model's latent
    prediction and ``noise_components`` (every registry model has them; others raise
    ``ValueError``); ``fewer_tests_lower`` is the target's (a speed: True;
    :meth:`geodbk.tile_effect.TileEffect.fit`).
    """
    import torch

    if threads:
        torch.set_num_threads(int(threads))
    split, urban = data["split"], data["urban"]
    tr, va, te = split == "train", split == "val", split == "test"
    X, y = data["X"], data["y"]
    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    model = build_model(
        name,
        epochs=epochs,
        batch_size=batch_size,
        seed=seed,
        rank=rank,
        hidden=hidden,
        device=device,
        overrides=overrides,
        preset=preset,
    )
    covariates = noise_options(name, model, noise, data)
    if tile_effect and not hasattr(model, "noise_components"):
        raise ValueError(f"{name} has no tile-effect option (no noise_components)")
    if tile_effect and not va.any():
        raise DataError("--tile-effect is chosen on the val split, which is empty")
    if covariates and "noise_init" not in (overrides or {}):
        # From 1e-2 the per-test noise cannot grow within a short budget
        # (docs/decisions/noise_model.md).
        model.set_params(noise_init=0.5)
    fit_kw: dict[str, Any] = {c: v[tr] for c, v in covariates.items()}
    if va.any():
        fit_kw |= {f"{c}_val": v[va] for c, v in covariates.items()}
    # Warm-up: the first optimiser construction imports torch's compile machinery (seconds on
    # a loaded machine); do it before the clock starts so that it is not billed to the model.
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    rss0 = _rss_mb()
    if use_cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    model.fit(X[tr], y[tr], X[va] if va.any() else None, y[va] if va.any() else None, **fit_kw)
    fit_s = time.perf_counter() - t0
    effect_params = None
    if tile_effect:
        pred, effect_params = _tile_effect_prediction(
            model, data, covariates, fewer_tests_lower=fewer_tests_lower
        )
    else:
        pred = model.predict_dist(X[te], **{k: v[te] for k, v in covariates.items()})
    t1 = time.perf_counter()
    model.predict_dist(X, **covariates)
    pred_s = time.perf_counter() - t1
    if not (np.isfinite(pred.mean).all() and np.isfinite(pred.var).all() and (pred.var > 0).all()):
        raise FloatingPointError("non-finite or non-positive predictions (diverged)")
    sd_train = float(np.std(y[tr])) or 1.0
    val_nll = None
    if va.any():
        val_pred = model.predict_dist(X[va], **{k: v[va] for k, v in covariates.items()})
        val_nll = float(summary(y[va], val_pred.mean, val_pred.var)[NLL])
    metrics = {}
    for group, mask in (
        ("all", np.ones(te.sum(), bool)),
        ("urban", urban[te]),
        ("rural", ~urban[te]),
    ):
        metrics[group] = group_metrics(
            y[te][mask], pred.mean[mask], pred.var[mask], log_sd_train=math.log(sd_train)
        )
    by_tests = None
    tests = data.get("tests")
    if tests is not None:
        by_tests = clean_json(  # empty buckets: NaN -> null
            by_tests_scores(
                y[te], pred.mean, np.sqrt(pred.var), urban[te], np.maximum(tests[te], 1.0)
            )
        )
    history = list(getattr(model, "history_", []) or [])
    n_epochs = max(len(history), 1)
    return {
        "seed": seed,
        "hyperparameters": model_hyperparameters(model),
        "val_nll": val_nll,
        "metrics": metrics,
        "by_tests": by_tests,
        "tile_effect": effect_params,
        "epochs_run": len(history),
        "best_epoch": getattr(model, "best_epoch_", None),
        "train_seconds": fit_s,
        "seconds_per_epoch": fit_s / n_epochs,
        "predict_points_per_second": X.shape[0] / max(pred_s, 1e-9),
        "peak_rss_mb": max(_peak_rss_mb() - rss0, 0.0) if not use_cuda else None,
        "cuda_peak_mb": torch.cuda.max_memory_allocated() / 2**20 if use_cuda else None,
    }


def _json_value(value: Any) -> Any:
    """``value`` if JSON can hold it as is (numbers, strings, booleans, None, lists), else its
    ``repr``; numpy scalars become Python numbers."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    return repr(value)


def model_hyperparameters(model: Any, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The model's full constructor options: ``model.get_params()`` where it has one, else
    ``kwargs`` (the constructor keyword arguments actually passed); JSON-able values."""
    getter = getattr(model, "get_params", None)
    params = dict(getter()) if callable(getter) else dict(kwargs or {})
    return {str(k): _json_value(v) for k, v in sorted(params.items())}


def _tile_effect_prediction(
    model: Any,
    data: dict[str, np.ndarray],
    covariates: dict[str, np.ndarray],
    *,
    fewer_tests_lower: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Test-split prediction of ``model`` plus a tile effect fitted on its train/val rows.

    Urban and rural tiles get their own ``tau²`` when each class has enough rows among those
    that choose the parameters (:func:`geodbk.tile_effect.choose_objective`: the validation
    rows, or the training hold-out on tile and block splits; as ``tile_effect_groups: auto``)."""

    split = data["split"]
    tr, va, te = split == "train", split == "val", split == "test"
    X, y, tiles, times = data["X"], data["y"], data["quadkey"], data["time_step"]
    kind, rows = choose_objective(tiles[tr], tiles[va])
    urban_obj = data["urban"][va][rows] if kind == "validation" else data["urban"][tr][rows]
    groups = urban_groups(data["urban"]) if urban_groups_supported(urban_obj) else None
    part = lambda mask: None if groups is None else groups[mask]  # noqa: E731
    effect = fit_tile_effect(
        model,
        X=X[tr],
        y=y[tr],
        tiles=tiles[tr],
        times=times[tr],
        X_val=X[va],
        y_val=y[va],
        tiles_val=tiles[va],
        times_val=times[va],
        noise={k: v[tr] for k, v in covariates.items()},
        noise_val={k: v[va] for k, v in covariates.items()},
        groups=part(tr),
        groups_val=part(va),
        fewer_tests_lower=fewer_tests_lower,
    )
    pred = predict_with_tile_effect(
        model,
        effect,
        X[te],
        tiles=tiles[te],
        times=times[te],
        noise={k: v[te] for k, v in covariates.items()},
        groups=part(te),
    )
    return pred, effect.params.to_dict()


def _worker(
    conn: Any, name: str, seed: int, data: dict[str, np.ndarray], kwargs: dict[str, Any]
) -> None:
    threads = kwargs.get("threads")
    if threads:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        conn.send({"ok": True, "result": run_one(name, seed, data, **kwargs)})
    except BaseException as exc:  # report every failure to the parent
        kind = type(exc).__name__
        if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
            kind = f"out of memory ({kind})"
        conn.send(
            {"ok": False, "reason": f"{kind}: {exc}", "traceback": traceback.format_exc(limit=6)}
        )
    finally:
        conn.close()


def run_isolated(
    name: str, seed: int, data: dict[str, np.ndarray], *, timeout: float | None, **kwargs: Any
) -> dict[str, Any]:
    """Run :func:`run_one` in a spawned process; a crash, kill or timeout becomes a failure record."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(child, name, seed, data, kwargs), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    child.close()
    msg: dict[str, Any] | None = None
    deadline = None if timeout is None else t0 + timeout
    while True:
        wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.perf_counter()))
        if parent.poll(wait):
            try:
                msg = parent.recv()
            except EOFError:
                msg = None
            break
        if not proc.is_alive():
            break
        if deadline is not None and time.perf_counter() >= deadline:
            proc.kill()
            proc.join()
            return {"ok": False, "reason": f"timeout: exceeded {timeout:.0f} s"}
    proc.join(timeout=30)
    if msg is None:
        code = proc.exitcode
        why = "killed (out of memory?)" if code is not None and code < 0 else "crashed"
        return {"ok": False, "reason": f"worker {why}: exit code {code}"}
    return msg


# ---------------------------------------------------------------------------------- aggregate
def _mean_sd(values: list[Any]) -> dict[str, float | None]:
    arr = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, "sd": None}
    return {"mean": float(arr.mean()), "sd": float(arr.std(ddof=1)) if arr.size > 1 else None}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± sd over seeds of every metric and cost in ``runs`` (successful runs only)."""
    out: dict[str, Any] = {}
    for group in GROUPS:
        out[group] = {
            m: _mean_sd([r["metrics"][group].get(m) for r in runs if r["metrics"].get(group)])
            for m in METRICS
        }
    for key in (
        "seconds_per_epoch",
        "train_seconds",
        "predict_points_per_second",
        "peak_rss_mb",
        "cuda_peak_mb",
        "epochs_run",
    ):
        out[key] = _mean_sd([r.get(key) for r in runs])
    return out


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:  # pragma: no cover
        pass
    return platform.processor() or "unknown"


def machine_info(threads: int | None, device: str) -> dict[str, Any]:
    """nproc, CPU model, Python/torch versions, threads, and the device asked for (``device``)
    and the one the models run on (``device_used``: ``auto`` resolved, a CUDA request without
    CUDA fallen back to ``cpu``) of this benchmark."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # each model warns of the fallback
        used = resolve_device(device).type
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": threads,
        "device": device,
        "device_used": used,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _short(reason: str, limit: int = 160) -> str:
    """A failure's reason cut at a word before ``limit`` characters, with "…" when cut."""
    if len(reason) <= limit:
        return reason
    return reason[:limit].rsplit(" ", 1)[0] + " …"


def _by_tests_lines(report: dict[str, Any]) -> list[str]:
    """Coverage (urban / rural) and NLL per tests bucket of each model's first seed."""
    rows: list[str] = []
    buckets: list[str] = []
    for name, entry in report["models"].items():
        runs = [r for r in entry.get("runs", []) if r.get("by_tests")]
        if not runs:
            continue
        bt = runs[0]["by_tests"]
        buckets = buckets or list(bt)
        cells = []
        for b in buckets:
            v = bt.get(b) or {}
            if not v.get("n"):
                cells.append("–")
                continue
            u, r = v.get("urban") or {}, v.get("rural") or {}
            cells.append(
                f"{_pct(v.get(COVERAGE95))} ({_pct(u.get(COVERAGE95))} / "
                f"{_pct(r.get(COVERAGE95))}); {v[NLL]:.3f}"
            )
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return [
        "## by tests bucket: 95% coverage (urban / rural); NLL (first seed of each model)",
        "",
        "| model | " + " | ".join(buckets) + " |",
        "|---|" + "---|" * len(buckets),
        *rows,
        "",
    ]


def _sweep_lines(report: dict[str, Any]) -> list[str]:
    """One line per swept model: every value's val / test NLL and the chosen value."""
    rows = []
    for name, entry in report["models"].items():
        sweep = entry.get("sweep")
        if not sweep:
            continue
        cells = ", ".join(
            f"{v['value']}: val {_num(v['val_nll'])} / test {_num(v['test_nll'])}"
            for v in sweep["by_value"]
        )
        rows.append(f"- {name}, {sweep['option']} (chosen {sweep['chosen']}): {cells}")
    if not rows:
        return []
    return ["## sweeps (NLL mean over seeds; chosen by the lowest val NLL)", "", *rows, ""]


def _num(value: Any) -> str:
    return "–" if value is None else f"{float(value):.3f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}%"


def render_markdown(report: dict[str, Any]) -> str:
    """The benchmark tables as Markdown (one quality table per group, then the costs)."""
    lines = [
        f"# Benchmark: {report['target']} ({report['run']})",
        "",
        f"Created {report['created']}; command: `{report['command']}`",
        "",
        "Budget: "
        + ", ".join(f"{k}={v}" for k, v in report["budget"].items())
        + f"; rows: {report['rows']}.",
        "",
    ]
    split = (report.get("tiles_metadata") or {}).get("split")
    if split:  # reports written before the split was recorded have none
        lines += [split_sentence(split), ""]
    lines += [
        "Machine: " + ", ".join(f"{k}={v}" for k, v in report["machine"].items()),
        "",
        f"Quality on the test split of the target log10 of `{target_info(report['target']).column}`"
        ", mean ± sd over seeds. MAE, CRPS and the PI widths are in log10 units; NLL is the mean "
        "Gaussian negative log-likelihood in nats per test row, NLL (std) = NLL − ln sd_train "
        "(the standardised target, the report's NLL_std); coverage 95% is the share of test "
        "rows inside the central 95% prediction interval (`width_sd`/`width_iqr`: spread of the "
        "per-tile 95% PI widths).",
        "",
    ]
    if report.get("protocol"):
        lines += table2_lines(report)
    for group in GROUPS:
        lines += [
            f"## {group}",
            "",
            "| model | MAE | NLL | NLL (std) | CRPS | coverage 95% | PI width | width sd | width IQR |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, entry in report["models"].items():
            s = entry.get("summary")
            if not s or entry["status"] == "failed":
                lines.append(
                    f"| {name} | failed: {_short(entry['failures'][0]['reason'])} |||||||| "
                )
                continue
            g = s[group]
            lines.append(
                f"| {name} | {format_stat(g[MAE])} | {format_stat(g[NLL])} | {format_stat(g[NLL + STD_SUFFIX])} | {format_stat(g[CRPS])} | "
                f"{format_stat(g[COVERAGE95], 1, 100, unit='%')} | {format_stat(g[WIDTH95])} | {format_stat(g[WIDTH_SD])} | {format_stat(g[WIDTH_IQR])} |"
            )
        lines.append("")
    lines += _by_tests_lines(report)
    lines += _sweep_lines(report)
    lines += [
        "## cost",
        "",
        "| model | status | epochs | s / epoch | train s | predict pts/s | peak RSS Δ MB | CUDA peak MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cost = partial(format_stat, same="")
    for name, entry in report["models"].items():
        s = entry.get("summary")
        status = entry["status"] + (
            ""
            if not entry["failures"]
            else f" ({len(entry['failures'])} failed: {_short(entry['failures'][0]['reason'])})"
        )
        if entry.get("overrides"):
            status += " [" + ", ".join(f"{k}={v}" for k, v in entry["overrides"].items()) + "]"
        own = entry.get("budget") or {}
        differs = [f"{k}={v}" for k, v in own.items() if report["budget"].get(k, v) != v]
        if differs:  # kept by --merge from a run with another budget
            status += " (budget: " + ", ".join(differs) + ")"
        if not s:
            lines.append(f"| {name} | {status} | – | – | – | – | – | – |")
            continue
        lines.append(
            f"| {name} | {status} | {cost(s['epochs_run'], 0)} | {cost(s['seconds_per_epoch'], 2)} | {cost(s['train_seconds'], 1)} | "
            f"{cost(s['predict_points_per_second'], 0)} | {cost(s['peak_rss_mb'], 0)} | {cost(s['cuda_peak_mb'], 0)} |"
        )
    return "\n".join(lines) + "\n"


def check_budget(
    *,
    epochs: int,
    seeds: list[int],
    batch_size: int,
    rank: int,
    hidden: int,
    threads: int | None,
    timeout: float | None,
) -> None:
    """Refuse a budget option no model can use, naming it (exit 3), rather than recording the
    same failure for every model and seed."""
    whole = {"--epochs": epochs, "--batch-size": batch_size, "--rank": rank, "--hidden": hidden}
    if threads is not None:
        whole["--threads"] = threads
    for option, value in whole.items():
        if not value >= 1:
            raise DataError(f"{option} must be a whole number of at least 1, got {value}")
    bad_seeds = [s for s in seeds if s < 0]
    if bad_seeds:
        raise DataError(
            f"--seeds must be whole numbers of at least 0 (e.g. --seeds 0,1,2), got {bad_seeds[0]}"
        )
    check_distinct("--seeds", "seed", seeds)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise DataError(
            f"--timeout must be a positive number of seconds per model and seed (or left out "
            f"for none), got {timeout}"
        )


def check_distinct(option: str, what: str, values: list[Any]) -> None:
    """Refuse a value named twice in ``option`` (a repeated seed is the same run again, counted
    as another seed; a repeated model is trained twice and kept once)."""
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise DataError(
            f"{option} names {twice} twice; give each {what} once "
            f"(e.g. {option} {','.join(str(v) for v in dict.fromkeys(values))})"
        )


def seed_option_refused(flag: str, name: str) -> str:
    """Why ``--set``/``--sweep`` (``flag``) of ``name``'s ``seed`` is refused: ``--seeds`` seeds
    every run, and one set seed would train each of them alike (a swept one would pick a seed)."""
    return (
        f"{flag} {name}.seed: every model trains once per seed of --seeds, which sets its seed "
        f"(a {flag} seed would replace it in every run); give the seeds as --seeds, e.g. --seeds 3"
    )


def check_overrides(
    models: list[str],
    overrides: dict[str, dict[str, Any]] | None,
    *,
    epochs: int,
    batch_size: int,
    rank: int,
    hidden: int,
    preset: str = "tuned",
) -> None:
    """Build each model given ``--set`` options once (no data, no training) so that an option
    or value it refuses stops the benchmark with the option named, not as a failure of every
    seed."""

    build = partial(
        build_model, epochs=epochs, batch_size=batch_size, seed=0, rank=rank, hidden=hidden
    )
    for name, options in (overrides or {}).items():
        if name not in models:
            raise DataError(
                f"--set {name}.{next(iter(options))}: {name} is not among --models "
                f"({', '.join(models)})"
            )
        if "seed" in options:
            raise DataError(seed_option_refused("--set", name))
        try:
            # options are checked when fitting, not when set (scikit-learn)
            build(name, overrides=options, preset=preset)._validate()
        except (TypeError, ValueError) as exc:
            given = ", ".join(f"{name}.{k}={v!r}" for k, v in options.items())
            raise DataError(
                f"--set {given}: the {name} model refuses it ({type(exc).__name__}: {exc}); "
                "check the option's name and value"
            ) from None
        parameters = inspect.signature(CONSTRUCTORS[name]).parameters
        base = build(name, preset=preset)
        for key, value in options.items():
            default = parameters[key].default if key in parameters else getattr(base, key, None)
            numeric = isinstance(default, int | float) and not isinstance(default, bool)
            if numeric and (isinstance(value, bool) or not isinstance(value, int | float)):
                raise DataError(
                    f"--set {name}.{key}={value!r}: the {name} model refuses it ({key} is a "
                    f"number, default {default}); e.g. --set {name}.{key}={default}"
                )


def run_benchmark(
    run: str | Path,
    *,
    target: str,
    models: list[str],
    epochs: int = 20,
    seeds: list[int] | None = None,
    batch_size: int = 1024,
    rank: int = 256,
    hidden: int = 64,
    device: str = "cpu",
    threads: int | None = None,
    timeout: float | None = None,
    isolate: bool = True,
    overrides: dict[str, dict[str, Any]] | None = None,
    command: str | None = None,
    merge: bool = False,
    noise: str = "constant",
    time: bool = False,
    tile_effect: bool = False,
    preset: str = "paper",
    sweeps: dict[str, dict[str, list[Any]]] | None = None,
    protocol: str | None = None,
) -> dict[str, Any]:
    """Benchmark ``models`` on ``run`` and write ``RUN/benchmark/TARGET.{json,md}``.

    ``protocol`` (a name of :data:`pipelines.benchmark_protocols.PROTOCOLS`, whose settings the
    caller applied with :func:`~pipelines.benchmark_protocols.apply_protocol`) writes
    ``RUN/benchmark/TARGET_PROTOCOL.{json,md}`` instead, with the protocol's table first.

    ``preset`` (``"paper"``, the default, or ``"tuned"``) picks every model's settings
    (:data:`geodbk.baselines.registry.PRESETS`); ``overrides`` (``--set``) win over it. Each
    model's entry records the preset and its full ``hyperparameters`` as trained.
    ``sweeps`` (``{"pp-dkl": {"beta": [0, 0.01, 0.1, 1]}}``) trains a model once per value of
    one option and keeps the value with the lowest validation NLL (:func:`resolve_sweeps`;
    with the ``paper`` preset the grids of :data:`PAPER_SWEEPS` are swept by default); the entry
    records the ``sweep`` (every value's val and test NLL, the chosen one).

    ``noise`` (one of :data:`NOISE_MODELS`) is the observation-noise model every model is asked
    to fit: every registry model has ``constant`` and ``tests``; ``tests+devices`` and ``+urban``
    are options of the ``DBKRegressor`` family (:func:`noise_options`), and a model without the
    option is recorded as failed with that reason.
    ``time`` gives every model the input ``[x1, x2, t]`` (``t``: the quarter, scaled over the
    train split's quarters as ``geodbk train --time`` does), so that a time-aware DBK is compared
    with time-aware baselines. ``tile_effect`` adds the per-tile offset of
    ``geodbk train --tile-effect`` to every model (each exposes its latent prediction and its
    noise terms; a model without them would be recorded as failed).

    Returns the report dict (also written as JSON). Failures are recorded per (model, seed).
    With ``merge`` the entries of models not in ``models`` are kept from the report on disk,
    re-read at each write (:func:`write_report`), so concurrent runs of different models into
    one run directory keep each other's results (each entry records its own budget and
    creation time).
    """

    run = Path(run)
    seeds = [0] if not seeds else list(seeds)
    try:
        check_preset(preset)
    except ValueError as exc:
        raise DataError(str(exc)) from None
    check_noise_model(noise)  # before the data are read: a typo is an error, not 12 failures
    check_distinct("--models", "model", models)
    check_budget(
        epochs=epochs,
        seeds=seeds,
        batch_size=batch_size,
        rank=rank,
        hidden=hidden,
        threads=threads,
        timeout=timeout,
    )
    check_overrides(
        models,
        overrides,
        epochs=epochs,
        batch_size=batch_size,
        rank=rank,
        hidden=hidden,
        preset=preset,
    )
    data = load_benchmark_data(run, target, time=time, tiles=tile_effect)
    sweeps = resolve_sweeps(
        models,
        sweeps,
        overrides,
        preset=preset,
        has_val=bool((data["split"] == "val").any()),
        epochs=epochs,
    )
    for name, options in sweeps.items():
        option, values = next(iter(options.items()))
        for value in values:
            check_overrides(
                [name],
                {name: {**((overrides or {}).get(name) or {}), option: value}},
                epochs=epochs,
                batch_size=batch_size,
                rank=rank,
                hidden=hidden,
                preset=preset,
            )
    rows = {s: int((data["split"] == s).sum()) for s in ("train", "val", "test")}
    rows["test_urban"] = int(((data["split"] == "test") & data["urban"]).sum())
    rows["test_rural"] = int(((data["split"] == "test") & ~data["urban"]).sum())
    report: dict[str, Any] = {
        "target": target,
        "run": str(run),
        "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command
        or f"geodbk benchmark --run {run} --target {target} --models {','.join(models)}",
        "budget": {
            "epochs": epochs,
            "batch_size": batch_size,
            "rank": rank,
            "hidden": hidden,
            "seeds": seeds,
            "threads": threads,
            "device": device,
            "noise": noise,
            "time": time,
            "tile_effect": tile_effect,
            "preset": preset,
        },
        "preset": preset,
        "protocol": protocol,
        "sweeps": sweeps,
        "rows": rows,
        "tiles_metadata": tiles_metadata(run),
        "inputs": ["x1", "x2", "t"] if time else ["x1", "x2"],
        "machine": machine_info(threads, device),
        "models": {},
    }
    if time:
        report["time_range"] = [str(q) for q in data["time_range"]]
    kwargs = {
        "epochs": epochs,
        "batch_size": batch_size,
        "rank": rank,
        "hidden": hidden,
        "device": device,
        "threads": threads,
        "noise": noise,
        "tile_effect": tile_effect,
        "fewer_tests_lower": target_info(target).higher_is_better,
        "preset": preset,
    }
    out_dir = run / "benchmark"
    stem = target if protocol is None else f"{target}_{protocol}"
    if merge:
        _read_models(out_dir / f"{stem}.json")  # an unreadable report fails before any training
        check_same_tiles(out_dir / f"{stem}.json", report["tiles_metadata"])
    for name in models:
        model_overrides = dict((overrides or {}).get(name) or {})
        sweep = None
        refused = options_refused(name, data, kwargs, model_overrides)
        if refused is not None:  # the same for every seed and swept value: recorded once
            log.warning("benchmark %s not run: %s", name, refused)
            runs: list[dict[str, Any]] = []
            failures: list[dict[str, Any]] = [{"seed": None, "reason": refused}]
        elif name in sweeps:
            option, values = next(iter(sweeps[name].items()))
            runs, failures, model_overrides, sweep = _run_sweep(
                name, option, values, seeds, data, kwargs, model_overrides, isolate, timeout
            )
        else:
            runs, failures = _run_seeds(
                name,
                seeds,
                data,
                {**kwargs, "overrides": model_overrides or None},
                isolate,
                timeout,
            )
        status = "ok" if not failures else ("failed" if not runs else "partial")
        report["models"][name] = {
            "status": status,
            "budget": dict(report["budget"]),
            "preset": preset,
            "overrides": model_overrides,
            "hyperparameters": _entry_hyperparameters(
                name, runs, seed=seeds[0], overrides=model_overrides, **kwargs
            ),
            "created": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "runs": runs,
            "failures": failures,
            "summary": summarise(runs) if runs else None,
        }
        if sweep is not None:
            report["models"][name]["sweep"] = sweep
        # Write after every model so a long benchmark leaves usable partial results.
        write_report(out_dir, stem, report, merge=merge, own=set(models))
    return report


def _read_models(path: Path) -> dict[str, Any]:
    """The model entries of the report at ``path`` (canonical metric names), or ``{}``."""
    if not path.is_file():
        return {}
    try:
        kept = json.loads(path.read_text(encoding="utf-8")).get("models", {})
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot merge into an unreadable report ({exc})") from exc
    return canonical_keys(kept)


def check_same_tiles(path: Path, tiles: dict[str, Any]) -> None:
    """Raise a ``DataError`` when the report at ``path`` scored its models on the tiles of
    another ingest or split than ``tiles`` (:func:`tiles_metadata`): ``--merge`` would put
    models scored on different test rows in one table. A report without ``tiles_metadata``
    (written before it was recorded) is not checked."""
    if not path.is_file():
        return
    try:
        before = json.loads(path.read_text(encoding="utf-8")).get("tiles_metadata")
    except (OSError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: cannot merge into an unreadable report ({exc})") from exc
    if not isinstance(before, dict):
        return
    keys = ("ingest_id", "split")
    if all(before.get(k) == tiles.get(k) for k in keys):
        return

    def split_words(info: dict[str, Any]) -> str:
        split = info.get("split")
        split = split if isinstance(split, dict) else {}
        return (
            f"ingest {info.get('ingest_id')}, split: {split.get('kind')}, seed {split.get('seed')}"
        )

    raise DataError(
        f"{path} scored its models on the tiles of {split_words(before)}, but "
        f"{path.parents[1] / 'tiles.parquet'} is {split_words(tiles)}; --merge would "
        "put models scored on different test rows in one table: benchmark every model again "
        "without --merge (the report is replaced), or use another run directory"
    )


def write_report(
    out_dir: Path, stem: str, report: dict[str, Any], *, merge: bool, own: set[str]
) -> None:
    """Write ``report`` as ``OUT_DIR/STEM.{json,md}`` atomically.

    With ``merge`` the entries of models not in ``own`` are re-read from the report on disk
    at each write, under an exclusive ``flock`` on ``RUN/.locks/benchmark_STEM.lock`` (waiting
    for it): several processes that benchmark different models into one run directory
    (``--merge``) keep each other's results.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{stem}.json"
    with contextlib.ExitStack() as held:
        if merge:
            locks = out_dir.parent / ".locks"
            locks.mkdir(exist_ok=True)
            lock = held.enter_context(open(locks / f"benchmark_{stem}.lock", "a", encoding="utf-8"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            others = {k: v for k, v in _read_models(json_path).items() if k not in own}
            report["models"] = {**others, **{k: v for k, v in report["models"].items() if k in own}}
        atomic_write_json(json_path, report)
        atomic_write_text(out_dir / f"{stem}.md", render_markdown(report))


def _run_seeds(
    name: str,
    seeds: list[int],
    data: dict[str, np.ndarray],
    kw: dict[str, Any],
    isolate: bool,
    timeout: float | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train and score ``name`` for every seed (:func:`run_one` with ``kw``); (runs, failures)."""
    runs: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    for seed in seeds:
        log.info("benchmark %s seed %d ...", name, seed)
        if isolate:
            msg = run_isolated(name, seed, data, timeout=timeout, **kw)
        else:
            try:
                msg = {"ok": True, "result": run_one(name, seed, data, **kw)}
            except Exception as exc:
                msg = {"ok": False, "reason": f"{type(exc).__name__}: {exc}"}
        if msg["ok"]:
            runs.append(msg["result"])
            r = msg["result"]
            log.info(
                "  %s seed %d: test NLL %.4f, %.1f s",
                name,
                seed,
                r["metrics"]["all"][NLL],
                r["train_seconds"],
            )
        else:
            failures.append({"seed": seed, "reason": msg["reason"]})
            log.warning("  %s seed %d failed: %s", name, seed, msg["reason"])
    return runs, failures


def options_refused(
    name: str, data: dict[str, np.ndarray], kwargs: dict[str, Any], overrides: dict[str, Any]
) -> str | None:
    """Why ``name`` cannot run with the benchmark's options (its noise, ``overrides``, a
    ``max_n`` below the train rows) whatever the seed or swept value, from building it without
    training (:func:`noise_options`), or ``None``."""
    try:
        model = build_model(
            name,
            **{k: kwargs[k] for k in ("epochs", "batch_size", "rank", "hidden", "device")},
            seed=0,
            overrides=overrides or None,
            preset=kwargs["preset"],
        )
        noise_options(name, model, kwargs["noise"], data)
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"
    n_train = int((data["split"] == "train").sum())
    max_n = getattr(model, "max_n", None)
    if max_n is not None and n_train > max_n:
        return (
            f"ProblemTooLargeError: {name}: {n_train} training points exceed max_n={max_n} "
            f"(O(n³) time, O(n²) memory); use a scalable model or raise the limit with "
            f"--set {name}.max_n={n_train}"
        )
    return None


def _run_sweep(
    name: str,
    option: str,
    values: list[Any],
    seeds: list[int],
    data: dict[str, np.ndarray],
    kwargs: dict[str, Any],
    overrides: dict[str, Any],
    isolate: bool,
    timeout: float | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Train ``name`` once per value of ``option`` (every seed) and keep the value with the
    lowest validation NLL (mean over the seeds that ran).

    Returns the chosen value's (runs, failures), the overrides it ran with, and the sweep's
    record ``{"option", "values", "criterion", "chosen", "by_value": [{"value", "status",
    "val_nll", "test_nll", "failures"}]}``. No value that ran: ``chosen`` is ``None`` and the
    first value's failures are returned, with ``overrides`` as they were.
    """
    tried = []
    for value in values:
        used = {**overrides, option: value}
        runs, failures = _run_seeds(
            name, seeds, data, {**kwargs, "overrides": used}, isolate, timeout
        )
        val = _mean_sd([r.get("val_nll") for r in runs])["mean"]
        tried.append((value, used, runs, failures, val))
        log.info("  %s %s=%r: val NLL %s", name, option, value, val)
    ran = [t for t in tried if t[4] is not None]
    best = min(ran, key=lambda t: math.inf if t[4] is None else t[4]) if ran else tried[0]
    if not ran:  # the first value's failures, under the options without the swept one
        best = (None, overrides, *tried[0][2:])
    record = {
        "option": option,
        "values": list(values),
        "criterion": "lowest validation NLL, mean over seeds",
        "chosen": best[0] if ran else None,
        "by_value": [
            {
                "value": value,
                "status": "ok" if not fails else ("failed" if not runs else "partial"),
                "val_nll": val,
                "test_nll": _mean_sd([r["metrics"]["all"].get(NLL) for r in runs])["mean"],
                "failures": fails,
            }
            for value, _, runs, fails, val in tried
        ],
    }
    return best[2], best[3], best[1], record


def resolve_sweeps(
    models: list[str],
    sweeps: dict[str, dict[str, list[Any]]] | None,
    overrides: dict[str, dict[str, Any]] | None,
    *,
    preset: str,
    has_val: bool,
    epochs: int | None = None,
) -> dict[str, dict[str, list[Any]]]:
    """The sweeps to run: ``sweeps`` (``--sweep MODEL.OPTION=V1,V2,...``), plus, with the
    ``paper`` preset, each model's paper grid (:data:`PAPER_SWEEPS`: PP-DKL's β over {0, 0.01,
    0.1, 1}, CaGP's lr over {1, 0.1, 0.01}) unless that option is given by ``--set``, the
    model by ``--sweep`` or the model trains no epoch (``--set MODEL.epochs=0``, else
    ``epochs``, the budget's): every value would give the same untrained model. One option per
    model; a sweep of more than one value needs the val split (it picks by validation NLL), and
    a sweep of a paper grid's option (training only) needs at least one epoch."""
    out = {name: dict(options) for name, options in (sweeps or {}).items()}

    def untrained(name: str) -> bool:
        return ((overrides or {}).get(name) or {}).get("epochs", epochs) == 0

    for name, options in out.items():
        if name not in models:
            raise DataError(
                f"--sweep {name}.{next(iter(options))}: {name} is not among --models "
                f"({', '.join(models)})"
            )
        if len(options) != 1:
            raise DataError(f"--sweep: one option per model, got {', '.join(options)} for {name}")
        option, values = next(iter(options.items()))
        if option == "seed":
            raise DataError(seed_option_refused("--sweep", name))
        if not values:
            raise DataError(f"--sweep {name}.{option}: give at least one value")
        if option in ((overrides or {}).get(name) or {}):
            raise DataError(f"{name}.{option} is given by both --set and --sweep; give one")
        if untrained(name) and PAPER_SWEEPS.get(name, ("",))[0] == option and len(values) > 1:
            raise DataError(
                f"--sweep {name}.{option}: {name} is given epochs 0, so it is not trained and "
                f"every {option} gives the same model; give {name}.epochs of at least 1 or "
                "drop the sweep"
            )
    for name, (option, grid) in PAPER_SWEEPS.items() if preset == "paper" else ():
        given = option in ((overrides or {}).get(name) or {})
        if name in models and name not in out and not given:
            if untrained(name):
                log.info("%s trains no epoch: its %s is not swept", name, option)
                continue
            out[name] = {option: list(grid)}
    many = [n for n, o in out.items() if len(next(iter(o.values()))) > 1]
    if many and not has_val:
        raise DataError(
            f"the sweep of {', '.join(many)} picks by validation NLL, but the val split is "
            "empty; give one value (e.g. --sweep pp-dkl.beta=1) or --set the option"
        )
    return out


def _entry_hyperparameters(
    name: str,
    runs: list[dict[str, Any]],
    *,
    seed: int,
    overrides: dict[str, Any] | None,
    **kwargs: Any,
) -> dict[str, Any]:
    """A model entry's hyperparameters: those its first successful run trained with (after the
    noise option), else those of the model as built (every seed failed). ``seed`` is left out:
    the seeds are the budget's."""
    if runs:
        params = dict(runs[0]["hyperparameters"])
    else:
        built = model_kwargs(
            name,
            epochs=kwargs["epochs"],
            batch_size=kwargs["batch_size"],
            seed=seed,
            rank=kwargs["rank"],
            hidden=kwargs["hidden"],
            device=kwargs["device"],
            overrides=overrides,
            preset=kwargs["preset"],
        )
        try:
            params = model_hyperparameters(CONSTRUCTORS[name](**built), built)
        except (TypeError, ValueError):
            params = model_hyperparameters(None, built)
    params.pop("seed", None)
    return params


# ---------------------------------------------------------------------------------- CLI
def _int_list(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from exc


def parse_settings(items: list[str]) -> dict[str, dict[str, Any]]:
    """``["cagp.epochs=3", "softki.lr=0.02"]`` → ``{"cagp": {"epochs": 3}, "softki": {"lr": 0.02}}``.

    Values are parsed as JSON when possible (numbers, true/false, null), else kept as strings.
    """
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        model, dot, option = key.partition(".")
        if not sep or not dot or not model or not option:
            raise DataError(f"--set expects MODEL.OPTION=VALUE, got {item!r}")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out.setdefault(model.strip().lower(), {})[option.strip()] = value
    return out


def parse_sweeps(items: list[str]) -> dict[str, dict[str, list[Any]]]:
    """``["pp-dkl.beta=0,0.01,0.1,1"]`` → ``{"pp-dkl": {"beta": [0, 0.01, 0.1, 1]}}``.

    Each comma-separated value is parsed as JSON when possible, else kept as a string.
    """
    out: dict[str, dict[str, list[Any]]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        model, dot, option = key.partition(".")
        if not sep or not dot or not model or not option:
            raise DataError(f"--sweep expects MODEL.OPTION=V1,V2,..., got {item!r}")
        values: list[Any] = []
        for text in (t.strip() for t in raw.split(",")):
            if not text:
                continue
            try:
                values.append(json.loads(text))
            except json.JSONDecodeError:
                values.append(text)
        out.setdefault(model.strip().lower(), {})[option.strip()] = values
    return out


def register(subparsers: Any) -> None:
    """Add the ``benchmark`` sub-command."""
    p = stage_parser(
        subparsers,
        "benchmark",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
        **FITTING,
    )
    p.add_argument(
        "--models", help="comma-separated model names, or 'all' (required without --protocol)"
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epoch budget for every model (default 20; a protocol's own, e.g. 400)",
    )
    p.add_argument("--seeds", type=_int_list, default=[0], help="comma-separated seeds (default 0)")
    p.add_argument("--batch-size", type=int, default=1024, help="mini-batch size (default 1024)")
    p.add_argument("--rank", type=int, default=256, help="r / inducing points / m (default 256)")
    p.add_argument("--hidden", type=int, default=64, help="backbone width h (default 64)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads per model (default: torch's)"
    )
    p.add_argument(
        "--device", choices=["cpu", "cuda", "auto"], default="cpu", help="device (default cpu)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per (model, seed) before it is recorded as failed",
    )
    p.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_false",
        help="run models in this process (no crash isolation)",
    )
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="MODEL.OPTION=VALUE",
        help="per-model option override, e.g. --set cagp.epochs=3 --set softki.lr=0.02 (repeatable)",
    )
    p.add_argument(
        "--noise",
        choices=list(NOISE_MODELS),
        default=None,
        help="observation noise for every model: constant s2, or tests-aware "
        "s2_floor + s2_meas/tests (every model); tests+devices and +urban (a floor per "
        "urban/rural class) for the DBKRegressor family (dbk-*, sv-rbf, sv-dkl, pp-dkl, vbll), "
        "recorded as failures for the others (default constant)",
    )
    p.add_argument(
        "--time",
        action="store_true",
        help="every model gets the quarter as a third input t (as geodbk train --time); "
        "default: quarters pooled",
    )
    p.add_argument(
        "--tile-effect",
        action="store_true",
        help="add the per-tile offset of geodbk train --tile-effect (fitted on the val split) to "
        "every model, with its own noise terms rescaled",
    )
    p.add_argument(
        "--preset",
        choices=["paper", "tuned"],
        default=None,
        help="each model's settings: 'paper' (its paper's optimiser, learning rate and "
        "initialisation, as far as the model can express them) or 'tuned' (the project's "
        "settings for short budgets: e.g. initial noise 0.5 for the ELBO/PPGP models); --set "
        "wins over both (default paper; docs/benchmarks/baselines.md, Presets)",
    )
    p.add_argument(
        "--sweep",
        dest="sweeps",
        action="append",
        default=[],
        metavar="MODEL.OPTION=V1,V2,...",
        help="train MODEL once per value of OPTION and keep the value with the lowest "
        "validation NLL, e.g. --sweep pp-dkl.beta=0,0.01,0.1,1 (repeatable, one option per "
        "model); with --preset paper PP-DKL's beta is swept over the DBK paper's grid "
        "{0, 0.01, 0.1, 1} and CaGP's lr over its paper's {1, 0.1, 0.01}, unless --set or "
        "--sweep gives the option",
    )
    p.add_argument(
        "--merge",
        action="store_true",
        help="keep the other models' results in TARGET.json (re-read at each write, so "
        "processes benchmarking different models, e.g. a protocol's models on one GPU, can "
        "share one run directory)",
    )
    p.add_argument(
        "--protocol",
        choices=list(PROTOCOLS),
        default=None,
        help="a paper's protocol with its models and settings fixed, written to "
        "RUN/benchmark/TARGET_PROTOCOL.{json,md}: seed-table2 trains DBK-RBF, SV-RBF and SV-DKL "
        "with the DBK paper's settings (paper preset, 400 epochs, no early stopping, constant "
        "noise) and reports urban/rural MAE, NLL and coverage in its Table 2 layout, with the "
        "spread of the interval widths",
    )


def _main(args: argparse.Namespace) -> int:

    if args.protocol is not None:
        fixed = apply_protocol(
            args.protocol,
            models=args.models,
            epochs=args.epochs,
            preset=args.preset,
            noise=args.noise,
            time=args.time,
            tile_effect=args.tile_effect,
        )
        models, epochs = fixed["models"], fixed["epochs"]
        preset, noise = fixed["preset"], fixed["noise"]
    else:
        if args.models is None:
            raise DataError("give --models (e.g. --models dbk-rbf,sv-dkl or 'all') or --protocol")
        try:
            models = parse_model_list(args.models)
        except ValueError as exc:
            raise DataError(str(exc)) from exc
        epochs = 20 if args.epochs is None else args.epochs
        preset = "paper" if args.preset is None else args.preset
        noise = "constant" if args.noise is None else args.noise
    report = call_with_options(
        run_benchmark,
        args,
        models=models,
        epochs=epochs,
        noise=noise,
        preset=preset,
        sweeps=parse_sweeps(args.sweeps),
        overrides=parse_settings(args.settings),
        command="geodbk " + " ".join(sys.argv[1:]) if sys.argv[1:] else None,
    )
    failed = [n for n, e in report["models"].items() if e["status"] != "ok"]
    stem = args.target if args.protocol is None else f"{args.target}_{args.protocol}"
    print(
        f"wrote {Path(args.run) / 'benchmark' / (stem + '.json')} and .md"
        + (f"; failures recorded for: {', '.join(failed)}" if failed else "")
    )
    print(
        json.dumps(
            {
                n: (e["summary"]["all"][NLL]["mean"] if e["summary"] else None)
                for n, e in report["models"].items()
            }
        )
    )
    return 0
