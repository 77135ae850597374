"""The figure of docs/quantities.md: the three quantities along one row of a predictive grid.

Reads ``RUN/grids/TARGET.nc`` (``geodbk predict``; every grid holds the parts of all three
quantities) and draws, along the grid row with the most measured tiles, the median and 95%
interval of the area quantity f(x), of the tile quantity, and of one speed test, with the
measured tiles marked::

    python benchmarks/figure_quantities.py --run runs/hawaii --target download \\
        --out docs/figures/quantities_transect.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main(argv: list[str] | None = None) -> int:
    """Draw the figure; see the module docstring."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xarray as xr

    from geodbk.predictive import Z95

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cells", type=int, default=160, help="cells of the row to draw")
    args = p.parse_args(argv)
    with xr.open_dataset(args.run / "grids" / f"{args.target}.nc") as ds:
        seen = np.nan_to_num(ds["tile_history"].values)
        row = int(np.argmax(seen.sum(axis=1)))
        cols = np.flatnonzero(np.isfinite(ds["tile_mean"].values[row]))
        centre = int(np.argmax(np.convolve(seen[row], np.ones(args.cells), mode="same")))
        lo = max(cols.min(), centre - args.cells // 2)
        part = slice(lo, min(cols.max() + 1, lo + args.cells))
        lon = ds["x"].values[part]
        lat = float(ds["y"].values[row])
        v = {
            n: ds[n].values[row, part].astype(np.float64)
            for n in ("area_mean", "std_f", "tile_mean", "tile_sd", "test_sd", "tile_history")
        }
        unit = str(ds.attrs.get("natural_units", "Mbps"))
        divisor = 1000.0 if unit == "Mbps" else 1.0

    def natural(x: np.ndarray) -> np.ndarray:
        return np.power(10.0, x) / divisor

    fig, ax = plt.subplots(figsize=(9, 4.2))
    for label, sd, colour, alpha in (
        ("test: one speed test", v["test_sd"], "#fde725", 0.45),
        ("tile: what the tile typically gets", v["tile_sd"], "#21918c", 0.35),
    ):
        ax.fill_between(
            lon,
            natural(v["tile_mean"] - Z95 * sd),
            natural(v["tile_mean"] + Z95 * sd),
            color=colour,
            alpha=alpha,
            label=f"{label}, 95% interval",
            linewidth=0,
        )
    for sign in (-1.0, 1.0):
        ax.plot(
            lon,
            natural(v["area_mean"] + sign * Z95 * v["std_f"]),
            color="#440154",
            lw=1.0,
            ls="--",
            label="area: neighbourhood level f(x), 95% interval" if sign > 0 else None,
        )
    ax.plot(lon, natural(v["area_mean"]), color="#440154", lw=1.5, label="area median")
    ax.plot(lon, natural(v["tile_mean"]), color="#21918c", lw=1.2, label="tile median")
    measured = v["tile_history"] > 0.5
    ax.plot(
        lon[measured],
        natural(v["tile_mean"][measured]),
        "o",
        ms=3,
        color="#21918c",
        label="tile with measured history",
    )
    ax.set_yscale("log")
    ax.set_xlabel(f"longitude (row at latitude {lat:.4f})")
    ax.set_ylabel(f"{args.target} ({unit})")
    ax.set_title(f"{args.target}: the three quantities along one grid row")
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
