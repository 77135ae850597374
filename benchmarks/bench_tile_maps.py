"""Cost of the tile quantity's maps against the area quantity's: time and peak memory of
``geodbk predict`` for grids of about 10^5, 10^6 and 10^7 cells.

Each (cells, quantity) runs in its own process (so its peak RSS is its own): ``seconds`` is the
first call (what ``geodbk predict`` costs, imports of the geo stack included), ``warm_seconds``
the fastest of ``--warm-calls`` further calls in the same process (the model and map work
alone; all of them in ``warm_calls``). ``--rounds`` repeats every process, area and tile
alternating, and the tile/area ratios within each round are printed at the end. On a run with
a trained model whose tile effect and local layer are saved (``geodbk train`` defaults)::

    OMP_NUM_THREADS=2 python benchmarks/bench_tile_maps.py --run runs/hip --target download \\
        --cells 100000 1000000 10000000 --rounds 3 --out docs/benchmarks/tile_maps.json

Each measurement waits until the 1-minute load is below ``--max-load`` (default 0.5: nothing
else may run on the 2-core machine; a 16-core GPU host may allow more); the JSON records the
load it started at, the thread count and the cells in the region.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHILD = """
import json, resource, sys, time
from pipelines.allocator import keep_freed_memory
from pipelines.predict import run_predict
keep_freed_memory()  # as the geodbk command does
import xarray as xr
run, target, quantity, res = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
warm_calls = int(sys.argv[5])
t0 = time.perf_counter()
path = run_predict(run, target=target, quantity=quantity, resolution=res, extent="tiles", force=True)
seconds = time.perf_counter() - t0
warm_all = []
for _ in range(warm_calls):
    t1 = time.perf_counter()
    run_predict(run, target=target, quantity=quantity, resolution=res, extent="tiles", force=True)
    warm_all.append(time.perf_counter() - t1)
warm = min(warm_all)
with xr.open_dataset(path) as ds:
    cells = int(ds.sizes["x"] * ds.sizes["y"])
    inside = int(ds["in_region"].values.sum())
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
import torch
device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
print(json.dumps({"seconds": seconds, "warm_seconds": warm, "warm_calls": warm_all,
                  "cells": cells, "in_region": inside,
                  "peak_rss_mb": rss, "device": device}))
"""


def _resolution(run: Path, cells: int) -> float:
    """Square cells of the tiles' extent (+ the predict margin) giving about ``cells`` cells."""
    import geopandas as gpd

    from pipelines.predict import grid_bounds
    from pipelines.rundir import RunDir

    region = gpd.read_file(run / "region.geojson").geometry.union_all()
    w, s, e, n = grid_bounds(RunDir(run), region.bounds, extent="tiles")
    return math.sqrt((e - w) * (n - s) / cells)


#: 1-minute load average below which a measurement starts (a quiet machine).
QUIET_LOAD = 0.5


def _wait_for_quiet(max_load: float = QUIET_LOAD, limit_s: float = 600.0) -> float:
    """Wait (up to ``limit_s``) until the 1-minute load is below ``max_load``; return the load
    the measurement starts at."""
    start = time.monotonic()
    while os.getloadavg()[0] >= max_load and time.monotonic() - start < limit_s:
        time.sleep(5)
    return os.getloadavg()[0]


def ratio_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per grid size: the tile map's time over the area map's, first and (fastest) warm call,
    as the range over rounds of the ratio within each round."""
    lines = []
    for cells in sorted({r["target_cells"] for r in rows}):
        by_round: dict[int, dict[str, dict[str, Any]]] = {}
        for r in rows:
            if r["target_cells"] == cells:
                by_round.setdefault(r["round"], {})[r["quantity"]] = r
        pairs = [q for q in by_round.values() if {"area", "tile"} <= q.keys()]
        if not pairs:
            continue
        first = [q["tile"]["seconds"] / q["area"]["seconds"] for q in pairs]
        warm = [q["tile"]["warm_seconds"] / q["area"]["warm_seconds"] for q in pairs]
        lines.append(
            f"{cells} cells, {len(pairs)} rounds: tile/area first {min(first):.2f}-"
            f"{max(first):.2f}x, warm {min(warm):.2f}-{max(warm):.2f}x"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--cells", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--max-load", type=float, default=QUIET_LOAD, help="start each call below this load"
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="processes per (cells, quantity), alternating"
    )
    p.add_argument(
        "--warm-calls", type=int, default=3, help="warm calls per process; the fastest is kept"
    )
    args = p.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for cells in args.cells:
            res = _resolution(args.run, cells)
            for quantity in ("area", "tile"):
                load = _wait_for_quiet(args.max_load)
                child = [str(args.run), args.target, quantity, str(res), str(args.warm_calls)]
                out = subprocess.run(
                    [sys.executable, "-c", CHILD, *child],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                row = {
                    "round": round_,
                    "target_cells": cells,
                    "quantity": quantity,
                    "resolution_deg": res,
                    "load_before": load,
                    **json.loads(out.stdout.strip().splitlines()[-1]),
                }
                rows.append(row)
                print(json.dumps(row))
    for line in ratio_lines(rows):
        print(line)
    result = {
        "run": str(args.run),
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "machine": f"{platform.machine()} {platform.processor()}, {os.cpu_count()} cores",
        "created": time.strftime("%Y-%m-%d"),
        "rows": rows,
        "command": "python benchmarks/bench_tile_maps.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
