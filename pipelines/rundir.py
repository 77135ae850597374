"""Run-directory layout, target definitions and the checks every stage makes before it starts.

A run directory ``RUN/`` is produced by ``geodbk ingest`` and extended by the later stages (see
``docs/architecture.md``). This module knows where each file lives, what each target is called
in ``tiles.parquet`` and in natural units, and raises :class:`~geodbk.errors.RunDirectoryError`
(exit code 5) or :class:`~geodbk.errors.ModelFileError` (exit code 4) with the command to run
first when something is missing.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import fcntl
import functools
import hashlib
import io
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import numpy as np

from geodbk.atomic import DISK_ERRNOS
from geodbk.errors import DataError, ModelFileError, RunDirectoryError
from geodbk.geo.contract import DEFAULT_THRESHOLDS, TARGETS, output_name, target_info
from geodbk.geo.frame import Scaling
from geodbk.geo.licence import OOKLA_LICENCE
from geodbk.geo.table import read_table_metadata, read_tile_table
from geodbk.geo.timeaxis import TimeScaling, extrapolation_of, time_input

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

log = logging.getLogger("geodbk")


def check_thresholds(thresholds: Sequence[float] | None, target: str) -> tuple[float, ...]:
    """``--thresholds`` as floats (``None``: the defaults of ``target``); a non-finite or
    non-positive value is refused with the option, its unit and valid values named."""
    spec = target_spec(target)
    thr = tuple(float(t) for t in (thresholds or DEFAULT_THRESHOLDS[target]))
    bad = [t for t in thr if not (np.isfinite(t) and t > 0)]
    if bad:
        example = " ".join(f"{t:g}" for t in DEFAULT_THRESHOLDS[target])
        raise DataError(
            f"--thresholds must be positive finite {spec.unit} values (e.g. --thresholds "
            f"{example}), got {bad[0]:g}"
        )
    return thr


@dataclass(frozen=True)
class TargetSpec:
    """How a target is stored, modelled and shown.

    Attributes
    ----------
    name
        ``download``, ``upload`` or ``latency``.
    column
        Raw column in ``tiles.parquet`` (kbps or ms).
    log_column
        Modelled column, ``log10_<name>`` = log10 of ``column``.
    unit
        Natural unit shown to users (``Mbps`` or ``ms``).
    divisor
        ``natural = 10**log10_value / divisor``.
    higher_is_better
        True for speeds, False for latency.
    """

    name: str
    column: str
    log_column: str
    unit: str
    divisor: float
    higher_is_better: bool

    def to_natural(self, log10_value: np.ndarray) -> np.ndarray:
        """Convert log10 values of the raw column to natural units."""
        return np.power(10.0, log10_value) / self.divisor

    def natural_to_log10(self, value: float) -> float:
        """Convert a natural-unit value (e.g. 25 Mbps) to the modelled log10 scale."""
        return float(np.log10(value * self.divisor))

    def threshold_name(self, value: float) -> str:
        """Variable name of the exceedance probability for ``value`` (natural units).

        Speeds: ``p_below_25mbps`` = P(speed < 25 Mbps); latency: ``p_above_100ms``.
        """
        text = f"{value:g}".replace(".", "p").replace("-", "m")
        unit = self.unit.lower()
        return f"p_below_{text}{unit}" if self.higher_is_better else f"p_above_{text}{unit}"


def target_spec(name: str) -> TargetSpec:
    """Return the :class:`TargetSpec` of ``name`` or raise a :class:`DataError` listing choices."""
    i = target_info(name)
    return TargetSpec(name, i.column, i.log_column, i.unit, i.divisor, i.higher_is_better)


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory.

    Parameters
    ----------
    root
        The run directory.
    """

    root: Path

    @property
    def tiles(self) -> Path:
        return self.root / "tiles.parquet"

    @property
    def region(self) -> Path:
        return self.root / "region.geojson"

    @property
    def urban_areas(self) -> Path:
        return self.root / "urban_areas.geojson"

    def model_dir(self, target: str) -> Path:
        return self.root / "models" / target

    def relative(self, path: str | Path) -> str:
        """``path`` relative to the run directory (POSIX separators), for output metadata:
        no output records an absolute local path. A path outside the run gives its file name."""
        p = Path(path)
        try:
            return p.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return p.name

    def checkpoint_dir(self, target: str) -> Path:
        return self.model_dir(target) / "checkpoints"

    def grid(self, target: str, quarter: str | None = None) -> Path:
        """``grids/TARGET.nc`` (the current map: the pooled model's, or a time-aware model's
        latest observed quarter) or ``grids/TARGET_2021Q3.nc`` for another quarter."""
        if quarter is None:
            return self.root / "grids" / f"{target}.nc"
        return self.root / "grids" / f"{target}_{quarter}.nc"

    def predictions_at(
        self, target: str, stem: str, *, quantity: str = "tile", quarter: str | None = None
    ) -> Path:
        """``predictions/TARGET_STEM.parquet``: ``geodbk predict --at`` for the file ``STEM`` (the
        tile quantity at the table's latest quarter; another quarter adds ``_QUARTER``, another
        quantity ``_QUANTITY``, so that none replaces another)."""
        name = output_name(f"{target}_{stem}", quarter=quarter, quantity=quantity)
        return self.root / "predictions" / f"{name}.parquet"

    def classes_at(self, stem: str, *, quarter: str | None = None, quantity: str = "tile") -> Path:
        """``service/classes_STEM.parquet``: ``geodbk service --at`` for the file ``STEM`` (the
        tile quantity at the table's latest quarter; another quarter adds ``_QUARTER``, another
        quantity ``_QUANTITY``)."""
        name = output_name(f"classes_{stem}", quarter=quarter, quantity=quantity)
        return self.root / "service" / f"{name}.parquet"

    def trend_grid(self, target: str, first: str, last: str) -> Path:
        """``grids/TARGET_trend_FIRST_LAST.nc``: change per year between two quarters."""
        return self.root / "grids" / f"{target}_trend_{first}_{last}.nc"

    def export_tif(self, target: str) -> Path:
        return self.root / "exports" / f"{target}.tif"

    def export_sidecar(self, target: str) -> Path:
        return self.root / "exports" / f"{target}.json"

    def report_dir(self, target: str) -> Path:
        return self.root / "report" / target

    def trained_targets(self) -> list[str]:
        """Targets with a saved model bundle (``models/TARGET/model.json``), in canonical order."""
        return [t for t in TARGETS if (self.model_dir(t) / "model.json").is_file()]


