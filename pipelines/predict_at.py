"""``geodbk predict --at FILE``: predictions at the places listed in a file.

Writes ``RUN/predictions/TARGET_<file stem>.parquet`` with one row per input row: the input's
own columns, then ``quadkey`` (the zoom-16 tile of the place), ``lon``, ``lat``, ``mean``,
``sd``, ``lower``, ``upper`` (log10 of the target's raw unit, kbps or ms, like
``tiles.parquet``), ``median``, ``lower_natural``, ``upper_natural`` (Mbps or ms),
``tile_history`` (the tile has measured history), ``tile_pull`` (the measured neighbours'
part of the tile's level, local layer), ``quantity`` and ``quarter``, and
``outside_region`` (True: the place lies outside the run's region; its values are then
missing rather than extrapolated). Input columns whose names clash with these are renamed
``input_<name>``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.atomic import atomic_path
from geodbk.errors import DataError
from geodbk.geo.locations import read_locations
from geodbk.geo.timeaxis import format_quarter, quarter_index
from geodbk.quantities import DEFAULT_MAP_QUANTITY, check_quantity, predict_quantity
from pipelines.predict import (
    observed_quarters,
    read_region,
    read_urban,
    tile_ids,
)
from pipelines.rundir import (
    licence_attrs,
    locked_stage,
    model_inputs,
    require_run,
    run_licence,
    scale_lonlat,
    target_spec,
    time_scaling_of,
)

log = logging.getLogger("geodbk")

__all__ = ["OUTPUT_COLUMNS", "run_predict_at"]

#: The columns :func:`run_predict_at` adds after the input's own.
OUTPUT_COLUMNS = (
    "quadkey",
    "lon",
    "lat",
    "mean",
    "sd",
    "lower",
    "upper",
    "median",
    "lower_natural",
    "upper_natural",
    "tile_history",
    "tile_pull",
    "quantity",
    "quarter",
    "outside_region",
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
    ``RUN/predictions/TARGET_<stem>.parquet``; return its path.

    Parameters
    ----------
    run
        Run directory with a trained ``models/TARGET``.
    at
        A parquet, CSV or GeoJSON file of places (:func:`geodbk.geo.locations.read_locations`).
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
    from pipelines.layers import layer_xy, load_map_layers
    from pipelines.train import load_model

    try:
        check_quantity(quantity)
    except ValueError as exc:
        raise DataError(f"--quantity: {exc}") from None
    if not (np.isfinite(tests) and tests >= 1):
        raise DataError(f"--tests must be >= 1, got {tests}")
    rd = require_run(run)
    spec = target_spec(target)
    places = read_locations(at)
    licence = licence_attrs(run_licence(rd))
    model = load_model(rd, target)
    md: dict[str, Any] = dict(getattr(model, "metadata_", None) or {})
    ts = time_scaling_of(md)
    observed = observed_quarters(rd, md)
    if ts is None and quarter is not None:
        raise DataError(
            f"--quarter needs a time-aware model, but {rd.model_dir(target)} pools all quarters; "
            f"retrain with `geodbk train --run {rd.root} --target {target} --time`"
        )
    if ts is not None:
        if quarter is None and not observed:
            raise DataError(f"{rd.model_dir(target)}: the model metadata lists no quarters")
        label = format_quarter(quarter_index(quarter or observed[-1]))
        time = float(quarter_index(label))
    else:
        label = f"pooled {observed[0]}:{observed[-1]}" if observed else "pooled"
        time = float(quarter_index(observed[-1])) if observed else 0.0
    import shapely

    region = read_region(rd)
    inside = np.asarray(shapely.intersects_xy(region, places.lon, places.lat), dtype=bool)
    effect, layer = (None, None) if quantity == "area" else load_map_layers(rd, target, model)
    keys = tile_ids(places.lon, places.lat)
    n = keys.size
    values = {c: np.full(n, np.nan) for c in ("mean", "sd")}
    seen = np.zeros(n, dtype=bool)
    pull = np.full(n, np.nan)
    if inside.any():
        urban = None
        if getattr(model, "noise_urban", False) or (effect is not None and effect.grouped):
            geom = read_urban(rd, target=target)
            urban = np.asarray(
                shapely.intersects_xy(geom, places.lon[inside], places.lat[inside]), dtype=bool
            )
        scaling = md.get("input_scaling")
        if not scaling:
            from pipelines.rundir import load_tiles, scaling_of

            scaling = scaling_of(load_tiles(rd)[1], source=rd.tiles)
        X = model_inputs(
            scale_lonlat(places.lon[inside], places.lat[inside], scaling),
            md,
            quarter=label if ts is not None else None,
        )
        q = predict_quantity(
            model,
            X,
            quantity=quantity,
            effect=effect,
            layer=layer,
            tiles=keys[inside],
            times=time,
            xy=layer_xy(layer, places.lon[inside], places.lat[inside]),
            urban=urban,
            tests=tests,
            devices=devices,
        )
        values["mean"][inside], values["sd"][inside], seen[inside] = q.mean, q.sd, q.seen
        pull[inside] = q.pull
    lower = values["mean"] - 1.96 * values["sd"]
    upper = values["mean"] + 1.96 * values["sd"]
    ids = places.ids.rename(columns={c: f"input_{c}" for c in places.ids if c in OUTPUT_COLUMNS})
    out = pd.concat(
        [
            ids,
            pd.DataFrame(
                {
                    "quadkey": keys.astype(str),
                    "lon": places.lon,
                    "lat": places.lat,
                    "mean": values["mean"],
                    "sd": values["sd"],
                    "lower": lower,
                    "upper": upper,
                    "median": spec.to_natural(values["mean"]),
                    "lower_natural": spec.to_natural(lower),
                    "upper_natural": spec.to_natural(upper),
                    "tile_history": seen,
                    "tile_pull": pull,
                    "quantity": quantity,
                    "quarter": label,
                    "outside_region": ~inside,
                }
            ),
        ],
        axis=1,
    )
    if inside.any() and not np.isfinite(out.loc[inside, ["mean", "sd"]].to_numpy()).all():
        raise DataError(
            f"{rd.model_dir(target)} gave non-finite predictions at {at}; the model file may be "
            "damaged: retrain it"
        )
    path = rd.predictions_at(target, Path(at).stem)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(out, preserve_index=False)
    meta = {**(table.schema.metadata or {}), b"geodbk_data_licence": json.dumps(licence).encode()}
    with atomic_path(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp)
    log.info(
        "wrote %s (%d places from %s, %d outside the region; %s quantity, %s)",
        path,
        n,
        places.source,
        int((~inside).sum()),
        quantity,
        label,
    )
    return path
