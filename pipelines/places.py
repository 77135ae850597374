"""One target's trained model, ready to predict a quantity at any lon/lat of the run's region.

:func:`load_place_predictor` reads what a prediction needs once (the model, its input scaling,
the quarter, the tile effect and local layer, the urban layer when the model needs it), and
:meth:`PlacePredictor.predict` gives the ``area``, ``tile`` or ``test`` quantity
(:mod:`geodbk.quantities`) at places. ``predict --at``, ``service`` and ``summarize`` share it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import shapely

from geodbk.errors import DataError
from geodbk.geo.longitude import native_longitude
from geodbk.geo.timeaxis import (
    TimeScaling,
    extrapolation_of,
    format_quarter,
    quarter_index,
    quarter_indices,
)
from geodbk.quantities import QuantityPrediction, check_quantity, predict_quantity
from geodbk.tile_effect import TileEffect
from pipelines.bundles import load_model
from pipelines.layers import load_map_layers, tile_positions
from pipelines.run_inputs import observed_quarters, pooled_label, read_urban, tile_codes
from pipelines.rundir import (
    RunDir,
    TargetSpec,
    load_tiles,
    model_inputs,
    scale_lonlat,
    scaling_of,
    target_spec,
    time_scaling_of,
)

log = logging.getLogger("geodbk")

__all__ = [
    "PlacePredictor",
    "load_place_predictor",
    "map_quarter_status",
    "places_quarter_status",
    "time_extrapolation_warning",
]


@dataclass
class PlacePredictor:
    """A target's fitted model and everything its quantities need at places.

    Attributes
    ----------
    target, spec
        The target and its units (:class:`pipelines.rundir.TargetSpec`).
    model
        The fitted :class:`geodbk.DBKRegressor`.
    metadata
        The model's metadata.
    quarter
        The quarter predicted (a time-aware model) or ``"pooled Q1:Q2"``.
    time
        The tile effect's time step of that quarter.
    effect, layer
        The tile effect and local layer (``None`` when not trained or not asked for).
    urban_geometry
        The run's urban polygons when the model needs each place's class, else ``None``.
    """

    target: str
    spec: TargetSpec
    model: Any
    metadata: dict[str, Any]
    scaling: dict[str, float]
    quarter: str
    time: float
    time_aware: bool
    effect: Any
    layer: Any
    urban_geometry: Any

    def inputs(self, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """Model inputs (n, d) of places: scaled lon/lat, plus t for a time-aware model."""
        X2 = scale_lonlat(np.asarray(lon), np.asarray(lat), self.scaling)
        return model_inputs(X2, self.metadata, quarter=self.quarter if self.time_aware else None)

    def urban(self, lon: np.ndarray, lat: np.ndarray) -> np.ndarray | None:
        """Each place's urban flag when the model needs it, else ``None``."""
        if self.urban_geometry is None:
            return None
        return np.asarray(
            shapely.intersects_xy(self.urban_geometry, native_longitude(lon), lat), dtype=bool
        )

    def predict(
        self,
        lon: np.ndarray,
        lat: np.ndarray,
        *,
        quantity: str,
        tests: Any = 1.0,
        devices: Any = None,
        chunk_size: int = 65536,
        quarters: Any = None,
        own_testers: bool = False,
    ) -> QuantityPrediction:
        """``quantity`` at places (lon/lat in degrees, inside the region): each place's tile
        is the zoom-16 tile of its point, its time step :attr:`time`.

        ``quarters`` (optional): one quarter per place (e.g. rows of the tile table), used
        instead of :attr:`quarter` for a time-aware model's input and as each place's tile
        time step. ``tests``/``devices`` may also be one value per place; ``own_testers``
        states an unmeasured tile at them (held-out rows) rather than at a typical training
        row's (:func:`geodbk.quantities.predict_quantity`)."""
        check_quantity(quantity)
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        effect, layer = self.effect, self.layer
        if quarters is None:
            times: Any = self.time
            X = self.inputs(lon, lat)
        else:
            per_row = np.asarray(quarters).astype(str)
            times = quarter_indices(per_row).astype(np.float64)
            X2 = scale_lonlat(lon, lat, self.scaling)
            X = model_inputs(X2, self.metadata, quarter=per_row if self.time_aware else None)
        return predict_quantity(
            self.model,
            X,
            quantity=quantity,
            effect=effect,
            layer=layer,
            tiles=tile_codes(lon, lat) if effect is not None else None,
            times=times,
            urban=self.urban(lon, lat),
            tests=tests,
            devices=devices,
            chunk_size=chunk_size,
            own_testers=own_testers,
        )

    def without_rows(self, tiles: Any, quarters: Any = None) -> PlacePredictor:
        """A copy whose tile effect and local layer are conditioned without the rows of these
        tiles and quarters (e.g. the validation split; ``quarters=None``: a table without
        quarters, every row at time step 0), so those rows are predicted as held out; the same
        predictor when no such row conditions them."""
        if self.effect is None:
            return self
        effect = self.effect
        ids = np.asarray(tiles).astype(str)
        steps = (
            np.zeros(ids.size, dtype=np.int64)
            if quarters is None
            else quarter_indices(np.asarray(quarters).astype(str))
        )
        drop = pd.MultiIndex.from_arrays([ids, steps])
        rows = pd.MultiIndex.from_arrays(
            [np.asarray(effect.tiles).astype(str), np.asarray(effect.times).astype(np.int64)]
        )
        keep = ~np.asarray(rows.isin(drop), dtype=bool)
        if keep.all():
            return self

        held = TileEffect(
            effect.params,
            tiles=effect.tiles[keep],
            times=effect.times[keep],
            residual=effect.residual[keep],
            var_f=effect.var_f[keep],
            components=effect.components[keep],
            groups=effect.groups[keep] if effect.grouped else None,
            max_rows=effect.max_rows,
        )
        layer = None
        if self.layer is not None:
            measured = np.unique(np.asarray(held.tiles).astype(str))  # the effect's tile order
            params = self.layer.params
            xy = tile_positions(measured, lat0=params.lat0, lon0=params.lon0)
            layer = self.layer.with_effect(held, tile_xy=xy)
        return replace(self, effect=held, layer=layer)


