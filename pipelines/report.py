"""``geodbk report``: test-set accuracy and calibration, urban vs rural, with figures.

Writes ``RUN/report/TARGET/`` (``predictions.parquet``, ``metrics.json``, ``summary.json``,
``report.md``/``report.html`` and ``figures/``; their fields: docs/architecture.md,
"report/TARGET/"). Each test row is predicted as the model was trained: a time-aware model at
the row's own quarter (:func:`pipelines.rundir.model_inputs`), a tests-aware model as the
average of the row's own ``tests`` (``std² = std_f² + s2_floor + s2_meas / tests``, plus
``s2_dev / devices`` for ``tests+devices``), a noise floor per class with the row's ``urban``
flag. Scores are on the log10 scale and standardised by the training sd
(``nll_std = nll - ln sd_train``), overall, urban/rural, by number of tests
(:func:`pipelines.scoring.by_tests_scores`) and by quarter
(:func:`pipelines.scoring.by_quarter_scores`). A tile or grid cell is *served* at a threshold
when P(speed ≥ threshold) ≥ 0.9 (latency: P(latency ≤ threshold) ≥ 0.9), at the table's latest
quarter for a time-aware model.

Memory: the tile table is never loaded whole; every pass streams the columns it needs, one
record batch at a time (:func:`geodbk.geo.parquet_batches.streaming_mean_std`,
:func:`geodbk.geo.parquet_batches.predict_table`, :func:`scan_tiles`, :class:`pipelines.figures.SdBinner`).
"""

from __future__ import annotations

import argparse
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from geodbk import __version__
from geodbk.atomic import atomic_path, atomic_write_json, atomic_write_text, staged_folder
from geodbk.errors import DataError, ModelFileError
from geodbk.exceedance import exceedance_probability
from geodbk.geo.blocks import PLACE_TEXT
from geodbk.geo.contract import TARGETS
from geodbk.geo.frame import frame_bounds
from geodbk.geo.licence import licence_line
from geodbk.geo.longitude import wrap_longitude
from geodbk.geo.parquet_batches import (
    count_rows,
    iter_parquet_batches,
    predict_table,
    streaming_mean_std,
)
from geodbk.geo.splits import split_sentence
from geodbk.geo.table import read_table_metadata
from geodbk.geo.timeaxis import format_quarter, quarter_index, quarter_indices, quarter_text
from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    CRPS,
    MAE,
    MEDIAN_ABS_ERROR,
    NLL,
    OFF_BY_2X,
    PLACES,
    THRESHOLD_CHECK_HEADER,
    WIDTH95,
    clustered_checks_caveat,
    coverage_verdict,
    tests_range,
    threshold_check_rows,
)
from geodbk.predictive import noise_kwargs
from geodbk.quantities import predict_quantity
from geodbk.tile_effect import MAX_PLACE_SHARE
from geodbk.validation import counts_or_one
from pipelines import figures
from pipelines.bundles import load_model
from pipelines.cli import stage_parser
from pipelines.gridfile import grid_attrs, open_grid
from pipelines.layers import MIN_PLACE_TILES, MIN_PLACE_UNITS, certifies, load_map_layers
from pipelines.map_calibration import map_calibration_of_run
from pipelines.places import map_quarter_status
from pipelines.predict import cut_to_tiles, tiles_west_of
from pipelines.report_areas import area_summaries_section, service_headline_section
from pipelines.report_doc import QUARTER_HEADER, Doc, quarter_rows
from pipelines.run_inputs import (
    observed_quarters,
    pooled_label,
    read_region,
    region_area_caveat,
)
from pipelines.rundir import (
    RunDir,
    TargetSpec,
    check_thresholds,
    licence_schema_metadata,
    locked_stage,
    model_inputs,
    require_run,
    run_licence,
    stale_model_message,
    target_spec,
    time_scaling_of,
)
from pipelines.scoring import (
    bucket_masks,
    by_quarter_scores,
    by_tests_scores,
    clean_json,
    reliability,
    urban_rural_scores,
)
from pipelines.threshold_check import SURE_PROB

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("geodbk")

#: Probability required to call a tile served.
SERVED_PROB = SURE_PROB

#: Rows per record batch of the streaming passes (the row-group size of a tile table).
BATCH_ROWS = 65536

#: Columns of ``predictions.parquet`` (``tests`` only when the tile table has it; a
#: ``tests+devices`` model adds ``devices`` at the end).
PREDICTION_COLUMNS: tuple[str, ...] = (
    "quadkey",
    "quarter",
    "urban",
    "y",
    "mean",
    "std",
    "lon",
    "lat",
    "tests",
)

#: What ``geodbk report --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Score a trained target on the test split, urban and rural apart, with figures.

