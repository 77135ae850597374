"""A small synthetic run directory following docs/architecture.md, for dashboard tests.

It is independent of the pipelines (so the app can be tested before and apart from them); the
model is a real, tiny ``DBKRegressor`` fitted for a few epochs when ``with_model`` is set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

LON = (-158.0, -157.6)
LAT = (21.25, 21.6)
SCALING = {"lon_min": LON[0], "lon_max": LON[1], "lat_min": LAT[0], "lat_max": LAT[1]}
URBAN_CENTRE = (-157.85, 21.33)


def _circle(lon: float, lat: float, r: float, n: int = 24) -> list[list[float]]:
    ang = np.linspace(0, 2 * np.pi, n, endpoint=False)
    ring = [[lon + r * np.cos(a), lat + 0.9 * r * np.sin(a)] for a in ang]
    return [*ring, ring[0]]


def _region_ring() -> list[list[float]]:
    w, e = LON
    s, n = LAT
    return [[w, s + 0.05], [e - 0.05, s], [e, n - 0.1], [w + 0.1, n], [w, s + 0.05]]


def _truth(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
    d = np.hypot(lon - URBAN_CENTRE[0], lat - URBAN_CENTRE[1])
    return 4.9 - 2.2 * d + 0.1 * np.sin(12 * lon)  # log10 kbps: ~80 Mbps in town, less outside


def write_tiles(
    run: Path,
    rng: np.random.Generator,
    n: int = 400,
    quarters: tuple[str, ...] = ("2023Q3", "2023Q4"),
) -> pd.DataFrame:
    """Write ``tiles.parquet`` (GeoParquet with ``geodbk`` metadata) and return it.

    Each tile gets one of ``quarters`` at random; its value rises by 0.05 log10 per quarter
    after the first (a trend a time-aware model can pick up).
    """
    import geopandas as gpd
    import pyarrow.parquet as pq
    import shapely

    u = rng.random(n)
    near = rng.normal(0, 0.03, size=(n, 2)) + np.array(URBAN_CENTRE)
    far = np.column_stack([rng.uniform(*LON, n), rng.uniform(*LAT, n)])
    pts = np.where((u < 0.5)[:, None], near, far)
    lon, lat = pts[:, 0], pts[:, 1]
    lon[0], lat[0] = -157.65, 21.55  # one isolated tile (the "remote" preset)
    q_idx = rng.integers(0, len(quarters), n)
    tile_quarters = np.asarray(quarters)[q_idx]
    y = _truth(lon, lat) + 0.05 * q_idx + rng.normal(0, 0.15, n)
    half = 0.003
    geom = shapely.box(lon - half, lat - half, lon + half, lat + half)
    urban = np.hypot(lon - URBAN_CENTRE[0], lat - URBAN_CENTRE[1]) < 0.06
    frame = gpd.GeoDataFrame(
        {
            "quadkey": [f"0213{i:012d}" for i in range(n)],
            "quarter": tile_quarters,
            "lon": lon,
            "lat": lat,
            "x1": 2 * (lon - LON[0]) / (LON[1] - LON[0]) - 1,
            "x2": 2 * (lat - LAT[0]) / (LAT[1] - LAT[0]) - 1,
            "avg_d_kbps": (10**y).round().astype(np.int64),
            "avg_u_kbps": (10 ** (y - 0.8)).round().astype(np.int64),
            "avg_lat_ms": rng.integers(15, 90, n),
            "tests": rng.integers(1, 60, n),
            "devices": rng.integers(1, 20, n),
            "log10_download": y,
            "log10_upload": y - 0.8,
            "log10_latency": np.log10(rng.integers(15, 90, n)),
            "urban": urban,
            "split": rng.choice(["train", "val", "test"], n, p=[0.8, 0.1, 0.1]),
        },
        geometry=geom,
        crs="EPSG:4326",
    )
    path = run / "tiles.parquet"
    frame.to_parquet(path)
    table = pq.read_table(path)
    meta = dict(table.schema.metadata or {})
    meta[b"geodbk"] = json.dumps(
        {
            "schema_version": 1,
            "scaling": SCALING,
            "quarters": list(quarters),
            "type": "mobile",
        }
    ).encode()
    pq.write_table(table.replace_schema_metadata(meta), path)
    return pd.DataFrame(frame.drop(columns="geometry"))


def write_geojson(run: Path) -> None:
    """Write ``region.geojson`` and ``urban_areas.geojson``."""
    region = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "properties": {"name": "synthetic"},
                "geometry": {"type": "Polygon", "coordinates": [_region_ring()]},
            }
        ],
    }
    urban = {
        "type": "FeatureCollection",
        "features": [
            {
                "type": "Feature",
                "properties": {"name": "Town"},
                "geometry": {"type": "Polygon", "coordinates": [_circle(*URBAN_CENTRE, 0.06)]},
            }
        ],
    }
    (run / "region.geojson").write_text(json.dumps(region))
    (run / "urban_areas.geojson").write_text(json.dumps(urban))


def _grid_coords(nx: int, ny: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cell centres (x ascending, y descending), their 2-D mesh and the in-region mask."""
    import shapely

    x = np.linspace(LON[0] + 0.0025, LON[1] - 0.0025, nx)
    y = np.linspace(LAT[1] - 0.0025, LAT[0] + 0.0025, ny)  # descending
    lon2, lat2 = np.meshgrid(x, y)
    inside = shapely.contains_xy(shapely.Polygon(_region_ring()), lon2, lat2)
    return x, y, np.stack([lon2, lat2]), inside


