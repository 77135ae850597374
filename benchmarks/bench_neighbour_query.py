"""Cost of the local layer's k-d tree query per map block, by the threads scipy starts for it.

A map asks the layer for the neighbours of a few hundred distinct tiles per block (one query
per block of in-region cells). ``cKDTree.query(workers=-1)`` starts one thread per core on
each query; this prints the best-of-``--repeats`` time of one query of ``--targets`` random
places among ``--tiles`` measured tiles (k = the layer's 16 neighbours + its own tile) with 1,
2 and 16 worker threads (16: what ``workers=-1`` starts on a 16-core GPU host)::

    OMP_NUM_THREADS=1 python benchmarks/bench_neighbour_query.py --targets 500 5000 50000
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
from scipy.spatial import cKDTree

from geodbk.local_layer import NEIGHBOURS


def best_query_seconds(
    tree: cKDTree, targets: np.ndarray, *, workers: int, calls: int, repeats: int
) -> float:
    """Best over ``repeats`` of the mean wall time of ``calls`` queries."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            tree.query(targets, k=NEIGHBOURS + 1, workers=workers)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def main(argv: list[str] | None = None) -> int:
    """Print one JSON line per (targets, workers); see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tiles", type=int, default=6000, help="measured tiles in the tree")
    p.add_argument("--targets", type=int, nargs="+", default=[500, 5000, 50000])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 16])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    tree = cKDTree(rng.uniform(0.0, 300.0, (args.tiles, 2)))  # km, a Hawaii-sized box
    load = os.getloadavg()[0]
    for m in args.targets:
        targets = rng.uniform(0.0, 300.0, (m, 2))
        calls = max(1, 100_000 // m)
        for workers in args.workers:
            s = best_query_seconds(
                tree, targets, workers=workers, calls=calls, repeats=args.repeats
            )
            print(
                json.dumps(
                    {
                        "targets": m,
                        "workers": workers,
                        "ms_per_query": round(1e3 * s, 3),
                        "cores": os.cpu_count(),
                        "load_before": round(load, 2),
                    }
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