Writes RUN/report/TARGET/: predictions.parquet (every test tile's prediction), metrics.json
(MAE, NLL, CRPS, 95% coverage and interval width for urban, rural and all tiles, by number
of speed tests and by quarter, and the map calibration of the tile and area quantities at
well-measured test tiles, 30+ tests, and of the tile quantity at less measured ones, 5-29),
summary.json (the constant-mean baseline, reliability curves and the service-coverage table,
each naming the quantity that judged it), report.md, report.html and figures/. Test tiles
are scored with their own number of tests and their tile's history, as the model was trained.
Details: docs/cli.md, "geodbk report".
"""

EPILOG = """\
examples:
  geodbk report --run runs/hawaii --target download
  geodbk report --run runs/hawaii                 # every trained target

exit codes: 0 ok, 2 usage, 3 bad data, 4 missing/bad model, 5 missing run directory.
"""


def register(subparsers: Any) -> None:
    """Add the ``report`` sub-command."""
    p = stage_parser(
        subparsers,
        "report",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
        run="run directory",
    )
    p.add_argument(
        "--target",
        choices=list(TARGETS),
        default=None,
        help="one target (default: every trained target)",
    )
    p.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=None,
        help="service thresholds in Mbps or ms (default: FCC 25/100, 3/20; 100 ms)",
    )


def _main(args: argparse.Namespace) -> int:
    rd = require_run(args.run)
    targets = [args.target] if args.target else rd.trained_targets()
    if not targets:
        raise ModelFileError(
            f"no trained model in {rd.root / 'models'}; run `geodbk train --run {rd.root} "
            "--target download` first"
        )
    for t in targets:
        run_report(rd.root, target=t, thresholds=args.thresholds)
    return 0


def _predict(
    model: Any,
    X: np.ndarray,
    chunk: int,
    tests: np.ndarray | None = None,
    devices: np.ndarray | None = None,
    urban: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and predictive sd; tests-aware models use ``tests`` per row (None: one test),
    ``tests+devices`` models ``devices`` too (None: ``devices = tests``), models with a noise
    floor per urban/rural class each row's ``urban``."""

    pred = model.predict_dist(
        X, chunk_size=chunk, **noise_kwargs(model, tests, devices, urban=urban)
    )
    return np.asarray(pred.mean, dtype=np.float64), np.asarray(pred.std, dtype=np.float64)


def _predict_tiles(
    model: Any,
    tile_model: Any,
    X: np.ndarray,
    tiles: pa.Table,
    quarter: str | None,
    chunk: int,
    *,
    urban: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd of the ``tile`` quantity (:mod:`geodbk.quantities`) of distinct tiles: with a
    tile effect or local layer ``tile_model`` each tile's offset at ``quarter``, without one
    f(x) plus the noise floor."""

    q = predict_quantity(
        model,
        X,
        quantity="tile",
        effect=tile_model,
        tiles=np.asarray(tiles.column("quadkey").to_pylist()).astype(str),
        times=float(quarter_index(quarter)) if quarter else 0.0,
        urban=urban,
        chunk_size=chunk,
    )
    return q.mean, q.sd


def threshold_label(spec: TargetSpec, thr: float) -> str:
    """``≥ 25 Mbps`` (a speed) or ``≤ 100 ms`` (latency): the good side of ``thr``."""
    return f"{'≥' if spec.higher_is_better else '≤'} {thr:g} {spec.unit}"


def _served_prob(spec: TargetSpec, mean: np.ndarray, std: np.ndarray, thr: float) -> np.ndarray:
    """P(on the good side of ``thr``): P(speed ≥ thr) or P(latency ≤ thr)."""
    return exceedance_probability(
        mean, std, spec.natural_to_log10(thr), above=spec.higher_is_better
    )


def _grid_area_share(rd: RunDir, spec: TargetSpec, thr: float) -> float | None:
    """Area-weighted share of in-region grid cells served at ``thr`` (None without a grid)."""
    path = rd.grid(spec.name)
    if not path.is_file():
        return None
    name = spec.threshold_name(thr)
    with open_grid(path, fix=f"geodbk predict --run {rd.root} --target {spec.name}") as ds:
        if name not in ds:
            return None
        served = 0.0
        total = 0.0
        step = 512
        for start in range(0, ds.sizes["y"], step):
            block = ds.isel(y=slice(start, start + step))
            p_bad = block[name].values
            inside = np.isfinite(p_bad)
            w = np.cos(np.deg2rad(block["y"].values))[:, None] * np.ones_like(p_bad)
            served += float(w[inside & (p_bad <= 1 - SERVED_PROB)].sum())
            total += float(w[inside].sum())
    return served / total if total > 0 else None


def _grid_attrs(rd: RunDir, spec: TargetSpec) -> dict[str, Any]:
    """The attributes of ``grids/TARGET.nc`` (empty without the grid)."""
    path = rd.grid(spec.name)
    if not path.is_file():
        return {}
    return grid_attrs(path, fix=f"geodbk predict --run {rd.root} --target {spec.name}")


def latest_quarter(quarters: Iterable[str]) -> str:
    """The latest of ``quarters`` (``2023Q4``), e.g. the distinct quarters of a tile table: the
    quarter of the current map."""

    return format_quarter(int(quarter_indices([str(q) for q in quarters]).max()))


def uses_devices(model: Any, columns: Iterable[str]) -> bool:
    """Whether ``model`` (``noise="tests+devices"``) is scored with a ``devices`` column.

    Raises
    ------
    DataError
        A ``tests+devices`` model and a table without ``devices`` (or ``tests``).
    """
    if not getattr(model, "devices_aware", False):
        return False
    missing = [c for c in ("tests", "devices") if c not in set(columns)]
    if missing:
        raise DataError(
            f"the model's noise is tests+devices but the tile table has no {missing} column(s); "
            "re-ingest tiles that have them, or retrain with --noise tests"
        )
    return True


def _batch_inputs(metadata: dict[str, Any]) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """Batch columns -> model inputs (:func:`pipelines.rundir.model_inputs`): ``[x1, x2]``, or
    ``[x1, x2, t]`` with ``t`` from each row's ``quarter`` for a time-aware model."""
    time_aware = time_scaling_of(metadata) is not None

    def inputs(cols: dict[str, np.ndarray]) -> np.ndarray:
        X2 = np.column_stack(
            [np.asarray(cols["x1"], dtype=np.float64), np.asarray(cols["x2"], dtype=np.float64)]
        )
        quarter = np.asarray(cols["quarter"], dtype=object).astype(str) if time_aware else None
        return model_inputs(X2, metadata, quarter=quarter)

    return inputs


def _first_per_tile(table: pa.Table) -> pa.Table:
    """The first row of each ``quadkey`` (in row order): ``groupby("quadkey").first()`` for a
    valid tile table (pandas' ``first`` skips missing values; ``x1``, ``x2``, ``urban`` have
    none).

    :func:`pyarrow.compute.dictionary_encode` numbers the quadkeys in order of first
    appearance, so the first row of each is where its code first occurs (measured on 2M rows:
    0.35 s and +77 MB, against 1.7 s and +158 MB for ``Table.group_by`` with ``first``).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = table.column("quadkey").combine_chunks()
    codes = pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False)
    _, first = np.unique(codes, return_index=True)
    return table.take(pa.array(first))


@dataclass
class TileScan:
    """What one column-wise pass over a tile table collects (:func:`scan_tiles`).

    Attributes
    ----------
    tiles
        Distinct tiles: ``quadkey, x1, x2, urban`` with each tile's first values (as
        ``groupby("quadkey").first()``), in order of first appearance.
    quarters
        Distinct values of ``quarter`` (sorted; empty unless asked for).
    extent
        ``(lon_min, lat_min, lon_max, lat_max)`` of the tile centroids (``None``: no rows).
    """

    tiles: pa.Table
    quarters: list[str]
    extent: tuple[float, float, float, float] | None


def scan_tiles(
    path: str | Path,
    *,
    quarters: bool = False,
    batch_size: int = BATCH_ROWS,
    compact_rows: int = 1 << 20,
    west: float = -180.0,
) -> TileScan:
    """Distinct tiles, quarters and lon/lat extent of a tile table, in one streaming pass.

    Reads ``quadkey``, ``x1``, ``x2``, ``urban``, ``lon``, ``lat`` (and ``quarter`` with
    ``quarters``) one record batch at a time, never the geometry. Each batch is reduced to one
    row per quadkey (its first row, :func:`_first_per_tile`); the reduced
    batches are merged the same way whenever they hold more rows than the merged table (and at
    least ``compact_rows``), so memory is about one row per distinct tile.

    Parameters
    ----------
    path
        A tile table (``tiles.parquet``).
    quarters
        Also collect the distinct values of ``quarter``.
    batch_size
        Rows per record batch.
    compact_rows
        Reduced rows held before a merge.
    west
        The extent's longitudes are taken in ``[west, west + 360)``
        (:func:`pipelines.predict.tiles_west_of`: contiguous across the 180° meridian).
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    keep = ["quadkey", "x1", "x2", "urban"]
    columns = [*keep, "lon", "lat"] + (["quarter"] if quarters else [])
    seen: set[str] = set()
    lo = np.array([np.inf, np.inf])
    hi = np.array([-np.inf, -np.inf])
    merged: pa.Table | None = None
    pending: list[pa.Table] = []
    n_pending = 0
    # pre_buffer=False: the default pre-buffering reads ahead across row groups, so its memory
    # grows with the file (measured: +195 MB at 4e6 rows, vs +55 MB flat without it)
    pf = pq.ParquetFile(path, pre_buffer=False)
    for batch in pf.iter_batches(batch_size=int(batch_size), columns=columns, use_threads=False):
        if batch.num_rows == 0:
            continue
        if quarters:
            seen.update(str(q) for q in pc.unique(batch.column("quarter")).to_pylist())
        for j, c in enumerate(("lon", "lat")):
            v = np.asarray(batch.column(c).to_numpy(zero_copy_only=False), dtype=np.float64)
            v = wrap_longitude(v, west=west) if c == "lon" else v
            lo[j], hi[j] = min(lo[j], v.min()), max(hi[j], v.max())
        pending.append(_first_per_tile(pa.Table.from_batches([batch]).select(keep)))
        n_pending += pending[-1].num_rows
        if n_pending >= max(int(compact_rows), merged.num_rows if merged is not None else 0):
            parts = ([merged] if merged is not None else []) + pending
            merged = _first_per_tile(pa.concat_tables(parts))
            pending, n_pending = [], 0
    if pending:
        merged = _first_per_tile(
            pa.concat_tables(([merged] if merged is not None else []) + pending)
        )
    if merged is None:
        schema = pf.schema_arrow
        empty = pa.table({c: pa.array([], type=schema.field(c).type) for c in keep})
        return TileScan(empty, sorted(seen), None)
    extent = (float(lo[0]), float(lo[1]), float(hi[0]), float(hi[1]))
    return TileScan(merged, sorted(seen), extent)


def service_coverage(
    rd: RunDir,
    spec: TargetSpec,
    model: Any,
    tiles: pa.Table,
    thresholds: Sequence[float],
    chunk: int,
    *,
    metadata: dict[str, Any] | None = None,
    quarter: str | None = None,
    tile_effect: Any = None,
    tile_quarter: str | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{"threshold", "label", "tiles", "area", "urban", "rural", "n_tiles",
    "quantity", "area_quantity", "quarter", "quarter_status", "area_quarter",
    "area_quarter_status"}`` (shares).

    ``tiles`` are the distinct tiles (:attr:`TileScan.tiles`); they are predicted ``chunk`` at a
    time and only the served counts are kept. A tile is judged on the ``tile`` quantity, what
    it typically gets (:mod:`geodbk.quantities`), not on one speed test: with a
    ``tile_effect`` (a tile effect or a local layer) each tile's own offset at ``tile_quarter``
    (the table's latest quarter), without one f(x) plus the noise floor. A time-aware model
    (``metadata["inputs"]`` holds ``t``) predicts every tile at ``quarter`` (the table's
    latest, as ``grids/TARGET.nc``); a pooled one ignores it. ``quarter`` and
    ``quarter_status`` name what the tile columns are judged at, as ``geodbk predict`` names a
    map's quarter (``2023Q4``, ``observed``; a pooled model's ``pooled 2022Q1:2023Q4``,
    ``pooled`` or ``pooled; tile offsets at 2023Q4``). The area share is read from the grid's
    exceedance layers, whose quantity and quarter (``area_quantity``, ``area_quarter``,
    ``area_quarter_status``) are the grid's own (None without a grid).
    """
    md = metadata or {}
    n = tiles.num_rows
    urban = np.asarray(tiles.column("urban").to_numpy(zero_copy_only=False), dtype=bool)
    n_urban = int(urban.sum())
    counts = np.zeros((len(thresholds), 3), dtype=np.int64)  # all, urban, rural
    step = max(int(chunk), 1)
    for start in range(0, n, step):
        part = tiles.slice(start, step)
        X2 = np.column_stack(
            [
                np.asarray(part.column(c).to_numpy(zero_copy_only=False), dtype=np.float64)
                for c in ("x1", "x2")
            ]
        )
        u = urban[start : start + step]
        X = model_inputs(X2, md, quarter=quarter)
        mean, std = _predict_tiles(model, tile_effect, X, part, tile_quarter, chunk, urban=u)
        for j, t in enumerate(thresholds):
            served = _served_prob(spec, mean, std, t) >= SERVED_PROB
            counts[j] += (int(served.sum()), int(served[u].sum()), int(served[~u].sum()))
    rows = []
    grid_attrs = _grid_attrs(rd, spec)
    area_quantity = str(grid_attrs.get("quantity", "")) or None
    ts = time_scaling_of(md)
    if quarter is not None and ts is not None:
        judged, status = quarter, map_quarter_status(ts, quarter, observed=())
    else:
        observed = observed_quarters(rd, md)
        judged = pooled_label(observed)
        offsets = [tile_quarter] if tile_effect is not None and tile_quarter else []
        status = map_quarter_status(None, None, observed=offsets, tile_offsets=bool(offsets))
    for j, t in enumerate(thresholds):
        rows.append(
            {
                "threshold": float(t),
                "label": threshold_label(spec, t),
                "quantity": "tile",
                "area_quantity": area_quantity,
                "quarter": judged,
                "quarter_status": status,
                "area_quarter": str(grid_attrs.get("quarter", "")) or None,
                "area_quarter_status": str(grid_attrs.get("quarter_status", "")) or None,
                "n_tiles": n,
                "tiles": int(counts[j, 0]) / n if n else None,
                "area": _grid_area_share(rd, spec, t),
                "urban": int(counts[j, 1]) / n_urban if n_urban else None,
                "rural": int(counts[j, 2]) / (n - n_urban) if n - n_urban else None,
            }
        )
    return rows


def coverage_quarter_text(rows: Sequence[dict[str, Any]]) -> str | None:
    """The quarter of service-coverage ``rows`` for a title: the tiles' (with a status other
    than observed or pooled), and the map's where it differs; None for rows without one."""
    first = rows[0] if rows else {}
    if not first.get("quarter"):
        return None
    text = quarter_text(first["quarter"], first.get("quarter_status"))
    area = first.get("area_quarter")
    if area and area != first["quarter"]:
        text += f"; area: {quarter_text(area, first.get('area_quarter_status'))}"
    return text


def _split_filter(spec: TargetSpec, splits: Sequence[str]) -> Any:
    """Rows of ``splits`` with a finite target (a :class:`pyarrow.compute.Expression`)."""
    import pyarrow.compute as pc

    in_split = (
        pc.field("split") == splits[0] if len(splits) == 1 else pc.field("split").isin(splits)
    )
    return in_split & pc.is_finite(pc.field(spec.log_column))


def _check_columns(rd: RunDir, spec: TargetSpec) -> set[str]:
    """Column names of ``tiles.parquet``; raise :class:`DataError` when the report lacks one."""
    import pyarrow.parquet as pq

    names = set(pq.read_schema(rd.tiles).names)
    if "split" not in names:
        raise DataError(f"{rd.tiles} has no 'split' column; re-run `geodbk ingest`")
    need = ("quadkey", "quarter", "lon", "lat", "x1", "x2", "urban", spec.log_column)
    missing = [c for c in need if c not in names]
    if missing:
        raise DataError(f"{rd.tiles} has no {missing} column(s); re-run `geodbk ingest`")
    return names


def scored_quantity(*, has_tests: bool) -> str:
    """The quantity the report scores test (and held-out) rows on, for its figure titles: the
    test quantity, each row the average of its own number of speed tests (``has_tests``), else
    the row's tile value."""
    if has_tests:
        return "test quantity: each row the average of its own speed tests"
    return "test quantity: each row's tile value"


def write_test_predictions(
    model: Any,
    rd: RunDir,
    spec: TargetSpec,
    dst: Path,
    *,
    metadata: dict[str, Any],
    chunk: int,
    has_tests: bool,
    has_devices: bool = False,
    tile_effect: Any = None,
    licence: dict[str, str] | None = None,
) -> int:
    """Stream the test split through ``model`` into ``dst`` (``predictions.parquet``, atomic,
    with the data ``licence`` in its metadata; default the run's).

    :func:`geodbk.geo.parquet_batches.predict_table` writes the test rows with a finite target (each at
    its own quarter for a time-aware model, with its own ``tests`` for a tests-aware one) to a
    temporary file, which is then rewritten batch by batch with the columns
    :data:`PREDICTION_COLUMNS` (``y`` = the log10 target, ``tests`` as float64 ≥ 1) plus,
    with ``has_devices`` (a ``tests+devices`` model), ``devices`` (float64 ≥ 1, each row scored
    with its own). A ``tile_effect`` (``geodbk train --tile-effect``) shifts each test row by
    its tile's offset at its quarter. Returns the number of rows.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    time_aware = time_scaling_of(metadata) is not None
    licence = run_licence(rd) if licence is None else licence
    keep = ["quadkey", "quarter", "urban", spec.log_column, "lon", "lat"]
    counts = ["tests"] if has_tests else []
    counts += ["devices"] if has_devices else []
    keep += counts
    with atomic_path(dst) as tmp:
        raw = tmp.with_name(f"{tmp.stem}.raw.parquet")
        try:
            n = predict_table(
                model,
                rd.tiles,
                raw,
                keep_columns=keep,
                filters=_split_filter(spec, ["test"]),
                batch_size=int(chunk),
                inputs=_batch_inputs(metadata),
                read_columns=["quarter"] if time_aware else [],
                tests_column="tests" if has_tests else None,
                devices_column="devices" if has_devices else None,
                urban_column="urban",
                tile_effect=tile_effect,
            )
            writer = None
            try:
                batches = pq.ParquetFile(raw, pre_buffer=False).iter_batches(
                    batch_size=BATCH_ROWS, use_threads=False
                )
                for batch in batches:
                    cols: dict[str, Any] = {
                        "quadkey": pc.cast(batch.column("quadkey"), pa.large_string()),
                        "quarter": pc.cast(batch.column("quarter"), pa.large_string()),
                        "urban": pc.cast(batch.column("urban"), pa.bool_()),
                        "y": pc.cast(batch.column(spec.log_column), pa.float64()),
                        "mean": batch.column("mean"),
                        "std": batch.column("std"),
                        "lon": pc.cast(batch.column("lon"), pa.float64()),
                        "lat": pc.cast(batch.column("lat"), pa.float64()),
                    }
                    for c in counts:
                        cols[c] = pa.array(
                            counts_or_one(batch.column(c).to_numpy(zero_copy_only=False))
                        )
                    table = pa.table(cols)
                    if writer is None:
                        schema = table.schema.with_metadata(licence_schema_metadata(licence))
                        writer = pq.ParquetWriter(str(tmp), schema)
                    writer.write_table(table)
            finally:
                if writer is not None:
                    writer.close()
        finally:
            raw.unlink(missing_ok=True)
    return n


def _read_scored(path: Path, *, has_tests: bool) -> dict[str, Any]:
    """The scoring columns of ``predictions.parquet`` as numpy arrays; ``quarter`` as the
    distinct quarters (``quarters``) and one code per row (``codes``), not one string per row."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    cols = ["quarter", "urban", "y", "mean", "std"] + (["tests"] if has_tests else [])
    table = pq.read_table(path, columns=cols)
    quarter = table.column("quarter")
    distinct = pc.unique(quarter)
    out: dict[str, Any] = {
        "quarters": [str(q) for q in distinct.to_pylist()],
        "codes": np.asarray(pc.index_in(quarter, value_set=distinct).to_numpy(), dtype=np.intp),
        "urban": np.asarray(table.column("urban").to_numpy(), dtype=bool),
    }
    for c in ("y", "mean", "std", *(["tests"] if has_tests else [])):
        out[c] = np.asarray(table.column(c).to_numpy(), dtype=np.float64)
    return out


def heldout_sd_map(
    rd: RunDir,
    spec: TargetSpec,
    model: Any,
    bounds: tuple[float, float, float, float],
    *,
    metadata: dict[str, Any],
    chunk: int,
    has_tests: bool,
    has_devices: bool = False,
) -> tuple[np.ndarray, np.ndarray, tuple[float, float, float, float]]:
    """Empirical and predicted sd maps of the held-out rows (val + test, finite target).

    Streams ``x1, x2, lon, lat``, the target (and ``quarter`` / ``tests`` where the model uses
    them) batch by batch into a :class:`pipelines.figures.SdBinner`; returns its result.
    """

    cols = ["x1", "x2", "lon", "lat", "urban", spec.log_column]
    cols += ["quarter"] if time_scaling_of(metadata) is not None else []
    cols += ["tests"] if has_tests else []
    cols += ["devices"] if has_devices else []
    inputs = _batch_inputs(metadata)
    binner = figures.SdBinner(bounds)
    for c in iter_parquet_batches(
        rd.tiles, columns=cols, filters=_split_filter(spec, ["val", "test"]), batch_size=BATCH_ROWS
    ):
        tests = counts_or_one(c["tests"]) if has_tests else None
        devices = counts_or_one(c["devices"]) if has_devices else None
        urban = np.asarray(c["urban"], dtype=bool)
        mean, std = _predict(model, inputs(c), chunk, tests, devices, urban)
        y = np.asarray(c[spec.log_column], dtype=np.float64)
        binner.add(
            np.asarray(c["lon"], dtype=np.float64),
            np.asarray(c["lat"], dtype=np.float64),
            y - mean,
            std,
        )
    return binner.result()


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{100 * v:.1f}%" if pct else f"{v:.3f}"


def table2_rows(
    models: dict[str, dict[str, dict[str, Any]]], *, suffix: str = ""
) -> list[list[str]]:
    """Rows in the seed's Table 2 layout: model | urban MAE NLL Cov | rural MAE NLL Cov."""
    rows = []
    for name, m in models.items():
        row = [name]
        for g in ("urban", "rural"):
            row += [
                _fmt(m[g].get(MAE + suffix)),
                _fmt(m[g].get(NLL + suffix)),
                _fmt(m[g].get(COVERAGE95), pct=True),
            ]
        rows.append(row)
    return rows


@locked_stage("report")
def run_report(run: str | Path, *, target: str, thresholds: Sequence[float] | None = None) -> Path:
    """Score the test split of ``target`` and write ``RUN/report/TARGET/``; return that folder.

    The files are written into a hidden folder beside it first and moved into place together
    once all are written: a failure (a full disk) leaves the earlier report whole.

    Parameters
    ----------
    run
        Run directory with ``tiles.parquet`` and a trained ``models/TARGET``.
    target
        ``download``, ``upload`` or ``latency``.
    thresholds
        Service-coverage thresholds in natural units (default: the FCC benchmarks).
    """
    thr = check_thresholds(thresholds, target)
    rd = require_run(run)
    final = rd.report_dir(target)
    with staged_folder(final) as out_dir:
        _write_report(rd, target=target, thr=thr, out_dir=out_dir)
    log.info(
        "wrote %s (predictions.parquet, metrics.json, summary.json, report.md, "
        "report.html, figures/*.png)",
        final,
    )
    return final


def _write_report(rd: RunDir, *, target: str, thr: tuple[float, ...], out_dir: Path) -> None:
    """The files of :func:`run_report`, written into ``out_dir``."""
    import pyarrow.compute as pc

    spec = target_spec(target)
    model = load_model(rd, target)
    tile_effect, layer = load_map_layers(rd, target, model)
    tile_model = layer if layer is not None else tile_effect
    licence = run_licence(rd)
    md: dict[str, Any] = dict(getattr(model, "metadata_", None) or {})
    chunk = int(md.get("config", {}).get("predict_chunk_size", 65536))
    tiles_meta = read_table_metadata(rd.tiles)
    names = _check_columns(rd, spec)
    has_tests = "tests" in names
    has_devices = uses_devices(model, names)
    train_rows = (
        _split_filter(spec, ["train"]) & pc.is_finite(pc.field("x1")) & pc.is_finite(pc.field("x2"))
    )
    mean_train, sd_train, n_train = streaming_mean_std(
        rd.tiles, column=spec.log_column, filters=train_rows
    )
    if n_train < 2:
        raise DataError(f"{rd.tiles}: fewer than 2 usable training rows for {target}")
    n_test = count_rows(rd.tiles, filters=_split_filter(spec, ["test"]))
    if n_test == 0:
        raise DataError(f"{rd.tiles} has no test rows with a finite {spec.log_column}")
    log.info("scoring %d test rows of %s (streamed, %d training rows)", n_test, rd.tiles, n_train)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)

    write_test_predictions(
        model,
        rd,
        spec,
        out_dir / "predictions.parquet",
        metadata=md,
        chunk=chunk,
        has_tests=has_tests,
        has_devices=has_devices,
        tile_effect=tile_model,
    )
    scored = _read_scored(out_dir / "predictions.parquet", has_tests=has_tests)
    y, mean, std, urban = scored["y"], scored["mean"], scored["std"], scored["urban"]
    tests = scored.get("tests")

    metrics = urban_rural_scores(y, mean, std, urban, sd_train=sd_train)
    base = urban_rural_scores(
        y, np.full_like(y, mean_train), np.full_like(y, sd_train), urban, sd_train=sd_train
    )
    metrics_doc: dict[str, Any] = dict(metrics)
    by_quarter = by_quarter_scores(y, mean, std, urban, scored["quarters"], codes=scored["codes"])
    bucket_curves: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    if tests is not None:
        metrics_doc["by_tests"] = by_tests_scores(y, mean, std, urban, tests)
        for label, bm in bucket_masks(tests).items():
            bucket_curves[label] = {
                g: reliability(y[gm], mean[gm], std[gm])
                for g, gm in (("urban", bm & urban), ("rural", bm & ~urban))
                if gm.any()
            }
    metrics_doc["by_quarter"] = by_quarter
    if tile_effect is not None:
        metrics_doc["tile_effect"] = tile_effect.params.to_dict()
    if layer is not None:
        metrics_doc["local_layer"] = layer.params.to_dict()
    metrics_doc["map_calibration"] = map_calibration_of_run(
        rd,
        spec,
        model,
        tile_model,
        metadata=md,
        chunk=chunk,
        thresholds=[(threshold_label(spec, t), t) for t in thr],
    )
    atomic_write_json(out_dir / "metrics.json", clean_json(metrics_doc))

    curves = {}
    for g, m in (("urban", urban), ("rural", ~urban), ("all", np.ones_like(urban))):
        if m.any():
            curves[g] = reliability(y[m], mean[m], std[m])
    ts = time_scaling_of(md)
    region = read_region(rd)
    region_extent = frame_bounds(region)
    scan = scan_tiles(
        rd.tiles,
        quarters=ts is not None or tile_effect is not None,
        west=tiles_west_of(region_extent),
    )
    latest = latest_quarter(scan.quarters) if scan.quarters else None
    current = latest if ts is not None else None
    coverage_rows = service_coverage(
        rd,
        spec,
        model,
        scan.tiles,
        thr,
        chunk,
        metadata=md,
        quarter=current,
        tile_effect=tile_model,
        tile_quarter=latest,
    )
    tile_extent = scan.extent
    del scan  # one row per distinct tile: not needed any more

    # Figure 10: held-out rows (val + test), binned.
    emp, pred_sd, extent = heldout_sd_map(
        rd,
        spec,
        model,
        cut_to_tiles(region_extent, tile_extent),
        metadata=md,
        chunk=chunk,
        has_tests=has_tests,
        has_devices=has_devices,
    )
    label = f"log10 {spec.column}"
    named: dict[str, Any] = {"target": target, "quantity": scored_quantity(has_tests=has_tests)}
    figures.pi_width_violin(
        3.92 * std, urban, fig_dir / "pi_width_violin.png", label=label, **named
    )
    figures.reliability_diagram(curves, fig_dir / "reliability.png", **named)
    if bucket_curves:
        figures.reliability_by_tests(bucket_curves, fig_dir / "reliability_by_tests.png", **named)
    figures.sd_maps(
        emp, pred_sd, extent, fig_dir / "sd_maps.png", region=region, label=label, **named
    )
    figures.service_coverage_figure(
        coverage_rows,
        fig_dir / "service_coverage.png",
        target=target,
        quarter=coverage_quarter_text(coverage_rows),
    )
    extrapolated = [q for q in by_quarter if ts is not None and ts.is_extrapolation(q)]
    figures.quarter_calibration(
        by_quarter, fig_dir / "quarter_calibration.png", extrapolated=extrapolated, **named
    )
    split_info = tiles_meta.get("split") if isinstance(tiles_meta.get("split"), dict) else {}
    time_info: dict[str, Any] = {
        "time_aware": ts is not None,
        "inputs": md.get("inputs", ["x1", "x2"]),
        "time_scaling": ts.to_dict() if ts is not None else None,
        "quarter_status": {q: (ts.describe(q) if ts is not None else "pooled") for q in by_quarter},
        "service_coverage_quarter": current,
    }

    summary = {
        "stale_model": stale_model_message(rd, target, md),
        "target": target,
        "units": {"log10": label, "natural": spec.unit},
        "run": rd.root.resolve().name,
        "model": rd.relative(rd.model_dir(target)),
        # the training the report scored, as grids record it (their ``model_created``)
        "model_created": str(md.get("created", "")),
        "config_hash": md.get("config_hash"),
        "best_epoch": md.get("best_epoch"),
        "y_train_mean": mean_train,
        "y_train_sd": sd_train,
        "metrics": metrics,
        "by_tests": metrics_doc.get("by_tests"),
        "by_quarter": by_quarter,
        "split": split_info,
        "time": time_info,
        "noise": md.get("noise"),
        "baseline_constant_mean": base,
        "reliability": {
            g: {"levels": lv.tolist(), "coverage": cv.tolist()} for g, (lv, cv) in curves.items()
        },
        "service_coverage": coverage_rows,
        "served_probability": SERVED_PROB,
        "sd_map": {
            "cells_long_side": 40,
            "min_count": 3,
            "rows": "val+test",
            "n_cells": int(np.isfinite(emp).sum()),
        },
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
        "data_licence": licence,
    }
    atomic_write_json(out_dir / "summary.json", clean_json(summary))

    doc = _build_doc(
        rd,
        spec,
        md,
        metrics,
        base,
        coverage_rows,
        sd_train,
        emp,
        pred_sd,
        split_info,
        time_info,
        tile_offsets=tile_effect is not None,
    )
    if "by_tests" in metrics_doc:
        _by_tests_section(
            doc, metrics_doc["by_tests"], md.get("noise"), rescaled=tile_effect is not None
        )
    if tile_effect is not None:
        _tile_effect_section(doc, tile_effect.params.to_dict(), with_layer=layer is not None)
    elif md.get("tile_effect_off"):  # fitted, then dropped by `geodbk train` for the GP alone
        doc.heading("Tile effect")
        doc.para(
            f"None: {md['tile_effect_off']}, so `geodbk train` kept the GP alone and the "
            "tile quantity is f(x) plus the noise floor (`--tile-effect` keeps them)."
        )
    if layer is not None:
        kind = (split_info or {}).get("kind")
        _local_layer_section(doc, layer.params.to_dict(), split_kind=kind)
    _map_calibration_section(doc, metrics_doc["map_calibration"])
    _threshold_check_section(doc, metrics_doc["map_calibration"].get("thresholds"))
    _by_quarter_section(doc, by_quarter, time_info)
    area_summaries_section(doc, rd, spec)
    service_headline_section(doc, rd)
    doc.heading("Data and licence")
    doc.para(licence_line(licence))
    atomic_write_text(out_dir / "report.md", doc.markdown())
    atomic_write_text(out_dir / "report.html", doc.html(base=out_dir))


