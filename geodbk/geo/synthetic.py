"""Seeded generator of a fictional Ookla-style region ("Synthetica", postal code ``SY``).

Writes, under ``OUT`` (``python -m geodbk.geo.synthetic --out data``):

- ``ookla/parquet/performance/type={mobile,fixed}/year=2023/quarter=Q/2023-MM-01_performance_{type}_tiles.parquet``
  in the official Ookla schema (``quadkey``, ``tile`` WKT, ``avg_d_kbps``, ``avg_u_kbps``,
  ``avg_lat_ms``, ``tests``, ``devices``; ``avg_lat_down_ms``/``avg_lat_up_ms`` and, from 2023Q3,
  ``tile_x``/``tile_y`` as in the real files), four quarters;
- ``census/synthetic_uac20.geojson``: the towns' urban areas in the TIGER ``tl_2020_us_uac20``
  schema (``UACE20``, ``GEOID20``, ``NAME20``, ``NAMELSAD20``, ...);
- ``census/synthetic_state_boundaries.geojson``: Synthetica and its neighbour "Nexta" in the
  ``cb_2018_us_state_500k`` schema (``STUSPS``, ``NAME``, ``GEOID``, ...), so ``--state SY`` works;
- ``census/synthetic_counties.geojson``: Synthetica's six counties (a 3 x 2 grid of its bounding
  box cut to its boundary) in the TIGER ``tl_2020_us_county`` schema (``GEOID``, ``NAME``,
  ``NAMELSAD``, ...), the areas of ``geodbk summarize`` in the demo.

The model (documented in ``docs/data.md``): tiles appear where people test — towns, roads and a
thin rural background, with rural gaps — with Poisson-gamma ``tests`` counts (about half the
tiles have 1-2 tests); the latent log10 speed is a smooth field that rises with urbanness and road
proximity, drops in the gaps and improves slightly every quarter; a tile's observed value adds
Gaussian noise of variance ``s2_floor + s2_meas / tests`` (heteroscedastic, shrinking with tests).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from geodbk.atomic import atomic_path, atomic_write_text
from geodbk.geo import quadkey as qk
from geodbk.geo.licence import SYNTHETIC_KEY

FloatArray = npt.NDArray[np.float64]

_TOWN_NAMES = (
    "Port Alder",
    "Brookhaven",
    "Cedar Falls",
    "Millbrook",
    "Ashford",
    "Dunmore",
    "Elm Ridge",
    "Foxley",
    "Granton",
)


@dataclass(frozen=True)
class SyntheticConfig:
    """Parameters of the synthetic region (defaults give ``data/``)."""

    seed: int = 20240
    center_lon: float = -99.8
    center_lat: float = 39.6
    half_width: float = 0.75  # degrees of longitude
    half_height: float = 0.5  # degrees of latitude
    year: int = 2023
    n_quarters: int = 4
    zoom: int = 16
    mobile_tiles: int = 3000  # expected tiles per quarter (all candidates, incl. outside margin)
    fixed_tiles: int = 2500
    trend_per_quarter: float = 0.02  # log10 speed gain per quarter
    s2_floor_download: float = 0.010
    s2_meas_download: float = 0.090
    s2_floor_upload: float = 0.015
    s2_meas_upload: float = 0.120
    s2_floor_latency: float = 0.004
    s2_meas_latency: float = 0.030


@dataclass(frozen=True)
class _Town:
    name: str
    lon: float
    lat: float
    radius_km: float
    weight: float


KM_PER_DEG_LAT = 111.32


def _km(cfg: SyntheticConfig) -> tuple[float, float]:
    """Kilometres per degree of lon and lat at the region's centre."""
    return KM_PER_DEG_LAT * np.cos(np.radians(cfg.center_lat)), KM_PER_DEG_LAT


