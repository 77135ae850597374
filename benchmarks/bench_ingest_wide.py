"""Peak memory of reading national-scale tile files for a small region: with the region's box
applied as each file is read (``read_tiles(..., within=BOX)``, what ``geodbk ingest`` does)
against reading every row first (``within=None``).

Writes ``--quarters`` files of ``--rows`` random zoom-16 tiles over the contiguous US box into
``--work`` (Ookla parquet schema), then reads them in a fresh process each way and prints the
rows kept, the seconds and the peak RSS (``ru_maxrss``)::

    OMP_NUM_THREADS=2 python benchmarks/bench_ingest_wide.py --work /tmp/wide
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from geodbk.geo import ookla
from geodbk.geo import quadkey as qk

#: A box around Atlanta: about 0.7% of the US box's tiles.
BOX = (-84.0, 33.0, -80.0, 35.5)


def build(work: Path, *, rows: int, quarters: int) -> None:
    """``quarters`` Ookla-style files of ``rows`` random tiles over the contiguous US."""
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for q in range(1, quarters + 1):
        lon, lat = rng.uniform(-125, -67, rows), rng.uniform(25, 49, rows)
        x, y = qk.lonlat_to_tile(lon, lat, 16)
        frame = pd.DataFrame(
            {
                "quadkey": qk.tile_to_quadkey(x, y, np.full(rows, 16)).astype(str),
                "avg_d_kbps": rng.integers(1_000, 200_000, rows),
                "avg_u_kbps": rng.integers(500, 50_000, rows),
                "avg_lat_ms": rng.integers(5, 100, rows),
                "tests": rng.integers(1, 50, rows),
                "devices": rng.integers(1, 20, rows),
            }
        )
        frame.to_parquet(work / f"2023-{3 * q - 2:02d}-01_performance_mobile_tiles.parquet")


def read(work: Path, *, boxed: bool) -> dict[str, float]:
    """Read the files (with or without the box) in this process: rows kept, seconds, peak MB."""
    t0 = time.perf_counter()
    got = ookla.read_tiles([work], within=BOX if boxed else None)
    return {
        "boxed": boxed,
        "rows_read": got.read,
        "rows_kept": len(got.frame),
        "seconds": round(time.perf_counter() - t0, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--rows", type=int, default=1_000_000, help="tiles per quarter file")
    p.add_argument("--quarters", type=int, default=4)
    p.add_argument("--read", choices=("boxed", "whole"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.read:
        print(json.dumps(read(args.work, boxed=args.read == "boxed")))
        return 0
    build(args.work, rows=args.rows, quarters=args.quarters)
    for how in ("boxed", "whole"):
        cmd = [sys.executable, __file__, "--work", str(args.work), "--read", how]
        print(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
