"""Does the trend map's 95% interval hold the synthetic region's true trend?

The embedded synthetic region (:mod:`geodbk.geo.synthetic`) improves by a known amount every
quarter (:func:`geodbk.geo.synthetic.latent_field`: download +0.02 log10 a quarter for mobile
tiles). For a run of it with a time-aware model and a trend grid (``geodbk predict --trend
Q1:Q2``), this prints, per target, the share of in-region cells whose 95% interval of the
change per year (``change_lower``..``change_upper``) holds the true change per year, the
median estimated change, and the share of cells with ``p_improved`` below 0.1 (the map saying
"got worse" where every place got better)::

    geodbk demo --run runs/demo
    python benchmarks/bench_trend_truth.py --run runs/demo --first 2023Q1 --last 2023Q4

The truth is the generator's change of the latent field between the two quarters at each
cell's centre, per year (the same at every place: the generator's trend is uniform).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from geodbk.geo.synthetic import latent_field
from geodbk.geo.table import read_table_metadata
from geodbk.geo.timeaxis import quarter_index, years_between


def trend_truth(run: Path, target: str, first: str, last: str) -> dict[str, Any]:
    """Coverage of the true change per year by ``grids/TARGET_trend_FIRST_LAST.nc``."""
    path = run / "grids" / f"{target}_trend_{first}_{last}.nc"
    with xr.open_dataset(path) as ds:
        inside = ds["in_region"].to_numpy().astype(bool)
        lon, lat = np.meshgrid(ds["x"].to_numpy(), ds["y"].to_numpy())
        est = ds["change_per_year"].to_numpy()[inside]
        low = ds["change_lower"].to_numpy()[inside]
        high = ds["change_upper"].to_numpy()[inside]
        p_up = ds["p_improved"].to_numpy()[inside]
    kind = str(read_table_metadata(run / "tiles.parquet").get("type", "mobile"))
    start = quarter_index("2023Q1")  # the generator's quarter 0 (data/README.md)
    q1, q2 = quarter_index(first) - start, quarter_index(last) - start
    x, y = lon[inside], lat[inside]
    truth = (
        latent_field(x, y, target=target, kind=kind, quarter=q2)
        - latent_field(x, y, target=target, kind=kind, quarter=q1)
    ) / years_between(first, last)
    held = (low <= truth) & (truth <= high)
    return {
        "target": target,
        "cells": int(inside.sum()),
        "true_change_per_year": float(np.median(truth)),
        "median_estimate": float(np.median(est)),
        "coverage95": float(held.mean()),
        "median_width": float(np.median(high - low)),
        "share_p_improved_below_0.1": float((p_up < 0.1).mean()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a run of the synthetic region")
    parser.add_argument("--first", default="2023Q1")
    parser.add_argument("--last", default="2023Q4")
    parser.add_argument("--targets", default="download,upload,latency")
    args = parser.parse_args(argv)
    for target in args.targets.split(","):
        print(json.dumps(trend_truth(args.run, target, args.first, args.last)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
