"""Where the time of ``geodbk predict`` goes: each phase's wall time and page faults, warm.

Times ``run_predict`` on a grid of about ``--cells`` cells (the run's tiles extent), one cold
call then ``--calls`` warm ones in this process, with the allocator settings of the ``geodbk``
command (:func:`pipelines.allocator.keep_freed_memory`; ``--default-malloc``: glibc's own).
Phases: ``model`` (:func:`geodbk.quantities.predict_quantity`), ``derived`` (the other grid
variables of :func:`pipelines.predict.predict_block`), ``write`` (the NetCDF-4 chunks),
``mask`` (the rasterised region), ``setup`` (creating the file) and ``close``; within
``model``, for the tile and test quantities, ``layer`` (the local layer's predict) and its
parts ``layer_neighbours`` (the k-d tree queries, their sorting and the distinct neighbour
sets), ``layer_kriging`` (the field's kriging solves), ``layer_factors`` (the measured
tiles' own factors and solves) and ``layer_summaries`` (each measured tile's GLS level, once
per call)::

    OMP_NUM_THREADS=2 python benchmarks/bench_predict_phases.py --run runs/hi3 \\
        --target download --cells 12000000

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_tile_maps import _resolution

import geodbk.local_layer as local_layer
import pipelines.gridfile as gridfile
import pipelines.predict as predict
from pipelines.allocator import keep_freed_memory

PHASES: tuple[tuple[Any, str, str], ...] = (
    (predict, "predict_quantity", "model"),
    (predict, "predict_block", "block"),
    (predict, "region_mask", "mask"),
    (gridfile.GridWriter, "__init__", "setup"),
    (gridfile.GridWriter, "write_rows", "write"),
    (gridfile.GridWriter, "close", "close"),
    # parts of ``model`` for the tile and test quantities (absent from an area map's rows)
    (local_layer.LocalLayer, "predict", "layer"),
    (local_layer.LocalLayer, "_tile_hood", "layer_neighbours"),
    (local_layer, "_krige", "layer_kriging"),
    (local_layer, "_own_tiles", "layer_factors"),
    (local_layer, "_summaries", "layer_summaries"),
)


def _timed(fn: Callable[..., Any], key: str, acc: dict[str, float]) -> Callable[..., Any]:
    """``fn`` adding its wall seconds to ``acc[key]`` and its page faults to ``acc[key_faults]``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] = acc.get(key, 0.0) + time.perf_counter() - start
            acc[f"{key}_faults"] = (
                acc.get(f"{key}_faults", 0.0)
                + resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                - faults
            )

    return wrapper


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--quantity", default="area", choices=["area", "tile", "test"])
    p.add_argument("--cells", type=int, default=12_000_000)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--default-malloc", action="store_true")
    args = p.parse_args(argv)
    tuned = False if args.default_malloc else keep_freed_memory()
    acc: dict[str, float] = {}
    for owner, name, key in PHASES:
        setattr(owner, name, _timed(getattr(owner, name), key, acc))
    res = _resolution(args.run, args.cells)

    def call() -> float:
        start = time.perf_counter()
        predict.run_predict(
            args.run,
            target=args.target,
            quantity=args.quantity,
            resolution=res,
            extent="tiles",
            force=True,
        )
        return time.perf_counter() - start

    load = os.getloadavg()[0]
    call()
    for _ in range(args.calls):
        acc.clear()
        total = call()
        row = {
            "total": total,
            **acc,
            "derived": acc["block"] - acc["model"],
            "model_share": acc["model"] / total,
        }
        row.pop("block")
        row.pop("block_faults")
        print(
            json.dumps(
                {
                    "load_before": load,
                    "threads": os.environ.get("OMP_NUM_THREADS"),
                    "malloc_tuned": tuned,
                    **{k: round(v, 3) for k, v in row.items()},
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
