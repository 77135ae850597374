"""Why the tile interval over-covers busy unmeasured tiles, and what a testers' share changes.

Needs a run directory with a trained GP (``geodbk train``); best on a tile or block split,
where the test tiles have no training rows::

    OMP_NUM_THREADS=1 python benchmarks/bench_busy_tiles.py --run runs/tile --target download \\
        --out runs/busy/tile-download-pooled.json

1. **Offset variance by tile volume.** For each tile without training rows (validation and test
   splits), the GLS mean of its GP residuals ``r̄_j = sum r/s2 / sum 1/s2`` (``s2``: the GP's
   noise of each row) and its noise variance ``1 / sum 1/s2``. The excess
   ``mean(r̄_j² - 1/sum 1/s2)`` is what the GP's error plus the tile's offset add, binned by
   the tile's mean devices per quarter, urban and rural.
2. **The tile effect with and without the testers' persistent share** (``fit_tile_effect(...,
   persistent=...)``, as ``geodbk train`` fits it): test-row NLL and 95% coverage, and the map
   calibration of test tiles with 30+ tests (:mod:`pipelines.map_calibration`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_local_layer import _gp_parts, _map_scores, _rows, _scores, fit_run_tile_effect

DEVICE_BINS = (1.0, 1.2, 1.6, 2.5, 4.0, 8.0, np.inf)


def excess_by_devices(frame: pd.DataFrame, residual: np.ndarray, s2: np.ndarray) -> list[dict]:
    """Excess variance of unmeasured tiles' mean residuals by devices per quarter (step 1)."""
    rows = frame.assign(r=residual, w=1.0 / s2)
    rows = rows.assign(wr=rows["w"] * rows["r"])
    trained = set(rows.loc[rows["split"] == "train", "quadkey"])
    rows = rows[rows["split"].isin(["val", "test"]) & ~rows["quadkey"].isin(trained)]
    agg = rows.groupby("quadkey").agg(
        sw=("w", "sum"), swr=("wr", "sum"), urban=("urban", "first"), devices=("devices", "mean")
    )
    excess = (agg["swr"] / agg["sw"]) ** 2 - 1.0 / agg["sw"]
    out = []
    for lo, hi in itertools.pairwise(DEVICE_BINS):
        for urban in (True, False):
            m = (agg["devices"] >= lo) & (agg["devices"] < hi) & (agg["urban"] == urban)
            if m.sum() < 15:
                continue
            e = excess[m]
            out.append(
                {
                    "devices": [lo, None if np.isinf(hi) else hi],
                    "urban": urban,
                    "tiles": int(m.sum()),
                    "excess": float(e.mean()),
                    "se": float(e.std(ddof=1) / np.sqrt(m.sum())),
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both measurements; see the module docstring."""
    import torch

    from geodbk import DBKRegressor
    from geodbk.tile_effect import urban_groups

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = DBKRegressor.load(args.run / "models" / args.target, device="cpu")
    frame = _rows(args.run, args.target)
    gp = _gp_parts(model, frame)
    comp = np.asarray(gp["comp"])
    split = frame["split"].to_numpy()
    te = split == "test"
    urban = frame["urban"].to_numpy(bool)
    groups = urban_groups(urban)
    tiles = frame["quadkey"].astype(str).to_numpy()
    y = frame["y"].to_numpy()

    results: dict[str, Any] = {}
    for name, persistent in (("tile_effect", False), ("with_testers_share", True)):
        effect = fit_run_tile_effect(model, frame, gp, persistent=persistent)
        part = effect.predict(
            tiles=tiles[te],
            times=gp["times"][te],
            var_f=gp["var_f"][te],
            components=comp[te],
            groups=groups[te],
        )
        mean = gp["mean"][te] + part.shift
        results[name] = {
            "parameters": effect.params.to_dict(),
            "rows": _scores(
                y[te],
                mean,
                part.tile_var + part.noise_var,
                urban[te],
                frame["tests"].to_numpy(np.float64)[te],
            ),
            "map": _map_scores(frame[te], mean, part.tile_var, part.noise_var, part.persistent_var),
        }
    out = {
        "run": str(args.run),
        "target": args.target,
        "split": json.loads((args.run / "ingest_report.json").read_text()).get("split"),
        "excess_by_devices": excess_by_devices(frame, gp["residual"], comp.sum(axis=1)),
        "results": results,
        "machine": f"{platform.machine()}; torch threads 1",
        "command": "python benchmarks/bench_busy_tiles.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for row in out["excess_by_devices"]:
        lo, hi = row["devices"]
        print(
            f"devices/quarter [{lo}, {hi or 'inf'}) {'urban' if row['urban'] else 'rural'}: "
            f"{row['tiles']} tiles, excess {row['excess']:.3f} ± {row['se']:.3f}"
        )
    for name, res in results.items():
        r, m = res["rows"]["all"], res["map"]
        cov = {g: round(100 * m[g]["coverage95"], 1) for g in ("all", "urban", "rural") if g in m}
        print(f"{name:20s} test NLL {r['nll']:.4f} cov {100 * r['coverage95']:.1f} | map {cov}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
