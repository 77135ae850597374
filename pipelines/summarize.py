"""``geodbk summarize``: area summaries (counties, tracts, service areas) with joint uncertainty.

Writes ``RUN/summaries/TARGET_<file stem>.parquet`` (GeoParquet, one row per polygon of the
areas file, its geometry kept) and ``.csv`` (the same rows, no geometry, the data licence in
``#`` header lines); another quarter than the table's latest adds ``_<quarter>``, the area or
test quantity ``_<quantity>`` to the name. Rows, metadata and header carry the quarter's
``quarter_status`` as ``geodbk predict`` writes it into the grid. Per area, from S joint posterior samples (shared weight draws of the DBK
model, :mod:`geodbk.joint`, plus the tile quantity's independent per-cell part):

- the cos-latitude area-weighted mean of the level over the map's cells inside the area
  (log10 and its geometric mean in Mbps or ms) with its 90% interval, and the interval had the
  cells been independent;
- the share of the area served at each tier (speeds at or above, latency at or below the
  threshold) with its 90% interval;
- over the run's observed tiles inside the area, weighted by their tests: the model's tile
  level and its 90% interval beside the plain test-weighted mean of the raw tile values (the
  figure Ookla's tutorials give) and their test-weighted geometric mean, the number of tiles
  and tests.

The cells are those of ``geodbk predict``'s grid (same resolution and extent options) inside
the region; the polygons are rasterised once per row block (:mod:`geodbk.geo.areas`) and the
cells streamed in chunks, so memory is O(chunk x S + areas x S). See
``docs/decisions/area_summaries.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from geodbk import __version__
from geodbk.area_sums import AreaSummary, AreaSums, pairs_of_layers
from geodbk.atomic import atomic_path, naming_errors
from geodbk.errors import DataError
from geodbk.geo.areas import ID_COLUMNS, NAME_COLUMNS, Areas, cell_area_km2, read_areas
from geodbk.geo.grids import DEFAULT_MAX_CELLS, Grid, block_rows_for, region_mask
from geodbk.geo.licence import licence_line
from geodbk.geo.longitude import native_longitude
from geodbk.geo.table import _to_arrow
from geodbk.geo.timeaxis import quarter_text
from geodbk.joint import JointSampler, quantity_draws, standard_normal_weights
from geodbk.quantities import DEFAULT_MAP_QUANTITY, check_quantity
from pipelines.cli import call_with_options, stage_parser
from pipelines.places import load_place_predictor, places_quarter_status
from pipelines.predict import (
    add_grid_options,
    add_quantity_option,
    check_grid_options,
    map_grid,
)
from pipelines.rundir import (
    DEFAULT_THRESHOLDS,
    RunDir,
    TargetSpec,
    licence_attrs,
    licence_schema_metadata,
    locked_stage,
    output_name,
    require_run,
    run_licence,
    target_spec,
    time_scaling_of,
    write_csv_rows,
)

log = logging.getLogger("geodbk")

__all__ = ["SUMMARY_KEY", "register", "run_summarize", "summary_columns", "summary_paths"]

#: Parquet key-value metadata holding the summary's provenance (JSON).
SUMMARY_KEY = b"geodbk_summary"
#: Central interval of every summary.
LEVEL = 0.90
#: Fewest joint samples accepted (a 90% interval from fewer is mostly noise).
MIN_SAMPLES = 20

EPILOG = """\
examples:
  geodbk summarize --run runs/hawaii --target download --areas tl_2020_15_tract.zip
  geodbk summarize --run runs/hawaii --target download --areas counties.gpkg --id-column GEOID
  geodbk summarize --run runs/hawaii --target upload --areas service_areas.geojson --samples 2000
  geodbk summarize --run runs/hawaii --target latency --areas areas.parquet --quantity area