def _by_tests_section(
    doc: Doc, by_tests: dict[str, Any], noise: Any, *, rescaled: bool = False
) -> None:
    """Table and per-bucket reliability figure of the scores by number of speed tests;
    ``rescaled``: the rows were scored with the tile effect's refitted noise terms."""
    doc.heading("By number of speed tests per tile")
    if isinstance(noise, dict) and noise.get("noise") in ("tests", "tests+devices"):
        devices = noise["noise"] == "tests+devices"
        floor = f"{noise['s2_floor']:.4f}"
        if "s2_floor_urban" in noise:
            floor = f"({noise['s2_floor_urban']:.4f} urban | {noise['s2_floor']:.4f} rural)"
        doc.para(
            "Tests-aware noise: each test tile is predicted as the average of its own number "
            f"of tests{' from its own number of devices' if devices else ''}, "
            f"s2 = {floor} + {noise['s2_meas']:.4f} / tests^{noise['power']:.2f}"
            + (
                f" + {noise['s2_dev']:.4f} / devices^{noise['power_devices']:.2f}"
                if devices
                else ""
            )
            + " (log10 units²)"
            + (
                ", the GP's terms; the rows below were scored with each term rescaled by the "
                "tile effect (its section below)."
                if rescaled
                else "."
            )
        )
    else:
        doc.para("Constant noise: the same observation variance for every tile.")
    rows = []
    for label, r in by_tests.items():
        row = [label, r["n"], _fmt(r[NLL]), _fmt(r[COVERAGE95], pct=True), _fmt(r[WIDTH95])]
        for g in ("urban", "rural"):
            row += [_fmt(r[g][NLL]), _fmt(r[g][COVERAGE95], pct=True)]
        rows.append(row)
    doc.table(
        [
            "tests",
            "n",
            "NLL",
            "coverage",
            "PI width",
            "urban NLL",
            "urban cov.",
            "rural NLL",
            "rural cov.",
        ],
        rows,
    )
    doc.image("figures/reliability_by_tests.png", "reliability diagram per tests bucket")