def map_quarter_status(
    ts: TimeScaling | None,
    quarter: str | None,
    *,
    observed: Sequence[str],
    tile_offsets: bool = False,
) -> str:
    """The ``quarter_status`` of a map of ``quarter``.

    A time-aware model (``ts``): ``observed`` or ``extrapolation beyond LAST`` / ``before
    FIRST`` (:meth:`~geodbk.geo.timeaxis.TimeScaling.describe`). A pooled model (``ts`` None):
    ``pooled``, or ``pooled; tile offsets at LATEST`` when measured tiles' offsets enter
    (``tile_offsets``), taken at the latest of the ``observed`` quarters.
    """
    if ts is None or quarter is None:
        if tile_offsets and observed:
            return f"pooled; tile offsets at {observed[-1]}"
        return "pooled"
    return ts.describe(quarter)


def time_extrapolation_warning(
    target: str, quarter: str, ts: TimeScaling, metadata: dict[str, Any]
) -> str:
    """The warning for a time-aware model's ``quarter`` outside its trained quarters: its
    status, the trained range, and what the map does there under the model's time
    extrapolation policy (``hold``: f held at the nearest trained quarter; ``trend``: the
    trend extrapolated)."""
    held = extrapolation_of(metadata) == "hold"
    return f"{target} {quarter}: {ts.describe(quarter)} (trained on {ts.first}..{ts.last}); " + (
        "the map holds f at the nearest trained quarter (time extrapolation 'hold'); each "
        "tile's offset decays toward its prior quarter by quarter"
        if held
        else "the map extrapolates the trend (time extrapolation 'trend')"
    )


def places_quarter_status(
    rd: RunDir, predictor: PlacePredictor, *, quantity: str, note: str = ""
) -> tuple[str | None, str]:
    """``(file quarter, quarter_status)`` of the quarter ``predictor`` predicts.

    The file quarter is a time-aware model's quarter when it is not the table's latest (else
    None: file names carry no quarter). The status is what ``geodbk predict`` writes into the
    grid of that quarter (:func:`map_quarter_status`). A quarter outside the trained ones is
    logged as ``predict`` logs it, naming the model's time extrapolation policy; a quarter
    without rows in the tile table is logged as interpolated; ``note`` ends both messages.
    """
    md = predictor.metadata
    observed = observed_quarters(rd, md)
    ts = time_scaling_of(md)
    quarter = str(predictor.quarter)
    tail = f"; {note}" if note else ""
    if not predictor.time_aware or ts is None:
        offsets = (predictor.effect is not None or predictor.layer is not None) and (
            quantity != "area"
        )
        return None, map_quarter_status(None, None, observed=observed, tile_offsets=offsets)
    status = map_quarter_status(ts, quarter, observed=observed)
    if ts.is_extrapolation(quarter):
        log.warning("%s%s", time_extrapolation_warning(predictor.target, quarter, ts, md), tail)
    elif quarter not in observed:
        log.warning(
            "%s is not a quarter of the tile table (%s); the model interpolates between its "
            "trained quarters%s",
            quarter,
            f"{observed[0]}..{observed[-1]}" if observed else "none",
            tail,
        )
    return (None if observed and quarter == observed[-1] else quarter), status


def load_place_predictor(
    rd: RunDir, target: str, *, quantity: str = "tile", quarter: str | None = None
) -> PlacePredictor:
    """Read ``target``'s model and what ``quantity`` needs from the run ``rd``.

    ``quarter``: time-aware models only, the quarter to predict (default the table's latest);
    a pooled model refuses it (:class:`~geodbk.errors.DataError` with the retrain command).
    """
    check_quantity(quantity)
    spec = target_spec(target)
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
        label = pooled_label(observed)
        time = float(quarter_index(observed[-1])) if observed else 0.0
    effect, layer = load_map_layers(rd, target, model)
    needs_urban = getattr(model, "noise_urban", False) or bool(
        effect is not None and effect.grouped
    )
    scaling = md.get("input_scaling") or scaling_of(load_tiles(rd)[1], source=rd.tiles)
    return PlacePredictor(
        target=target,
        spec=spec,
        model=model,
        metadata=md,
        scaling={k: float(v) for k, v in scaling.items()},
        quarter=label,
        time=time,
        time_aware=ts is not None,
        effect=effect,
        layer=layer,
        urban_geometry=read_urban(rd, target=target) if needs_urban else None,
    )
