"""A target's model ready to predict at places: inputs from lon/lat, quantities, urban class."""

from __future__ import annotations

import numpy as np
import pytest
import shapely

from geodbk import DBKRegressor
from pipelines.places import PlacePredictor
from pipelines.rundir import target_spec

SCALING = {"lon_min": -158.0, "lon_max": -154.0, "lat_min": 18.0, "lat_max": 22.0}


@pytest.fixture(scope="module")
def model() -> DBKRegressor:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(40, 2))
    opts = {"rank": 4, "hidden": 4, "epochs": 1, "batch_size": 20, "device": "cpu"}
    return DBKRegressor(**opts).fit(x, 4.0 + np.sin(x[:, 0]))


def _predictor(model: DBKRegressor, **changes: object) -> PlacePredictor:
    fields: dict[str, object] = {
        "target": "download",
        "spec": target_spec("download"),
        "model": model,
        "metadata": {"inputs": ["x1", "x2"]},
        "scaling": SCALING,
        "quarter": "pooled 2023Q1:2023Q4",
        "time": 3.0,
        "time_aware": False,
        "effect": None,
        "layer": None,
        "urban_geometry": None,
    }
    return PlacePredictor(**{**fields, **changes})  # type: ignore[arg-type]


def test_places_are_scaled_to_the_model_inputs_and_predicted(model: DBKRegressor) -> None:
    places = _predictor(model)
    lon, lat = np.array([-158.0, -156.0, -155.0]), np.array([18.0, 20.0, 21.0])
    np.testing.assert_allclose(places.inputs(lon, lat), [[-1, -1], [0, 0], [0.5, 0.5]])
    dist = model.predict_dist(places.inputs(lon, lat))
    area = places.predict(lon, lat, quantity="area")
    np.testing.assert_allclose(area.mean, dist.mean)
    np.testing.assert_allclose(area.var, dist.var_f)
    test = places.predict(lon, lat, quantity="test")  # one speed test: plus the noise
    np.testing.assert_allclose(test.var, dist.var)
    assert (test.var > area.var).all()
    with pytest.raises(ValueError, match="quantity must be one of area, tile, test"):
        places.predict(lon, lat, quantity="median")


def test_urban_class_only_when_the_model_needs_it(model: DBKRegressor) -> None:
    lon, lat = np.array([-157.5, -155.5]), np.array([21.5, 19.5])
    assert _predictor(model).urban(lon, lat) is None
    town = shapely.box(-158.0, 21.0, -157.0, 22.0)
    places = _predictor(model, urban_geometry=town)
    assert places.urban(lon, lat).tolist() == [True, False]


def test_without_rows_is_the_same_predictor_without_a_tile_effect(model: DBKRegressor) -> None:
    places = _predictor(model)
    assert places.without_rows(["0" * 16], ["2023Q1"]) is places