def _boundary(cfg: SyntheticConfig, rng: np.random.Generator) -> shapely.Polygon:
    theta = np.linspace(0.0, 2.0 * np.pi, 181)[:-1]
    ph = rng.uniform(0, 2 * np.pi, 3)
    r = (
        1.0
        + 0.10 * np.sin(3 * theta + ph[0])
        + 0.06 * np.sin(5 * theta + ph[1])
        + 0.03 * np.sin(9 * theta + ph[2])
    )
    lon = np.round(cfg.center_lon + cfg.half_width * 0.9 * r * np.cos(theta), 6)
    lat = np.round(cfg.center_lat + cfg.half_height * 0.9 * r * np.sin(theta), 6)
    return shapely.Polygon(np.column_stack([lon, lat]))


def _towns(cfg: SyntheticConfig, rng: np.random.Generator) -> list[_Town]:
    sizes = [(7.0, 1.0), (4.0, 0.7), (3.5, 0.6)] + [(1.6, 0.45)] * 6
    towns: list[_Town] = []
    kx, ky = _km(cfg)
    while len(towns) < len(sizes):
        rad = np.sqrt(rng.uniform(0, 0.55))
        ang = rng.uniform(0, 2 * np.pi)
        lon = cfg.center_lon + cfg.half_width * rad * np.cos(ang)
        lat = cfg.center_lat + cfg.half_height * rad * np.sin(ang)
        if all(np.hypot((lon - t.lon) * kx, (lat - t.lat) * ky) > 18 for t in towns):
            r_km, w = sizes[len(towns)]
            towns.append(_Town(_TOWN_NAMES[len(towns)], round(lon, 5), round(lat, 5), r_km, w))
    return towns


def _roads(towns: list[_Town], cfg: SyntheticConfig) -> list[FloatArray]:
    """Polylines (lon, lat) linking each town to its nearest bigger town, plus a highway."""
    kx, ky = _km(cfg)
    lines = []
    for i, t in enumerate(towns[1:], start=1):
        d = [np.hypot((t.lon - o.lon) * kx, (t.lat - o.lat) * ky) for o in towns[:i]]
        o = towns[int(np.argmin(d))]
        s = np.linspace(0, 1, 60)
        lon = t.lon + (o.lon - t.lon) * s
        lat = t.lat + (o.lat - t.lat) * s + 0.02 * np.sin(np.pi * s * 3) * (i % 2 * 2 - 1)
        lines.append(np.column_stack([lon, lat]))
    s = np.linspace(-1.2, 1.2, 120)
    hw_lon = cfg.center_lon + cfg.half_width * s
    hw_lat = cfg.center_lat - 0.1 * cfg.half_height + 0.08 * np.sin(2.5 * s)
    lines.append(np.column_stack([hw_lon, hw_lat]))
    return lines


def _dist_to_lines_km(
    lon: FloatArray, lat: FloatArray, lines: list[FloatArray], cfg: SyntheticConfig
) -> FloatArray:
    kx, ky = _km(cfg)
    geoms = [shapely.LineString(np.column_stack([ln[:, 0] * kx, ln[:, 1] * ky])) for ln in lines]
    multi = shapely.MultiLineString(geoms)
    return np.asarray(shapely.distance(multi, shapely.points(lon * kx, lat * ky)), dtype=float)