def _tile_effect_section(doc: Doc, params: dict[str, Any], *, with_layer: bool = False) -> None:
    """What the tile effect is and what it was fitted to; ``with_layer``: a local layer's
    section follows (unseen tiles then also get their measured neighbours' pull)."""
    doc.heading("Tile effect")
    scales = ", ".join(
        f"{name} × {scale:.3g}"
        for name, scale in zip(params["components"], params["noise_scale"], strict=True)
    )
    holdout = params.get("objective") == "training hold-out"
    where = (
        "Each tile is shifted by its own persistent offset, learned from its quarters in the "
        "train and val splits (on this split no test tile has any, so test tiles get the "
        "offsets' prior)"
        if holdout
        else "Each test tile is shifted by its own persistent offset, learned from its other "
        "quarters in the train and val splits"
    )
    objective = "Held-out training NLL" if holdout else "Validation NLL"
    doc.para(
        f"{where}: an AR(1) offset over quarters with variance "
        f"τ² = {_per_group_text(params['tau2'])} (log10 units²) and correlation "
        f"ρ = {params['rho']:.3f} per "
        "quarter, learned together with the GP's own error at the tile (its latent variance "
        f"× {params.get('latent_scale', 1.0):.3g}); the observation noise was refitted as "
        f"{scales}. {objective} {_fmt(params.get('val_nll_without'))} without the offset, "
        f"{_fmt(params.get('val_nll'))} with it. Tiles never seen in training get the GP mean "
        "with the prior variance of error and offset"
        + (", moved by their measured neighbours' pull (local layer, below)" if with_layer else "")
        + ". The tile quantity of the maps, of "
        "`predict --at` and of the tile shares of service coverage uses each tile's offset "
        "(at the table's latest quarter for the shares). "
        + (
            f"The parameters were chosen on {params.get('objective_rows')} held-out training "
            "rows (no validation tile had training rows)."
            if params.get("objective") == "training hold-out"
            else ""
        )
        + _tests_shift_text(params)
        + (
            ""
            if with_layer
            else _unseen_prior_text(params.get("unseen_prior"), params.get("val_nll_unseen"))
        )
    )


