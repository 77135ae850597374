"""``geodbk predict --at FILE``: predictions at the places listed in a file.

Writes ``RUN/predictions/TARGET_<file stem>.parquet`` (``_<quarter>`` before the suffix for a
time-aware model's quarter other than the table's latest, ``_<quantity>`` for the area or test
quantity) with one row per input row: the input's
own columns, then ``quadkey`` (the zoom-16 tile of the place), ``lon``, ``lat``, ``mean``,
``sd``, ``lower``, ``upper`` (log10 of the target's raw unit, kbps or ms, like
``tiles.parquet``), ``median``, ``lower_natural``, ``upper_natural`` (Mbps or ms),
``tile_history`` (the tile has measured history), ``tile_pull`` (the measured neighbours'
part of the tile's level, local layer), ``quantity``, ``quarter`` and ``quarter_status``
(``observed``, ``extrapolation beyond 2023Q4``, ``pooled``, ... as ``geodbk predict`` writes
it into a grid; an extrapolated quarter is also warned about), ``located`` (False: the
input row has no place, a blank cell or missing geometry) and ``outside_region`` (True: the
place lies outside the run's region). Both kinds of row are kept, their values missing rather
than extrapolated. Input columns whose names clash with these are renamed
``input_<name>`` (``input_input_<name>`` when the input has ``input_<name>`` too, as an
earlier output read back does). The parquet metadata ``geodbk_predictions`` (JSON) says what
the file holds: the places file's name and SHA-256, target, quantity, quarter, model and
units, and for the tile quantity the report's held-out check of the same training
(:func:`pipelines.held_out_check.held_out_check`); replacing the predictions at another file
of the same stem is warned about.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import shapely

from geodbk import __version__
from geodbk.atomic import atomic_path, naming_errors
from geodbk.errors import DataError
from geodbk.geo.contract import PLACES_OUTPUT_COLUMNS, PREDICTIONS_KEY, QUANTITY_LABELS, Z95
from geodbk.geo.licence import licence_line
from geodbk.geo.locations import Locations, read_locations
from geodbk.geo.longitude import native_longitude
from geodbk.geo.timeaxis import quarter_text
from geodbk.quantities import DEFAULT_MAP_QUANTITY, check_quantity, describe_quantity
from pipelines.held_out_check import held_out_check
from pipelines.places import load_place_predictor, places_quarter_status
from pipelines.run_inputs import read_region, region_kind, tile_ids
from pipelines.rundir import (
    licence_schema_metadata,
    locked_stage,
    require_run,
    run_licence_attrs,
    target_spec,
    write_csv_rows,
)

log = logging.getLogger("geodbk")

__all__ = [
    "OUTPUT_COLUMNS",
    "PREDICTIONS_KEY",
    "check_tests_devices",
    "places_source",
    "run_predict_at",
    "tests_text",
    "warn_replacing_other_places",
    "write_places",
]

#: The columns :func:`run_predict_at` adds after the input's own.
OUTPUT_COLUMNS = PLACES_OUTPUT_COLUMNS


def check_tests_devices(tests: float, devices: float | None) -> None:
    """Refuse a ``test`` quantity of fewer than one test, or of more devices than tests (each
    test is made on one device)."""
    if not (np.isfinite(tests) and tests >= 1):
        raise DataError(f"--tests must be >= 1, got {tests}")
    if devices is None:
        return
    if not (np.isfinite(devices) and devices >= 1):
        raise DataError(f"--devices must be >= 1, got {devices}")
    if devices > tests:
        raise DataError(
            f"--devices {devices:g} is more than --tests {tests:g}: each speed test is made on "
            "one device, so K tests come from at most K devices; give --devices <= --tests"
        )


@locked_stage("predict")
def run_predict_at(
    run: str | Path,
    at: str | Path,
    *,
    target: str,
    quantity: str = DEFAULT_MAP_QUANTITY,
    quarter: str | None = None,
    tests: float = 1.0,
    devices: float | None = None,
) -> Path:
    """Predict ``quantity`` of ``target`` at the places in ``at`` and write
    ``RUN/predictions/TARGET_<stem>[_<quarter>][_<quantity>].parquet`` (a quarter other than
    the table's latest, a quantity other than ``tile``); return its path.

    Parameters
    ----------
    run
        Run directory with a trained ``models/TARGET``.
    at
        A parquet, CSV, Excel, GeoJSON, GeoPackage or zipped-shapefile file of places (:func:`geodbk.geo.locations.read_locations`).
    target
        ``download``, ``upload`` or ``latency``.
    quantity
        ``tile`` (default), ``area`` or ``test`` (:mod:`geodbk.quantities`).
    quarter
        Time-aware models: the quarter to predict (default the table's latest); pooled models
        refuse it.
    tests, devices
        The tests (and devices) of the ``test`` quantity.
    """
    try:
        check_quantity(quantity)
    except ValueError as exc:
        raise DataError(f"--quantity: {exc}") from None
    check_tests_devices(tests, devices)
    rd = require_run(run)
    spec = target_spec(target)
    places = read_locations(at)
    licence = run_licence_attrs(rd)
    predictor = load_place_predictor(rd, target, quantity=quantity, quarter=quarter)
    inside = np.asarray(
        shapely.intersects_xy(read_region(rd), native_longitude(places.lon), places.lat), dtype=bool
    )
    values = {c: np.full(inside.size, np.nan) for c in ("mean", "sd")}
    seen = np.zeros(inside.size, dtype=bool)
    pull = np.full(inside.size, np.nan)
    if inside.any():
        q = predictor.predict(
            places.lon[inside],
            places.lat[inside],
            quantity=quantity,
            tests=tests,
            devices=devices,
        )
        values["mean"][inside], values["sd"][inside], seen[inside] = q.mean, q.sd, q.seen
        pull[inside] = q.pull
    if not (np.isfinite(values["mean"][inside]).all() and np.isfinite(values["sd"][inside]).all()):
        raise DataError(
            f"{rd.model_dir(target)} gave non-finite predictions at {at}; the model file may be "
            "damaged: retrain it"
        )
    lower = values["mean"] - Z95 * values["sd"]
    upper = values["mean"] + Z95 * values["sd"]
    columns = {
        **values,
        "lower": lower,
        "upper": upper,
        "median": spec.to_natural(values["mean"]),
        "lower_natural": spec.to_natural(lower),
        "upper_natural": spec.to_natural(upper),
        "tile_history": seen,
        "tile_pull": pull,
    }
    file_quarter, status = places_quarter_status(rd, predictor, quantity=quantity)
    path = rd.predictions_at(target, Path(at).stem, quantity=quantity, quarter=file_quarter)
    record = {
        **places_source(Path(at)),
        "target": target,
        "quantity": quantity,
        "tests": tests if quantity == "test" else None,
        "devices": devices if quantity == "test" else None,
        "quarter": predictor.quarter,
        "quarter_status": status,
        "model_path": rd.relative(rd.model_dir(target)),
        "units": f"mean, sd, lower, upper: log10 {spec.column}; median, lower_natural, "
        f"upper_natural: {spec.unit} (10**log10 / {spec.divisor:g})",
        "interval": "95% prediction interval: mean -+ 1.96 sd",
        # how often the tile quantity's interval held held-out tiles' levels (the report)
        "held_out_check": held_out_check(
            rd,
            target,
            quantity=quantity,
            model_created=(getattr(predictor.model, "metadata_", None) or {}).get("created"),
        ),
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "geodbk_version": __version__,
    }
    warn_replacing_other_places(path, record, key=PREDICTIONS_KEY)
    return write_places(
        path,
        places,
        inside,
        columns,
        quantity=quantity,
        quarter=predictor.quarter,
        quarter_status=status,
        licence=licence,
        metadata={PREDICTIONS_KEY: json.dumps(record, sort_keys=True).encode("utf-8")},
        name=str(record["at"]),
        region_kind=region_kind(rd),
        description=(
            f"geodbk predict --at {record['at']}: {target}, "
            f"{_quantity_label(predictor.model, quantity, tests, devices)}, "
            f"{quarter_text(predictor.quarter, status)}; {record['interval']}; {record['units']}"
        ),
    )


def _quantity_label(model: Any, quantity: str, tests: float, devices: float | None) -> str:
    """The quantity as the CSV's first line names it: the test quantity with its tests and
    devices (``test: tile average of 4 speed tests from 2 devices (tests=4, devices=2)``), as
    ``geodbk predict`` labels a grid's, not ``one speed test`` whatever ``--tests`` was."""
    if quantity != "test":
        return QUANTITY_LABELS[quantity]
    return f"test: {describe_quantity(model, tests, devices)}"


def places_source(path: Path) -> dict[str, str]:
    """What a ``--at`` output records of its places file: ``at`` (its name) and
    ``at_sha256`` (the SHA-256 of its bytes, hex)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return {"at": path.name, "at_sha256": digest.hexdigest()}


def tests_text(tests: Any, devices: Any = None) -> str:
    """``"4 tests"`` or ``"4 tests from 2 devices"``: what a test quantity averages."""
    text = f"{float(tests):g} tests"
    return text if devices is None else f"{text} from {float(devices):g} devices"


def warn_replacing_other_places(path: Path, record: dict[str, Any], *, key: bytes) -> None:
    """Warn when ``path`` holds the outputs at another places file of the same stem
    (``sites.xlsx`` after ``sites.csv``, or another folder's ``sites.csv``), or at the same
    file the test quantity of other ``tests``/``devices``, which the new ones (``record``, with
    :func:`places_source`'s keys) replace; ``key``: the parquet metadata key of the record.
    Files written before the record are not judged."""
    if not path.is_file():
        return
    try:
        before = json.loads((pq.read_schema(path).metadata or {}).get(key, b"{}"))
    except (OSError, ValueError, pa.ArrowException):
        return
    name = before.get("at") if isinstance(before, dict) else None
    if not name:
        return
    if (name, before.get("at_sha256")) == (record["at"], record["at_sha256"]):
        if record.get("tests") is not None and before.get("tests") is not None:
            was = tests_text(before["tests"], before.get("devices"))
            now = tests_text(record["tests"], record.get("devices"))
            if was != now:
                log.warning(
                    "%s holds the outputs of %s; they are replaced by those of %s (copy the "
                    "file first to keep both)",
                    path.name,
                    was,
                    now,
                )
        return
    other = f"another {name} (other content)" if name == record["at"] else name
    log.warning(
        "%s holds the outputs at %s; they are replaced by those at %s (rename one of the "
        "files to keep both)",
        path.name,
        other,
        record["at"],
    )


def write_places(
    path: Path,
    places: Locations,
    inside: np.ndarray,
    columns: dict[str, Any],
    *,
    quantity: str,
    quarter: str,
    licence: dict[str, str],
    quarter_status: str | None = None,
    metadata: dict[bytes, bytes] | None = None,
    description: str = "",
    name: str = "",
    region_kind: str | None = None,
) -> Path:
    """Write the parquet of a file's places (``predict --at``, ``service --at``) to ``path``,
    and the same rows to a CSV beside it (``path`` with ``.csv``, for spreadsheets: the
    ``description``, the licence and how to read it in ``#`` lines above the header), both
    atomically; return the parquet's path. The rows: the places' own columns (one named like an output column is renamed
    ``input_<name>``), then ``quadkey`` (the zoom-16 tile), ``lon``, ``lat``, ``columns``,
    ``quantity``, ``quarter``, ``quarter_status`` (when given: as ``geodbk predict`` writes it
    into a grid), ``located`` (the row has a place) and ``outside_region``
    (located, not ``inside``); the schema metadata holds
    the ``licence`` (file attributes) and ``metadata``. An input column named like an output
    column is renamed ``input_<name>``, prefixed again while that name is taken
    (:func:`_renamed_inputs`). ``name``: the places file's, for the messages (default: how the
    places were found, ``lon/lat``); ``region_kind``: how the run's region was drawn, for the
    fix the outside-region warning names."""
    located = places.located
    quadkey = np.full(located.size, None, dtype=object)
    if located.any():
        quadkey[located] = tile_ids(places.lon[located], places.lat[located]).astype(str)
    out = pd.DataFrame(
        {
            "quadkey": pd.array(quadkey, dtype="string"),
            "lon": places.lon,
            "lat": places.lat,
            **columns,
            "quantity": quantity,
            "quarter": quarter,
            **({} if quarter_status is None else {"quarter_status": quarter_status}),
            "located": located,
            "outside_region": located & ~inside,
        }
    )
    ids = places.ids.rename(columns=_renamed_inputs([str(c) for c in places.ids], out.columns))
    frame = pd.concat([ids, out], axis=1)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    meta = {**(table.schema.metadata or {}), **licence_schema_metadata(licence), **(metadata or {})}
    csv = path.with_suffix(".csv")
    with atomic_path(path) as tmp, atomic_path(csv) as tmp_csv:
        with naming_errors(path):
            pq.write_table(table.replace_schema_metadata(meta), tmp)
        with naming_errors(csv), open(tmp_csv, "w", encoding="utf-8", newline="") as handle:
            handle.write(_csv_header(description, licence, _text_columns(frame)))
            write_csv_rows(handle, frame, table=table)
    _warn_outside(
        int((located & ~inside).sum()),
        int(located.sum()),
        name or places.source,
        region_kind=region_kind,
    )
    log.info(
        "wrote %s (%d places from %s, %d outside the region, %d without a place; %s quantity, %s)",
        path,
        inside.size,
        places.source,
        int((located & ~inside).sum()),
        int((~located).sum()),
        quantity,
        quarter,
    )
    return path


def _text_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of ``frame`` that hold text (``quadkey``, ids such as ``007`` or GEOIDs)."""
    return [
        str(c)
        for c in frame.columns
        if pd.api.types.is_string_dtype(frame[c]) or frame[c].dtype == object
    ]


def _csv_header(description: str, licence: dict[str, str], text: list[str]) -> str:
    """The ``#`` lines above a places CSV's header: what it holds, the data licence (file
    attributes, :func:`pipelines.rundir.licence_attrs`) and how to read its ``text`` columns
    as text (a reader that guesses types drops their leading zeros)."""
    url = f" {licence['license_url']}" if licence.get("license_url") else ""
    dtype = ", ".join(f"{c!r}: str" for c in text).replace("'", '"')
    lines = [
        description,
        licence_line(
            {"source": "", "license": "", **licence, "terms": licence.get("license_terms")}
        )
        + url,
        f"Text columns ({', '.join(text)}): import them as text in a spreadsheet, or their "
        "leading zeros are lost (quadkey: 16 digits). Read with pandas.read_csv(path, "
        f'comment="#", dtype={{{dtype}}}). Columns: docs/cli.md "geodbk predict" and '
        '"geodbk service".',
    ]
    return "".join(f"# {line}\n" for line in lines if line)


def _warn_outside(outside: int, located: int, source: str, *, region_kind: str | None) -> None:
    """Warn that ``outside`` of the ``located`` places of ``source`` (the file) lie outside the run's
    region and have no values, with the fix for how the region was drawn (``region_kind``,
    :func:`pipelines.run_inputs.region_kind`): a rectangle is drawn again to hold them; a state
    or polygon boundary, whose coast cuts off shore places, is replaced by one that reaches into
    coastal water."""
    if not outside:
        return
    if region_kind in ("bbox", "tiles"):
        drawn = "a bounding box (--bbox)" if region_kind == "bbox" else "the tiles' extent"
        fix = (
            f"The region is {drawn}: to map them, ingest again with a --bbox, --state or "
            "--region that holds them."
        )
    else:
        fix = (
            "Places on a coast can fall just outside a boundary clipped to the shoreline (the "
            "Census cartographic files, such as cb_2018_us_state_500k): to map them, ingest "
            "again with --region FILE, a boundary that reaches into coastal water (the Census "
            "TIGER/Line state file does)."
        )
    log.warning(
        "%d of %d places in %s lie outside the run's region (RUN/region.geojson) and have no "
        "values (outside_region = true). %s",
        outside,
        located,
        source,
        fix,
    )


def _renamed_inputs(inputs: list[str], outputs: Iterable[str]) -> dict[str, str]:
    """New names of the input columns that clash with ``outputs``: ``input_<name>``, or
    ``input_input_<name>`` (and so on) while the name is another input's or an output's.

    Parameters
    ----------
    inputs
        The input's column names, in order.
    outputs
        The output's column names.

    Returns
    -------
    dict
        ``{old: new}`` for the clashing columns only.
    """
    taken = set(outputs)
    used = taken | set(inputs)
    renamed: dict[str, str] = {}
    for name in inputs:
        if name not in taken:
            continue
        new = f"input_{name}"
        while new in used:
            new = f"input_{new}"
        used.add(new)
        renamed[name] = new
    return renamed