class _Fields:
    """Latent covariates of the region at any lon/lat."""

    def __init__(self, cfg: SyntheticConfig, rng: np.random.Generator) -> None:
        self.cfg = cfg
        self.boundary = _boundary(cfg, rng)
        self.towns = _towns(cfg, rng)
        self.roads = _roads(self.towns, cfg)
        kx, ky = _km(cfg)
        gaps: list[tuple[float, float, float]] = []
        while len(gaps) < 3:
            lon = cfg.center_lon + rng.uniform(-0.8, 0.8) * cfg.half_width
            lat = cfg.center_lat + rng.uniform(-0.8, 0.8) * cfg.half_height
            if all(np.hypot((lon - t.lon) * kx, (lat - t.lat) * ky) > 15 for t in self.towns):
                gaps.append((lon, lat, rng.uniform(6.0, 10.0)))
        self.gaps = gaps
        # smooth regional variation: a few plane waves, wavelengths 25-70 km
        n_w = 6
        self.wave_k = rng.uniform(2 * np.pi / 70, 2 * np.pi / 25, n_w)
        self.wave_dir = rng.uniform(0, 2 * np.pi, (4, n_w))
        self.wave_ph = rng.uniform(0, 2 * np.pi, (4, n_w))

    def covariates(self, lon: FloatArray, lat: FloatArray) -> dict[str, FloatArray]:
        cfg = self.cfg
        kx, ky = _km(cfg)
        ex = (lon - cfg.center_lon) * kx
        ny = (lat - cfg.center_lat) * ky
        dens = np.zeros_like(lon)
        urb = np.zeros_like(lon)
        for t in self.towns:
            d2 = (ex - (t.lon - cfg.center_lon) * kx) ** 2 + (
                ny - (t.lat - cfg.center_lat) * ky
            ) ** 2
            dens += t.weight * np.exp(-d2 / (2 * t.radius_km**2))
            urb += np.exp(-d2 / (2 * (1.3 * t.radius_km) ** 2))
        d_road = _dist_to_lines_km(lon, lat, self.roads, cfg)
        gap = np.zeros_like(lon)
        for glon, glat, r in self.gaps:
            d2 = (ex - (glon - cfg.center_lon) * kx) ** 2 + (ny - (glat - cfg.center_lat) * ky) ** 2
            gap += np.exp(-d2 / (2 * r**2))
        waves = np.zeros((4, lon.shape[0]))
        for j in range(4):
            proj = (
                ex[None, :] * np.cos(self.wave_dir[j])[:, None]
                + ny[None, :] * np.sin(self.wave_dir[j])[:, None]
            )
            waves[j] = np.sin(self.wave_k[:, None] * proj + self.wave_ph[j][:, None]).mean(axis=0)
        inside = np.asarray(shapely.intersects_xy(self.boundary, lon, lat), dtype=bool)
        return {
            "density": dens,
            "urban": np.minimum(urb, 1.0),
            "road": np.exp(-(d_road**2) / (2 * 0.5**2)),
            "road_wide": np.exp(-(d_road**2) / (2 * 2.0**2)),
            "gap": np.minimum(gap, 1.0),
            "wave": waves,
            "inside": inside,
        }


def _candidates(fields: _Fields) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    cfg = fields.cfg
    w, s, e, n = fields.boundary.bounds
    m = 0.06
    x0, y0 = qk.lonlat_to_tile([w - m], [n + m], cfg.zoom)
    x1, y1 = qk.lonlat_to_tile([e + m], [s - m], cfg.zoom)
    xs, ys = np.meshgrid(
        np.arange(int(x0[0]), int(x1[0]) + 1), np.arange(int(y0[0]), int(y1[0]) + 1)
    )
    return xs.ravel().astype(np.int64), ys.ravel().astype(np.int64)


def _latent(
    cov: dict[str, FloatArray], kind: str, q: int, cfg: SyntheticConfig
) -> dict[str, FloatArray]:
    """Latent log10 download/upload (kbps) and latency (ms) for network ``kind`` in quarter ``q``."""
    u, rd, g, wv = cov["urban"], cov["road_wide"], cov["gap"], cov["wave"]
    tr = cfg.trend_per_quarter * q
    if kind == "mobile":
        d = 4.15 + 0.65 * u + 0.25 * rd - 0.55 * g + 0.25 * wv[0] + tr
        up = 3.35 + 0.45 * u + 0.20 * rd - 0.45 * g + 0.20 * wv[1] + 0.6 * tr
        lat = 1.75 - 0.30 * u - 0.10 * rd + 0.25 * g + 0.10 * wv[2] - 0.5 * tr
    else:
        d = 4.30 + 0.85 * u + 0.05 * rd - 0.65 * g + 0.25 * wv[1] + tr
        up = 3.45 + 0.75 * u - 0.50 * g + 0.25 * wv[3] + 0.8 * tr
        lat = 1.45 - 0.25 * u + 0.30 * g + 0.10 * wv[0] - 0.5 * tr
    return {"download": d, "upload": up, "latency": lat}


