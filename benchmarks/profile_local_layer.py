"""Where a tile map's local layer spends its time: a cProfile of ``LocalLayer.predict`` alone.

Runs ``geodbk predict --quantity tile`` once on a small grid (imports, caches), then once on a
grid of about ``--cells`` cells of the run's tiles extent with ``LocalLayer.predict`` profiled,
and prints one JSON line: the map's wall time, the layer's profiled time, its calls (one per
block chunk) and the layer's own time by kind of work:

- ``torch linear algebra``: the batched Cholesky factors, triangular and Cholesky solves and
  distance matrices, the part a GPU could take;
- ``torch elementwise``: the other torch operators (gathers, sums, exponentials);
- ``k-d tree``: scipy's neighbour queries;
- ``numpy``: set operations, sorts and gathers of the rows and tiles;
- ``python``: the rest (the layer's own code between the operators)::

    OMP_NUM_THREADS=1 python benchmarks/profile_local_layer.py --run runs/hi3 \\
        --target download --cells 60000000

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

from bench_tile_maps import _resolution
from scipy.spatial import cKDTree

import geodbk.local_layer as local_layer
from geodbk.local_layer import LocalLayer
from pipelines.allocator import keep_freed_memory
from pipelines.predict import run_predict

#: Kinds of work, by fragments of a profiled function's name (first match wins).
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch linear algebra", ("linalg", "cholesky", "cdist", "triangular")),
    ("k-d tree", ("profile_local_layer.py",)),
    ("torch elementwise", ("torch", "Tensor")),
    ("numpy", ("numpy", "ndarray", "ufunc", "_arraysetops", "fromnumeric")),
)


class _ProfiledTree(cKDTree):
    """scipy's k-d tree, its compiled query seen by cProfile under this class's ``query``."""

    def query(self, *args: Any, **kwargs: Any) -> Any:
        return super().query(*args, **kwargs)


def kind_of(where: str) -> str:
    """The kind of work a profiled function (file, line, name) falls in."""
    for kind, keys in KINDS:
        if any(k in where for k in keys):
            return kind
    return "python"


def main(argv: list[str] | None = None) -> int:
    """Profile the layer; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--cells", type=int, default=60_000_000)
    args = p.parse_args(argv)
    keep_freed_memory()
    load = os.getloadavg()[0]

    def tile_map(cells: int) -> float:
        start = time.perf_counter()
        run_predict(
            args.run,
            target=args.target,
            quantity="tile",
            resolution=_resolution(args.run, cells),
            extent="tiles",
            force=True,
        )
        return time.perf_counter() - start

    tile_map(1_000_000)
    profiler = cProfile.Profile()
    predict = LocalLayer.predict

    def profiled(self: LocalLayer, **kwargs: Any) -> Any:
        profiler.enable()
        try:
            return predict(self, **kwargs)
        finally:
            profiler.disable()

    LocalLayer.predict = profiled  # type: ignore[method-assign]
    local_layer.cKDTree = _ProfiledTree
    try:
        seconds = tile_map(args.cells)
    finally:
        LocalLayer.predict = predict  # type: ignore[method-assign]
        local_layer.cKDTree = cKDTree
    stats: dict[Any, Any] = getattr(pstats.Stats(profiler), "stats")  # noqa: B009
    by_kind: dict[str, float] = {}
    for (file, line, name), (_, _, own, _, _) in stats.items():
        if name == "profiled":
            continue
        kind = kind_of(f"{file}:{line}:{name}")
        by_kind[kind] = by_kind.get(kind, 0.0) + own
    layer = sum(by_kind.values())
    predict_calls = sum(
        v[1] for (file, _, name), v in stats.items() if name == "predict" and "local_layer" in file
    )
    print(
        json.dumps(
            {
                "load_before": round(load, 2),
                "threads": os.environ.get("OMP_NUM_THREADS"),
                "cells": args.cells,
                "map_seconds": round(seconds, 2),
                "layer_seconds": round(layer, 2),
                "layer_calls": int(predict_calls),
                **{k: round(v / layer, 3) for k, v in sorted(by_kind.items())},
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