def _write_nc(ds: object, path: Path) -> None:
    """Write a dataset as the pipelines do: netCDF4 (h5netcdf), netCDF3 (scipy) without h5py."""
    try:
        import h5py  # noqa: F401

        ds.to_netcdf(path, engine="h5netcdf")  # type: ignore[attr-defined]
    except ImportError:
        ds.to_netcdf(path, engine="scipy")  # type: ignore[attr-defined]


def write_grid(
    run: Path,
    target: str = "download",
    nx: int = 80,
    ny: int = 70,
    *,
    quarter: str | None = None,
    attrs: dict[str, object] | None = None,
    shift: float = 0.0,
) -> Path:
    """Write ``grids/TARGET.nc`` (``quarter`` None) or ``grids/TARGET_QUARTER.nc`` with the
    contract's variables (NaN outside the region); ``shift`` is added to the log10 mean and
    ``attrs`` to the global attributes (``quarter``, ``quarter_status``, ``time_aware``)."""
    import xarray as xr

    x, y, (lon2, lat2), inside = _grid_coords(nx, ny)
    mean = np.where(inside, _truth(lon2, lat2) + shift, np.nan)
    d = np.hypot(lon2 - URBAN_CENTRE[0], lat2 - URBAN_CENTRE[1])
    std = np.where(inside, 0.12 + 0.4 * d, np.nan)
    div = 1000.0 if target != "latency" else 1.0
    lo, hi = mean - 1.96 * std, mean + 1.96 * std
    from scipy.special import ndtr

    data = {
        "mean": mean,
        "std": std,
        "pi_lower": lo,
        "pi_upper": hi,
        "pi_width": hi - lo,
        "mean_natural": 10**mean / div,
        "pi_lower_natural": 10**lo / div,
        "pi_upper_natural": 10**hi / div,
        "pi_width_natural": (10**hi - 10**lo) / div,
        "p_below_25mbps": ndtr((np.log10(25_000) - mean) / std),
        "in_region": inside.astype(np.int8),
    }
    ds = xr.Dataset(
        {k: (("y", "x"), v.astype(np.float32) if k != "in_region" else v) for k, v in data.items()},
        coords={"x": x, "y": y},
        attrs={"target": target, "units": "log10 kbps", "natural_units": "Mbps", **(attrs or {})},
    )
    (run / "grids").mkdir(exist_ok=True)
    path = run / "grids" / (f"{target}.nc" if quarter is None else f"{target}_{quarter}.nc")
    _write_nc(ds, path)
    return path


def write_trend_grid(
    run: Path,
    first: str,
    last: str,
    target: str = "download",
    nx: int = 80,
    ny: int = 70,
) -> Path:
    """Write ``grids/TARGET_trend_FIRST_LAST.nc`` as ``geodbk predict --trend`` does.

    The change per year (log10 units) rises from -0.05 in the west to +0.15 in the east, with
    a 95% interval of +/- 0.04 and ``p_improved = Phi(change / 0.02)``.
    """
    import xarray as xr
    from scipy.special import ndtr

    x, y, (lon2, _lat2), inside = _grid_coords(nx, ny)
    years = ((int(last[:4]) * 4 + int(last[5])) - (int(first[:4]) * 4 + int(first[5]))) / 4
    frac = (lon2 - LON[0]) / (LON[1] - LON[0])
    change = np.where(inside, -0.05 + 0.2 * frac, np.nan)
    lower, upper = change - 0.04, change + 0.04
    p = ndtr(change / 0.02)
    data = {
        "change_per_year": change,
        "change_lower": lower,
        "change_upper": upper,
        "p_improved": p if target != "latency" else 1 - p,
        "ratio_per_year": 10**change,
        "ratio_lower": 10**lower,
        "ratio_upper": 10**upper,
    }
    ds = xr.Dataset(
        {k: (("y", "x"), v.astype(np.float32)) for k, v in data.items()}
        | {"in_region": (("y", "x"), inside.astype(np.int8))},
        coords={"x": x, "y": y},
        attrs={
            "product": "trend",
            "target": target,
            "first_quarter": first,
            "last_quarter": last,
            "years": years,
            "time_aware": 1,
            "units": "log10 units per year (latent mean)",
        },
    )
    (run / "grids").mkdir(exist_ok=True)
    path = run / "grids" / f"{target}_trend_{first}_{last}.nc"
    _write_nc(ds, path)
    return path