def latent_field(
    lon: Any,
    lat: Any,
    *,
    target: str,
    kind: str = "mobile",
    quarter: int = 0,
    config: SyntheticConfig | None = None,
) -> FloatArray:
    """The true latent level of :func:`generate`'s region at lon/lat (degrees): log10 kbps
    (download, upload) or log10 ms (latency) of ``kind`` tiles in quarter ``quarter`` (0 = the
    first generated quarter). A generated tile's value is this plus Gaussian noise of variance
    ``s2_floor + s2_meas / tests`` (then rounded to whole kbps or ms), so this is the surface a
    model's ``f`` estimates. Same fields as :func:`generate` with the same ``config``."""
    cfg = config or SyntheticConfig()
    fields = _Fields(cfg, np.random.default_rng(cfg.seed))  # generate() draws them first
    x = np.asarray(lon, dtype=np.float64).ravel()
    y = np.asarray(lat, dtype=np.float64).ravel()
    return _latent(fields.covariates(x, y), kind, int(quarter), cfg)[target]


def _wkt(w: FloatArray, s: FloatArray, e: FloatArray, n: FloatArray) -> list[str]:
    return [
        f"POLYGON(({a!r} {d!r}, {c!r} {d!r}, {c!r} {b!r}, {a!r} {b!r}, {a!r} {d!r}))"
        for a, b, c, d in zip(w.tolist(), s.tolist(), e.tolist(), n.tolist(), strict=True)
    ]


def _quarter_table(
    fields: _Fields,
    cov: dict[str, Any],
    xs: npt.NDArray[np.int64],
    ys: npt.NDArray[np.int64],
    kind: str,
    q: int,
    scale: float,
    rng: np.random.Generator,
) -> pa.Table:
    cfg = fields.cfg
    lam = _intensity(cov, kind)
    p = 1.0 - np.exp(-scale * lam)
    present = rng.random(lam.shape[0]) < p
    idx = np.flatnonzero(present)
    lam_i = lam[idx]
    ref = np.quantile(lam, 0.995)
    mean_tests = 0.6 + 14.0 * (lam_i / ref) ** 1.3
    shape = 0.7
    rate = rng.gamma(shape, mean_tests / shape)
    tests = 1 + rng.poisson(rate)
    devices = 1 + rng.binomial(tests - 1, 0.35)
    sub = {k: (v[:, idx] if k == "wave" else v[idx]) for k, v in cov.items()}
    lat_f = _latent(sub, kind, q, cfg)
    obs = {}
    for target in ("download", "upload", "latency"):
        s2 = getattr(cfg, f"s2_floor_{target}") + getattr(cfg, f"s2_meas_{target}") / tests
        obs[target] = lat_f[target] + np.sqrt(s2) * rng.standard_normal(idx.shape[0])
    z = np.full(idx.shape[0], cfg.zoom)
    x, y = xs[idx], ys[idx]
    keys = qk.tile_to_quadkey(x, y, z)
    order = np.argsort(keys, kind="stable")
    keys, x, y = keys[order], x[order], y[order]
    tests, devices = tests[order], devices[order]
    obs = {k: v[order] for k, v in obs.items()}
    w, s, e, n = qk.tile_bounds(x, y, z)
    lat_ms = np.maximum(np.round(10 ** obs["latency"]), 1).astype(np.int64)
    quarter_no = q % 4 + 1
    year = cfg.year + q // 4
    cols: dict[str, pa.Array] = {
        "quadkey": pa.array(keys.tolist(), pa.string()),
        "tile": pa.array(_wkt(w, s, e, n), pa.string()),
    }
    if (year, quarter_no) >= (2023, 3):
        cols["tile_x"] = pa.array(np.round((w + e) / 2, 7), pa.float64())
        cols["tile_y"] = pa.array(np.round((s + n) / 2, 7), pa.float64())
    cols["avg_d_kbps"] = pa.array(np.maximum(np.round(10 ** obs["download"]), 1).astype(np.int64))
    cols["avg_u_kbps"] = pa.array(np.maximum(np.round(10 ** obs["upload"]), 1).astype(np.int64))
    cols["avg_lat_ms"] = pa.array(lat_ms)
    if (year, quarter_no) >= (2022, 4):
        down = lat_ms + rng.poisson(0.6 * lat_ms)
        up = lat_ms + rng.poisson(0.4 * lat_ms)
        cols["avg_lat_down_ms"] = pa.array(down.astype(np.int64))
        cols["avg_lat_up_ms"] = pa.array(up.astype(np.int64))
    cols["tests"] = pa.array(tests.astype(np.int64))
    cols["devices"] = pa.array(devices.astype(np.int64))
    return pa.table(cols)


