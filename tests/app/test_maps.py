"""Dashboard choice of what the map shows (tile, area f(x), single test, tile average of K), and
the first frame's capped raster."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app import loaders, maps


def test_quantities_match_the_grid_and_order(tiny_run: Path) -> None:
    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    inside = grid.in_region
    tile = maps.layer_values(grid, maps.LayerSpec("std"))
    # predict's default grid is the tile quantity, and so is the dashboard's default layer
    assert grid.attrs["quantity"] == "tile"
    assert np.allclose(tile[inside], grid.arrays["std"][inside], rtol=1e-6)
    single = maps.layer_values(grid, maps.LayerSpec("std", quantity="single"))
    assert np.allclose(single[inside], grid.arrays["test_sd"][inside], rtol=1e-6)
    assert np.all(single[inside] >= tile[inside])
    median = maps.layer_values(grid, maps.LayerSpec("median"))
    area_median = maps.layer_values(grid, maps.LayerSpec("median", quantity="latent"))
    assert np.allclose(median[inside], grid.natural("tile_mean")[inside], rtol=1e-5)
    assert np.allclose(area_median[inside], grid.natural("area_mean")[inside], rtol=1e-5)
    avg = maps.layer_values(grid, maps.LayerSpec("std", quantity="average", tests=16))
    latent = maps.layer_values(grid, maps.LayerSpec("std", quantity="latent"))
    assert np.allclose(latent[inside], grid.arrays["std_f"][inside])
    # the tile average of K tests is derived from the GP's own noise: offered (and ordered
    # between f and one test) only for grids made without a tile effect
    assert ("average" in maps.quantities_of(grid)) != maps.has_tile_effect(grid)
    tests_aware = grid.attrs.get("noise_model") in ("tests", "tests+devices")
    if tests_aware and not maps.has_tile_effect(grid):
        assert np.all(latent[inside] < avg[inside]) and np.all(avg[inside] < single[inside])

    width = maps.layer_values(grid, maps.LayerSpec("pi_width", quantity="latent"))
    lo = maps.layer_values(grid, maps.LayerSpec("pi_lower", quantity="latent"))
    hi = maps.layer_values(grid, maps.LayerSpec("pi_upper", quantity="latent"))
    assert np.allclose(width[inside], (hi - lo)[inside])
    assert np.allclose(lo[inside], grid.arrays["latent_pi_lower_natural"][inside], rtol=1e-3)
    legend = maps.layer_legend(grid, maps.LayerSpec("std", quantity="latent"), None)  # type: ignore[arg-type]
    assert "area: neighbourhood level f(x)" in legend.title
    tile_legend = maps.layer_legend(grid, maps.LayerSpec("median"), None)  # type: ignore[arg-type]
    assert "tile: what the tile here typically gets" in tile_legend.title


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


def test_first_frame_raster_is_capped_and_sampled_from_block_middles() -> None:
    import base64
    import io

    from PIL import Image

    from app.colormaps import ColorScale
    from app.maps import raster_url, thin

    ny, nx = 1200, 900
    values = np.arange(ny * nx, dtype=np.float64).reshape(ny, nx)
    lats = np.linspace(22.0, 18.0, ny)
    small, small_lats = thin(values, lats, 512)
    assert max(small.shape) <= 512 and small.shape == (ny // 3, nx // 3)  # step 3
    assert small[0, 0] == values[1, 1] and small_lats[0] == lats[1]  # middle of a 3 x 3 block
    same, same_lats = thin(values[:100, :80], lats[:100], 512)
    assert same.shape == (100, 80) and same_lats.size == 100  # small grids are left alone
    url = raster_url(small, small_lats, ColorScale("viridis", 0.0, float(values.max())))
    png = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert png.size == (nx // 3, ny // 3)


def test_the_tile_model_caption_names_the_recorded_parameters() -> None:
    """The caption reads the tile effect's and local layer's grid attributes (the layer's
    place share when there is a layer, the effect's otherwise); none without a tile effect."""
    attrs = {
        "tile_effect": 1,
        "local_layer": 1,
        "tile_effect_tau2_rural": 0.151,
        "tile_effect_tau2_urban": 0.205,
        "tile_effect_latent_scale": 1e-6,
        "tile_effect_place_share": 1.0,
        "local_layer_place_share": 0.35,
        "local_layer_range_km": 4.18,
        "local_layer_sigma2": 0.0297,
    }
    text = maps.tile_model_caption(attrs)
    assert text is not None
    assert "τ² rural 0.151, urban 0.205 log10²" in text
    assert "λ 1 × 10⁻⁶ of the GP's variance" in text
    assert "place share 0.35" in text and "range 4.18 km" in text and "ρ" not in text
    rho = {"local_layer_rho_rural": 0.857, "local_layer_rho_urban": 0.938}
    refitted = maps.tile_model_caption({**attrs, **rho, "tile_effect_rho": 0.5})
    assert refitted is not None
    assert "σ² 0.0297 log10²; ρ rural 0.857, urban 0.938 per quarter)" in refitted
    assert "0.5 per quarter" not in refitted  # the refitted rho is the one in use
    tau2 = {"local_layer_tau2_rural": 0.0994, "local_layer_tau2_urban": 0.152}
    refitted = maps.tile_model_caption({**attrs, **tau2})
    assert refitted is not None and "τ² rural 0.0994, urban 0.152 log10²" in refitted
    assert "0.151" not in refitted  # the refitted tau² is the one in use
    alone = maps.tile_model_caption({**attrs, "local_layer": 0, "tile_effect_place_share": 0.2})
    assert alone is not None and "place share 0.20" in alone and "local layer" not in alone
    assert maps.tile_model_caption({"tile_effect": 0}) is None
    assert maps.tile_model_caption(None) is None
    gp_prior = maps.tile_model_caption({**attrs, "local_layer_unseen_prior": "gp"})
    assert gp_prior is not None and "nobody measured has the GP's own spread" in gp_prior
    assert "nobody measured" not in text  # the tile effect's prior (older grids too)
    blocks = {"local_layer_place_share": 1.0, "local_layer_place_share_tiles": 151}
    blocks["local_layer_place_share_units"] = 7
    text = maps.tile_model_caption({**attrs, **blocks})
    assert text is not None
    want = "place share 1.00: the whole prior, as 151 validation tiles in 7 held-out blocks could"
    assert want in text and "chosen" not in text
    tiles = {"tile_effect_place_share_tiles": 1, "tile_effect_place_share_units": 1}
    alone = maps.tile_model_caption({**attrs, **tiles, "local_layer": 0})
    assert alone is not None and "as 1 validation tile could not certify less" in alone
    chosen = {"tile_effect_place_share": 0.4, "tile_effect_place_share_tiles": 115}
    alone = maps.tile_model_caption(
        {**attrs, **chosen, "tile_effect_place_share_units": 115, "local_layer": 0}
    )
    assert alone is not None and "place share 0.40, chosen on 115 validation tiles)" in alone
    wider = {"tile_effect_place_share": 1.5, "tile_effect_place_share_tiles": 115}
    alone = maps.tile_model_caption(
        {**attrs, **wider, "tile_effect_place_share_units": 115, "local_layer": 0}
    )
    assert alone is not None and "place share 1.50: wider than the prior" in alone
    groups = {"local_layer_place_share_urban": 0.05, "local_layer_place_share_rural": 1.25}
    by_group = maps.tile_model_caption({**attrs, **groups})
    assert by_group is not None
    assert "urban tiles 0.05, rural tiles 1.25, each chosen on its own validation tiles" in by_group
    assert "tiles 0.05" not in text  # no group of its own: the pooled share alone


def test_the_tile_model_caption_writes_tiny_parameters_readably_with_units() -> None:
    """A variance driven to its floor reads as a power of ten (not ``1.22e-08`` or 0.0000),
    and every parameter carries its unit: log10² for variances, km for the range, per quarter
    for rho, lambda as a multiple of the GP's variance."""
    attrs = {
        "tile_effect": 1,
        "local_layer": 1,
        "tile_effect_tau2_rural": 1.2164246679392026e-08,
        "tile_effect_tau2_urban": 6.42714051499461e-10,
        "tile_effect_rho": 0.5234753465818012,
        "tile_effect_latent_scale": 1.2469129650137836,
        "local_layer_sigma2": 5e-09,
        "local_layer_range_km": 2.0,
    }
    text = maps.tile_model_caption(attrs)
    assert text is not None
    assert "τ² rural 1.22 × 10⁻⁸, urban 6.43 × 10⁻¹⁰ log10²" in text
    assert "λ 1.25 of the GP's variance" in text and "ρ 0.523 per quarter" in text
    assert "range 2 km" in text and "σ² 5 × 10⁻⁹ log10²" in text
    assert "e-0" not in text
    assert maps.tile_model_caption({"tile_effect": 1}) == "Tile quantity: tile effect."


def test_a_single_tests_median_moves_by_the_grids_test_mean_shift(tiny_run: Path) -> None:
    """One speed test's median is the tile's moved by the grid's ``test_mean_shift`` (the
    tile effect's, written by ``geodbk predict``); the tile and area quantities keep theirs."""
    import dataclasses

    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    inside = grid.in_region
    moved = dataclasses.replace(grid, attrs={**grid.attrs, "test_mean_shift": -0.25})
    for quantity in ("tile", "latent"):
        spec = maps.LayerSpec("median", quantity=quantity)
        a, b = maps.layer_values(grid, spec), maps.layer_values(moved, spec)
        assert np.allclose(a[inside], b[inside])
    single = maps.LayerSpec("median", quantity="single")
    base = maps.layer_values(grid, single)
    shifted = maps.layer_values(moved, single)
    before = float(grid.attrs.get("test_mean_shift", 0.0))
    np.testing.assert_allclose(shifted[inside], base[inside] * 10 ** (-0.25 - before), rtol=1e-5)


def test_an_area_map_without_the_tile_parts_offers_only_the_area(tiny_run: Path) -> None:
    path = tiny_run / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    assert "tile" in maps.quantities_of(grid)
    area_map = loaders.Grid(
        target=grid.target,
        lon=grid.lon,
        lat=grid.lat,
        arrays={k: v for k, v in grid.arrays.items() if not k.startswith(("tile_", "test_"))},
        attrs={**grid.attrs, "quantity": "area", "tile_parts_omitted": 1},
    )
    assert list(maps.quantities_of(area_map)) == ["latent"]


def test_the_trend_caption_reads_the_trend_grids_attributes() -> None:
    """Quantity, quarters, years and the log10 units come from the grid (``geodbk predict
    --trend``'s attributes); the change is explained in × per year."""
    attrs = {
        "first_quarter": "2022Q2",
        "last_quarter": "2023Q4",
        "years": 1.5,
        "quantity": "latent mean f(x) (noise excluded)",
        "units": "log10 avg_d_kbps per year (ratio_*: factor per year, natural units)",
    }
    text = maps.trend_caption(attrs, "download", "trend_change", first="x", last="y")
    assert "Change per year of download's latent mean f(x) (noise excluded)" in text
    assert "from 2022Q2 to 2023Q4 (1.5 years)" in text
    assert "as a factor per year: ×1.10 = up 10% a year" in text
    assert "change_per_year holds it in log10 avg_d_kbps per year)" in text
    p = maps.trend_caption(attrs, "latency", "trend_p")
    assert "probability that latency's latent mean f(x) (noise excluded) is lower in 2023Q4" in p
    assert "than in 2022Q2 (1.5 years)" in p and "0.5 = cannot tell" in p
    # a grid without the attributes: the file name's quarters, the default quantity
    bare = maps.trend_caption({}, "upload", "trend_change", first="2023Q1", last="2024Q1", years=1)
    assert "upload's latent mean f(x) (noise excluded) from 2023Q1 to 2024Q1 (1 year)" in bare
    assert "change_per_year holds" not in bare