def write_model(
    run: Path,
    tiles: pd.DataFrame,
    target: str = "download",
    *,
    time_scaling: dict[str, str] | None = None,
) -> None:
    """Fit a tiny real DBKRegressor and save the bundle with history and config.

    With ``time_scaling`` (``{"first": Q, "last": Q}``) the model is time-aware: inputs
    ``[x1, x2, t]`` with t = ``TimeScaling.scale(quarter)``, and the metadata records
    ``inputs``, ``time_scaling`` and ``quarters`` as ``geodbk train --time`` does.
    """
    from geodbk.estimator import DBKRegressor

    train = tiles[tiles["split"] != "test"]
    X = train[["x1", "x2"]].to_numpy(dtype=float)
    extra: dict[str, object] = {}
    if time_scaling is not None:
        from geodbk.geo.timeaxis import TimeScaling

        ts = TimeScaling.from_dict(time_scaling)
        X = np.column_stack([X, ts.scale(train["quarter"].astype(str).to_numpy())])
        extra = {
            "inputs": ["x1", "x2", "t"],
            "time_scaling": ts.to_dict(),
            "quarters": sorted(tiles["quarter"].astype(str).unique().tolist()),
        }
    y = train[f"log10_{target}"].to_numpy(dtype=float)
    model = DBKRegressor(rank=32, hidden=16, epochs=4, batch_size=256, device="cpu", seed=0)
    model.fit(X[:300], y[:300], X[300:], y[300:])
    hist = [dict(r) for r in model.history_]
    model.save(
        run / "models" / target,
        metadata={
            "target": target,
            "input_scaling": SCALING,
            "n_train": 300,
            "n_val": len(y) - 300,
            "best_epoch": model.best_epoch_,
            "timings": {"fit_seconds": 1.5, "epochs_run": len(hist), "seconds_per_epoch": 0.4},
            "target_transform": "log10(avg_d_kbps); natural = 10**y / 1000 Mbps",
            **extra,
        },
    )
    pd.DataFrame(hist).to_csv(run / "models" / target / "history.csv", index=False)
    (run / "models" / target / "config.yaml").write_text("rank: 32\nhidden: 16\nepochs: 4\n")


def write_report(run: Path, tiles: pd.DataFrame, target: str = "download") -> None:
    """Write ``report/TARGET/`` (metrics, summary, predictions, figures, report files)."""
    from PIL import Image

    rdir = run / "report" / target
    (rdir / "figures").mkdir(parents=True, exist_ok=True)
    test = tiles[tiles["split"] == "test"]
    y = test[f"log10_{target}"].to_numpy()
    mean = _truth(test["lon"].to_numpy(), test["lat"].to_numpy())
    std = np.full_like(mean, 0.16)
    pd.DataFrame(
        {
            "quadkey": test["quadkey"],
            "quarter": test["quarter"],
            "urban": test["urban"],
            "y": y,
            "mean": mean,
            "std": std,
        }
    ).to_parquet(rdir / "predictions.parquet")
    group = {
        "n": len(y),
        "mae": 0.12,
        "nll": -0.4,
        "crps": 0.09,
        "coverage95": 0.95,
        "width95": 0.63,
    }
    group |= {
        "mae_std": 0.4,
        "nll_std": 0.8,
        "crps_std": 0.3,
        "coverage95_std": 0.95,
        "width95_std": 2.1,
    }
    metrics = {"urban": group, "rural": group, "all": group}
    (rdir / "metrics.json").write_text(json.dumps(metrics))
    summary = {
        "metrics": metrics,
        "baseline_constant_mean": metrics,
        "reliability": {"all": {"levels": [0.5, 0.9, 0.95], "coverage": [0.52, 0.9, 0.94]}},
        "service_coverage": [
            {
                "threshold": 25.0,
                "label": "≥ 25 Mbps",
                "tiles": 0.7,
                "area": 0.4,
                "urban": 0.9,
                "rural": 0.5,
                "n_tiles": 400,
            }
        ],
    }
    (rdir / "summary.json").write_text(json.dumps(summary))
    for name in ("pi_width_violin", "reliability", "service_coverage", "sd_maps"):
        Image.new("RGB", (120, 80), (200, 220, 240)).save(rdir / "figures" / f"{name}.png")
    (rdir / "report.md").write_text("# report\n")
    (rdir / "report.html").write_text("<h1>report</h1>")
    (run / "exports").mkdir(exist_ok=True)
    (run / "exports" / f"{target}.tif").write_bytes(b"II*\x00fake")


