"""Build small run directories for pipeline tests without the ingest stage."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pytest
import shapely
from tile_tables import write_synthetic_tile_table

#: A triangle-ish island used as the test region (lon/lat degrees).
REGION = shapely.Polygon([(-158.3, 21.2), (-157.6, 21.2), (-157.7, 21.75), (-158.2, 21.7)])


def make_run(path: Path, *, n: int = 600, seed: int = 0) -> Path:
    """Write ``tiles.parquet``, ``region.geojson`` and ``urban_areas.geojson`` of a synthetic
    region into ``path``.

    Tiles are random points in :data:`REGION` (one quarter), urban where ``x1 + x2 > 0.4``
    (the north-east of the region: :func:`urban_polygon`), with smooth log10
    download/upload/latency fields and heteroscedastic noise.
    """
    rng = np.random.default_rng(seed)
    lon_min, lat_min, lon_max, lat_max = REGION.bounds
    pts: list[tuple[float, float]] = []
    while len(pts) < n:
        x, y = rng.uniform(lon_min, lon_max), rng.uniform(lat_min, lat_max)
        if REGION.contains(shapely.Point(x, y)):
            pts.append((x, y))
    lon, lat = np.array(pts).T
    x1 = 2 * (lon - lon_min) / (lon_max - lon_min) - 1
    x2 = 2 * (lat - lat_min) / (lat_max - lat_min) - 1
    urban = (x1 + x2) > 0.4
    noise = np.where(urban, 0.15, 0.35)
    ld = 4.4 + 0.4 * np.sin(2 * x1) + 0.3 * urban + noise * rng.standard_normal(n)
    lu = 3.7 + 0.3 * np.cos(2 * x2) + 0.2 * urban + noise * rng.standard_normal(n)
    ll = 1.6 - 0.1 * urban + 0.5 * noise * rng.standard_normal(n)
    split = rng.choice(["train", "val", "test"], size=n, p=[0.7, 0.15, 0.15])
    write_synthetic_tile_table(
        path,
        lon=lon,
        lat=lat,
        x1=x1,
        x2=x2,
        bounds=(lon_min, lat_min, lon_max, lat_max),
        log10_download=ld,
        log10_upload=lu,
        log10_latency=ll,
        urban=urban,
        split=split,
        rng=rng,
        tile_half_width=0.003,
        fractions=(0.7, 0.15, 0.15),
        seed=seed,
        source="tests",
    )
    gpd.GeoDataFrame({"name": ["test"]}, geometry=[REGION], crs="EPSG:4326").to_file(
        path / "region.geojson", driver="GeoJSON"
    )
    gpd.GeoDataFrame({"name": ["town"]}, geometry=[urban_polygon()], crs="EPSG:4326").to_file(
        path / "urban_areas.geojson", driver="GeoJSON"
    )
    return path


def urban_polygon() -> shapely.Polygon:
    """The urban part of :data:`REGION`'s bounding box, ``x1 + x2 > 0.4`` in scaled
    coordinates (``x = 2 (lon - min) / width - 1``), as a lon/lat polygon."""
    lon_min, lat_min, lon_max, lat_max = REGION.bounds

    def lonlat(x1: float, x2: float) -> tuple[float, float]:
        return (
            lon_min + (x1 + 1) / 2 * (lon_max - lon_min),
            lat_min + (x2 + 1) / 2 * (lat_max - lat_min),
        )

    return shapely.Polygon([lonlat(1.0, -0.6), lonlat(1.0, 1.0), lonlat(-0.6, 1.0)])


@contextmanager
def killed_after_checkpoints(monkeypatch: pytest.MonkeyPatch, n: int) -> Iterator[None]:
    """Simulate a process killed right after its ``n``-th training checkpoint is written.

    Inside the block, ``geodbk.training._save_checkpoint`` (used by the in-memory and the
    streaming loops) writes the checkpoint and then raises ``KeyboardInterrupt`` on call ``n``;
    the block expects that interrupt, and the real writer is restored when it ends.
    """
    import geodbk.training

    real_save = geodbk.training._save_checkpoint
    calls = {"n": 0}

    def save_then_die(directory: Path, state: dict[str, Any]) -> None:
        real_save(directory, state)
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt

    monkeypatch.setattr(geodbk.training, "_save_checkpoint", save_then_die)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield
    finally:
        monkeypatch.setattr(geodbk.training, "_save_checkpoint", real_save)


def grid_noise_s2(
    attrs: Any, tests: float, devices: float | None = None, *, urban: Any = False
) -> Any:
    """The observation-noise variance a grid's attributes describe, computed independently of
    the code under test: ``s2_floor + s2_meas / tests^p`` (+ ``s2_dev / devices^q`` for a
    ``tests+devices`` model, devices = tests unless given); a model with a floor per
    urban/rural class uses ``s2_floor_urban`` where ``urban`` (bool or bool array) is true."""
    floor = float(attrs["noise_s2_floor"])
    if "noise_s2_floor_urban" in attrs:
        floor = np.where(urban, float(attrs["noise_s2_floor_urban"]), floor)
    s2 = floor + float(attrs["noise_s2_meas"]) / tests ** float(attrs.get("noise_power", 1.0))
    if attrs["noise_model"] == "tests+devices":
        k = tests if devices is None else devices
        s2 += float(attrs["noise_s2_dev"]) / k ** float(attrs.get("noise_power_devices", 1.0))
    return s2


#: Each service target's predictive mean and sd (log10 units) at every place of
#: :func:`fake_service`: 30 Mbps / 5 Mbps / 40 ms, sds 0.1, 0.2, 0.1.
FAKE_SERVICE_LEVELS = {
    "download": (np.log10(30e3), 0.1),
    "upload": (np.log10(5e3), 0.2),
    "latency": (np.log10(40.0), 0.1),
}


def fake_service(*, quarters: tuple[str, ...] = ("2023Q4",) * 3, tiers: str = "25/3,100/20") -> Any:
    """A :class:`pipelines.service_classes.Service` of three stand-in predictors (the same
    mean and sd at every place: :data:`FAKE_SERVICE_LEVELS`; ``quarters``: each target's
    quarter) and a copula with correlation 0.5 between download and upload."""
    from types import SimpleNamespace

    from pipelines.copula import Copula
    from pipelines.service_classes import SERVICE_TARGETS, Service, resolve_tiers

    def predictor(target: str, quarter: str) -> Any:
        mean, sd = FAKE_SERVICE_LEVELS[target]

        def predict(lon: Any, lat: Any, *, quantity: str) -> Any:
            n = len(lon)
            return SimpleNamespace(mean=np.full(n, mean), sd=np.full(n, sd))

        model = SimpleNamespace(tests_aware=False)
        return SimpleNamespace(
            predict=predict, quarter=quarter, model=model, effect=None, layer=None
        )

    R = np.array([[1.0, 0.5, 0.0], [0.5, 1.0, 0.0], [0.0, 0.0, 1.0]])
    copula = Copula(SERVICE_TARGETS, R, rows=40, residual_sd=dict.fromkeys(SERVICE_TARGETS, 1.0))
    checked, latency = resolve_tiers(tiers, 100.0)
    predictors = {t: predictor(t, q) for t, q in zip(SERVICE_TARGETS, quarters, strict=True)}
    return Service(checked, latency, "tile", predictors, copula)  # type: ignore[arg-type]


#: What the service stage reads from a run (grids, exports and reports are not copied).
SERVICE_INPUTS = ("tiles.parquet", "region.geojson", "urban_areas.geojson", "ingest_manifest.json")


def copy_service_inputs(
    src: Path, dst: Path, *, targets: tuple[str, ...] = ("download", "upload", "latency")
) -> Path:
    """A writable run at ``dst`` with ``src``'s tile table, region and the models of
    ``targets``."""
    dst.mkdir(parents=True)
    for name in SERVICE_INPUTS:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
    for t in targets:
        shutil.copytree(src / "models" / t, dst / "models" / t)
    return dst