def _intensity(cov: dict[str, Any], kind: str) -> FloatArray:
    """Relative rate at which a tile holds tests."""
    road_w = 0.35 if kind == "mobile" else 0.06
    lam = cov["density"] + road_w * cov["road"] + 0.035 * (1.0 + 0.5 * cov["wave"][2])
    lam = lam * (1.0 - 0.92 * cov["gap"])
    return np.asarray(np.where(cov["inside"], lam, 0.3 * lam), dtype=float)


def _calibrate(lam: FloatArray, target: float) -> float:
    """Scale ``c`` with ``sum(1 - exp(-c lam)) = target`` (bisection)."""
    lo, hi = 0.0, 1.0
    while (1 - np.exp(-hi * lam)).sum() < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if (1 - np.exp(-mid * lam)).sum() < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _urban_layer(fields: _Fields, rng: np.random.Generator) -> gpd.GeoDataFrame:
    cfg = fields.cfg
    kx, ky = _km(cfg)
    rows: list[dict[str, Any]] = []
    geoms = []
    theta = np.linspace(0, 2 * np.pi, 73)[:-1]
    for i, t in enumerate(fields.towns):
        r = (
            1.5
            * t.radius_km
            * (
                1
                + 0.15 * np.sin(3 * theta + rng.uniform(0, 6.3))
                + 0.08 * np.sin(7 * theta + rng.uniform(0, 6.3))
            )
        )
        lon = np.round(t.lon + r * np.cos(theta) / kx, 6)
        lat = np.round(t.lat + r * np.sin(theta) / ky, 6)
        poly = shapely.Polygon(np.column_stack([lon, lat])).intersection(fields.boundary)
        geoms.append(poly)
        code = f"{99001 + i * 7:05d}"
        area_km2 = float(np.pi * (1.5 * t.radius_km) ** 2)
        rows.append(
            {
                "UACE20": code,
                "GEOID20": code,
                "GEOIDFQ20": f"400C100US{code}",
                "NAME20": f"{t.name}, SY",
                "NAMELSAD20": f"{t.name}, SY Urban Area",
                "LSAD20": "75",
                "MTFCC20": "G3500",
                "FUNCSTAT20": "S",
                "ALAND20": round(area_km2 * 1e6),
                "AWATER20": 0,
                "INTPTLAT20": f"{t.lat:+011.7f}",
                "INTPTLON20": f"{t.lon:+012.7f}",
            }
        )
    return gpd.GeoDataFrame(rows, geometry=geoms, crs="EPSG:4326")


def _state_layer(fields: _Fields) -> gpd.GeoDataFrame:
    cfg = fields.cfg
    w, s, e, n = fields.boundary.bounds
    outer = shapely.box(w - 0.3, s - 0.3, e + 0.3, n + 0.3)
    nexta = outer.difference(fields.boundary)
    rows = [
        {
            "STATEFP": "91",
            "STATENS": "09100000",
            "AFFGEOID": "0400000US91",
            "GEOID": "91",
            "STUSPS": "SY",
            "NAME": "Synthetica",
            "LSAD": "00",
        },
        {
            "STATEFP": "92",
            "STATENS": "09200000",
            "AFFGEOID": "0400000US92",
            "GEOID": "92",
            "STUSPS": "NX",
            "NAME": "Nexta",
            "LSAD": "00",
        },
    ]
    gdf = gpd.GeoDataFrame(rows, geometry=[fields.boundary, nexta], crs="EPSG:4326")
    area = gdf.to_crs(f"+proj=laea +lat_0={cfg.center_lat} +lon_0={cfg.center_lon}").area
    gdf["ALAND"] = np.round(area.to_numpy()).astype(np.int64)
    gdf["AWATER"] = np.int64(0)
    return gdf


#: Names of the synthetic counties, west to east, north row first.
COUNTY_NAMES = ("Alder", "Birch", "Cedar", "Dogwood", "Elm", "Fir")