def write_by_quarter(run: Path, quarters: tuple[str, ...], target: str = "download") -> None:
    """Add ``by_quarter`` to ``report/TARGET/metrics.json`` (the contract's keys per quarter:
    n, nll, coverage95, mae, width95 and the same for urban and rural). Coverage falls from
    0.95 by 0.05 per quarter after the first, urban 0.01 above and rural 0.01 below."""
    path = run / "report" / target / "metrics.json"
    metrics = json.loads(path.read_text())
    by_quarter: dict[str, object] = {}
    for i, q in enumerate(quarters):
        cov = 0.95 - 0.05 * i

        def group(n: int, c: float, i: int = i) -> dict[str, float | int]:
            return {"n": n, "nll": -0.4 + 0.1 * i, "coverage95": c, "mae": 0.12, "width95": 0.6}

        by_quarter[q] = group(30 + i, cov) | {
            "urban": group(10, cov + 0.01),
            "rural": group(20 + i, cov - 0.01),
        }
    metrics["by_quarter"] = by_quarter
    path.write_text(json.dumps(metrics))


#: Metric keys of reports written before the names were unified: new name -> old name.
OLD_METRIC_KEYS = {
    "coverage95": "coverage",
    "width95": "pi_width",
    "coverage95_std": "coverage_std",
    "width95_std": "pi_width_std",
}


def write_old_metric_keys(run: Path, target: str = "download") -> None:
    """Rewrite ``report/TARGET/metrics.json`` and ``summary.json`` with the old metric keys
    (``coverage``, ``pi_width``, ...), as an older geodbk wrote them."""

    def old(doc: object) -> object:
        if isinstance(doc, dict):
            return {OLD_METRIC_KEYS.get(k, k): old(v) for k, v in doc.items()}
        if isinstance(doc, list):
            return [old(v) for v in doc]
        return doc

    for name in ("metrics.json", "summary.json"):
        path = run / "report" / target / name
        path.write_text(json.dumps(old(json.loads(path.read_text()))))


#: Quarters of the time-aware synthetic run: trained on the first three (forecast split).
TIME_QUARTERS = ("2023Q1", "2023Q2", "2023Q3", "2023Q4")


def build_time_aware(run: Path, *, seed: int = 0) -> Path:
    """A synthetic run of a time-aware model (``geodbk train --time``) on a forecast split.

    Tiles in 2023Q1–2023Q4; the model is trained on 2023Q1–2023Q3 (``time_scaling``), so
    ``grids/download.nc`` shows 2023Q4 as an extrapolation; ``grids/download_2023Q2.nc`` is an
    observed quarter; ``grids/download_trend_2023Q1_2023Q4.nc`` is the trend; the report's
    ``metrics.json`` has ``by_quarter``.
    """
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tiles = write_tiles(run, rng, quarters=TIME_QUARTERS)
    write_geojson(run)
    write_grid(
        run,
        attrs={
            "quarter": "2023Q4",
            "quarter_status": "extrapolation beyond 2023Q3",
            "time_aware": 1,
        },
        shift=0.15,
    )
    write_grid(
        run,
        quarter="2023Q2",
        attrs={"quarter": "2023Q2", "quarter_status": "observed", "time_aware": 1},
        shift=-0.3,
    )
    write_trend_grid(run, "2023Q1", "2023Q4")
    write_model(run, tiles, time_scaling={"first": "2023Q1", "last": "2023Q3"})
    write_report(run, tiles)
    write_by_quarter(run, TIME_QUARTERS)
    return run


def build(run: Path, *, with_model: bool = True, seed: int = 0) -> Path:
    """Write a complete synthetic run (download target) and return its path."""
    run.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tiles = write_tiles(run, rng)
    write_geojson(run)
    write_grid(run)
    if with_model:
        write_model(run, tiles)
    write_report(run, tiles)
    return run