def _tests_shift_text(params: dict[str, Any]) -> str:
    """The tile effect's tests shift in a sentence ('' when it has none)."""
    moved = [
        f"{name} × {gamma:.2f}"
        for name, gamma in zip(params["components"], params.get("tests_shift") or (), strict=False)
        if gamma != 0.0
    ]
    dropped = params.get("tests_shift_dropped")
    if dropped is not None:
        fitted = ", ".join(
            f"{name} × {gamma:+.2f}"
            for name, gamma in zip(params["components"], dropped, strict=False)
            if gamma != 0.0
        )
        return (
            f" The fitted tests shift ({fitted}) put rows of fewer tests above rows of more, "
            "which averages of speed tests do not do, and was dropped: the GP is likely far "
            "from its data (trained briefly?), and test rows' means do not move with their "
            "tests."
        )
    if not moved:
        return ""
    return (
        " A test row's mean also moves with its own number of tests (the log of an average "
        "of fewer tests sits lower), by its noise terms around the training rows' mean: "
        f"{', '.join(moved)} (log10 per log10² of noise); the tile's offset and the tile "
        "quantity do not."
    )


def _local_layer_section(
    doc: Doc, params: dict[str, Any], *, split_kind: str | None = None
) -> None:
    """What the local layer's spatial field is and what it was fitted to; ``split_kind`` (the
    tile table's ``split.kind``) names the held-out units of the place share."""
    doc.heading("Local layer")
    doc.para(
        "On top of the tile effect, a short-range spatial field (Matérn-3/2, range "
        f"{params['range_km']:.2f} km, variance {params['sigma2']:.4f} log10 units²) pulls each "
        f"tile toward its {params['neighbours']} nearest measured tiles; the offset's remaining "
        f"white part has τ² = {_per_group_text(params['tau2'])}"
        + (
            " and a quarter-to-quarter correlation ρ = "
            f"{_per_group_text(params['rho'])}, refitted with the field"
            if params.get("rho") is not None
            else ""
        )
        + ". Validation NLL "
        f"{_fmt(params.get('val_nll_without'))} with the tile effect alone, "
        f"{_fmt(params.get('val_nll'))} with the field"
        + _gp_nll_text(params.get("val_nll_gp"))
        + _unseen_prior_text(params.get("unseen_prior"), params.get("val_nll_unseen"))
        + _place_share_text(
            params.get("place_share"), params.get("place_share_basis"), split_kind=split_kind
        )
        + _group_shares_text(params.get("place_share_by_group"))
    )


