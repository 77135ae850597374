"""ISA-L's deflate against the standard library's zlib on a grid's own chunks, one thread.

Reads the float32 variables of a ``geodbk predict`` grid, cuts them into the writer's chunks
(``pipelines.gridfile``: tiles of ``CHUNK_CELLS`` cells), keeps the chunks that hold a cell of
the region, shuffles their bytes as HDF5 does and compresses each at ``COMPRESSION_LEVEL`` with
both encoders: prints MB/s of input and the compressed size as a share of the input, best of
``--repeats`` passes::

    OMP_NUM_THREADS=1 python benchmarks/bench_deflate.py --grid runs/hi3/grids/download.nc

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from pathlib import Path

import numpy as np
import xarray as xr
from isal import isal_zlib

from pipelines.gridfile import CHUNK_CELLS, CHUNK_COLS, COMPRESSION_LEVEL


def shuffled_chunks(grid: Path, *, limit: int) -> list[bytes]:
    """Byte-shuffled float32 chunks of the grid's variables that hold a cell of the region."""
    rows = CHUNK_CELLS // CHUNK_COLS
    out: list[bytes] = []
    with xr.open_dataset(grid) as ds:
        inside = ds["in_region"].values.astype(bool)
        for var in ds.data_vars.values():
            if var.dtype != np.float32 or var.ndim != 2:
                continue
            values = var.values
            for r in range(0, values.shape[0], rows):
                for c in range(0, values.shape[1], CHUNK_COLS):
                    if not inside[r : r + rows, c : c + CHUNK_COLS].any():
                        continue
                    tile = np.ascontiguousarray(values[r : r + rows, c : c + CHUNK_COLS])
                    out.append(tile.reshape(-1).view(np.uint8).reshape(-1, 4).T.tobytes())
                    if len(out) >= limit:
                        return out
    return out


def main(argv: list[str] | None = None) -> int:
    """Time both encoders; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--grid", type=Path, required=True)
    p.add_argument("--chunks", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.2f}, one thread")
    chunks = shuffled_chunks(args.grid, limit=args.chunks)
    size = sum(len(c) for c in chunks)
    for name, compress in (("zlib", zlib.compress), ("isal", isal_zlib.compress)):
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = sum(len(compress(c, COMPRESSION_LEVEL)) for c in chunks)
            best = min(best, time.perf_counter() - start)
        print(
            f"{name}: {len(chunks)} chunks, {size / 1e6:.1f} MB, {size / best / 1e6:.0f} MB/s, "
            f"compressed to {100 * out / size:.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
