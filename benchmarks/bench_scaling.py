"""Scaling benchmarks: huge predictive grids and streaming over 10^5..10^7-row tables.

Every measurement runs in a fresh child process and reports its wall time and peak resident
memory (``ru_maxrss``), so the peaks of different sizes do not mix.

* ``grid``: a small DBK-RBF model (r=16, h=8, trained for 2 epochs on 2,000 synthetic rows) is
  evaluated on an N x N lon/lat grid with a polygon mask through the Dask-backed
  :func:`pipelines.lazygrid.grid_dataset` (chunks of 1024 x 1024 cells) and written window by
  window into a tiled, DEFLATE-compressed 14-band GeoTIFF with
  :func:`pipelines.lazygrid.write_grid_geotiff`. Also reports the time of the model evaluation
  alone on one chunk, to split model time from host-side work (mask, post-processing, DEFLATE).
* ``stream``: a synthetic table of N rows (x1, x2, y, split; row groups of 100,000 rows) is
  written to ``/tmp`` and then (a) predicted in one streaming pass
  (:func:`geodbk.geo.parquet_batches.predict_table`), (b) trained on for one streaming epoch
  (:func:`geodbk.streaming.train_streaming`, batch 1024), and (c), for contrast, read as one
  rank's in-memory shard (:func:`geodbk.geo.parquet_shards.read_parquet_shard`, what ``train
  --distributed`` holds per rank).
* ``report``: a synthetic run directory of N rows (N/4 tiles x 4 quarters, 80/10/10 random
  split, tile polygons, row groups of 65,536 rows, a small pooled model) is scored by
  ``geodbk report`` (:func:`pipelines.report.run_report`: streaming passes, no GeoDataFrame)
  and, for contrast, loaded as the GeoDataFrame (:func:`pipelines.rundir.load_tiles`) that the
  in-memory report held before predicting.
* ``model``: DBK-RBF training-step time (dPPGP, one batch, median of 10 after 2 warm-ups) and
  prediction time per point (65,536 points, folded weights) for several (r, h, batch).
  ``--device cuda`` times it on a GPU (median of 50 steps after 2 warm-ups, 2^20 prediction
  points, synchronised, peak ``torch.cuda.max_memory_allocated``); ``--epoch-rows N ...`` also
  times one epoch of ``DBKRegressor.fit`` on N in-memory rows at the last (r, h, batch) for each
  ``--kernel-every K`` (``kernel_update_every``; default 1), and
  ``--map-side N ...`` the model part of an N x N map (:func:`child_map`).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scaling.py grid --sizes 4096 8192
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scaling.py stream --rows 1e5 1e6 1e7
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scaling.py report --rows 1e5 1e6
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_scaling.py model
    python benchmarks/bench_scaling.py model --device cuda --epoch-rows 1e6 1e7 --map-side 16384
    ... [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.benchmark import cpu_model

REPO = Path(__file__).resolve().parents[1]
SCALING = {"lon_min": -125.0, "lon_max": -66.0, "lat_min": 24.0, "lat_max": 50.0}


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _small_model() -> Any:
    from geodbk import DBKRegressor

    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(2000, 2))
    y = 4.5 + 0.4 * np.sin(3 * X[:, 0]) * np.cos(2 * X[:, 1]) + 0.1 * rng.standard_normal(2000)
    return DBKRegressor(rank=16, hidden=8, epochs=2, batch_size=256, device="cpu").fit(X, y)


# ---------------------------------------------------------------- children
def child_grid(size: int, out: Path) -> dict[str, Any]:
    """Predict an N x N grid lazily and write it as a tiled GeoTIFF; return the figures."""
    import shapely

    from geodbk.geo.grids import make_grid
    from pipelines.lazygrid import grid_dataset, write_grid_geotiff
    from pipelines.rundir import scale_lonlat, target_spec

    model = _small_model()
    spec = target_spec("download")
    bounds = (SCALING["lon_min"], SCALING["lat_min"], SCALING["lon_max"], SCALING["lat_max"])
    res = (bounds[2] - bounds[0]) / size
    grid = make_grid(bounds, resolution=res)
    grid = type(grid)(x=grid.x[:size], y=np.linspace(bounds[3], bounds[1], size), dx=res, dy=res)
    # a 10-vertex polygon covering most of the box (realistic mask cost)
    t = np.linspace(0, 2 * np.pi, 11)[:-1]
    cx, cy = (bounds[0] + bounds[2]) / 2, (bounds[1] + bounds[3]) / 2
    region = shapely.Polygon(np.column_stack([cx + 32 * np.cos(t), cy + 15 * np.sin(t)]))
    # model-only throughput on one chunk-sized batch
    lon2, lat2 = np.meshgrid(grid.x[:4096], grid.y[:1024])
    X = scale_lonlat(lon2.ravel(), lat2.ravel(), SCALING)
    t0 = time.perf_counter()
    model.predict_dist(X, chunk_size=65536)
    model_s_per_cell = (time.perf_counter() - t0) / len(X)
    t0 = time.perf_counter()
    ds = grid_dataset(model, spec, grid, scaling=SCALING, thresholds=(25, 100), geometry=region)
    path = write_grid_geotiff(ds, out, fmt="gtiff")
    seconds = time.perf_counter() - t0
    return {
        "size": size,
        "cells": size * size,
        "bands": len(ds.data_vars),
        "seconds": seconds,
        "peak_rss_mib": _peak_mib(),
        "file_mib": path.stat().st_size / 2**20,
        "model_seconds_per_cell": model_s_per_cell,
        "model_seconds_projected": model_s_per_cell * size * size,
    }


def _write_table(path: Path, rows: int, group: int = 100_000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    writer = None
    try:
        for start in range(0, rows, group):
            m = min(group, rows - start)
            x = rng.uniform(-1, 1, size=(m, 2))
            y = 4.0 + 0.5 * np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.1 * rng.standard_normal(m)
            split = np.where(rng.random(m) < 0.9, "train", "val")
            table = pa.table({"x1": x[:, 0], "x2": x[:, 1], "y": y, "split": split})
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table, row_group_size=group)
    finally:
        if writer is not None:
            writer.close()


def child_stream(rows: int, phase: str, src: Path) -> dict[str, Any]:
    """One streaming phase over a table of ``rows`` rows."""
    import pyarrow.compute as pc
    import torch

    from geodbk.geo.parquet_batches import ParquetRowGroups, count_rows, predict_table
    from geodbk.geo.parquet_shards import read_parquet_shard
    from geodbk.hyperparameters import DBKHyperparameters
    from geodbk.model import DBKModel
    from geodbk.streaming import train_streaming
    from geodbk.training import LoopConfig

    t0 = time.perf_counter()
    train = pc.field("split") == "train"
    if phase == "predict":
        model = _small_model()
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            n = predict_table(model, src, Path(tmp) / "pred.parquet", keep_columns=["y"])
    elif phase == "train_epoch":
        torch.manual_seed(0)
        model = DBKModel(2, rank=16, hidden=8, generator=torch.Generator().manual_seed(0))
        cfg = LoopConfig.of(DBKHyperparameters(batch_size=1024, epochs=1, lr=1e-3, seed=0))
        n = count_rows(src, filters=train)
        train_streaming(
            model,
            ParquetRowGroups(src, filters=train),
            x_columns=["x1", "x2"],
            y_column="y",
            y_mean=4.0,
            y_std=0.3,
            config=cfg,
            n_global=n,
        )
    elif phase == "shard_in_memory":
        data = read_parquet_shard(src, columns=["x1", "x2", "y"], rank=0, world_size=1)
        n = len(data["y"])
    else:
        raise ValueError(phase)
    return {
        "rows": rows,
        "phase": phase,
        "rows_processed": n,
        "seconds": time.perf_counter() - t0,
        "peak_rss_mib": _peak_mib(),
    }


def _write_run(run: Path, rows: int) -> None:
    """A run directory of ``rows`` tile-quarters (``tiles.parquet``, region, download model)."""
    import geopandas as gpd
    import pandas as pd
    import shapely

    from geodbk import DBKRegressor
    from geodbk.geo.table import write_tile_table

    quarters = ("2023Q1", "2023Q2", "2023Q3", "2023Q4")
    rng = np.random.default_rng(0)
    n_tiles = rows // len(quarters)
    box = (-158.3, 21.2, -157.6, 21.75)
    scaling = dict(zip(("lon_min", "lat_min", "lon_max", "lat_max"), box, strict=True))
    lon = rng.uniform(box[0], box[2], n_tiles)
    lat = rng.uniform(box[1], box[3], n_tiles)
    x1 = 2 * (lon - box[0]) / (box[2] - box[0]) - 1
    x2 = 2 * (lat - box[1]) / (box[3] - box[1]) - 1
    urban = x1 + x2 > 0.4
    quadkey = np.char.zfill(np.arange(n_tiles).astype(str), 16).astype(object)
    half = 0.0005
    geometry = shapely.box(lon - half, lat - half, lon + half, lat + half)
    parts = []
    for q in quarters:
        logs = {
            name: base + 0.4 * np.sin(2 * x1) + 0.2 * urban + 0.3 * rng.standard_normal(n_tiles)
            for name, base in (("download", 4.4), ("upload", 3.7), ("latency", 1.6))
        }
        parts.append(
            pd.DataFrame(
                {
                    "quadkey": quadkey,
                    "quarter": q,
                    "lon": lon,
                    "lat": lat,
                    "x1": x1,
                    "x2": x2,
                    "avg_d_kbps": 10 ** logs["download"],
                    "avg_u_kbps": 10 ** logs["upload"],
                    "avg_lat_ms": 10 ** logs["latency"],
                    "tests": rng.integers(1, 50, n_tiles),
                    "devices": rng.integers(1, 20, n_tiles),
                    "log10_download": logs["download"],
                    "log10_upload": logs["upload"],
                    "log10_latency": logs["latency"],
                    "urban": urban,
                    "split": rng.choice(["train", "val", "test"], n_tiles, p=[0.8, 0.1, 0.1]),
                }
            )
        )
    df = pd.concat(parts, ignore_index=True)
    table = gpd.GeoDataFrame(df, geometry=np.tile(geometry, len(quarters)), crs="EPSG:4326")
    meta = {
        "scaling": scaling,
        "split": {"kind": "random", "seed": 0, "unit": "row"},
        "quarters": list(quarters),
        "type": "mobile",
    }
    run.mkdir(parents=True, exist_ok=True)
    write_tile_table(table, run / "tiles.parquet", meta)
    region = gpd.GeoDataFrame({"name": ["box"]}, geometry=[shapely.box(*box)], crs="EPSG:4326")
    region.to_file(run / "region.geojson", driver="GeoJSON")
    model = DBKRegressor(rank=16, hidden=8, epochs=2, batch_size=256, device="cpu")
    fit = df.iloc[rng.choice(len(df), 2000, replace=False)]
    model.fit(fit[["x1", "x2"]].to_numpy(), fit["log10_download"].to_numpy())
    md = {"target": "download", "inputs": ["x1", "x2"], "config": {"predict_chunk_size": 65536}}
    model.save(run / "models" / "download", metadata=md)


def _status_mib(key: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of this process from ``/proc/self/status`` (None off Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def child_report(rows: int, phase: str, run: Path) -> dict[str, Any]:
    """``report``: :func:`pipelines.report.run_report`; ``load_tiles``: the GeoDataFrame only.

    Both import the same modules first; the peak RSS of the phase alone (``phase_peak_rss_mib``)
    is ``VmHWM`` after resetting it (``/proc/self/clear_refs``) once the imports are done.
    """
    import geopandas  # noqa: F401
    import pyarrow.dataset  # noqa: F401
    import torch  # noqa: F401

    import geodbk.estimator  # noqa: F401
    import pipelines.predict  # noqa: F401
    from pipelines.report import run_report
    from pipelines.rundir import RunDir, load_tiles

    before = _status_mib("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")  # reset VmHWM to the current RSS
        resettable = True
    except OSError:
        resettable = False
    t0 = time.perf_counter()
    if phase == "report":
        run_report(run, target="download")
    elif phase == "load_tiles":
        load_tiles(RunDir(run))
    else:
        raise ValueError(phase)
    return {
        "rows": rows,
        "phase": phase,
        "seconds": time.perf_counter() - t0,
        "peak_rss_mib": _peak_mib(),
        "rss_before_mib": before,
        "phase_peak_rss_mib": _status_mib("VmHWM") if resettable else None,
    }


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak_device_mib(device: str) -> float:
    import torch

    if device.startswith("cuda"):
        return float(torch.cuda.max_memory_allocated()) / 2**20
    return _peak_mib()


def _gpu_name(device: str) -> str | None:
    if not device.startswith("cuda"):
        return None
    import torch

    return str(torch.cuda.get_device_name(0))


def child_model(rank: int, hidden: int, batch: int, device: str = "cpu") -> dict[str, Any]:
    """Training-step time (dPPGP, one batch) and prediction time per point of DBK-RBF.

    On CUDA every timed region ends with ``torch.cuda.synchronize()``; the peak memory is then
    ``torch.cuda.max_memory_allocated`` (MiB) instead of the process's peak RSS.
    """
    import torch

    from geodbk.hyperparameters import DBKHyperparameters
    from geodbk.model import DBKModel
    from geodbk.training import LoopConfig, _make_optimizer, batch_loss

    torch.manual_seed(0)
    model = DBKModel(2, rank=rank, hidden=hidden, generator=torch.Generator().manual_seed(0))
    model = model.to(device)
    cfg = LoopConfig.of(DBKHyperparameters(batch_size=batch))
    opt = _make_optimizer(model, cfg)
    x = (torch.rand(batch, 2) * 2 - 1).to(device)
    y = torch.randn(batch).to(device)
    times = []
    for i in range(12 if device == "cpu" else 52):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        batch_loss(model, x, y, n=10**6, config=cfg).backward()
        opt.step()
        _sync(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    model.eval()
    folded = model.fold()
    n_pred = 65536 if device == "cpu" else 2**20
    xp = (torch.rand(n_pred, 2) * 2 - 1).to(device)
    with torch.no_grad():
        model.predict_folded(xp[:1024], folded)
        _sync(device)
        t0 = time.perf_counter()
        model.predict_folded(xp, folded)
        _sync(device)
        pred_s = (time.perf_counter() - t0) / len(xp)
    return {
        "rank": rank,
        "hidden": hidden,
        "batch": batch,
        "device": device,
        "step_ms_median": 1e3 * float(np.median(times)),
        "predict_us_per_point": 1e6 * pred_s,
        "predict_points": n_pred,
        "peak_mib": _peak_device_mib(device),
    }


def child_epoch(
    rows: int, rank: int, hidden: int, batch: int, device: str, kernel_update_every: int = 1
) -> dict[str, Any]:
    """Seconds per epoch of ``DBKRegressor.fit`` on ``rows`` in-memory rows (tests-aware).

    Two epochs on synthetic 2-D rows with a 10% validation set; the second epoch's seconds
    (training pass + validation NLL, as recorded in the history) is the figure, so CUDA start-up
    and the first epoch's allocations are excluded.
    """
    from geodbk import DBKRegressor

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(rows, 2))
    tests = rng.integers(1, 30, size=rows).astype(np.float64)
    y = 4.0 + 0.5 * np.sin(3 * x[:, 0]) + rng.standard_normal(rows) * np.sqrt(0.01 + 0.2 / tests)
    n_val = rows // 10
    est = DBKRegressor(
        rank=rank,
        hidden=hidden,
        batch_size=batch,
        epochs=2,
        device=device,
        noise="tests",
        seed=0,
        kernel_update_every=kernel_update_every,
    )
    t0 = time.perf_counter()
    est.fit(
        x[n_val:], y[n_val:], x[:n_val], y[:n_val], tests=tests[n_val:], tests_val=tests[:n_val]
    )
    total = time.perf_counter() - t0
    return {
        "rows": rows,
        "rank": rank,
        "hidden": hidden,
        "batch": batch,
        "device": device,
        "kernel_update_every": kernel_update_every,
        "steps_per_epoch": -(-(rows - n_val) // batch),
        "epoch_s": float(est.history_[-1]["seconds"]),
        "fit_s_two_epochs": total,
        "peak_mib": _peak_device_mib(device),
    }


def child_map(side: int, rank: int, hidden: int, device: str, cap_s: float) -> dict[str, Any]:
    """Seconds for the model part of a ``side`` x ``side`` map of the area and tile quantities.

    A DBK-RBF model (``rank``, ``hidden``; one epoch on 4,096 synthetic rows: the cost of a
    prediction does not depend on the weights) is evaluated on the grid's cell centres in
    blocks of about 2^20 cells through :func:`geodbk.quantities.predict_quantity` (the code
    ``geodbk predict`` runs per block), and each block's mean, sd and the exceedance
    probability ``P(y <= 1)`` (:func:`geodbk.exceedance.exceedance_probability`) are stored as
    float32 host arrays. The
    region mask and the file writes are not included. A pass stops once it has run ``cap_s``
    seconds; the cells it reached are reported.
    """
    from geodbk import DBKRegressor
    from geodbk.exceedance import exceedance_probability
    from geodbk.quantities import predict_quantity

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(4096, 2))
    y = 1.0 + 0.5 * np.sin(3 * x[:, 0]) + 0.1 * rng.standard_normal(4096)
    model = DBKRegressor(rank=rank, hidden=hidden, epochs=1, device=device, seed=0).fit(x, y)
    axis = np.linspace(-1, 1, side)
    rows_per_block = max(1, 2**20 // side)
    block = 2**20
    out: dict[str, Any] = {
        "side": side,
        "cells": side * side,
        "rank": rank,
        "hidden": hidden,
        "device": device,
    }
    predict_quantity(model, x[:1024], quantity="area")  # warm-up: kernels, allocator
    for quantity in ("area", "tile"):
        mean = np.empty((side, side), dtype=np.float32)
        sd = np.empty((side, side), dtype=np.float32)
        below = np.empty((side, side), dtype=np.float32)
        t0 = time.perf_counter()
        done = 0
        for start in range(0, side, rows_per_block):
            rows = slice(start, min(side, start + rows_per_block))
            lat = np.repeat(axis[rows], side)
            lon = np.tile(axis, rows.stop - rows.start)
            q = predict_quantity(
                model, np.column_stack([lon, lat]), quantity=quantity, chunk_size=block
            )
            mean[rows] = q.mean.reshape(-1, side)
            sd[rows] = q.sd.reshape(-1, side)
            below[rows] = exceedance_probability(q.mean, q.sd, 1.0, above=False).reshape(-1, side)
            done = rows.stop
            if time.perf_counter() - t0 > cap_s:
                break
        seconds = time.perf_counter() - t0
        out[f"{quantity}_cells_done"] = done * side
        out[f"{quantity}_s"] = seconds
        out[f"{quantity}_cells_per_s"] = done * side / seconds
    out["peak_mib"] = _peak_device_mib(device)
    out["host_peak_rss_mib"] = _peak_mib()
    return out


# ---------------------------------------------------------------- driver
def _run_child(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    proc = subprocess.run(
        [sys.executable, __file__, "_child", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the chosen benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid", help="N x N grid: lazy predict + windowed GeoTIFF")
    g.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    g.add_argument("--out", type=Path, default=None)
    s = sub.add_parser("stream", help="streaming passes over 1e5..1e7-row tables")
    s.add_argument("--rows", type=float, nargs="+", default=[1e5, 1e6, 1e7])
    s.add_argument("--phases", nargs="+", default=["predict", "train_epoch", "shard_in_memory"])
    s.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    s.add_argument("--out", type=Path, default=None)
    rp = sub.add_parser("report", help="peak memory of `geodbk report` on 1e5..1e6-row runs")
    rp.add_argument("--rows", type=float, nargs="+", default=[1e5, 1e6])
    rp.add_argument("--phases", nargs="+", default=["report", "load_tiles"])
    rp.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    rp.add_argument("--out", type=Path, default=None)
    m = sub.add_parser("model", help="DBK-RBF step and prediction cost as r and h grow")
    m.add_argument(
        "--configs",
        nargs="+",
        default=["16:8:1024", "256:64:1024", "1024:256:1024"],
        help="rank:hidden:batch triples",
    )
    m.add_argument("--device", default="cpu", help="cpu or cuda")
    m.add_argument(
        "--epoch-rows",
        type=float,
        nargs="*",
        default=[],
        help="also time one epoch of DBKRegressor.fit (rank, hidden, batch of the last config)",
    )
    m.add_argument(
        "--kernel-every",
        type=int,
        nargs="+",
        default=[1],
        help="the epochs' kernel_update_every values, one process each (1: the kernel "
        "steps on every batch)",
    )
    m.add_argument(
        "--map-side",
        type=int,
        nargs="*",
        default=[],
        help="also time the model part of an N x N map (area and tile quantities, "
        "last config's rank and hidden)",
    )
    m.add_argument("--map-cap-s", type=float, default=300.0, help="stop a map pass after S s")
    m.add_argument("--out", type=Path, default=None)
    c = sub.add_parser("_child")
    c.add_argument("what")
    c.add_argument("rest", nargs="*")
    args = parser.parse_args(argv)

    if args.cmd == "_child":
        if args.what == "grid":
            size, out = int(args.rest[0]), Path(args.rest[1])
            result = child_grid(size, out)
        elif args.what == "model":
            r, h, b = (int(v) for v in args.rest[:3])
            result = child_model(r, h, b, args.rest[3] if len(args.rest) > 3 else "cpu")
        elif args.what == "epoch":
            rows, r, h, b = (int(float(v)) for v in args.rest[:4])
            result = child_epoch(rows, r, h, b, args.rest[4], int(args.rest[5]))
        elif args.what == "map":
            side, r, h = (int(v) for v in args.rest[:3])
            result = child_map(side, r, h, args.rest[3], float(args.rest[4]))
        elif args.what == "write_run":
            _write_run(Path(args.rest[1]), int(args.rest[0]))
            result = {"rows": int(args.rest[0])}
        elif args.what == "report":
            result = child_report(int(args.rest[0]), args.rest[1], Path(args.rest[2]))
        else:
            result = child_stream(int(args.rest[0]), args.rest[1], Path(args.rest[2]))
        print(json.dumps(result))
        return 0

    machine = {
        "cpu": cpu_model(),
        "nproc": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "python": platform.python_version(),
        "gpu": _gpu_name(getattr(args, "device", "cpu")),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results: list[dict[str, Any]] = []
    if args.cmd == "grid":
        with tempfile.TemporaryDirectory() as tmp:
            for size in args.sizes:
                r = _run_child(["grid", str(size), str(Path(tmp) / f"grid{size}.tif")])
                print(json.dumps(r), flush=True)
                results.append(r)
    elif args.cmd == "model":
        for triple in args.configs:
            r = _run_child(["model", *triple.split(":"), args.device])
            print(json.dumps(r), flush=True)
            results.append(r)
        for rows in args.epoch_rows:
            for every in args.kernel_every:
                r = _run_child(
                    ["epoch", str(int(rows)), *args.configs[-1].split(":"), args.device, str(every)]
                )
                print(json.dumps(r), flush=True)
                results.append(r)
        for side in args.map_side:
            rank, hidden = args.configs[-1].split(":")[:2]
            r = _run_child(["map", str(side), rank, hidden, args.device, str(args.map_cap_s)])
            print(json.dumps(r), flush=True)
            results.append(r)
    elif args.cmd == "report":
        for rows_f in args.rows:
            rows = int(rows_f)
            run = args.tmp / f"geodbk_report_{rows}"
            if not (run / "models" / "download" / "model.json").is_file():
                # in a child too: a big parent would inflate the children's ru_maxrss (Linux
                # folds the forked image's RSS into it at exec)
                t0 = time.perf_counter()
                _run_child(["write_run", str(rows), str(run)])
                print(f"wrote {run} in {time.perf_counter() - t0:.1f} s", flush=True)
            for phase in args.phases:
                r = _run_child(["report", str(rows), phase, str(run)])
                print(json.dumps(r), flush=True)
                results.append(r)
    else:
        args.tmp.mkdir(parents=True, exist_ok=True)
        for rows_f in args.rows:
            rows = int(rows_f)
            src = args.tmp / f"geodbk_stream_{rows}.parquet"
            if not src.exists():
                t0 = time.perf_counter()
                _write_table(src, rows)
                print(f"wrote {src} in {time.perf_counter() - t0:.1f} s", flush=True)
            for phase in args.phases:
                r = _run_child(["stream", str(rows), phase, str(src)])
                print(json.dumps(r), flush=True)
                results.append(r)
    doc = {"machine": machine, "benchmark": args.cmd, "results": results}
    if args.out is not None:
        args.out.write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc["machine"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