Writes RUN/summaries/TARGET_<file stem>.parquet (GeoParquet) and .csv: per area, the area
mean of the level (geometric mean in Mbps or ms) with its 90% interval from S joint posterior
samples, the interval if the cells were independent, the share of area served at each tier
(download 25 and 100 Mbps, upload 3 and 20 Mbps: at or above; latency 100 ms: at or below)
with its 90% interval, and over the observed tiles inside it (tests-weighted) the model's tile
level beside the plain test-weighted mean of the raw tiles. Areas outside the map are empty
rows. Another quarter than the table's latest adds _<quarter> to the name, the area or test
quantity _<quantity> (so no summary replaces another's). Every row, the CSV's # header and
the parquet metadata name the quarter and its quarter_status, as predict does (observed,
extrapolation beyond/before the trained quarters, or pooled). Columns: docs/cli.md, "geodbk summarize".
exit codes: 0 ok, 2 usage, 3 bad areas file/column or option, 4 missing/bad model,
5 missing run directory, 6 the disk refused a write.
"""


def register(subparsers: Any) -> None:
    """Add the ``summarize`` sub-command."""
    p = stage_parser(
        subparsers,
        "summarize",
        _main,
        description=(
            "Summarise a trained target over the polygons of a file (counties, tracts, your\n"
            "service areas): area means and shares served with 90% intervals from joint\n"
            "posterior samples, beside the observed tiles' test-weighted figures."
        ),
        epilog=EPILOG,
        run="run directory",
        target="trained target",
    )
    p.add_argument(
        "--areas",
        required=True,
        type=Path,
        metavar="FILE",
        help="polygons: GeoJSON, GeoPackage, shapefile (.shp or zipped; FILE.zip!layer.shp "
        "picks a layer) or GeoParquet, any CRS",
    )
    p.add_argument(
        "--id-column",
        default=None,
        metavar="COL",
        help="column identifying each area, one value per row (default: GEOID/GEOID20/GEOID10/"
        "GEOIDFQ/FIPS/id or a NAME column with unique values, else the row number)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=1000,
        metavar="S",
        help="joint posterior samples (default %(default)s; memory grows with areas x S)",
    )
    add_quantity_option(
        p,
        "what is averaged over each area's cells: tile (default) = what a zoom-16 tile "
        "typically gets; area = the neighbourhood level f(x); test = one speed test",
    )
    p.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the samples (default 0)"
    )
    add_grid_options(p, verb="evaluate")
    p.add_argument(
        "--quarter",
        default=None,
        metavar="Q",
        help="time-aware models: the quarter to summarise (default: the table's latest)",
    )


def _main(args: argparse.Namespace) -> int:
    call_with_options(run_summarize, args)
    return 0


def summary_paths(
    rd: RunDir,
    target: str,
    areas: str | Path,
    *,
    quarter: str | None = None,
    quantity: str = DEFAULT_MAP_QUANTITY,
) -> tuple[Path, Path]:
    """``RUN/summaries/TARGET_<stem>.parquet`` and ``.csv`` for the areas file ``areas``
    (``FILE.zip!layer.shp``: the zip's stem); ``TARGET_<stem>_<quarter>.*`` for a time-aware
    model's quarter other than the table's latest (as ``grids/TARGET_Q.nc``); the area or test
    ``quantity`` adds ``_<quantity>`` (as ``predict --at``), so it never replaces the tile
    quantity's summary."""
    stem = Path(str(areas).split("!")[0]).stem
    name = output_name(f"{target}_{stem}", quarter=quarter, quantity=quantity)
    folder = rd.root / "summaries"
    return folder / f"{name}.parquet", folder / f"{name}.csv"


def tier_name(spec: TargetSpec, threshold: float) -> str:
    """``share_ge_25mbps`` (speeds: at or above) or ``share_le_100ms`` (latency: at or below)."""
    text = f"{threshold:g}".replace(".", "p").replace("-", "m")
    rel = "ge" if spec.higher_is_better else "le"
    return f"share_{rel}_{text}{spec.unit.lower()}"


def summary_columns(spec: TargetSpec, thresholds: tuple[float, ...]) -> list[str]:
    """The output's columns, in order (the GeoParquet adds ``geometry``)."""
    level = [
        "mean_log10",
        "lower_log10",
        "upper_log10",
        "mean_natural",
        "lower_natural",
        "upper_natural",
        "independent_lower_log10",
        "independent_upper_log10",
        "independent_lower_natural",
        "independent_upper_natural",
    ]
    shares = [
        f"{tier_name(spec, t)}{suffix}" for t in thresholds for suffix in ("", "_lower", "_upper")
    ]
    tiles = [
        "n_tiles",
        "n_tests",
        "tiles_mean_log10",
        "tiles_lower_log10",
        "tiles_upper_log10",
        "tiles_mean_natural",
        "tiles_lower_natural",
        "tiles_upper_natural",
        "tiles_raw_mean_natural",
        "tiles_raw_geomean_natural",
    ]
    head = ["id", "name", "n_cells", "area_km2", "polygon_area_km2", "cells_from"]
    tail = ["unit", "target", "quantity", "quarter", "quarter_status", "samples"]
    return [*head, *level, *shares, *tiles, *tail]


@dataclass
class _Sampler:
    """Joint draws of a quantity at places from one set of weight draws (shared by all)."""

    predictor: Any
    joint: JointSampler
    rng: np.random.Generator
    chunk: int

    def draws(
        self, lon: np.ndarray, lat: np.ndarray, *, quantity: str
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(draws (n, S), mean, var)`` of ``quantity`` at the places."""
        q = self.predictor.predict(lon, lat, quantity=quantity, chunk_size=self.chunk)
        latent = self.joint.draws(self.predictor.inputs(lon, lat), chunk_size=self.chunk)
        out = quantity_draws(q, latent, rng=self.rng)
        if not np.isfinite(out).all():
            raise DataError(
                f"the {self.predictor.target} model gave non-finite samples, so no summary was "
                "written (earlier files are kept); the model file may be damaged: retrain it "
                "with `geodbk train`"
            )
        return out, q.mean, q.var


def _check_options(samples: int, quantity: str, chunk_cells: int, seed: int = 0) -> None:
    if isinstance(samples, bool) or int(samples) != samples or samples < MIN_SAMPLES:
        raise DataError(
            f"--samples must be a whole number of at least {MIN_SAMPLES} (default 1000), "
            f"got {samples}"
        )
    if isinstance(seed, bool) or int(seed) != seed or seed < 0:
        raise DataError(f"--seed must be a whole number of at least 0 (default 0), got {seed}")
    try:
        check_quantity(quantity)
    except ValueError as exc:
        raise DataError(f"--quantity: {exc}") from None
    if chunk_cells < 1:
        raise DataError(f"chunk_cells must be at least 1, got {chunk_cells}")


def _check_unique_ids(areas: Areas) -> None:
    """Refuse an ``--id-column`` that repeats a value: its rows would be separate summary rows
    under one id (not merged), which no reader of the table could tell apart."""
    col = areas.id_column
    if col is None:
        return
    ids = pd.Series(areas.ids)
    counts = ids.value_counts(sort=True)
    repeated = counts[counts > 1]
    if repeated.empty:
        return
    shown = ", ".join(f"{k!r} in {int(v)} rows" for k, v in repeated.head(3).items())
    more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
    frame = areas.frame
    others = [c for c in frame.columns if c != frame.geometry.name]
    columns = [str(c) for c in others]
    unique = [
        str(c)
        for c in others
        if str(c) != col and frame[c].notna().all() and not frame[c].duplicated().any()
    ]
    known = {n.lower() for n in (*ID_COLUMNS, *NAME_COLUMNS)}
    suggested = [c for c in unique if c.lower() in known] or unique[:3]
    such = f" such as {', '.join(suggested)}" if suggested else ""
    raise DataError(
        f"{areas.source}: column {col!r} (--id-column) repeats {len(repeated)} of its "
        f"{len(counts)} values over {len(ids)} rows ({shown}{more}), so several rows would be "
        f"summarised separately under one id; to summarise one area per {col!r} value, "
        f"dissolve the polygons by it first (geopandas: gdf.dissolve(by={col!r})), or choose "
        f"a column with one value per row{such} with --id-column. Columns found: "
        f"{', '.join(columns)}"
    )


@locked_stage("summarize")
def run_summarize(
    run: str | Path,
    *,
    target: str,
    areas: str | Path,
    id_column: str | None = None,
    samples: int = 1000,
    quantity: str = DEFAULT_MAP_QUANTITY,
    seed: int = 0,
    resolution: float | None = None,
    tile_zoom: int | None = None,
    max_cells: int = DEFAULT_MAX_CELLS,
    force: bool = False,
    extent: str = "tiles",
    quarter: str | None = None,
    chunk_cells: int = 4096,
    max_block_cells: int = 262_144,
) -> Path:
    """Summarise ``target`` over the polygons of ``areas``; write
    ``RUN/summaries/TARGET_<stem>.parquet`` and ``.csv`` and return the parquet's path.

    Parameters
    ----------
    run
        Run directory with a trained ``models/TARGET``.
    target
        ``download``, ``upload`` or ``latency``.
    areas
        Polygon file (:func:`geodbk.geo.areas.read_areas`).
    id_column
        Column identifying each area, one value per row (default: detected, else the row
        number); a column that repeats a value is refused (:class:`DataError` naming the
        values, and the fix: dissolve the polygons by it, or choose a unique column).
    samples
        Joint posterior samples S.
    quantity
        What is averaged over the cells: ``tile`` (default), ``area`` or ``test``
        (:mod:`geodbk.quantities`). The observed-tile figures always use ``tile``.
    seed
        Seed of the weight draws and of the independent per-place draws.
    resolution, tile_zoom, max_cells, force, extent
        The grid, as for ``geodbk predict`` (:func:`pipelines.predict.map_grid`).
    quarter
        Time-aware models: the quarter (default the table's latest); pooled models refuse it.
    chunk_cells
        Cells drawn at once (memory ``chunk_cells x samples`` floats per array).
    max_block_cells
        Cells rasterised at once.
    """

    _check_options(samples, quantity, chunk_cells, seed)
    grid_options = check_grid_options(
        resolution=resolution, tile_zoom=tile_zoom, max_cells=max_cells, extent=extent, force=force
    )
    rd = require_run(run)
    spec = target_spec(target)
    area_set = read_areas(areas, id_column=id_column)
    _check_unique_ids(area_set)
    licence = run_licence(rd)
    predictor = load_place_predictor(rd, target, quantity="tile", quarter=quarter)
    file_quarter, status = places_quarter_status(
        rd, predictor, quantity=quantity, note="no observed tiles enter the summary"
    )
    region, grid = map_grid(rd, **grid_options)
    thresholds = tuple(float(t) for t in DEFAULT_THRESHOLDS[target])
    rng = np.random.default_rng(seed)
    eps = standard_normal_weights(predictor.model.model_.rank, samples, rng=rng)
    sampler = _Sampler(
        predictor=predictor,
        joint=JointSampler(predictor.model, eps),
        rng=rng,
        chunk=chunk_cells,
    )
    cells = AreaSums(
        len(area_set),
        samples,
        thresholds=tuple(spec.natural_to_log10(t) for t in thresholds),
        higher_is_better=spec.higher_is_better,
    )
    log.info(
        "summarising %s (%s quantity, %s) over %d areas of %s: %d x %d grid, %d samples "
        "(%.0f MB of per-area sums)",
        target,
        quantity,
        quarter_text(predictor.quarter, status),
        len(area_set),
        area_set.source,
        *grid.shape,
        samples,
        2 * cells.memory_bytes() / 1e6,
    )
    t0 = time.perf_counter()
    cells_from = _summarize_cells(
        area_set,
        grid,
        region,
        sampler,
        cells,
        quantity=quantity,
        block_rows=block_rows_for(grid.shape[1], max_block_cells=max_block_cells),
        extent=grid_options["extent"],
    )
    cell_summary = cells.summary(level=LEVEL)
    area_km2 = _cell_area(area_set, grid, cells)
    if not (cell_summary.count > 0).any():
        w, s, e, n = (grid.x[0], grid.y[-1], grid.x[-1], grid.y[0])
        raise DataError(
            f"none of the {len(area_set)} areas of {area_set.source} holds a map cell of "
            f"{rd.root.name} (grid box {w:.3f}, {s:.3f}, {e:.3f}, {n:.3f}; cells in the region "
            "only), so nothing was written; give areas inside the run's region"
        )
    tiles = _summarize_tiles(rd, spec, area_set, sampler, samples=samples)
    frame = _table(
        spec,
        area_set,
        thresholds,
        cell_summary,
        tiles,
        cells_from=cells_from,
        area_km2=area_km2,
        quantity=quantity,
        quarter=predictor.quarter,
        quarter_status=status,
        samples=samples,
    )
    meta = {
        "target": target,
        "quantity": quantity,
        "quarter": predictor.quarter,
        "quarter_status": status,
        **(
            {"trained_quarters": f"{ts.first}:{ts.last}"}
            if (ts := time_scaling_of(predictor.metadata)) is not None
            else {}
        ),
        "time_aware": bool(predictor.time_aware),
        "samples": int(samples),
        "seed": int(seed),
        "interval": f"{LEVEL:.0%} central interval of the joint posterior samples",
        "areas_file": area_set.source,
        "id_column": area_set.id_column or "row number",
        "name_column": area_set.name_column,
        "repaired_geometries": area_set.repaired,
        "rows_without_polygon": area_set.unusable,
        "thresholds": list(thresholds),
        "threshold_rule": "at or above" if spec.higher_is_better else "at or below",
        "unit": spec.unit,
        "level": f"log10 {spec.column}; natural = 10**log10 / {spec.divisor:g} ({spec.unit})",
        "weighting": "cells: cos(latitude) (area); observed tiles: tests",
        "observed_tiles": (
            f"rows of {predictor.quarter}" if predictor.time_aware else "all quarters pooled"
        ),
        "resolution_deg": [grid.dx, grid.dy],
        "extent": extent,
        "grid_shape": list(grid.shape),
        "model_path": rd.relative(rd.model_dir(target)),
        "tile_effect": predictor.effect is not None,
        "local_layer": predictor.layer is not None,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        **licence_attrs(licence),
    }
    paths = summary_paths(rd, target, areas, quarter=file_quarter, quantity=quantity)
    _warn_replacing_other_areas(paths[0], area_set.source)
    out = _write(paths, frame, area_set, meta=meta, licence=licence)
    log.info(
        "wrote %s and .csv (%d areas, %d with cells, %d empty; %.1f s)",
        out,
        len(area_set),
        int((cell_summary.count > 0).sum()),
        int((cell_summary.count == 0).sum()),
        time.perf_counter() - t0,
    )
    return out


def _summarize_cells(
    areas: Areas,
    grid: Grid,
    region: Any,
    sampler: _Sampler,
    sums: AreaSums,
    *,
    quantity: str,
    block_rows: int,
    extent: str,
) -> np.ndarray:
    """Stream the map's cells inside the region and some polygon through ``sums`` (chunks of
    ``sampler.chunk`` cells, weights cos(lat)); then give each polygon without a cell centre
    the cell under its representative point. Returns each area's ``cells_from``."""
    from tqdm import tqdm

    blocks = tqdm(
        list(grid.row_blocks(block_rows)),
        desc="summarize",
        unit="block",
        disable=not sys.stderr.isatty(),
        leave=False,
    )
    for rows in blocks:
        rasters = areas.rasterise(grid, rows)
        inside = np.zeros((len(grid.y[rows]), len(grid.x)), dtype=bool)
        for raster in rasters:
            inside |= raster >= 0
        if not inside.any():
            continue
        inside &= region_mask(region, grid, rows)
        r_idx, c_idx = np.nonzero(inside)
        lat_all, lon_all = grid.y[rows][r_idx], grid.x[c_idx]
        ids_all = [raster[r_idx, c_idx] for raster in rasters]
        for start in range(0, r_idx.size, sampler.chunk):
            part = slice(start, start + sampler.chunk)
            lon, lat = lon_all[part], lat_all[part]
            draws, mean, var = sampler.draws(lon, lat, quantity=quantity)
            places, area_of = pairs_of_layers([ids[part] for ids in ids_all])
            weight = np.cos(np.radians(lat))
            sums.add(places, area_of, weight=weight, draws=draws, mean=mean, var=var)
    cells_from = np.where(areas.usable, "none", "no polygon").astype(object)
    cells_from[sums.count > 0] = "centres"
    missing = np.flatnonzero(areas.usable & (sums.count == 0))
    row, col = areas.representative_cells(grid, missing)
    ok = row >= 0
    if ok.any():
        lon, lat = grid.x[col[ok]], grid.y[row[ok]]
        import shapely

        in_region = np.asarray(
            shapely.intersects_xy(region, native_longitude(lon), lat), dtype=bool
        )
        chosen = missing[ok][in_region]
        lon, lat = lon[in_region], lat[in_region]
        for start in range(0, chosen.size, sampler.chunk):
            part = slice(start, start + sampler.chunk)
            draws, mean, var = sampler.draws(lon[part], lat[part], quantity=quantity)
            n = draws.shape[0]
            sums.add(
                np.arange(n),
                chosen[part],
                weight=np.cos(np.radians(lat[part])),
                draws=draws,
                mean=mean,
                var=var,
            )
        cells_from[chosen] = "representative point"
        if chosen.size:
            log.info(
                "%d areas hold no cell centre; each takes the cell under its representative "
                "point (cells_from = 'representative point')",
                chosen.size,
            )
    _warn_on_empty_areas_in_region(
        areas, region, np.flatnonzero(cells_from == "none"), grid=grid, extent=extent
    )
    return cells_from


def _warn_on_empty_areas_in_region(
    areas: Areas, region: Any, empty: np.ndarray, *, grid: Grid, extent: str
) -> None:
    """Warn about the areas left without a value (``empty``) that overlap the region, not
    water or another state, each with its fix: those beyond the grid box (under ``--extent
    tiles`` it ends at the measured tiles) need ``--extent region``; those inside it hold no
    cell centre in the region (a coastal sliver, a polygon smaller than a cell) and need a
    finer ``--resolution``."""
    import shapely

    land = empty[np.asarray(shapely.intersects(areas.polygons[empty], region), dtype=bool)]
    if not land.size:
        return
    row, _ = areas.representative_cells(grid, land)
    beyond = land[row < 0] if extent == "tiles" else land[:0]
    within = np.setdiff1d(land, beyond)
    if beyond.size:
        log.warning(
            "%d area(s) overlap the region but the map has no cell there, so they get no value "
            "(cells_from = 'none'; e.g. %s): the map ends at the measured tiles (--extent "
            "tiles, the default); pass --extent region to summarise them",
            beyond.size,
            ", ".join(str(i) for i in areas.ids[beyond[:3]]),
        )
    if within.size:
        log.warning(
            "%d area(s) overlap the region but no cell centre of the map lies in both, so "
            "they get no value (cells_from = 'none'; e.g. %s): a coastal sliver or a polygon "
            "smaller than a cell (%.4g x %.4g deg); a finer --resolution reaches them",
            within.size,
            ", ".join(str(i) for i in areas.ids[within[:3]]),
            grid.dx,
            grid.dy,
        )


def _cell_area(areas: Areas, grid: Grid, sums: AreaSums) -> np.ndarray:
    """km² of each area's cells: ``sum cos(lat)`` times a cell's area at the equator."""
    per_weight = float(cell_area_km2(np.zeros(1), grid.dx, grid.dy)[0])
    return np.where(sums.count > 0, sums.weight * per_weight, 0.0)


@dataclass(frozen=True)
class _TileSummary:
    summary: AreaSummary
    n_tiles: np.ndarray
    n_tests: np.ndarray
    raw_mean: np.ndarray
    raw_geomean: np.ndarray


def _observed_tiles(rd: RunDir, spec: TargetSpec, areas: Areas, predictor: Any) -> pd.DataFrame:
    """The run's tiles inside the areas' box, one row per tile: ``lon``, ``lat``, ``tests``
    (summed over the quarters used), ``raw`` (sum of tests x value, natural units) and
    ``log`` (sum of tests x log10 value). A time-aware model's quarter only; a pooled
    model's every quarter."""
    import pyarrow.parquet as pq

    names = pq.read_schema(rd.tiles).names
    w, s, e, n = areas.frame.total_bounds
    filters: list[Any] = [("lon", ">=", w), ("lon", "<=", e), ("lat", ">=", s), ("lat", "<=", n)]
    if predictor.time_aware:
        filters.append(("quarter", "==", predictor.quarter))
    cols = ["quadkey", "lon", "lat", spec.column] + (["tests"] if "tests" in names else [])
    frame = pq.read_table(rd.tiles, columns=cols, filters=filters).to_pandas()
    value = frame[spec.column].to_numpy(dtype=np.float64)
    tests = frame["tests"].to_numpy(dtype=np.float64) if "tests" in frame else np.ones(len(frame))
    ok = np.isfinite(value) & (value > 0) & np.isfinite(tests) & (tests > 0)
    frame = frame.loc[ok, ["quadkey", "lon", "lat"]].assign(
        tests=tests[ok],
        raw=tests[ok] * value[ok] / spec.divisor,
        log=tests[ok] * np.log10(value[ok]),
    )
    return (
        frame.groupby("quadkey", sort=True)
        .agg(lon=("lon", "first"), lat=("lat", "first"), tests=("tests", "sum"))
        .join(frame.groupby("quadkey")[["raw", "log"]].sum())
        .reset_index()
    )


def _summarize_tiles(
    rd: RunDir, spec: TargetSpec, areas: Areas, sampler: _Sampler, *, samples: int
) -> _TileSummary:
    """The tile quantity at the observed tiles inside each area (joint draws from the same
    weight draws as the cells), weighted by their tests, and the raw tiles' test-weighted
    arithmetic and geometric means."""
    tiles = _observed_tiles(rd, spec, areas, sampler.predictor)
    p = len(areas)
    sums = AreaSums(p, samples)
    n_tests: np.ndarray = np.zeros(p)
    raw: np.ndarray = np.zeros(p)
    logs: np.ndarray = np.zeros(p)
    n_tiles: np.ndarray = np.zeros(p, dtype=np.int64)
    if len(tiles):
        point, area = areas.areas_of_points(tiles["lon"].to_numpy(), tiles["lat"].to_numpy())
        order = np.argsort(point, kind="stable")
        point, area = point[order], area[order]
        used = np.unique(point)
        t = tiles.iloc[used].reset_index(drop=True)
        local = np.searchsorted(used, point)
        tests = t["tests"].to_numpy()
        n_tiles = np.bincount(area, minlength=p)
        n_tests = np.bincount(area, weights=tests[local], minlength=p)
        raw = np.bincount(area, weights=t["raw"].to_numpy()[local], minlength=p)
        logs = np.bincount(area, weights=t["log"].to_numpy()[local], minlength=p)
        lon, lat = t["lon"].to_numpy(), t["lat"].to_numpy()
        for start in range(0, used.size, sampler.chunk):
            stop = min(start + sampler.chunk, used.size)
            draws, mean, var = sampler.draws(lon[start:stop], lat[start:stop], quantity="tile")
            sel = (local >= start) & (local < stop)
            sums.add(
                local[sel] - start,
                area[sel],
                weight=tests[start:stop],
                draws=draws,
                mean=mean,
                var=var,
            )
        log.info(
            "%d observed tiles (%d tests) lie in the areas",
            used.size,
            int(tests.sum()),
        )
    has = n_tests > 0
    safe = np.where(has, n_tests, 1.0)
    return _TileSummary(
        summary=sums.summary(level=LEVEL),
        n_tiles=n_tiles,
        n_tests=n_tests,
        raw_mean=np.where(has, raw / safe, np.nan),
        raw_geomean=np.where(has, spec.to_natural(logs / safe), np.nan),
    )


def _table(
    spec: TargetSpec,
    areas: Areas,
    thresholds: tuple[float, ...],
    cells: AreaSummary,
    tiles: _TileSummary,
    *,
    cells_from: np.ndarray,
    area_km2: np.ndarray,
    quantity: str,
    quarter: str,
    quarter_status: str,
    samples: int,
) -> pd.DataFrame:
    """The summary rows in the areas file's order, columns :func:`summary_columns`."""
    nat = spec.to_natural
    ts = tiles.summary
    data: dict[str, Any] = {
        "id": areas.ids.astype(str),
        "name": areas.names if areas.names is not None else np.full(len(areas), None),
        "n_cells": cells.count,
        "area_km2": area_km2,
        "polygon_area_km2": areas.polygon_area_km2(),
        "cells_from": cells_from.astype(str),
        "mean_log10": cells.mean,
        "lower_log10": cells.lower,
        "upper_log10": cells.upper,
        "mean_natural": nat(cells.mean),
        "lower_natural": nat(cells.lower),
        "upper_natural": nat(cells.upper),
        "independent_lower_log10": cells.independent_lower,
        "independent_upper_log10": cells.independent_upper,
        "independent_lower_natural": nat(cells.independent_lower),
        "independent_upper_natural": nat(cells.independent_upper),
    }
    for k, t in enumerate(thresholds):
        name = tier_name(spec, t)
        data[name] = cells.share_mean[k]
        data[f"{name}_lower"] = cells.share_lower[k]
        data[f"{name}_upper"] = cells.share_upper[k]
    data.update(
        {
            "n_tiles": tiles.n_tiles.astype(np.int64),
            "n_tests": tiles.n_tests.astype(np.int64),
            "tiles_mean_log10": ts.mean,
            "tiles_lower_log10": ts.lower,
            "tiles_upper_log10": ts.upper,
            "tiles_mean_natural": nat(ts.mean),
            "tiles_lower_natural": nat(ts.lower),
            "tiles_upper_natural": nat(ts.upper),
            "tiles_raw_mean_natural": tiles.raw_mean,
            "tiles_raw_geomean_natural": tiles.raw_geomean,
            "unit": spec.unit,
            "target": spec.name,
            "quantity": quantity,
            "quarter": quarter,
            "quarter_status": quarter_status,
            "samples": int(samples),
        }
    )
    frame = pd.DataFrame(data)
    filled = cells.count > 0
    values = frame.loc[filled, ["mean_log10", "lower_log10", "upper_log10"]].to_numpy()
    if not np.isfinite(values).all():
        raise DataError(
            "the model gave non-finite area summaries, so nothing was written (earlier files "
            "are kept); the model file may be damaged: retrain it with `geodbk train`"
        )
    return frame[summary_columns(spec, thresholds)]


#: The CSV's columns of codes and names: read as text, so ``007`` or a GEOID starting with
#: ``0`` keeps its leading zeros.
CSV_TEXT_COLUMNS = ("id", "name")


def _csv_header(meta: dict[str, Any], licence: dict[str, str]) -> str:
    """``#`` lines opening the CSV: what it holds (target, quantity, quarter, samples, areas
    file, the units of the log10, natural and share columns), how to read its id and name as
    text (:data:`CSV_TEXT_COLUMNS`) and the data licence."""

    url = f" {licence['license_url']}" if licence.get("license_url") else ""
    dtype = ", ".join(f'"{c}": str' for c in CSV_TEXT_COLUMNS)
    spec = target_spec(str(meta["target"]))
    units = (
        f"*_log10 columns: log10 of {spec.column}; *_natural columns: {spec.unit} "
        f"(10**log10 / {spec.divisor:g}); share_* columns: fractions 0-1 of the area"
    )
    return (
        f"# geodbk area summaries: {meta['target']}, {meta['quantity']} quantity, "
        f"{quarter_text(meta['quarter'], meta.get('quarter_status'))}, "
        f"{meta['samples']} joint samples, {meta['interval']}; areas "
        f"{meta['areas_file']} (id: {meta['id_column']}); {units}. Columns: "
        'docs/cli.md "geodbk summarize". Read with pandas.read_csv(path, comment="#", '
        f"dtype={{{dtype}}}) (import {' and '.join(CSV_TEXT_COLUMNS)} as text in a spreadsheet, "
        "or codes such as 007 lose their leading zeros).\n"
        f"# {licence_line(licence)}{url}\n"
    )


def _warn_replacing_other_areas(parquet: Path, source: str) -> None:
    """Warn when ``parquet`` holds the summary of another areas file of the same stem (e.g.
    ``X.zip`` and ``X.shp``, or two layers of one zip), which the new summary replaces."""
    if not parquet.is_file():
        return
    import pyarrow.parquet as pq

    try:
        meta = json.loads((pq.read_schema(parquet).metadata or {}).get(SUMMARY_KEY, b"{}"))
    except (OSError, ValueError):
        return
    before = meta.get("areas_file") if isinstance(meta, dict) else None
    if before and before != source:
        log.warning(
            "%s holds the summary of %s; it is replaced by that of %s (rename one of the "
            "files to keep both)",
            parquet.name,
            before,
            source,
        )


def _write(
    paths: tuple[Path, Path],
    frame: pd.DataFrame,
    areas: Areas,
    *,
    meta: dict[str, Any],
    licence: dict[str, str],
) -> Path:
    """Write the GeoParquet (geometry kept; licence and provenance in the metadata) and the
    CSV (licence in its ``#`` header) atomically, as a pair: both are staged first."""
    import geopandas as gpd
    import pyarrow.parquet as pq

    parquet, csv = paths
    parquet.parent.mkdir(parents=True, exist_ok=True)
    gdf = gpd.GeoDataFrame(frame, geometry=areas.frame.geometry.to_numpy(), crs="EPSG:4326")
    arrow = _to_arrow(gdf)
    kv = {
        **(arrow.schema.metadata or {}),
        **licence_schema_metadata(licence),
        SUMMARY_KEY: json.dumps(meta, sort_keys=True, allow_nan=False).encode("utf-8"),
    }
    with atomic_path(parquet) as tmp_parquet, atomic_path(csv) as tmp_csv:
        with naming_errors(parquet):
            pq.write_table(arrow.replace_schema_metadata(kv), tmp_parquet, compression="zstd")
        with naming_errors(csv), open(tmp_csv, "w", encoding="utf-8", newline="") as handle:
            handle.write(_csv_header(meta, licence))
            write_csv_rows(handle, frame)
    return parquet
