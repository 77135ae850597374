"""``geodbk benchmark`` alone, for machines without the geo stack.

The full CLI builds every stage's parser, and the ingest, download, predict and export stages
import geopandas, shapely, pyproj and rioxarray. The benchmark stage reads ``tiles.parquet``
with pyarrow and needs none of them, so on a machine that has only torch, numpy, pandas,
pyarrow and scipy (the lent GPU machine) it runs through this script, with the same options::

    PYTHONPATH=. python3 benchmarks/benchmark_stage_only.py --run RUN --target download \\
        --models cagp --device cuda --tile-effect
"""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse ``geodbk benchmark``'s options from ``argv`` and run the stage."""
    from pipelines import benchmark

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    parser = argparse.ArgumentParser(prog="benchmark_stage_only.py")
    benchmark.register(parser.add_subparsers())
    args = parser.parse_args(["benchmark", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":  # the benchmark's worker processes re-import this file
    raise SystemExit(main())
