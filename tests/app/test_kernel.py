"""Kernel slices (normalised, phi(x) phi(x_ref), the preset points) and threshold layers, also
against the estimator and the pipelines' grid (demo run)."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app import loaders, maps
from app.kernel import kernel_slice, normalise_slice, preset_points
from app.quarters import time_input, with_time
from app.tabs.kernel_tab import shared_scale

REPO = Path(__file__).resolve().parents[2]


#: The demo model is time-aware: slices are taken at the latest quarter (grids/download.nc).
QUARTER = "2023Q4"


def _t(model: object) -> float | None:
    return time_input(model.metadata_, QUARTER)  # type: ignore[attr-defined]


def _features(run: Path) -> loaders.GridFeatures:
    model_dir = run / "models" / "download"
    grid = run / "grids" / "download.nc"
    model = loaders.load_model(str(model_dir), loaders.stamp(model_dir / "weights.safetensors"))
    sc = tuple(sorted(model.metadata_["input_scaling"].items()))
    return loaders.grid_features(
        str(model_dir),
        loaders.stamp(model_dir / "weights.safetensors"),
        str(grid),
        loaders.stamp(grid),
        "download",
        sc,
        _t(model),
    )


def test_phi_grid_is_cached_and_a_new_slice_takes_under_a_second(tiny_run: Path) -> None:
    feats = _features(tiny_run)
    assert _features(tiny_run) is feats  # cached once per model and grid
    model = loaders.load_model(
        str(tiny_run / "models" / "download"),
        loaders.stamp(tiny_run / "models" / "download" / "weights.safetensors"),
    )
    sc = model.metadata_["input_scaling"]
    t0 = time.perf_counter()
    x_ref = with_time(
        loaders.scale_lonlat(
            np.array([feats.lon[len(feats.lon) // 2]]), np.array([feats.lat[0]]), sc
        ),
        _t(model),
    )
    phi_ref = np.asarray(model.features(x_ref), dtype=np.float32)[0]
    values = normalise_slice(kernel_slice(feats.phi, phi_ref))
    image = np.full(feats.shape, np.nan)
    image[feats.rows, feats.cols] = values
    maps.raster_url(image, feats.lat, shared_scale([image]))
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"a kernel slice took {elapsed:.2f} s"
    assert np.nanmax(image) == pytest.approx(1.0)


def test_slice_matches_the_estimator_kernel(tiny_run: Path) -> None:
    feats = _features(tiny_run)
    model = loaders.load_model(
        str(tiny_run / "models" / "download"),
        loaders.stamp(tiny_run / "models" / "download" / "weights.safetensors"),
    )
    sc = model.metadata_["input_scaling"]
    pts = preset_points(
        loaders.load_tiles(
            str(tiny_run / "tiles.parquet"), loaders.stamp(tiny_run / "tiles.parquet")
        ).frame
    )
    ref = pts[0]
    x_ref = with_time(loaders.scale_lonlat(np.array([ref.lon]), np.array([ref.lat]), sc), _t(model))
    ours = normalise_slice(kernel_slice(feats.phi, np.asarray(model.features(x_ref))[0]))
    X = with_time(loaders.scale_lonlat(feats.lon[feats.cols], feats.lat[feats.rows], sc), _t(model))
    k = model.kernel(X, x_ref)[:, 0]
    assert np.allclose(ours, k / k.max(), atol=1e-4)


def test_probability_layer_matches_the_pipelines_exceedance_grid(tiny_run: Path) -> None:
    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    assert "p_below_25mbps" in grid.arrays
    at_least = maps.layer_values(grid, maps.LayerSpec("prob", 25.0, True))
    inside = grid.in_region
    assert np.allclose(1.0 - at_least[inside], grid.arrays["p_below_25mbps"][inside], atol=1e-4)
    assert np.isnan(at_least[~inside]).all()
    assert np.allclose(grid.natural("mean")[inside], grid.arrays["mean_natural"][inside], rtol=1e-4)


def test_server_binds_to_localhost_by_default() -> None:
    config = tomllib.loads((REPO / ".streamlit" / "config.toml").read_text())
    assert config["server"]["address"] == "localhost"
    assert config["server"]["headless"] is True
    assert config["browser"]["gatherUsageStats"] is False
    assert config["client"]["toolbarMode"] == "viewer"


def test_normalise_slice_has_max_one_keeps_nan_and_rejects_degenerate() -> None:
    k = np.array([[2.0, 4.0], [np.nan, 1.0]])
    out = normalise_slice(k)
    assert np.nanmax(out) == 1.0 and np.isnan(out[1, 0])
    assert np.allclose(out[np.isfinite(out)], [0.5, 1.0, 0.25])
    assert np.isnan(normalise_slice(np.array([0.0, -1.0]))).all()
    assert np.isnan(normalise_slice(np.array([np.nan]))).all()


def test_kernel_slice_is_phi_times_phi_ref() -> None:
    rng = np.random.default_rng(0)
    phi = rng.normal(size=(50, 8))
    ref = rng.normal(size=8)
    assert np.allclose(kernel_slice(phi.astype(np.float32), ref), phi @ ref, atol=1e-4)


def test_preset_points_pick_dense_urban_typical_rural_and_isolated() -> None:
    rng = np.random.default_rng(1)
    town = rng.normal(0, 0.002, size=(60, 2)) + np.array([-157.8, 21.3])
    country = np.column_stack([rng.uniform(-157.75, -157.5, 40), rng.uniform(21.3, 21.5, 40)])
    lonely = np.array([[-157.2, 21.9]])
    xy = np.vstack([town, country, lonely])
    tiles = pd.DataFrame(
        {
            "quadkey": [str(i) for i in range(len(xy))],
            "lon": xy[:, 0],
            "lat": xy[:, 1],
            "x1": xy[:, 0],
            "x2": xy[:, 1],
            "urban": [True] * 60 + [False] * 41,
            "tests": 5,
        }
    )
    pts = {p.name: p for p in preset_points(tiles)}
    assert set(pts) == {"Urban", "Rural", "Remote"}
    assert abs(pts["Urban"].lon + 157.8) < 0.01
    assert pts["Remote"].lon == pytest.approx(-157.2) and pts["Remote"].lat == pytest.approx(21.9)
    assert -157.75 <= pts["Rural"].lon <= -157.2
