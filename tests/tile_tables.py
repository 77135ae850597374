"""Write small valid ``tiles.parquet`` tables for tests, without running the ingest stage.

Shared by the pipeline and baseline test helpers: they draw their own synthetic fields and hand
the columns here, which builds the GeoDataFrame and the ``geodbk`` metadata in the ingest schema
(docs/architecture.md) and writes it with the geo layer's writer.
"""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import shapely

from geodbk.geo.table import write_tile_table


def write_synthetic_tile_table(
    path: Path,
    *,
    lon: np.ndarray,
    lat: np.ndarray,
    x1: np.ndarray,
    x2: np.ndarray,
    bounds: tuple[float, float, float, float],
    log10_download: np.ndarray,
    log10_upload: np.ndarray,
    log10_latency: np.ndarray,
    urban: np.ndarray,
    split: np.ndarray,
    rng: np.random.Generator,
    tile_half_width: float,
    fractions: tuple[float, float, float],
    seed: int,
    source: str,
) -> Path:
    """Write ``path/tiles.parquet`` (one quarter, 2023Q4) and return ``path``.

    ``bounds`` = (lon_min, lat_min, lon_max, lat_max) is the [-1,1]² scaling box recorded in the
    metadata. ``tests`` and ``devices`` are drawn from ``rng``; speeds are ``10**log10_*``; every tile is a
    square of half-width ``tile_half_width`` degrees around its centroid.
    """
    n = len(lon)
    d = tile_half_width
    lon_min, lat_min, lon_max, lat_max = bounds
    gdf = gpd.GeoDataFrame(
        {
            "quadkey": [f"{i:016d}" for i in range(n)],
            "quarter": "2023Q4",
            "lon": lon,
            "lat": lat,
            "x1": x1,
            "x2": x2,
            "avg_d_kbps": 10**log10_download,
            "avg_u_kbps": 10**log10_upload,
            "avg_lat_ms": 10**log10_latency,
            "tests": rng.integers(1, 50, n).astype("int64"),
            "devices": rng.integers(1, 20, n).astype("int64"),
            "log10_download": log10_download,
            "log10_upload": log10_upload,
            "log10_latency": log10_latency,
            "urban": urban,
            "split": split,
        },
        geometry=[shapely.box(a - d, b - d, a + d, b + d) for a, b in zip(lon, lat, strict=True)],
        crs="EPSG:4326",
    )
    meta = {
        "scaling": {"lon_min": lon_min, "lon_max": lon_max, "lat_min": lat_min, "lat_max": lat_max},
        "split": {"kind": "random", "seed": seed, "fractions": list(fractions)},
        "sources": [source],
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


def fit_effect_on_masks(
    model: object,
    *,
    x: np.ndarray,
    y: np.ndarray,
    ids: np.ndarray,
    times: np.ndarray,
    train: np.ndarray,
    val: np.ndarray,
    tests: np.ndarray | None = None,
) -> object:
    """:func:`geodbk.tile_effect.fit_tile_effect` on the rows of the ``train`` and ``val``
    masks (``tests``: the rows' number of tests, for a tests-aware model)."""
    from geodbk.tile_effect import fit_tile_effect

    def noise(m: np.ndarray) -> dict[str, np.ndarray]:
        return {} if tests is None else {"tests": tests[m]}

    return fit_tile_effect(
        model,
        X=x[train],
        y=y[train],
        tiles=ids[train],
        times=times[train],
        X_val=x[val],
        y_val=y[val],
        tiles_val=ids[val],
        times_val=times[val],
        noise=noise(train),
        noise_val=noise(val),
    )
