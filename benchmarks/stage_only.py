"""One ``geodbk`` stage alone, for machines without the full geo stack.

The full CLI builds every stage's parser, and the ingest, download, predict and export stages
import geopandas, shapely, pyproj and rioxarray. ``benchmark`` reads ``tiles.parquet`` with
pyarrow and needs none of them; ``train`` needs geopandas, shapely and pyproj (carried as
wheels) but not rioxarray or rasterio. On a machine that has torch, numpy, pandas, pyarrow and
scipy (the lent GPU machine) they run through this script, with the stage's own options::

    PYTHONPATH=. python3 benchmarks/stage_only.py benchmark --run RUN --target download \\
        --models cagp --device cuda --tile-effect
    PYTHONPATH=.:SITE python3 benchmarks/stage_only.py train --run RUN --target download \\
        --device cuda --no-progress
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

STAGES = ("benchmark", "train")


def main(argv: list[str] | None = None) -> int:
    """Parse ``geodbk STAGE``'s options from ``argv`` (``STAGE`` first) and run the stage."""
    args_in = sys.argv[1:] if argv is None else argv
    if not args_in or args_in[0] not in STAGES:
        print(f"usage: stage_only.py {{{','.join(STAGES)}}} [options]", file=sys.stderr)
        return 2
    stage = importlib.import_module(f"pipelines.{args_in[0]}")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    parser = argparse.ArgumentParser(prog="stage_only.py")
    stage.register(parser.add_subparsers())
    args = parser.parse_args(args_in)
    return int(args.func(args))


if __name__ == "__main__":  # the benchmark's worker processes re-import this file
    raise SystemExit(main())
