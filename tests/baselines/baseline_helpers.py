"""Tiny synthetic data for the baseline tests: a 2-D heteroscedastic region and a run directory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tile_tables import write_synthetic_tile_table


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
    return write_synthetic_tile_table(
        path,
        lon=lon,
        lat=lat,
        x1=X[:, 0],
        x2=X[:, 1],
        bounds=(lon_min, lat_min, lon_max, lat_max),
        log10_download=ld,
        log10_upload=lu,
        log10_latency=ll,
        urban=urban,
        split=split,
        rng=rng,
        tile_half_width=0.002,
        fractions=(0.7, 0.1, 0.2),
        seed=seed,
        source="tests/baselines",
    )
