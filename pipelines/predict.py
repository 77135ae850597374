"""``geodbk predict``: evaluate a trained model on a regular grid over the region.

Writes ``RUN/grids/TARGET.nc`` (see ``docs/architecture.md``). The grid is evaluated and written
in row blocks (at most ~262k cells each), so memory stays bounded for any grid size: blocks are
spooled to disk and assembled into a classic NetCDF file (64-bit offset; readable with
``xarray.open_dataset(path)`` and no HDF5 library) by :class:`pipelines.gridfile.GridWriter`,
then moved into place atomically.

Variables (float32, NaN outside the region): ``mean``, ``std``, ``pi_lower``, ``pi_upper``,
``pi_width`` (log10 of kbps or ms; ``std`` is the predictive sd of a tile's observed value, noise
included; the interval is the 95% predictive interval mean ± 1.96 std), ``mean_natural``,
``pi_lower_natural``, ``pi_upper_natural``, ``pi_width_natural`` (Mbps or ms; ``mean_natural``
is 10**mean, the predictive median), ``std_f`` (latent sd, noise excluded), one exceedance
probability per threshold (speeds: ``p_below_25mbps`` = P(speed < 25 Mbps); latency:
``p_above_100ms`` = P(latency > 100 ms)), the latent layer ``latent_pi_lower``,
``latent_pi_upper`` (+ ``_natural``: mean ± 1.96 std_f, the 95% credible interval of the latent
mean f(x)) and ``in_region`` (bool).

What the observation variables describe (``--tests K``, attribute ``quantity``): with a
tests-aware model, the tile average of K speed tests, ``std² = std_f² + s2_floor + s2_meas/K^p``
(default K = 1: a single speed test); with a constant-noise model, an observation with the one
learned ``s2``. Every variable's ``quantity`` attribute (and the GeoTIFF band description) says
which; the grid attributes hold the noise parameters so other K can be derived from ``std_f``.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import ndtr

from geodbk import __version__
from geodbk.errors import DataError
from geodbk.geo.grids import DEFAULT_MAX_CELLS, block_rows_for, make_grid, region_mask
from pipelines.gridfile import GridWriter
from pipelines.rundir import (
    DEFAULT_THRESHOLDS,
    TARGETS,
    RunDir,
    TargetSpec,
    config_hash,
    require_run,
    scale_lonlat,
    target_spec,
)

log = logging.getLogger("geodbk")

EPILOG = """\
examples:
  geodbk predict --run runs/hawaii --target download
  geodbk predict --run runs/hawaii --target download --resolution 0.01
  geodbk predict --run runs/hawaii --target upload --tile-zoom 14 --thresholds 3 10 20

