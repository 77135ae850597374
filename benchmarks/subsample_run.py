"""Copy a run directory with a random subset of its training rows, for the full-batch models.

Exact GPs (``exact-rbf``, refusing n > ``max_n`` = 5,000) and CaGP (n² kernel evaluations per
step) cannot train on a whole region's training split on a CPU. This script writes a run
directory that keeps every validation and test row of ``--run`` and ``--train-rows`` training
rows drawn without replacement (seeded), so that ``geodbk benchmark`` scores every model on the
same test rows as the full run. The table's metadata records the subsample::

    python benchmarks/subsample_run.py --run runs/hi --out runs/hi5k --train-rows 5000
    geodbk benchmark --run runs/hi5k --target download --models exact-rbf,cagp,dbk-rbf ...
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np

from geodbk.geo.table import read_tile_table, write_tile_table

#: Files of a run directory that describe the region, copied as they are.
REGION_FILES = ("region.geojson", "urban_areas.geojson", "ingest_report.json")


def subsample_run(run: Path, out: Path, *, train_rows: int, seed: int = 0) -> dict[str, int]:
    """Write ``out/tiles.parquet`` with ``train_rows`` of ``run``'s training rows, all others.

    Returns the rows per split of the new table.
    """
    table, meta = read_tile_table(run / "tiles.parquet")
    train = np.flatnonzero(table["split"].to_numpy() == "train")
    if train_rows >= train.size:
        raise SystemExit(f"--train-rows {train_rows} keeps all {train.size} training rows")
    keep = np.ones(len(table), dtype=bool)
    keep[train] = False
    keep[np.random.default_rng(seed).choice(train, size=train_rows, replace=False)] = True
    sub = table.loc[keep].reset_index(drop=True)
    counts = {s: int((sub["split"] == s).sum()) for s in ("train", "val", "test")}
    meta = dict(meta)
    meta["subsample"] = {"source": str(run), "train_rows": train_rows, "seed": seed}
    out.mkdir(parents=True, exist_ok=True)
    write_tile_table(sub, out / "tiles.parquet", meta)
    for name in REGION_FILES:
        if (run / name).is_file():
            shutil.copy2(run / name, out / name)
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", type=Path, required=True, help="run directory to subsample")
    p.add_argument("--out", type=Path, required=True, help="new run directory")
    p.add_argument("--train-rows", type=int, required=True, help="training rows to keep")
    p.add_argument("--seed", type=int, default=0, help="seed of the draw (default 0)")
    args = p.parse_args()
    print(subsample_run(args.run, args.out, train_rows=args.train_rows, seed=args.seed))


if __name__ == "__main__":
    main()
