"""Dashboard choice of what the map shows: single test, tile average of K tests, latent f(x)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app import loaders, maps


def test_quantities_match_the_grid_and_order(tiny_run: Path) -> None:
    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    inside = grid.in_region
    single = maps.layer_values(grid, maps.LayerSpec("std"))
    # predict's default grid is a single speed test: the derived sd equals the stored one
    assert np.allclose(single[inside], grid.arrays["std"][inside], rtol=1e-3)
    avg = maps.layer_values(grid, maps.LayerSpec("std", quantity="average", tests=16))
    latent = maps.layer_values(grid, maps.LayerSpec("std", quantity="latent"))
    assert np.allclose(latent[inside], grid.arrays["std_f"][inside])
    if grid.attrs.get("noise_model") in ("tests", "tests+devices"):
        assert np.all(latent[inside] < avg[inside]) and np.all(avg[inside] < single[inside])
    width = maps.layer_values(grid, maps.LayerSpec("pi_width", quantity="latent"))
    lo = maps.layer_values(grid, maps.LayerSpec("pi_lower", quantity="latent"))
    hi = maps.layer_values(grid, maps.LayerSpec("pi_upper", quantity="latent"))
    assert np.allclose(width[inside], (hi - lo)[inside])
    assert np.allclose(lo[inside], grid.arrays["latent_pi_lower_natural"][inside], rtol=1e-3)
    legend = maps.layer_legend(grid, maps.LayerSpec("std", quantity="latent"), None)  # type: ignore[arg-type]
    assert "latent mean f(x)" in legend.title


def test_old_grids_without_noise_attributes_fall_back_to_stored_std(tiny_run: Path) -> None:
    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    old = loaders.Grid(
        target=grid.target,
        lon=grid.lon,
        lat=grid.lat,
        arrays={k: v for k, v in grid.arrays.items() if k != "std_f"},
        attrs={k: v for k, v in grid.attrs.items() if not k.startswith("noise")},
    )
    spec = maps.LayerSpec("std", quantity="average", tests=8)
    assert maps.quantity_std(old, spec) is None
    assert np.array_equal(maps.layer_values(old, spec), grid.arrays["std"], equal_nan=True)
