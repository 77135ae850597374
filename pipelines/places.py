"""One target's trained model, ready to predict a quantity at any lon/lat of the run's region.

:func:`load_place_predictor` reads what a prediction needs once (the model, its input scaling,
the quarter, the tile effect and local layer, the urban layer when the model needs it), and
:meth:`PlacePredictor.predict` gives the ``area``, ``tile`` or ``test`` quantity
(:mod:`geodbk.quantities`) at places. ``predict --at``, ``service`` and ``summarize`` share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import shapely

from geodbk.errors import DataError
from geodbk.geo.timeaxis import format_quarter, quarter_index
from geodbk.quantities import QuantityPrediction, check_quantity, predict_quantity
from pipelines.layers import layer_xy, load_map_layers
from pipelines.predict import observed_quarters, read_urban, tile_ids
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
from pipelines.train import load_model

__all__ = ["PlacePredictor", "load_place_predictor"]


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
        return np.asarray(shapely.intersects_xy(self.urban_geometry, lon, lat), dtype=bool)

    def predict(
        self,
        lon: np.ndarray,
        lat: np.ndarray,
        *,
        quantity: str,
        tests: float = 1.0,
        devices: float | None = None,
        chunk_size: int = 65536,
    ) -> QuantityPrediction:
        """``quantity`` at places (lon/lat in degrees, inside the region): each place's tile
        is the zoom-16 tile of its point, its time step :attr:`time`."""
        check_quantity(quantity)
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        use = quantity != "area"
        effect, layer = (self.effect, self.layer) if use else (None, None)
        return predict_quantity(
            self.model,
            self.inputs(lon, lat),
            quantity=quantity,
            effect=effect,
            layer=layer,
            tiles=tile_ids(lon, lat) if effect is not None else None,
            times=self.time,
            xy=layer_xy(layer, lon, lat),
            urban=self.urban(lon, lat),
            tests=tests,
            devices=devices,
            chunk_size=chunk_size,
        )


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
        label = f"pooled {observed[0]}:{observed[-1]}" if observed else "pooled"
        time = float(quarter_index(observed[-1])) if observed else 0.0
    effect, layer = (None, None) if quantity == "area" else load_map_layers(rd, target, model)
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
