"""Four parts of a tile map's local layer, each against the form it replaced, on one run.

- ``quadkeys``: :func:`geodbk.geo.quadkey.quadkey_to_tile` of 51,000 random zoom-16 keys;
- ``set_distances``: ``torch.cdist`` of 6,000 random sets of 16 measured tiles, by direct
  differences (what the layer uses) and by its default matrix-product form;
- ``summaries``: the layer's GLS summaries of the run's measured tiles, in groups of similar
  row counts and padded to the longest history (``steps=()``);
- ``map_layer``: the layer's time in one warm tile map of about ``--cells`` cells, with groups
  of at least ``MIN_GROUP_TILES`` tiles and with groups of any size (``min_tiles=1``).

Best of ``--repeats`` calls each; one JSON line per part. On a run whose model has a local
layer (``geodbk train`` defaults)::

    OMP_NUM_THREADS=2 python benchmarks/bench_layer_parts.py --run runs/hi3 --target download

Each part waits until the 1-minute load is below ``--max-load``; the line records the load it
started at and the thread count.
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
import torch
from bench_tile_maps import QUIET_LOAD, _resolution, _wait_for_quiet

import geodbk.local_layer as local_layer
import geodbk.tile_effect as tile_effect
from geodbk.geo.quadkey import quadkey_to_tile, tile_to_quadkey
from pipelines.allocator import keep_freed_memory
from pipelines.bundles import load_model
from pipelines.layers import load_map_layers
from pipelines.predict import run_predict
from pipelines.rundir import RunDir


def best(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``fn``, in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def with_groups(min_tiles: int, steps: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Set :func:`geodbk.tile_effect.row_count_groups`' defaults; returns the previous ones."""
    defaults = dict(tile_effect.row_count_groups.__kwdefaults__)
    tile_effect.row_count_groups.__kwdefaults__.update(
        min_tiles=min_tiles, steps=defaults["steps"] if steps is None else steps
    )
    return defaults


def main(argv: list[str] | None = None) -> int:
    """Run the measurements; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--cells", type=int, default=30_000_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-load", type=float, default=QUIET_LOAD)
    args = p.parse_args(argv)
    keep_freed_memory()
    threads = os.environ.get("OMP_NUM_THREADS")
    rng = np.random.default_rng(0)

    def report(part: str, load: float, **figures: float) -> None:
        row = {"part": part, "load_before": round(load, 2), "threads": threads}
        print(json.dumps({**row, **{k: round(v, 5) for k, v in figures.items()}}))

    keys = tile_to_quadkey(rng.integers(0, 2**16, 51_000), rng.integers(0, 2**16, 51_000), 16)
    load = _wait_for_quiet(args.max_load)
    report("quadkeys", load, seconds=best(lambda: quadkey_to_tile(keys), args.repeats))

    rd = RunDir(args.run)
    model = load_model(rd, args.target)
    _, layer = load_map_layers(rd, args.target, model)
    if layer is None:
        raise SystemExit(f"{args.run}: the {args.target} model has no local layer")
    xy = torch.as_tensor(layer.tile_xy[rng.integers(0, len(layer.tile_xy), (6_000, 16))])
    load = _wait_for_quiet(args.max_load)
    report(
        "set_distances",
        load,
        direct=best(
            lambda: torch.cdist(xy, xy, compute_mode="donot_use_mm_for_euclid_dist"), args.repeats
        ),
        matrix_product=best(lambda: torch.cdist(xy, xy), args.repeats),
    )

    lay, t = layer.effect._layout(), layer._tensors()

    def summaries() -> Any:
        with torch.no_grad():
            return local_layer._summaries(lay, t.tau2, t.rho, t.kappa, t.mu)

    load = _wait_for_quiet(args.max_load)
    grouped = best(summaries, args.repeats)
    defaults = with_groups(1, steps=())
    padded = best(summaries, args.repeats)
    tile_effect.row_count_groups.__kwdefaults__.update(defaults)
    report("summaries", load, tiles=float(lay.mask.shape[0]), grouped=grouped, padded=padded)

    res = _resolution(args.run, args.cells)
    spent = {"layer": 0.0}
    predict = local_layer.LocalLayer.predict

    def timed(self: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return predict(self, **kwargs)
        finally:
            spent["layer"] += time.perf_counter() - start

    local_layer.LocalLayer.predict = timed  # type: ignore[method-assign]

    def map_layer() -> float:
        spent["layer"] = 0.0
        run_predict(
            args.run, target=args.target, quantity="tile", resolution=res, extent="tiles",
            force=True,
        )  # fmt: skip
        return spent["layer"]

    map_layer()  # imports and caches
    figures: dict[str, float] = {}
    for label, min_tiles in (("floor", tile_effect.MIN_GROUP_TILES), ("any_size", 1)):
        load = _wait_for_quiet(args.max_load)
        defaults = with_groups(min_tiles)
        figures[label] = min(map_layer() for _ in range(max(1, args.repeats // 2)))
        tile_effect.row_count_groups.__kwdefaults__.update(defaults)
    report("map_layer", load, cells=float(args.cells), **figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
