"""Tiny synthetic data for the baseline tests: a 2-D heteroscedastic region and a run directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def field(X: np.ndarray) -> np.ndarray:
    """Smooth mean field on [-1, 1]²."""
    return np.sin(3.0 * X[:, 0]) + np.cos(2.0 * X[:, 1])


def region(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n points uniform in [-1,1]² with noise sd 0.1 (x1 < 0) or 0.4 (x1 > 0)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, (n, 2))
    sd = np.where(X[:, 0] > 0, 0.4, 0.1)
    return X, field(X) + sd * rng.standard_normal(n)


def make_tiny_run(path: Path, *, n: int = 300, seed: int = 0) -> Path:
    """Write a minimal valid ``tiles.parquet`` (via the geo layer's writer) into ``path``."""
    import geopandas as gpd
    import shapely

    from geodbk.geo.table import write_tile_table

    rng = np.random.default_rng(seed)
    X, ld = region(n, seed=seed)
    ld = 4.0 + 0.3 * ld
    lon_min, lon_max, lat_min, lat_max = -158.3, -157.6, 21.2, 21.75
    lon = lon_min + (X[:, 0] + 1) / 2 * (lon_max - lon_min)
    lat = lat_min + (X[:, 1] + 1) / 2 * (lat_max - lat_min)
    urban = (X[:, 0] + X[:, 1]) > 0.3
    lu = 3.5 + 0.2 * X[:, 1] + 0.2 * rng.standard_normal(n)
    ll = 1.5 + 0.1 * rng.standard_normal(n)
    split = rng.choice(["train", "val", "test"], size=n, p=[0.7, 0.1, 0.2])
    d = 0.002
    gdf = gpd.GeoDataFrame(
        {
            "quadkey": [f"{i:016d}" for i in range(n)],
            "quarter": "2023Q4",
            "lon": lon,
            "lat": lat,
            "x1": X[:, 0],
            "x2": X[:, 1],
            "avg_d_kbps": 10**ld,
            "avg_u_kbps": 10**lu,
            "avg_lat_ms": 10**ll,
            "tests": rng.integers(1, 50, n).astype("int64"),
            "devices": rng.integers(1, 20, n).astype("int64"),
            "log10_download": ld,
            "log10_upload": lu,
            "log10_latency": ll,
            "urban": urban,
            "split": split,
        },
        geometry=[shapely.box(a - d, b - d, a + d, b + d) for a, b in zip(lon, lat, strict=True)],
        crs="EPSG:4326",
    )
    meta = {
        "scaling": {"lon_min": lon_min, "lon_max": lon_max, "lat_min": lat_min, "lat_max": lat_max},
        "split": {"kind": "random", "seed": seed, "fractions": [0.7, 0.1, 0.2]},
        "sources": ["tests/baselines"],
        "type": "mobile",
        "quarters": ["2023Q4"],
        "region": {"kind": "test"},
        "counts": {
            "read": n,
            "kept": n,
            "dropped": {},
            "urban": int(urban.sum()),
            "rural": int((~urban).sum()),
        },
    }
    path.mkdir(parents=True, exist_ok=True)
    write_tile_table(gdf, path / "tiles.parquet", meta)
    return path