Default resolution: the size of a zoom-16 Ookla tile at the region's central latitude,
coarsened (if needed) so the grid has at most 1,000,000 cells. Default extent: the region's
bounding box cut to the observed tiles + 0.05 deg (--extent region: the whole box).
Default thresholds: download 25 100 Mbps, upload 3 20 Mbps, latency 100 ms.
exit codes: 0 ok, 2 usage, 3 bad data, 4 missing/bad model, 5 missing run directory.
"""

#: Log10-scale variables and the natural-unit variables derived from them.
LOG_VARS = ("mean", "std", "std_f", "pi_lower", "pi_upper", "pi_width")
NATURAL_VARS = ("mean_natural", "pi_lower_natural", "pi_upper_natural", "pi_width_natural")
#: The latent layer (95% credible interval of f(x), noise excluded).
LATENT_VARS = (
    "latent_pi_lower",
    "latent_pi_upper",
    "latent_pi_lower_natural",
    "latent_pi_upper_natural",
)


def register(subparsers: Any) -> None:
    """Add the ``predict`` sub-command."""
    p = subparsers.add_parser(
        "predict",
        help="predict a target on a regular grid over the region (grids/TARGET.nc)",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--run", required=True, type=Path, help="run directory")
    p.add_argument("--target", required=True, choices=list(TARGETS), help="trained target")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--resolution", type=float, default=None, help="cell size in degrees")
    g.add_argument("--tile-zoom", type=int, default=None, help="cell size of tiles of zoom Z")
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=None,
        help="thresholds in Mbps (speeds) or ms (latency) for exceedance probabilities",
    )
    p.add_argument(
        "--max-cells",
        type=int,
        default=DEFAULT_MAX_CELLS,
        help="cap on the default grid size (default %(default)s)",
    )
    p.add_argument(
        "--extent",
        choices=["tiles", "region"],
        default="tiles",
        help="grid box: the region cut to the observed tiles (default) or the whole region",
    )
    p.add_argument(
        "--tests",
        type=float,
        default=1.0,
        metavar="K",
        help="the observation layers are the tile average of K speed tests (default 1: a single "
        "speed test; tests-aware models only, constant-noise models ignore it)",
    )
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    run_predict(
        args.run,
        target=args.target,
        resolution=args.resolution,
        tile_zoom=args.tile_zoom,
        thresholds=args.thresholds,
        max_cells=args.max_cells,
        extent=args.extent,
        tests=args.tests,
    )
    return 0


def read_region(rd: RunDir) -> Any:
    """Union of the polygons in ``RUN/region.geojson`` (EPSG:4326)."""
    import geopandas as gpd

    try:
        gdf = gpd.read_file(rd.region)
    except Exception as exc:  # pyogrio raises several types
        raise DataError(f"cannot read region {rd.region}: {exc}") from exc
    if gdf.empty:
        raise DataError(f"region {rd.region} has no features")
    if gdf.crs is not None and gdf.crs.to_epsg() != 4326:
        gdf = gdf.to_crs(4326)
    log.info("read %s", rd.region)
    return gdf.geometry.union_all()


def describe_quantity(model: Any, tests: float) -> str:
    """What the observation layers show: ``single speed test``, ``tile average of K speed
    tests`` (tests-aware models) or ``observation (constant noise)``."""
    if not getattr(model, "tests_aware", False):
        return "observation (constant noise)"
    if tests == 1:
        return "single speed test (tests=1)"
    return f"tile average of {tests:g} speed tests (tests={tests:g})"


def predict_block(
    model: Any,
    spec: TargetSpec,
    X: np.ndarray,
    thresholds: Sequence[float],
    *,
    chunk_size: int,
    tests: float = 1.0,
) -> dict[str, np.ndarray]:
    """All grid variables for inputs ``X`` (n, 2), as 1-D float64 arrays.

    Observation variables are for the tile average of ``tests`` speed tests (tests-aware
    models; ``tests=1``: a single test); ``std_f`` and ``latent_*`` are the latent f(x).
    """
    if getattr(model, "tests_aware", False):
        pred = model.predict(X, chunk_size=chunk_size, tests=tests)
    else:
        pred = model.predict(X, chunk_size=chunk_size)
    mean = np.asarray(pred.mean, dtype=np.float64)
    std = np.asarray(pred.std, dtype=np.float64)
    lower = mean - 1.96 * std
    upper = mean + 1.96 * std
    out = {
        "mean": mean,
        "std": std,
        "std_f": np.sqrt(np.maximum(np.asarray(pred.var_f, dtype=np.float64), 0.0)),
        "pi_lower": lower,
        "pi_upper": upper,
        "pi_width": upper - lower,
        "mean_natural": spec.to_natural(mean),
        "pi_lower_natural": spec.to_natural(lower),
        "pi_upper_natural": spec.to_natural(upper),
    }
    out["pi_width_natural"] = out["pi_upper_natural"] - out["pi_lower_natural"]
    out["latent_pi_lower"] = mean - 1.96 * out["std_f"]
    out["latent_pi_upper"] = mean + 1.96 * out["std_f"]
    out["latent_pi_lower_natural"] = spec.to_natural(out["latent_pi_lower"])
    out["latent_pi_upper_natural"] = spec.to_natural(out["latent_pi_upper"])
    for t in thresholds:
        p_below = ndtr((spec.natural_to_log10(t) - mean) / std)
        out[spec.threshold_name(t)] = p_below if spec.higher_is_better else 1.0 - p_below
    return out


def _var_attrs(
    spec: TargetSpec, thresholds: Sequence[float], quantity: str = "observation"
) -> dict[str, dict[str, str]]:
    lg = f"log10 {spec.column}"
    latent = "latent mean f(x)"
    attrs = {
        "mean": {"long_name": f"predictive mean of log10 {spec.name}", "units": lg},
        "std": {"long_name": "predictive sd (noise included)", "units": lg},
        "std_f": {"long_name": "latent sd (noise excluded)", "units": lg},
        "pi_lower": {"long_name": "95% prediction interval, lower", "units": lg},
        "pi_upper": {"long_name": "95% prediction interval, upper", "units": lg},
        "pi_width": {"long_name": "95% prediction interval width", "units": lg},
        "mean_natural": {"long_name": f"predictive median {spec.name}", "units": spec.unit},
        "pi_lower_natural": {"long_name": "95% PI lower", "units": spec.unit},
        "pi_upper_natural": {"long_name": "95% PI upper", "units": spec.unit},
        "pi_width_natural": {"long_name": "95% PI width", "units": spec.unit},
        "latent_pi_lower": {"long_name": "95% credible interval of f(x), lower", "units": lg},
        "latent_pi_upper": {"long_name": "95% credible interval of f(x), upper", "units": lg},
        "latent_pi_lower_natural": {"long_name": "95% CI of f(x), lower", "units": spec.unit},
        "latent_pi_upper_natural": {"long_name": "95% CI of f(x), upper", "units": spec.unit},
    }
    for name, a in attrs.items():
        if name in ("mean", "mean_natural"):
            a["quantity"] = "median (latent mean f(x); the same for every quantity)"
        elif name == "std_f" or name.startswith("latent_"):
            a["quantity"] = latent
        else:
            a["quantity"] = quantity
    for t in thresholds:
        rel = "<" if spec.higher_is_better else ">"
        attrs[spec.threshold_name(t)] = {
            "long_name": f"P({spec.name} {rel} {t:g} {spec.unit})",
            "units": "1",
            "threshold": f"{t:g}",
            "quantity": quantity,
        }
    return attrs


#: Margin (degrees) around the observed tiles for ``extent="tiles"``.
TILE_MARGIN_DEG = 0.05


def grid_bounds(
    rd: RunDir, region_bounds: tuple[float, float, float, float], *, extent: str
) -> tuple[float, float, float, float]:
    """Bounding box of the grid: the region's, or cut to the tiles' extent (+ margin)."""
    if extent == "region":
        return region_bounds
    if extent != "tiles":
        raise DataError(f"extent must be 'tiles' or 'region', got {extent!r}")
    import pyarrow.parquet as pq

    cols = pq.read_table(rd.tiles, columns=["lon", "lat"])
    lon = cols.column("lon").to_numpy()
    lat = cols.column("lat").to_numpy()
    if len(lon) == 0:
        return region_bounds
    m = TILE_MARGIN_DEG
    box = (
        max(region_bounds[0], float(lon.min()) - m),
        max(region_bounds[1], float(lat.min()) - m),
        min(region_bounds[2], float(lon.max()) + m),
        min(region_bounds[3], float(lat.max()) + m),
    )
    return box if box[2] > box[0] and box[3] > box[1] else region_bounds


def crs_attributes() -> dict[str, Any]:
    """Attributes of the ``spatial_ref`` variable for EPSG:4326, as rioxarray writes them."""
    import rioxarray  # noqa: F401  (registers .rio)
    import xarray as xr

    ds = xr.Dataset().rio.write_crs("EPSG:4326")
    return dict(ds["spatial_ref"].attrs)


def run_predict(
    run: str | Path,
    *,
    target: str,
    resolution: float | None = None,
    tile_zoom: int | None = None,
    thresholds: Sequence[float] | None = None,
    max_cells: int = DEFAULT_MAX_CELLS,
    max_block_cells: int = 262_144,
    extent: str = "tiles",
    tests: float = 1.0,
) -> Path:
    """Predict ``target`` on the region grid and write ``RUN/grids/TARGET.nc``; return its path.

    Parameters
    ----------
    run
        Run directory with ``region.geojson`` and a trained ``models/TARGET``.
    target
        ``download``, ``upload`` or ``latency``.
    resolution, tile_zoom
        Cell size in degrees, or the size of a tile of this zoom (exclusive).
    thresholds
        Natural-unit thresholds (default :data:`pipelines.rundir.DEFAULT_THRESHOLDS`).
    max_cells
        Cap on the default grid size.
    max_block_cells
        Cells evaluated and held in memory at once.
    extent
        ``tiles`` (default): the grid spans the region's bounding box cut to the extent of the
        observed tiles plus a 0.05° margin (a state whose boundary includes remote, untested
        islands is not gridded where the model has no data); ``region``: the whole bounding box.
        Cells outside the region polygons are masked either way.
    tests
        Number of speed tests K the observation layers average (tests-aware models;
        default 1: a single speed test). Recorded in the attributes ``tests`` and ``quantity``.
    """
    from pipelines.train import load_model

    if not (np.isfinite(tests) and tests >= 1):
        raise DataError(f"--tests must be >= 1, got {tests}")

    rd = require_run(run)
    spec = target_spec(target)
    model = load_model(rd, target)
    md: dict[str, Any] = dict(getattr(model, "metadata_", None) or {})
    scaling = md.get("input_scaling")
    if not scaling:
        from pipelines.rundir import load_tiles, scaling_of

        scaling = scaling_of(load_tiles(rd)[1], source=rd.tiles)
    thr = tuple(float(t) for t in (thresholds or DEFAULT_THRESHOLDS[target]))
    if any(t <= 0 for t in thr):
        raise DataError(f"thresholds must be > 0, got {thr}")
    geom = read_region(rd)
    bounds = grid_bounds(rd, geom.bounds, extent=extent)
    grid = make_grid(bounds, resolution=resolution, tile_zoom=tile_zoom, max_cells=max_cells)
    ny, nx = grid.shape
    block_rows = block_rows_for(nx, max_block_cells=max_block_cells)
    chunk = int(md.get("config", {}).get("predict_chunk_size", 65536))
    names = [*LOG_VARS, *NATURAL_VARS, *LATENT_VARS, *(spec.threshold_name(t) for t in thr)]
    quantity = describe_quantity(model, tests)
    noise_params = (
        model.noise_parameters() if hasattr(model, "noise_parameters") else {"noise": "constant"}
    )
    attrs = {
        "title": f"geodbk {target} predictive grid",
        "target": target,
        "units": f"log10 {spec.column} (natural: {spec.unit})",
        "natural_units": spec.unit,
        "model_path": str(rd.model_dir(target)),
        "model_config_hash": md.get("config_hash") or config_hash(md.get("config", {})),
        "thresholds": list(thr),
        "resolution_deg": [grid.dx, grid.dy],
        "extent": extent,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        "interval": "95% predictive interval mean +- 1.96 std (log10 scale)",
        "quantity": quantity,
        "tests": float(tests),
        "noise_model": str(noise_params.get("noise", "constant")),
        **{f"noise_{k}": float(v) for k, v in noise_params.items() if k != "noise"},
    }
    out = rd.grid(target)
    t0 = time.perf_counter()
    log.info(
        "predicting %s on a %d x %d grid (%.5f x %.5f deg) in blocks of %d rows",
        target,
        ny,
        nx,
        grid.dx,
        grid.dy,
        block_rows,
    )
    var_attrs = _var_attrs(spec, thr, quantity)
    variables: dict[str, tuple[Any, dict[str, Any]]] = {
        n: (np.float32, var_attrs.get(n, {})) for n in names
    }
    variables["in_region"] = (bool, {"long_name": "cell centre inside the region"})
    writer = GridWriter(
        out, x=grid.x, y=grid.y, variables=variables, attrs=attrs, crs_attrs=crs_attributes()
    )
    n_in = 0
    try:
        for rows in grid.row_blocks(block_rows):
            mask = region_mask(geom, grid, rows)
            blocks: dict[str, np.ndarray] = {"in_region": mask}
            values: dict[str, np.ndarray] = {}
            if mask.any():
                lon2, lat2 = np.meshgrid(grid.x, grid.y[rows])
                X = scale_lonlat(lon2[mask], lat2[mask], scaling)
                values = predict_block(model, spec, X, thr, chunk_size=chunk, tests=tests)
                n_in += int(mask.sum())
            for name in names:
                block = np.full(mask.shape, np.nan, dtype=np.float32)
                if values:
                    block[mask] = values[name]
                blocks[name] = block
            writer.write_rows(rows, blocks)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    log.info(
        "wrote %s (%d of %d cells in the region, %.1f s)",
        out,
        n_in,
        grid.size,
        time.perf_counter() - t0,
    )
    return out