def _group_shares_text(by_group: dict[str, float] | None) -> str:
    """The urban / rural groups whose own validation tiles chose their own place share (the
    same rule on the group's tiles alone), in a sentence; nothing when none did."""
    if not by_group:
        return ""
    shares = ", ".join(f"{g} {float(c):.2f}" for g, c in sorted(by_group.items()))
    return (
        f" Groups whose own well-measured validation tiles ({MIN_PLACE_UNITS} or more) can "
        f"certify a share take their own, by the same rule on their tiles alone: {shares}."
    )


def _unseen_prior_text(prior: str | None, nll: dict[str, float] | None) -> str:
    """Which prior of a tile never measured the layer states, and the validation NLLs that
    chose it (nothing for files without the choice)."""
    if not nll:
        return ""
    scores = (
        f"validation NLL {_fmt(nll.get('gp'))} with the GP's, "
        f"{_fmt(nll.get('tile effect'))} with the tile effect's"
    )
    if prior == "gp":  # geodbk.local_layer.UNSEEN_GP
        return (
            " A tile never measured gets the GP's own spread of a tile around f(x) at its tests "
            "(the GP's latent variance and the part of its noise that is not a test's own, less "
            "what its neighbours explain), at a typical training row's tests on a map, rather "
            f"than the tile effect's τ² ({scores}, on validation rows of unmeasured tiles)."
        )
    return (
        " A tile never measured gets the tile effect's τ² as its prior, not the GP's own "
        f"spread ({scores}, on validation rows of unmeasured tiles)."
    )


def _gp_nll_text(gp: float | None) -> str:
    """The GP alone's validation NLL beside the layer's (nothing for files without it)."""
    return "." if gp is None else f", {_fmt(gp)} for the GP alone with its own noise."


def _place_share_text(
    share: float | None, basis: dict[str, int] | None = None, *, split_kind: str | None = None
) -> str:
    """The place share of an unmeasured tile's prior, and what chose it, in sentences. The
    held-out units are blocks on a block split (``split_kind``), the tiles themselves on the
    others, where only the number of tiles can fall short."""
    tiles, units = (basis or {}).get("tiles", 0), (basis or {}).get("units", 0)
    where = f" {tiles} well-measured validation tiles without training rows"
    if units and units < tiles:
        where += f", which lie in {units} held-out block{'' if units == 1 else 's'},"
    if share is None or (float(share) == 1.0 and not certifies(tiles, units)):
        if not basis and split_kind == "block":
            why = (
                "too few well-measured validation tiles without training rows, or too few "
                f"held-out blocks holding them ({MIN_PLACE_UNITS} are needed), to certify "
                "another"
            )
        elif not basis:
            why = (
                "too few well-measured validation tiles without training rows "
                f"({MIN_PLACE_TILES} are needed) to choose another"
            )
        elif tiles < MIN_PLACE_TILES:
            why = f"only{where} ({MIN_PLACE_TILES} are needed to choose another)"
        else:
            why = f"the{where} cannot certify another ({MIN_PLACE_UNITS} blocks are needed)"
        return (
            " A tile never measured keeps its whole prior offset variance in the tile quantity "
            f"(place share 1: {why})."
        )
    c = float(share)
    if c < 1.0:
        split = (
            " of its prior offset variance in the tile quantity (never less than the GP's own "
            "variance there), and the rest goes to one test's noise"
        )
    elif c > 1.0:
        split = (
            " of its prior offset variance in the tile quantity, the difference taken from "
            "one test's own noise (at most all of it): the well-measured tiles' levels stray "
            "from the map more than the prior says"
        )
    else:
        split = " of its prior offset variance in the tile quantity, the prior as stated"
    widest = (
        f"; where none covers that many, the widest, {MAX_PLACE_SHARE:g}"
        if c >= MAX_PLACE_SHARE
        else ""
    )
    return (
        f" A tile never measured keeps a place share {c:.2f}{split}. It is the smallest "
        "share whose intervals cover "
        + _place_share_rule(split_kind)
        + widest
        + (f", chosen on{where.rstrip(',')}." if basis else ".")
    )