@contextlib.contextmanager
def target_lock(rd: RunDir, target: str, *, stage: str) -> Iterator[None]:
    """Hold ``RUN/.locks/TARGET.lock`` (an exclusive ``flock``) while a stage writes ``target``'s
    outputs; a second train, predict or report of the same run and target is refused with the
    first one's stage and pid. The kernel drops the lock when the process dies, so a killed
    stage never blocks the next one.

    Raises
    ------
    DataError
        When another stage holds the lock, or the run directory cannot be written for another
        reason than the disk's.
    OSError
        When the disk refuses the lock file (read-only, full, no permission): ``errno`` kept and
        the run directory as its file name, so the command line stops with exit 6 naming it.
    """
    folder = rd.root / ".locks"
    path = folder / f"{target}.lock"
    try:
        folder.mkdir(exist_ok=True)
        handle = open(path, "a+", encoding="utf-8")  # held until the finally below
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise OSError(exc.errno, os.strerror(exc.errno), str(rd.root)) from None
        raise DataError(
            f"cannot write in {rd.root} ({exc.strerror or exc}); give the run directory write "
            "permission and free space, or copy it to a writable place"
        ) from None
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise DataError(
                f"{target} in {rd.root} is being written by another geodbk stage ({holder}); "
                "wait for it to finish, or stop it, and run this again"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"geodbk {stage}, pid {os.getpid()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # closing releases the flock


_F = TypeVar("_F", bound=Callable[..., Any])


def locked_stage(stage: str) -> Callable[[_F], _F]:
    """Run a stage ``fn(run, ..., target=T, ...)`` under :func:`target_lock` (skipped on the
    non-zero ranks of a distributed run, which write nothing)."""

    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def locked(run: str | Path, *args: Any, target: str, **kwargs: Any) -> Any:
            if os.environ.get("RANK", "0") != "0":
                return fn(run, *args, target=target, **kwargs)
            rd = require_run(run)
            with target_lock(rd, target, stage=stage):
                return fn(run, *args, target=target, **kwargs)

        return locked  # type: ignore[return-value]

    return wrap


def run_licence(rd: RunDir) -> dict[str, str]:
    """The data licence recorded in ``tiles.parquet`` at ingest (:mod:`geodbk.geo.licence`);
    a run ingested before it was recorded is taken to hold Ookla's data."""

    recorded = read_table_metadata(rd.tiles).get("data_licence")
    return dict(recorded) if isinstance(recorded, dict) else dict(OOKLA_LICENCE)


#: The licence's attribute names in grids, GeoTIFF tags, sidecars and ``--at`` files.
LICENCE_KEYS = ("source", "license", "license_url", "license_terms")


def licence_attrs(licence: dict[str, str]) -> dict[str, str]:
    """The licence as file attributes/tags: ``source``, ``license``, ``license_url``,
    ``license_terms`` (ACDD/CF names)."""
    values = (licence.get(k, "") for k in ("source", "license", "license_url", "terms"))
    return dict(zip(LICENCE_KEYS, values, strict=True))


def run_licence_attrs(rd: RunDir) -> dict[str, str]:
    """The run's data licence (:func:`run_licence`) as file attributes (:func:`licence_attrs`)."""
    return licence_attrs(run_licence(rd))


def stale_model_message(rd: RunDir, target: str, metadata: dict[str, Any]) -> str | None:
    """Why ``target``'s model no longer matches the run's tile table, or ``None``: the model
    records the ``ingest_id`` of the table it was trained on, and a later ``geodbk ingest``
    wrote a new one (another region, split or data). Models without the record are not
    judged."""

    trained_on = (metadata.get("tiles_metadata") or {}).get("ingest_id")
    if not trained_on or not rd.tiles.is_file():
        return None
    current = read_table_metadata(rd.tiles).get("ingest_id")
    if not current or current == trained_on:
        return None
    return (
        f"the {target} model was trained on an earlier ingest of {rd.root.name} (tiles.parquet "
        f"has been re-ingested since: another region, split or data); its maps and reports "
        f"describe the old table. Retrain: geodbk train --run {rd.root} --target {target}"
    )


#: Key of the data licence (JSON) in the metadata of every parquet file geodbk writes.
PARQUET_LICENCE_KEY = b"geodbk_data_licence"


def licence_schema_metadata(licence: dict[str, str]) -> dict[bytes, bytes]:
    """The licence as parquet schema metadata (:data:`PARQUET_LICENCE_KEY`, JSON)."""
    return {PARQUET_LICENCE_KEY: json.dumps(licence, sort_keys=True).encode()}


def write_csv_rows(handle: TextIO, frame: pd.DataFrame, *, table: pa.Table | None = None) -> None:
    """Write ``frame`` (header and rows, no index) as CSV to ``handle``, below the ``#`` lines
    that open geodbk's CSVs: every text cell is quoted, so that ``pandas.read_csv(path,
    comment="#")`` keeps a ``#`` inside a cell (``Suite #4``, an id starting with ``#``) instead
    of reading the rest of the line as a comment; numbers and booleans stay unquoted, missing
    values are empty.

    Arrow's CSV writer writes it (``table``: ``frame`` as Arrow, when the caller has it), about
    seven times as fast as pandas' (booleans ``true``/``false``). A frame with columns that
    Arrow would write otherwise than pandas (dates, times, categories, nested values) or cannot
    convert (an object column of mixed types) is written by pandas, with the same quoting."""
    import pyarrow as pa
    import pyarrow.csv as pa_csv

    try:
        arrow = table if table is not None else pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        arrow = None
    if arrow is None or not all(map(_arrow_writes_like_pandas, arrow.schema.types)):
        frame.to_csv(handle, index=False, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)
        return
    options = pa_csv.WriteOptions(quoting_style="needed")  # quotes every text cell
    encoding = codecs.lookup(getattr(handle, "encoding", None) or "utf-8").name
    raw = getattr(handle, "buffer", None) if encoding == "utf-8" else None
    if raw is None:  # an in-memory text handle, or a file of another encoding
        sink = io.BytesIO()
        pa_csv.write_csv(arrow, sink, write_options=options)
        handle.write(sink.getvalue().decode("utf-8"))
        return
    handle.flush()
    pa_csv.write_csv(arrow, raw, write_options=options)
    raw.flush()


def _arrow_writes_like_pandas(kind: Any) -> bool:
    """Whether Arrow's CSV writer writes a column of type ``kind`` as pandas does: numbers,
    booleans, text and all-missing columns."""
    import pyarrow.types as t

    return bool(
        t.is_integer(kind)
        or t.is_floating(kind)
        or t.is_boolean(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_null(kind)
    )


def file_in_run_path(run: str | Path) -> Path | None:
    """The file that stands where the run directory ``run`` or one of its parent folders
    should be (``run`` itself, or a parent that is a file), else ``None``."""
    path = Path(run)
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def file_in_run_path_message(run: str | Path, blocker: Path) -> str:
    """Why ``run`` cannot be a run directory: ``blocker`` (:func:`file_in_run_path`) is a file."""
    inside = "" if blocker == Path(run) else f" (a folder {run} cannot be made inside it)"
    return f"run directory {run}: {blocker} is a file, not a folder{inside}"


def require_run(run: str | Path) -> RunDir:
    """Check that ``run`` is an ingested run directory and return its :class:`RunDir`.

    Raises
    ------
    RunDirectoryError
        When the folder or its ``tiles.parquet`` / ``region.geojson`` is missing, or ``run``
        (or a parent of it) is a file.
    """
    rd = RunDir(Path(run))
    blocker = file_in_run_path(rd.root)
    if blocker is not None:
        raise RunDirectoryError(
            f"{file_in_run_path_message(rd.root, blocker)}; pass the run folder that "
            f"`geodbk ingest --run FOLDER ...` wrote"
        )
    if not rd.root.is_dir():
        raise RunDirectoryError(
            f"run directory {rd.root} does not exist; create it with "
            f"`geodbk ingest --run {rd.root} ...` (or `geodbk demo --run {rd.root}`)"
        )
    for path in (rd.tiles, rd.region):
        if not path.is_file():
            raise RunDirectoryError(
                f"{path} is missing: {rd.root} is not a complete ingested run; "
                f"run `geodbk ingest --run {rd.root} ...` first"
            )
    return rd


def require_model(rd: RunDir, target: str) -> Path:
    """Return the model bundle folder of ``target`` or raise with the train command to run."""
    target_spec(target)
    path = rd.model_dir(target)
    if not (path / "model.json").is_file():
        raise ModelFileError(
            f"no trained {target} model in {path} (model.json missing); "
            f"run `geodbk train --run {rd.root} --target {target}` first"
        )
    return path


def require_grid(rd: RunDir, target: str) -> Path:
    """Return ``grids/TARGET.nc`` or raise with the predict command to run."""
    path = rd.grid(target)
    if not path.is_file():
        raise RunDirectoryError(
            f"{path} is missing; run `geodbk predict --run {rd.root} --target {target}` first"
        )
    return path


def load_tiles(rd: RunDir, *, geometry: bool = True) -> tuple[Any, dict[str, Any]]:
    """Read ``tiles.parquet`` with :func:`geodbk.geo.table.read_tile_table` and log it
    (``geometry=False``: without the tile polygons, a plain DataFrame)."""

    gdf, meta = read_tile_table(rd.tiles, geometry=geometry)
    log.info("read %s (%d rows)", rd.tiles, len(gdf))
    if "split" not in gdf.columns:
        raise DataError(f"{rd.tiles} has no 'split' column; re-run `geodbk ingest`")
    return gdf, meta


def scaling_of(meta: dict[str, Any], *, source: Path) -> dict[str, float]:
    """Return the lon/lat scaling ``{"lon_min", "lon_max", "lat_min", "lat_max"}`` from metadata."""
    try:
        sc = meta["scaling"]
        return {k: float(sc[k]) for k in ("lon_min", "lon_max", "lat_min", "lat_max")}
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"{source}: geodbk metadata lacks a valid 'scaling' entry") from exc


def scale_lonlat(lon: np.ndarray, lat: np.ndarray, scaling: dict[str, float]) -> np.ndarray:
    """Scale lon/lat to the model's inputs ``[x1, x2]`` in [-1, 1]² (float64, shape (n, 2)) by
    :meth:`geodbk.geo.frame.Scaling.scale`."""
    x1, x2 = Scaling.from_dict(scaling).scale(lon, lat)
    return np.column_stack([x1, x2]).astype(np.float64)


def time_scaling_of(metadata: dict[str, Any]) -> Any:
    """The :class:`~geodbk.geo.timeaxis.TimeScaling` of a time-aware model, else ``None``.

    A model is time-aware when its metadata lists the input ``t`` (``geodbk train --time``).
    """

    if "t" not in (metadata.get("inputs") or []):
        return None
    ts = metadata.get("time_scaling")
    if not isinstance(ts, dict):
        raise ModelFileError("a time-aware model's metadata lacks 'time_scaling'; retrain it")
    return TimeScaling.from_dict(ts)


def model_inputs(
    X2: np.ndarray, metadata: dict[str, Any], *, quarter: str | np.ndarray | None = None
) -> np.ndarray:
    """Model inputs from scaled lon/lat ``X2`` (n, 2): ``[x1, x2]`` for a pooled model,
    ``[x1, x2, t]`` for a time-aware one, with t from ``quarter`` (one quarter for all rows,
    or one per row) under the model's extrapolation policy
    (:func:`geodbk.geo.timeaxis.time_input`; ``hold`` clips t to the training range).

    Raises
    ------
    DataError
        When a time-aware model gets no quarter.
    """
    ts = time_scaling_of(metadata)
    if ts is None:
        return X2
    if quarter is None:
        raise DataError("this model is time-aware (trained with --time): give a quarter")

    q = quarter if isinstance(quarter, str) else np.asarray(quarter)
    t = time_input(ts, q, extrapolation=extrapolation_of(metadata))
    t = np.broadcast_to(np.asarray(t, dtype=np.float64), (X2.shape[0],))
    return np.column_stack([X2, t]).astype(np.float64)


def config_hash(config: dict[str, Any]) -> str:
    """Short SHA-256 of a JSON-serialisable config (sorted keys), for provenance."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def model_config_hash(metadata: dict[str, Any]) -> str:
    """The config hash a model's metadata records, or the hash of its ``config``."""
    return str(metadata.get("config_hash") or config_hash(metadata.get("config", {})))


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, raising :class:`RunDirectoryError` naming the file when it is bad."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RunDirectoryError(f"cannot read {path}: {exc}") from exc
    if not isinstance(obj, dict):
        raise RunDirectoryError(f"{path} does not hold a JSON object")
    return obj
