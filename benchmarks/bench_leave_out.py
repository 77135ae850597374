"""Time of the place share's leave-out scoring at a mainland-like size:
``LocalLayer.predict`` of 6,000 validation tiles (4 rows each) among 60,000 measured tiles
in an 800 km box, plainly, leaving out each tile (a tile split) and leaving out each 20 km
block (a block split, about 1,600 blocks). Synthetic tiles; 8 neighbours::

    OMP_NUM_THREADS=2 python benchmarks/bench_leave_out.py
"""

from __future__ import annotations

import time

import numpy as np

from geodbk.local_layer import LocalLayer, SpatialParameters
from geodbk.tile_effect import TileEffect, TileEffectParameters


def main() -> int:
    rng = np.random.default_rng(0)
    n_tiles, rows = 60_000, 4
    xy = rng.uniform(0.0, 800.0, (n_tiles, 2))
    ids = np.array([f"t{j:06d}" for j in range(n_tiles)])
    tiles = np.repeat(ids, rows)
    params = TileEffectParameters(
        tau2={"all": 0.1}, rho=0.9, noise_scale=(1.0,), components=("noise",), latent_scale=1.0
    )
    effect = TileEffect(
        params,
        tiles=tiles,
        times=np.tile(np.arange(float(rows)), n_tiles),
        residual=rng.normal(0.0, 0.3, tiles.size),
        var_f=np.full(tiles.size, 0.01),
        components=np.full((tiles.size, 1), 0.05),
    )
    spatial = SpatialParameters(sigma2=0.1, range_km=2.0, tau2={"all": 0.05}, neighbours=8)
    layer = LocalLayer(effect, spatial, tile_xy=xy)
    val = rng.choice(n_tiles, 6_000, replace=False)
    block = (xy[val] // 20.0).astype(int)
    unit = np.repeat(block[:, 0] * 1000 + block[:, 1], rows)
    kw = {
        "tiles": np.repeat(ids[val], rows),
        "times": np.tile(np.arange(float(rows)), val.size),
        "xy": np.repeat(xy[val], rows, axis=0),
        "var_f": np.full(val.size * rows, 0.01),
        "components": np.full((val.size * rows, 1), 0.05),
    }
    layer.predict(**kw)  # warm the summaries and the tree
    print(f"{np.unique(unit).size} blocks, {val.size * rows} rows")
    for name, labels in (("none", None), ("per tile", kw["tiles"]), ("per block", unit)):
        t0 = time.perf_counter()
        layer.predict(leave_out=labels, **kw)
        print(f"{name}: {time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
