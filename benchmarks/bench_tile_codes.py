"""Tile ids as strings against a ``pandas.Categorical`` of codes (``tile_codes``) on a map.

1. The in-region cells of the first blocks of ``geodbk predict``'s grid of about ``--cells``
   cells (up to ``--block-cells`` of them): naming their zoom-16 tiles
   (:func:`pipelines.run_inputs.tile_ids` against :func:`~pipelines.run_inputs.tile_codes`)
   and the local layer's prediction with each (best of 3, the same numbers checked).
2. The whole tile map (``run_predict --quantity tile``) in one process, ``--calls`` times each,
   alternating strings and codes, after a cold call::

    OMP_NUM_THREADS=2 PYTHONPATH=.:benchmarks python benchmarks/bench_tile_codes.py \\
        --run runs/hi3 --target download --cells 12000000

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench_tile_maps import _resolution

import pipelines.predict as predict
from geodbk.geo.grids import region_mask
from pipelines.allocator import keep_freed_memory
from pipelines.bundles import load_model
from pipelines.layers import load_map_layers
from pipelines.run_inputs import tile_codes, tile_ids
from pipelines.rundir import RunDir


def _best(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """Best wall time of ``repeats`` calls and the last result."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _cells(rd: RunDir, resolution: float, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """Lon/lat of the in-region cells of the grid's first row blocks, at most ``limit``."""
    geom, grid = predict.map_grid(
        rd, resolution=resolution, tile_zoom=None, max_cells=1, extent="tiles", force=True
    )
    lon: list[np.ndarray] = []
    lat: list[np.ndarray] = []
    for rows in grid.row_blocks(max(1, 262_144 // len(grid.x))):
        mask = region_mask(geom, grid, rows)
        lon2, lat2 = np.meshgrid(grid.x, grid.y[rows])
        lon.append(lon2[mask])
        lat.append(lat2[mask])
        if sum(a.size for a in lon) >= limit:
            break
    return np.concatenate(lon)[:limit], np.concatenate(lat)[:limit]


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run", type=Path, required=True)
    ap.add_argument("--target", default="download")
    ap.add_argument("--cells", type=int, default=12_000_000)
    ap.add_argument("--block-cells", type=int, default=250_000)
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    keep_freed_memory()
    print(
        json.dumps(
            {"load_before": os.getloadavg()[0], "threads": os.environ.get("OMP_NUM_THREADS")}
        )
    )
    rd = RunDir(args.run)
    model = load_model(rd, args.target)
    effect, layer = load_map_layers(rd, args.target, model)
    if layer is None:
        raise SystemExit(f"{args.run}: the {args.target} model has no local layer")
    res = _resolution(args.run, args.cells)
    lon, lat = _cells(rd, res, args.block_cells)
    t_ids, names = _best(lambda: tile_ids(lon, lat))
    t_codes, codes = _best(lambda: tile_codes(lon, lat))
    n = lon.size
    kw = {
        "times": np.full(n, float(effect.times.max())),
        "var_f": np.full(n, 0.01),
        "components": np.full((n, len(effect.params.components)), 0.05),
        "groups": np.where(np.arange(n) % 2 == 0, "urban", "rural") if effect.grouped else None,
    }
    t_str, by_name = _best(lambda: layer.predict(tiles=names, **kw))
    t_cat, by_code = _best(lambda: layer.predict(tiles=codes, **kw))
    same = np.array_equal(by_name.shift, by_code.shift) and np.array_equal(
        by_name.tile_var, by_code.tile_var
    )
    print(
        json.dumps(
            {
                "cells": n,
                "tiles": len(codes.categories),
                "tile_ids_ms": 1e3 * t_ids,
                "tile_codes_ms": 1e3 * t_codes,
                "layer_strings_ms": 1e3 * t_str,
                "layer_codes_ms": 1e3 * t_cat,
                "same_numbers": bool(same),
            }
        )
    )

    def call() -> float:
        start = time.perf_counter()
        predict.run_predict(
            args.run,
            target=args.target,
            quantity="tile",
            resolution=res,
            extent="tiles",
            force=True,
        )
        return time.perf_counter() - start

    call()
    times: dict[str, list[float]] = {"strings": [], "codes": []}
    for _ in range(args.calls):
        for name, fn in (("strings", tile_ids), ("codes", tile_codes)):
            predict.tile_codes = fn  # type: ignore[assignment]
            times[name].append(round(call(), 3))
    predict.tile_codes = tile_codes
    print(json.dumps({"map_seconds": times}))


if __name__ == "__main__":
    main()