def _map_calibration_section(doc: Doc, cal: dict[str, Any]) -> None:
    """How well the map's tile quantity covers the levels of well-measured held-out tiles."""
    doc.heading("Map calibration")
    if not cal.get("tile", {}).get("all"):
        doc.para(
            f"No test tile has {cal.get('min_tests')} or more tests over its test quarters, so "
            "the map's own calibration cannot be measured on this split."
        )
        return
    doc.para(
        f"Test tiles with at least {cal['min_tests']} tests over their test quarters: the "
        "95% interval of the map's quantity against the tile's tests-weighted level (its "
        "own test noise added). tile: what the map shows by default; area: the smooth f(x) "
        "alone. The coverage's own 95% confidence interval (exact binomial over the tiles) "
        "says how far the count of tiles lets it be read: a calibrated map has 95% inside it. "
        "Tiles near each other share their errors, so the same interval is also counted by "
        f"place ({PLACE_TEXT}; Korn-Graubard's effective size), the one to read."
    )
    rows = []
    less = cal.get("tile_less_measured") or {}
    blocks = [("tile", cal.get("tile", {})), ("area", cal.get("area", {}))]
    if less.get("all"):
        blocks.append((f"tile, {tests_range(less)} tests", less))
    for quantity, block in blocks:
        for group in ("all", "urban", "rural"):
            r = block.get(group)
            if r:
                rows.append(
                    [
                        quantity,
                        group,
                        str(r["tiles"]),
                        _fmt(r[COVERAGE95], True),
                        _interval_text(r.get(COVERAGE95_INTERVAL)),
                        str(r.get(PLACES, "–")),
                        _interval_text(r.get(COVERAGE95_INTERVAL_BY_PLACE)),
                        _fmt(r[MEDIAN_ABS_ERROR]),
                        _fmt(r[OFF_BY_2X], True),
                    ]
                )
    doc.table(
        [
            "quantity",
            "group",
            "tiles",
            "95% coverage",
            "its 95% CI",
            "places",
            "95% CI by place",
            "median |error| (log10)",
            "off by > 2×",
        ],
        rows,
    )
    _tile_reading(doc, cal)
    _less_measured_reading(doc, less)


def _threshold_check_section(doc: Doc, block: dict[str, Any] | None) -> None:
    """The map's service thresholds on held-out tiles (:mod:`pipelines.threshold_check`)."""
    rows = threshold_check_rows(block or {})
    if not rows or block is None:
        return
    sure = float(block.get("sure", SURE_PROB))
    doc.heading("Thresholds on held-out tiles")
    doc.para(
        "The same test tiles at each service threshold: the expected share served (the mean "
        "of the tile quantity's probability that the tile's level is on the good side) "
        "against the share whose level is, with that share's 95% interval counted by place. "
        f"Then the tiles the map is sure of (probability at least {sure:.0%} served, or at "
        f"most {1 - sure:.0%}) and the share it was right about: a calibrated map is right "
        f"about at least {sure:.0%} of them. A map that is sure of few tiles says that it "
        "cannot tell them apart from the threshold."
    )
    doc.table(list(THRESHOLD_CHECK_HEADER), rows)


def _less_measured_reading(doc: Doc, less: dict[str, Any]) -> None:
    """What the tile quantity's coverage of the less measured test tiles says, by place."""
    tile = less.get("all")
    if not tile:
        return
    by_place = tile.get(COVERAGE95_INTERVAL_BY_PLACE)
    interval = by_place or tile.get(COVERAGE95_INTERVAL)
    if interval is None:
        return
    doc.para(
        f"The {tile['tiles']} test tiles with {tests_range(less)} tests are less well "
        "measured, and more like the map's typical tile, which few people test. Their levels "
        "carry more of their own test noise, which each tile's interval holds, so they test "
        "the map's width less sharply. The tile quantity covers "
        f"{_fmt(tile[COVERAGE95], True)} of them; its confidence interval, "
        f"{_interval_text(interval)}"
        + (" counted by place, " if by_place else ", ")
        + _coverage_reading(interval, "places" if by_place else "tiles")
    )


def _tile_reading(doc: Doc, cal: dict[str, Any]) -> None:
    """What the tile quantity's coverage of the well-measured test tiles says, by tile and by
    place."""
    tile = cal["tile"]["all"]
    interval = tile.get(COVERAGE95_INTERVAL)
    by_place = tile.get(COVERAGE95_INTERVAL_BY_PLACE)
    if interval is None:
        return
    covers = f"the tile quantity covers {_fmt(tile[COVERAGE95], True)}"
    if not by_place:
        doc.para(
            f"On these {tile['tiles']} tiles {covers}; its confidence interval, "
            f"{_interval_text(interval)}, "
            + _coverage_reading(interval, "tiles")
            + clustered_checks_caveat(tile["tiles"], cal.get("held_out_blocks"))
        )
        return
    # a block split's places are its held-out blocks
    places = "held-out blocks" if cal.get("held_out_blocks") else "places"
    where = f"On these {tile['tiles']} tiles in {tile.get(PLACES)} {places} {covers}"
    tile_verdict = coverage_verdict(interval)
    if tile_verdict == coverage_verdict(by_place):
        doc.para(
            f"{where}; its confidence interval, {_interval_text(interval)} over the tiles and "
            f"{_interval_text(by_place)} counted by place, " + _coverage_reading(by_place, "places")
        )
        return
    doc.para(
        f"{where}. Its confidence interval over the tiles, {_interval_text(interval)}, "
        + ("holds 95%" if tile_verdict == "consistent" else f"leaves out 95% ({tile_verdict})")
        + f", but tiles near each other share their errors: counted by place it is "
        f"{_interval_text(by_place)}, which " + _coverage_reading(by_place, "places")
    )


def _coverage_reading(interval: Any, items: str) -> str:
    """``holds 95%: …`` or ``leaves out 95%: … too narrow / too wide`` for a coverage's
    confidence interval over ``items``."""
    verdict = coverage_verdict(interval)
    if verdict == "consistent":
        return (
            "holds 95%: the map's intervals are as wide as they should be, as far as these "
            f"{items} can tell."
        )
    return f"leaves out 95%: the map's intervals are {verdict}."


def _interval_text(interval: Any) -> str:
    """``93.9–99.8%`` for a share's ``[low, high]``; ``–`` without one."""
    if not interval:
        return "–"
    return f"{100 * interval[0]:.1f}–{100 * interval[1]:.1f}%"


def _per_group_text(value: dict[str, float] | float) -> str:
    """A parameter with one value per tile group (tau², rho): ``0.1700``, or ``0.1400 for
    rural tiles and 0.2100 for urban tiles``."""
    if isinstance(value, dict) and list(value) != ["all"]:
        return " and ".join(f"{v:.4f} for {group} tiles" for group, v in value.items())
    return f"{value['all'] if isinstance(value, dict) else value:.4f}"


def _place_share_rule(split_kind: str | None) -> str:
    """How the place share was chosen, by the unit tiles were held out in: blocks on a block
    split, tiles on the others (``None``: a split not recorded, both named)."""
    if split_kind == "block":
        return (
            "0.95 (K + 1) / K of the well-measured validation tiles without training rows, "
            "averaged over the K blocks they were held out in (hierarchical split conformal)"
        )
    if split_kind is not None:
        return (
            "0.95 (K + 1) / K of the K well-measured validation tiles without training rows "
            "(split conformal)"
        )
    return (
        "0.95 (K + 1) / K of the well-measured validation tiles without training rows, "
        "averaged over the K units they were held out in (blocks on a block split, tiles "
        "otherwise; hierarchical split conformal)"
    )