def _county_layer(fields: _Fields) -> gpd.GeoDataFrame:
    """Synthetica's counties: a 3 x 2 grid of the state's bounding box cut to its boundary."""
    w, s, e, n = fields.boundary.bounds
    lons = np.linspace(w, e, 4)
    lats = np.linspace(n, s, 3)
    rows, geoms = [], []
    for k, (i, j) in enumerate((i, j) for i in range(2) for j in range(3)):
        cell = shapely.box(lons[j], lats[i + 1], lons[j + 1], lats[i])
        fips = f"{2 * k + 1:03d}"
        rows.append(
            {
                "STATEFP": "91",
                "COUNTYFP": fips,
                "GEOID": f"91{fips}",
                "NAME": COUNTY_NAMES[k],
                "NAMELSAD": f"{COUNTY_NAMES[k]} County",
                "LSAD": "06",
            }
        )
        geoms.append(cell.intersection(fields.boundary))
    return gpd.GeoDataFrame(rows, geometry=geoms, crs="EPSG:4326")


def _write_geojson(gdf: gpd.GeoDataFrame, path: Path) -> None:
    data = json.loads(gdf.to_json(drop_id=True))
    atomic_write_text(path, json.dumps(data, separators=(",", ":")) + "\n")


def generate(out: str | Path, *, config: SyntheticConfig | None = None) -> dict[str, Any]:
    """Generate the synthetic region under ``out``; returns a summary (paths, tile counts).

    Output is a pure function of ``config`` (same numpy/pyarrow versions give identical bytes).
    """
    cfg = config or SyntheticConfig()
    out_dir = Path(out)
    rng = np.random.default_rng(cfg.seed)
    fields = _Fields(cfg, rng)
    xs, ys = _candidates(fields)
    w, s, e, n = qk.tile_bounds(xs, ys, np.full(xs.shape, cfg.zoom))
    cov = fields.covariates((w + e) / 2, (s + n) / 2)
    summary: dict[str, Any] = {"config": asdict(cfg), "files": [], "tiles": {}}
    for kind in ("mobile", "fixed"):
        lam = _intensity(cov, kind)
        target = cfg.mobile_tiles if kind == "mobile" else cfg.fixed_tiles
        scale = _calibrate(lam, target)
        for q in range(cfg.n_quarters):
            qrng = np.random.default_rng([cfg.seed, 1 if kind == "mobile" else 2, q])
            table = _quarter_table(fields, cov, xs, ys, kind, q, scale, qrng)
            year = cfg.year + q // 4
            qn = q % 4 + 1
            path = (
                out_dir
                / "ookla/parquet/performance"
                / f"type={kind}/year={year}/quarter={qn}"
                / f"{year}-{3 * (qn - 1) + 1:02d}-01_performance_{kind}_tiles.parquet"
            )
            marked = table.replace_schema_metadata({SYNTHETIC_KEY: b"1"})  # no Ookla licence
            with atomic_path(path) as tmp:
                pq.write_table(marked, tmp, compression="snappy")
            summary["files"].append(str(path))
            summary["tiles"][f"{kind} {year}Q{qn}"] = table.num_rows
    urban_path = out_dir / "census/synthetic_uac20.geojson"
    states_path = out_dir / "census/synthetic_state_boundaries.geojson"
    counties_path = out_dir / "census/synthetic_counties.geojson"
    _write_geojson(_urban_layer(fields, np.random.default_rng([cfg.seed, 3])), urban_path)
    _write_geojson(_state_layer(fields), states_path)
    _write_geojson(_county_layer(fields), counties_path)
    summary["files"] += [str(urban_path), str(states_path), str(counties_path)]
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m geodbk.geo.synthetic --out data``."""
    parser = argparse.ArgumentParser(description="Generate the synthetic Ookla-style region.")
    parser.add_argument("--out", default="data", help="output folder (default: data)")
    parser.add_argument("--seed", type=int, default=SyntheticConfig.seed, help="random seed")
    args = parser.parse_args(argv)
    summary = generate(args.out, config=SyntheticConfig(seed=args.seed))
    for key, value in summary["tiles"].items():
        print(f"{key}: {value} tiles")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