def _time_sentence(time_info: dict[str, Any], *, tile_offsets: bool = False) -> str:
    """How the model treats time: pooled over quarters, or the input t over a quarter range;
    with ``tile_offsets``, a measured tile's offset from the GP still moves by quarter."""
    ts = time_info.get("time_scaling")
    if not time_info.get("time_aware") or not isinstance(ts, dict):
        if tile_offsets:
            return (
                "Model inputs x1, x2 (pooled over quarters): the GP gives every quarter the "
                "same surface; a measured tile's own offset from it (the tile effect) changes "
                "from quarter to quarter."
            )
        return (
            "Model inputs x1, x2 (pooled over quarters): every quarter gets the same prediction "
            "at a tile."
        )
    beyond = [q for q, st in time_info.get("quarter_status", {}).items() if st != "observed"]
    extra = (
        f"; test quarter(s) {', '.join(beyond)} lie outside it (extrapolation, t outside [-1, 1])"
        if beyond
        else ""
    )
    return (
        f"Model inputs x1, x2, t (time-aware): t scaled to [-1, 1] over the training quarters "
        f"{ts['first']}–{ts['last']}; each test tile is predicted at its own quarter{extra}."
    )


def _by_quarter_section(
    doc: Doc, by_quarter: dict[str, dict[str, Any]], time_info: dict[str, Any]
) -> None:
    """Table and figure of the test scores per quarter."""
    doc.heading("By quarter")
    doc.para(
        "Test rows of each quarter, log10 scale; coverage = share inside the 95% prediction "
        "interval (a calibrated model stays within 95% ± 2%). Status: observed (inside the "
        "time-aware model's training quarters), extrapolation, or pooled (no time input)."
    )
    doc.table(QUARTER_HEADER, quarter_rows(by_quarter, time_info.get("quarter_status", {})))
    doc.image("figures/quarter_calibration.png", "coverage and NLL per quarter")


def _build_doc(
    rd: RunDir,
    spec: TargetSpec,
    md: dict[str, Any],
    metrics: dict[str, Any],
    base: dict[str, Any],
    coverage_rows: list[dict[str, Any]],
    sd_train: float,
    emp: np.ndarray,
    pred_sd: np.ndarray,
    split_info: dict[str, Any] | None = None,
    time_info: dict[str, Any] | None = None,
    *,
    tile_offsets: bool = False,
) -> Doc:
    cfg = md.get("config", {})
    timings = md.get("timings", {})
    doc = Doc(f"geodbk report: {spec.name} ({rd.root.name})")
    stale = stale_model_message(rd, spec.name, md)
    if stale:
        doc.para(f"Warning: {stale}.")
    doc.bullets(
        [
            f"Run `{rd.root.resolve().name}`; model `{rd.relative(rd.model_dir(spec.name))}` "
            f"(config hash {md.get('config_hash')}), geodbk {__version__}.",
            f"DBK-{cfg.get('expansion', 'rbf').upper()} trained with {cfg.get('objective', '?')}: "
            f"r={cfg.get('rank')}, h={cfg.get('hidden')}, α={cfg.get('alpha')}, β={cfg.get('beta')}, "
            f"batch {cfg.get('batch_size')}, lr {cfg.get('lr')}, up to {cfg.get('epochs')} epochs; "
            f"best epoch {md.get('best_epoch')} of {timings.get('epochs_run')} "
            f"({_fmt(timings.get('fit_seconds'))} s).",
            f"Target log10 of `{spec.column}`; training sd {sd_train:.3f}. "
            f"Test rows: {metrics['urban']['n']} urban, {metrics['rural']['n']} rural.",
            split_sentence(split_info),
            _time_sentence(time_info or {}, tile_offsets=tile_offsets),
        ]
    )
    models = {"DBK (this model)": metrics, "constant mean (train mean, sd)": base}
    header = [
        "model",
        "urban MAE",
        "urban NLL",
        "urban cov.",
        "rural MAE",
        "rural NLL",
        "rural cov.",
    ]
    doc.heading("Test accuracy and calibration (layout of the seed's Table 2)")
    doc.para(
        "log10 scale; coverage = share of test rows inside the 95% prediction interval; NLL = "
        "mean Gaussian negative log-likelihood in nats per test row."
    )
    doc.table(header, table2_rows(models))
    doc.para("Standardised scale (target divided by the training sd; NLL_std = NLL − ln sd).")
    doc.table(header, table2_rows(models, suffix="_std"))
    doc.heading("All metrics (log10 scale)", 3)
    doc.table(
        ["group", "n", "MAE", "NLL", "CRPS", "coverage", "mean 95% PI width"],
        [
            [
                g,
                metrics[g]["n"],
                _fmt(metrics[g][MAE]),
                _fmt(metrics[g][NLL]),
                _fmt(metrics[g][CRPS]),
                _fmt(metrics[g][COVERAGE95], pct=True),
                _fmt(metrics[g][WIDTH95]),
            ]
            for g in ("urban", "rural", "all")
        ],
    )
    doc.heading("Interval widths")
    doc.image("figures/pi_width_violin.png", "95% PI widths by urban/rural")
    doc.heading("Reliability")
    doc.para("Empirical coverage of central predictive intervals at nominal levels 50–99%.")
    doc.image("figures/reliability.png", "reliability diagram")
    doc.heading("Empirical vs predicted sd (seed Figure 10)")
    doc.para(
        "Tiles of the held-out splits (val + test) are binned on a raster with 40 cells along "
        "the longer side of the region box cut to the tiles. Empirical sd of a cell = "
        "sqrt(mean((y − mean)²)) of its rows around the model mean; predicted sd = "
        "sqrt(mean(std²)); cells with < 3 rows blank. "
        f"{int(np.isfinite(emp).sum())} cells shown."
    )
    doc.image("figures/sd_maps.png", "empirical vs predicted sd maps")
    doc.heading("Service coverage")
    first: dict[str, Any] = coverage_rows[0] if coverage_rows else {}
    area_quantity = first.get("area_quantity")
    area_caveat = region_area_caveat(rd)
    predict_cmd = f"`geodbk predict --run {rd.root} --target {spec.name}"
    judged = quarter_text(first.get("quarter"), first.get("quarter_status"))
    pooled = str(first.get("quarter", "")).startswith("pooled")
    n_tiles = first.get("n_tiles", 0)
    when = (
        f"Judged at {judged}: the table's {n_tiles} distinct tiles (measured in any "
        "quarter) are predicted on the pooled model's one surface"
        if pooled
        else f"Judged at quarter {judged}: the table's {n_tiles} distinct tiles (measured in "
        f"any quarter) are all predicted at {first.get('quarter')}"
    )
    if area_quantity is None:
        area_text = f"the area share needs a map: run {predict_cmd}`, then report again"
    else:
        area_quarter = quarter_text(first.get("area_quarter"), first.get("area_quarter_status"))
        area_text = (
            f"the area share on the map's {area_quantity} quantity (`grids/{spec.name}.nc`, "
            f"{area_quarter}"
            + (
                ""
                if first.get("area_quarter") in (None, first.get("quarter"))
                else f"; not the tiles' quarter: run {predict_cmd}` again"
            )
            + ")"
        )
        if any(r.get("area") is None for r in coverage_rows):
            area_text += (
                " (a threshold the map has no layer for shows '–': add it to "
                f"{predict_cmd} --thresholds ...`)"
            )
    doc.para(
        f"{when}. Share of distinct tiles, of region area (grid cells, cos-lat weighted) and of urban / "
        f"rural tiles where the {spec.name} is on the good side of the threshold with "
        f"probability ≥ {SERVED_PROB:.0%}. Tiles are judged on the tile quantity (what a "
        f"tile typically gets, not one speed test); {area_text}."
        + (f" {area_caveat}" if area_caveat else "")
    )
    doc.table(
        ["threshold", "tiles", "area", "urban tiles", "rural tiles"],
        [
            [
                r["label"],
                _fmt(r["tiles"], True),
                _fmt(r["area"], True),
                _fmt(r["urban"], True),
                _fmt(r["rural"], True),
            ]
            for r in coverage_rows
        ],
    )
    doc.image("figures/service_coverage.png", "service coverage")
    return doc
