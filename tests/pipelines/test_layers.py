"""The local layer in the run directory: resolution, saving, loading, turning it off."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from geodbk import DBKRegressor
from geodbk.errors import DataError, ModelFileError
from geodbk.local_layer import LocalLayer, SpatialParameters
from geodbk.tile_effect import TileEffect, TileEffectParameters, tile_id_strings
from pipelines.config import TrainConfig, demo_config
from pipelines.layers import (
    LAYER_FILE,
    ValidationRows,
    load_local_layer,
    load_map_layers,
    tile_positions,
)
from pipelines.predict import run_predict
from pipelines.run_inputs import tile_codes, tile_ids
from pipelines.rundir import RunDir
from pipelines.train import resolve_local_layer, run_train


def test_resolve_local_layer_follows_the_tile_effect() -> None:
    on = TrainConfig(tile_effect="on")
    assert resolve_local_layer(on).local_layer == "on"
    assert resolve_local_layer(on.replace(local_layer="off")).local_layer == "off"
    assert resolve_local_layer(TrainConfig(tile_effect="off")).local_layer == "off"
    with pytest.raises(DataError, match="local_layer: on needs the tile effect"):
        resolve_local_layer(TrainConfig(tile_effect="off", local_layer="on"))
    assert TrainConfig(local_layer=False).local_layer == "off"  # type: ignore[arg-type]
    with pytest.raises(DataError, match="local_layer"):
        TrainConfig(local_layer="sometimes")


def test_tile_positions_are_km_apart() -> None:
    # two zoom-16 neighbours east-west: 360° / 2^16 of longitude apart at latitude lat0
    xy = tile_positions(["0223031123101313", "0223031123101312"], lat0=21.3)
    want = 6371.0088 * np.cos(np.radians(21.3)) * np.radians(360 / 2**16)
    assert np.hypot(*(xy[0] - xy[1])) == pytest.approx(want, rel=1e-9)


def test_a_maps_tile_keys_predict_as_its_quadkeys() -> None:
    """A map's cells name their tiles by integer keys (``tile_codes``); the tile effect and the
    local layer give exactly what the same cells' quadkeys give, measured tiles or not."""
    rng = np.random.default_rng(11)
    lon0, lat0 = -157.86, 21.30
    # measured tiles: rows at random points of a 0.05° square, a few quarters each
    mlon, mlat = lon0 + rng.uniform(0, 0.05, 60), lat0 + rng.uniform(0, 0.05, 60)
    measured = tile_ids(np.repeat(mlon, 3), np.repeat(mlat, 3))
    n = measured.size
    params = TileEffectParameters(
        tau2={"all": 0.1}, rho=0.9, noise_scale=(0.5,), components=("noise",), latent_scale=1.0
    )
    effect = TileEffect(
        params,
        tiles=measured,
        times=np.tile([4.0, 5.0, 6.0], n // 3),
        residual=rng.normal(0, 0.3, n),
        var_f=np.full(n, 1e-3),
        components=np.full((n, 1), 0.05),
    )
    spatial = SpatialParameters(
        sigma2=0.04, range_km=2.0, tau2={"all": 0.1}, neighbours=8, lat0=lat0, lon0=lon0
    )

    def positions(tiles: np.ndarray) -> np.ndarray:
        return tile_positions(tiles, lat0=lat0, lon0=lon0)

    layer = LocalLayer(
        effect, spatial, tile_xy=positions(effect._layout().tiles), positions=positions
    )
    # map cells: some in measured tiles, most not, several cells per tile
    lon = np.concatenate([mlon[:20], lon0 + rng.uniform(-0.02, 0.07, 400)])
    lat = np.concatenate([mlat[:20], lat0 + rng.uniform(-0.02, 0.07, 400)])
    keys, names = tile_codes(lon, lat), tile_ids(lon, lat)
    assert np.asarray(keys.categories).dtype.kind == "i"
    np.testing.assert_array_equal(tile_id_strings(keys), names)
    m = lon.size
    kw = {"times": np.full(m, 6.0), "var_f": rng.uniform(0.01, 0.03, m)}
    kw["components"] = np.full((m, 1), 0.05)
    by_key, by_name = layer.predict(tiles=keys, **kw), layer.predict(tiles=names, **kw)
    assert 0 < by_name.seen.sum() < m
    for field in ("shift", "tile_var", "pull", "noise_var", "seen"):
        np.testing.assert_array_equal(getattr(by_key, field), getattr(by_name, field))
    half = keys[: m // 2]  # a chunk whose categories are not all used
    np.testing.assert_array_equal(
        layer.predict(tiles=half, **{k: a[: m // 2] for k, a in kw.items()}).shift,
        by_name.shift[: m // 2],
    )
    eff_key, eff_name = effect.predict(tiles=keys, **kw), effect.predict(tiles=names, **kw)
    np.testing.assert_array_equal(eff_key.shift, eff_name.shift)
    np.testing.assert_array_equal(eff_key.tile_var, eff_name.tile_var)


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("layers") / "run"
    shutil.copytree(tiny_run, r)
    return r


def test_the_demo_model_has_a_local_layer_that_loads(run: Path) -> None:
    rd = RunDir(run)
    model = DBKRegressor.load(rd.model_dir("download"), device="cpu")
    effect, layer = load_map_layers(rd, "download", model)
    assert layer is not None and layer.effect is effect
    assert layer.params.to_dict() == model.metadata_["local_layer"]
    p = layer.params
    assert p.sigma2 >= 0 and p.range_km > 0
    assert p.val_nll is not None and p.val_nll_without is not None
    assert p.val_nll <= p.val_nll_without + 1e-9  # the fit can always take sigma² -> 0
    # the GP alone's NLL on the same validation rows, with its own noise model
    import pandas as pd

    from geodbk.metrics import gaussian_nll
    from geodbk.predictive import noise_kwargs
    from pipelines.rundir import model_inputs

    frame = pd.read_parquet(rd.tiles)
    val = frame[(frame["split"] == "val") & np.isfinite(frame["log10_download"])]
    quarters = val["quarter"].astype(str).to_numpy()
    X = model_inputs(
        val[["x1", "x2"]].to_numpy(np.float64),
        model.metadata_,
        quarter=quarters if model.metadata_.get("time_scaling") else None,
    )
    kw = noise_kwargs(
        model,
        val["tests"].to_numpy(np.float64),
        val["devices"].clip(lower=1).to_numpy(np.float64),
        urban=val["urban"].to_numpy(bool),
    )
    pred = model.predict_dist(X, **kw)
    want = gaussian_nll(val["log10_download"].to_numpy(), pred.mean, pred.var)
    assert p.val_nll_gp == pytest.approx(want, rel=1e-6)


def test_a_foreign_or_missing_layer_file_is_refused(run: Path, tmp_path: Path) -> None:
    rd = RunDir(run)
    model = DBKRegressor.load(rd.model_dir("download"), device="cpu")
    effect, _ = load_map_layers(rd, "download", model)
    folder = tmp_path / "model"
    folder.mkdir()
    expected = model.metadata_["local_layer"]
    with pytest.raises(ModelFileError, match="missing or unreadable"):
        load_local_layer(folder, effect, expected=expected)
    (folder / LAYER_FILE).write_text(json.dumps({**expected, "sigma2": 123.0}))
    with pytest.raises(ModelFileError, match="does not belong"):
        load_local_layer(folder, effect, expected=expected)
    (folder / LAYER_FILE).write_text("{not json")
    with pytest.raises(ModelFileError, match="retrain"):
        load_local_layer(folder, effect, expected=expected)
    assert load_local_layer(folder, effect, expected=None) is None


def test_no_local_layer_keeps_the_tile_effect_alone(run: Path) -> None:
    cfg = demo_config(quick=True).replace(epochs=2)
    run_train(run, target="upload", config=cfg, progress=False, local_layer="off")
    folder = RunDir(run).model_dir("upload")
    assert not (folder / LAYER_FILE).exists()
    md = DBKRegressor.load(folder, device="cpu").metadata_
    assert md["config"]["local_layer"] == "off" and "local_layer" not in md
    assert md["config"]["tile_effect"] == "on"
    share = md["tile_effect"]["place_share"]  # chosen for the tile effect alone
    assert 0.0 < share <= 1.0
    run_predict(run, target="upload", max_cells=900)
    with xr.open_dataset(run / "grids" / "upload.nc") as ds:
        assert ds.attrs["local_layer"] == 0 and ds.attrs["tile_effect"] == 1
        assert ds.attrs["tile_effect_place_share"] == share
        assert (
            ds["std"].attrs["quantity"] == "tile: what the tile here typically gets (tile effect)"
        )
        inside = ds["in_region"].values
        assert np.all(ds["tile_pull"].values[inside] == 0)


def test_a_range_at_its_bound_is_warned_about(
    tiny_run: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A fitted range at its upper bound (one offset shared by every neighbour,
    :func:`geodbk.local_layer.range_at_bound`; forced here) is logged as a warning that says
    what it means and what to try; the layer is still saved."""
    import logging

    import pipelines.layers as layers

    r = tmp_path / "run"
    shutil.copytree(tiny_run, r)
    monkeypatch.setattr(layers, "range_at_bound", lambda _range: 200.0)
    cfg = demo_config(quick=True).replace(epochs=2, local_layer_neighbours=6)
    with caplog.at_level(logging.WARNING, logger="geodbk"):
        run_train(r, target="upload", config=cfg, progress=False)
    said = [rec.getMessage() for rec in caplog.records if "reached its bound" in rec.getMessage()]
    assert len(said) == 1
    assert "200 km with 6 neighbours" in said[0] and "one offset shared" in said[0]
    assert "--no-local-layer" in said[0]
    assert (RunDir(r).model_dir("upload") / LAYER_FILE).exists()


def test_the_grid_records_the_layers_place_share(run: Path) -> None:
    """The model's place share (saved with the layer) and what chose it are grid attributes,
    and so are the tau² the layer refitted (what the maps use, not the tile effect's) and the
    prior of an unmeasured tile it chose."""
    params = DBKRegressor.load(RunDir(run).model_dir("download"), device="cpu").metadata_[
        "local_layer"
    ]
    share, basis = params["place_share"], params.get("place_share_basis")
    assert 0.0 < share <= 1.0
    run_predict(run, target="download", max_cells=900)
    with xr.open_dataset(run / "grids" / "download.nc") as ds:
        assert ds.attrs["local_layer_place_share"] == share
        assert ds.attrs["local_layer_unseen_prior"] == params.get("unseen_prior", "tile effect")
        recorded = {
            k: int(ds.attrs[f"local_layer_place_share_{k}"])
            for k in ("tiles", "units")
            if f"local_layer_place_share_{k}" in ds.attrs
        }
        assert recorded == (basis or {})
        own = {
            g: ds.attrs[f"local_layer_place_share_{g}"]
            for g in ("urban", "rural")
            if f"local_layer_place_share_{g}" in ds.attrs
        }
        assert own == (params.get("place_share_by_group") or {})
        for group, value in params["tau2"].items():
            assert ds.attrs[f"local_layer_tau2_{group}"] == value


class _PriorOnlyLayer:
    """A stand-in tile model: every row's tile unmeasured (or measured where ``seen``), shift 0,
    tile variance ``latent + prior``, noise ``noise``; split with ``lambda`` 1; one group."""

    unseen_latent_scale = 1.0
    params = TileEffectParameters(tau2=0.2, rho=0.9, noise_scale=(1.0,), components=("meas",))

    def __init__(self, *, latent: float, prior: float, noise: float, seen: np.ndarray) -> None:
        self.latent, self.prior, self.noise, self.seen = latent, prior, noise, seen

    def predict(self, **kw: object) -> object:
        from geodbk.tile_effect import TileEffectPrediction

        n = self.seen.size
        return TileEffectPrediction(
            shift=np.zeros(n),
            tile_var=np.where(self.seen, self.latent, self.latent + self.prior),
            noise_var=np.full(n, self.noise),
            persistent_var=np.zeros(n),
            seen=self.seen,
        )


def _place_data(n_tiles: int, *, place_var: float, rows: int = 8, seed: int = 0):
    """``rows`` rows of 5 tests per tile; each tile's level N(0, place_var), each row's value
    its level plus N(0, 0.05)."""
    rng = np.random.default_rng(seed)
    level = rng.normal(0.0, np.sqrt(place_var), n_tiles)
    tiles = np.repeat([f"t{j:03d}" for j in range(n_tiles)], rows)
    y = np.repeat(level, rows) + rng.normal(0.0, np.sqrt(0.05), tiles.size)
    return tiles, y


def test_the_place_share_needs_the_hierarchical_conformal_coverage() -> None:
    """0.95 (K + 1) / K of K held-out units: with one tile per unit the split-conformal count
    (96 of 100 tiles, 111 of 115), and above 1 (nothing certified) below 19 units."""
    import math

    from pipelines.layers import required_coverage

    for n, count in ((100, 96), (115, 111), (30, 30), (19, 19)):
        assert math.ceil(required_coverage(n) * n - 1e-9) == count
    assert all(required_coverage(k) > 1.0 for k in range(1, 19))
    assert required_coverage(19) == pytest.approx(1.0)
    assert all(required_coverage(k) >= 0.95 for k in range(19, 400))


def test_the_place_share_is_the_smallest_that_covers_95_percent_of_unseen_tiles(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Validation tiles whose levels spread by half the prior: the chosen share is the
    smallest on the grid whose intervals cover the split-conformal count of their levels
    (``ceil(0.95 (n + 1))``; the next smaller one covers fewer); measured tiles' rows do not
    count; too few tiles leave it at 1."""
    import math

    from pipelines.layers import PLACE_SHARES, choose_place_share, required_coverage
    from pipelines.map_calibration import map_calibration

    tiles, y = _place_data(200, place_var=0.1)
    seen = np.zeros(tiles.size, dtype=bool)
    seen[:16] = True  # two measured tiles, far off: ignored
    y[:16] += 5.0
    layer = _PriorOnlyLayer(latent=0.01, prior=0.2, noise=0.05, seen=seen)
    kw = {
        "xy": np.zeros((tiles.size, 2)),
        "times": np.zeros(tiles.size),
        "mean": np.zeros(tiles.size),
        "var_f": np.full(tiles.size, 0.01),
        "components": np.ones((tiles.size, 1)),
        "groups": None,
        "tests": np.full(tiles.size, 5.0),
        "urban": np.zeros(tiles.size, dtype=bool),
    }
    with caplog.at_level(logging.INFO, logger="geodbk"):
        choice = choose_place_share(layer, tiles=tiles, y=y, **kw)  # type: ignore[arg-type]
    share = choice.share
    assert 0.2 <= share < 1.0
    assert (choice.tiles, choice.units) == (198, 198)  # the two measured tiles left out
    # the log names what chose it: the tiles and the count they had to reach
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"place share {share:.2f}" in said and "198 validation tiles" in said
    assert f"{100 * required_coverage(198):.1f}%" in said and "each tile counted once" in said
    assert "err wide" not in said
    # 60 tiles in 25 held-out blocks: the count asks nearly all of them, and the log says so
    caplog.clear()
    blocks = np.repeat(np.arange(tiles.size // 8) % 25, 8)
    with caplog.at_level(logging.INFO, logger="geodbk"):
        choose_place_share(layer, tiles=tiles, y=y, units=blocks, **kw)  # type: ignore[arg-type]
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "25 held-out blocks" in said and "err wide" in said

    def covered(c: float) -> int:
        var = 0.01 + c * 0.2
        out = map_calibration(
            tiles=tiles[~seen],
            y=y[~seen],
            tests=kw["tests"][~seen],
            urban=kw["urban"][~seen],
            mean=np.zeros((~seen).sum()),
            var=np.full((~seen).sum(), var),
            noise=np.full((~seen).sum(), 0.05 + (1 - c) * 0.2),
        )
        return round(out["all"]["coverage95"] * out["tiles"])

    n_unseen = int((~seen).sum() // 8)
    needed = math.ceil(required_coverage(n_unseen) * n_unseen - 1e-9)
    assert covered(share) >= needed
    smaller = [c for c in PLACE_SHARES if c < share]
    assert not smaller or covered(smaller[-1]) < needed
    few_tiles, few_y = _place_data(20, place_var=0.04)
    few = _PriorOnlyLayer(latent=0.01, prior=0.2, noise=0.05, seen=np.zeros(160, dtype=bool))
    kw_few = {k: (v[:160] if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
    assert choose_place_share(few, tiles=few_tiles, y=few_y, **kw_few).share == 1.0  # type: ignore[arg-type]


def test_levels_that_stray_more_than_the_prior_widen_the_place_share() -> None:
    """Validation tiles whose levels spread by 1.6 times the prior: the whole prior covers too
    few, so the smallest certified share is above 1 (taken from one test's noise); levels far
    wider than the widest share can state get the widest, with a warning. The grid ends at
    MAX_PLACE_SHARE."""
    import logging

    from geodbk.tile_effect import MAX_PLACE_SHARE
    from pipelines.layers import PLACE_SHARES, choose_place_share, place_share_coverage

    assert PLACE_SHARES[-1] == MAX_PLACE_SHARE and list(PLACE_SHARES) == sorted(PLACE_SHARES)
    tiles, y = _place_data(200, place_var=0.32)
    layer = _PriorOnlyLayer(latent=0.01, prior=0.2, noise=0.5, seen=np.zeros(tiles.size, bool))
    kw = _unit_kw(tiles.size)
    choice = choose_place_share(layer, tiles=tiles, y=y, **kw)  # type: ignore[arg-type]
    assert 1.0 < choice.share < MAX_PLACE_SHARE
    curve = place_share_coverage(layer, tiles=tiles, y=y, **kw)  # type: ignore[arg-type]
    assert curve["coverage"][1.0] < curve["coverage"][choice.share]
    tiles, y = _place_data(200, place_var=5.0)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("geodbk").addHandler(handler)
    try:
        widest = choose_place_share(layer, tiles=tiles, y=y, **kw)  # type: ignore[arg-type]
    finally:
        logging.getLogger("geodbk").removeHandler(handler)
    assert widest.share == MAX_PLACE_SHARE
    assert any("stray from the map more" in r.getMessage() for r in records)


def _unit_kw(n_rows: int) -> dict[str, object]:
    return {
        "xy": np.zeros((n_rows, 2)),
        "times": np.zeros(n_rows),
        "mean": np.zeros(n_rows),
        "var_f": np.full(n_rows, 0.01),
        "components": np.ones((n_rows, 1)),
        "groups": None,
        "tests": np.full(n_rows, 5.0),
        "urban": np.zeros(n_rows, dtype=bool),
    }


def test_tiles_held_out_in_few_blocks_keep_the_whole_prior() -> None:
    """200 validation tiles whose levels need only part of the prior, held out in 10 blocks:
    10 units cannot certify a share below 1; the same tiles as their own units (a tile
    split) choose less."""
    from pipelines.layers import choose_place_share, place_share_coverage

    tiles, y = _place_data(200, place_var=0.1)
    layer = _PriorOnlyLayer(latent=0.01, prior=0.2, noise=0.05, seen=np.zeros(tiles.size, bool))
    kw = _unit_kw(tiles.size)
    blocks = np.repeat(np.arange(10), tiles.size // 10)
    assert choose_place_share(layer, tiles=tiles, y=y, **kw).share < 1.0  # type: ignore[arg-type]
    by_block = choose_place_share(layer, tiles=tiles, y=y, units=blocks, **kw)  # type: ignore[arg-type]
    assert by_block.share == 1.0 and by_block.basis == {"tiles": 200, "units": 10}
    curve = place_share_coverage(layer, tiles=tiles, y=y, units=blocks, **kw)  # type: ignore[arg-type]
    assert curve["tiles"] == 200 and curve["units"] == 10
    assert set(curve["coverage"]) == set(curve["unit_coverage"])


def test_each_held_out_block_counts_once() -> None:
    """40 blocks: one holds 160 tiles whose levels sit at the place's centre, 39 hold one tile
    each, spread by the whole prior. Counting tiles, the big block's easy tiles let a small
    share through; counting blocks, the share must cover the spread tiles, so it is larger:
    the smallest whose mean coverage over the blocks reaches 0.95 (K + 1) / K."""
    from pipelines.layers import choose_place_share, place_share_coverage, required_coverage

    rng = np.random.default_rng(0)
    n_big, n_small, rows = 160, 39, 8
    level = np.concatenate([np.zeros(n_big), rng.normal(0.0, np.sqrt(0.2), n_small)])
    tiles = np.repeat([f"t{j:03d}" for j in range(level.size)], rows)
    y = np.repeat(level, rows) + rng.normal(0.0, np.sqrt(0.05), tiles.size)
    blocks = np.repeat(np.concatenate([np.zeros(n_big, int), np.arange(1, n_small + 1)]), rows)
    layer = _PriorOnlyLayer(latent=0.01, prior=0.2, noise=0.05, seen=np.zeros(tiles.size, bool))
    kw = _unit_kw(tiles.size)
    by_tile = choose_place_share(layer, tiles=tiles, y=y, **kw).share  # type: ignore[arg-type]
    by_block = choose_place_share(layer, tiles=tiles, y=y, units=blocks, **kw).share  # type: ignore[arg-type]
    assert by_tile < by_block < 1.0
    curve = place_share_coverage(layer, tiles=tiles, y=y, units=blocks, **kw)  # type: ignore[arg-type]
    assert curve["units"] == n_small + 1
    needed = required_coverage(n_small + 1)
    assert curve["unit_coverage"][by_block] >= needed - 1e-9
    assert curve["unit_coverage"][round(by_block - 0.05, 2)] < needed


class _LatentGP:
    """A stand-in GP: latent mean 0 and variance 0.01 everywhere, one noise component 0.05."""

    class _Latent:
        def __init__(self, n: int) -> None:
            self.mean, self.var_f, self._n = np.zeros(n), np.full(n, 0.01), n

        def __len__(self) -> int:
            return self._n

    def predict_dist(self, X: np.ndarray, **kw: object) -> object:
        return self._Latent(len(X))

    def noise_components(self, *, n: int, **kw: object) -> tuple[tuple[str], np.ndarray]:
        return ("meas",), np.full((n, 1), 0.05)


def _unmeasured_validation_rows() -> ValidationRows:
    """Validation rows of 200 tiles without training rows (:func:`_place_data`, levels
    N(0, 0.1)), 5 tests a row, rural, at quarter 0."""
    tiles, y = _place_data(200, place_var=0.1)
    n = tiles.size
    return ValidationRows(
        X=np.zeros((n, 2)),
        y=y,
        tiles=tiles,
        times=np.zeros(n),
        noise={},
        tests=np.full(n, 5.0),
        urban=np.zeros(n, dtype=bool),
    )


def _effect_on_training_tiles(
    params: TileEffectParameters, *, var_f: float, seed: int
) -> TileEffect:
    """A tile effect with ``params`` on 40 training tiles of 4 quarters each (residuals
    N(0, 0.36), GP variance ``var_f``, one noise component 0.05)."""
    rng = np.random.default_rng(seed)
    train_tiles = np.repeat([f"a{j:03d}" for j in range(40)], 4)
    return TileEffect(
        params,
        tiles=train_tiles,
        times=np.tile(np.arange(4.0), 40),
        residual=rng.normal(0.0, 0.6, train_tiles.size),
        var_f=np.full(train_tiles.size, var_f),
        components=np.full((train_tiles.size, 1), 0.05),
    )


def test_the_tile_effect_alone_gets_a_place_share_from_unseen_validation_tiles() -> None:
    """A real tile effect (no local layer): validation tiles without training rows whose
    levels spread by less than tau² keep the tile effect's prior (the GP's noise alone is too
    narrow for them) and choose a share below 1, and
    :func:`pipelines.layers.with_effect_place_share` saves it in the effect's parameters,
    which its predictions then use."""
    from pipelines.layers import choose_place_share, with_effect_place_share

    params = TileEffectParameters(
        tau2=0.25, rho=0.9, noise_scale=(1.0,), components=("meas",), latent_scale=1.0
    )
    effect = _effect_on_training_tiles(params, var_f=0.01, seed=1)
    train_tiles = effect.tiles
    val = _unmeasured_validation_rows()
    tiles, y, n = val.tiles, val.y, val.tiles.size
    choice = choose_place_share(
        effect,
        tiles=tiles,
        times=val.times,
        y=y,
        mean=np.zeros(n),
        var_f=np.full(n, 0.01),
        components=np.full((n, 1), 0.05),
        groups=None,
        tests=val.tests,  # type: ignore[arg-type]
        urban=val.urban,  # type: ignore[arg-type]
    )
    share = choice.share
    assert 0.05 <= share < 1.0
    with_share = with_effect_place_share(_LatentGP(), effect, n_train=train_tiles.size, val=val)
    assert with_share.params.place_share == share
    assert with_share.params.unseen_prior == "tile effect"
    assert with_share.params.place_share_basis == choice.basis == {"tiles": 200, "units": 200}
    kw = {"times": np.zeros(1), "var_f": np.full(1, 0.01), "components": np.full((1, 1), 0.05)}
    unseen = with_share.predict(tiles=np.array(["zzz"]), **kw)
    assert unseen.tile_var[0] == pytest.approx(0.01 + share * 0.25)


def test_the_share_curve_is_the_coverage_of_the_maps_at_each_share() -> None:
    """A tile effect whose unmeasured tiles take the GP's prior (which holds all of ``v_f``,
    whatever the effect's ``lambda``): the coverage the place share is chosen by equals, at
    every share, the coverage of the tile quantity that the same model predicts at that share,
    as a map is made."""
    from geodbk.tile_effect import UNSEEN_GP
    from pipelines.layers import PLACE_SHARES, place_share_coverage
    from pipelines.map_calibration import map_calibration

    params = TileEffectParameters(
        tau2=0.25,
        rho=0.9,
        noise_scale=(0.5,),
        components=("meas",),
        latent_scale=0.2,
        unseen_prior=UNSEEN_GP,
    )
    effect = _effect_on_training_tiles(params, var_f=0.1, seed=3)
    tiles, y = _place_data(200, place_var=0.12)
    n = tiles.size
    rows = {
        "tiles": tiles,
        "times": np.zeros(n),
        "var_f": np.full(n, 0.1),
        "components": np.full((n, 1), 0.05),
        "groups": None,
    }
    scored = {"y": y, "mean": np.zeros(n), "tests": np.full(n, 5.0), "urban": np.zeros(n, bool)}
    curve = place_share_coverage(effect, **rows, **scored)
    for c in PLACE_SHARES:
        p = effect.predict(**rows, place_share=c)
        direct = map_calibration(
            tiles=tiles,
            y=y,
            tests=scored["tests"],
            urban=scored["urban"],
            mean=p.shift,
            var=p.tile_var,
            noise=p.noise_var,
            persistent=p.persistent_var,
        )
        assert curve["coverage"][float(c)] == pytest.approx(direct["all"]["coverage95"])
    assert len(set(curve["coverage"].values())) > 2  # the share moves the coverage here


def _grouped_place_rows(n_urban: int, n_rural: int) -> dict[str, np.ndarray]:
    """Validation rows of unmeasured tiles: urban levels spread N(0, 0.05), rural N(0, 0.5),
    8 rows of 5 tests a tile."""
    u_tiles, u_y = _place_data(n_urban, place_var=0.05, seed=1)
    r_tiles, r_y = _place_data(n_rural, place_var=0.5, seed=2)
    tiles = np.concatenate([np.char.add("u", u_tiles), np.char.add("r", r_tiles)])
    urban = np.r_[np.ones(u_tiles.size, bool), np.zeros(r_tiles.size, bool)]
    n = tiles.size
    return {
        "tiles": tiles,
        "times": np.zeros(n),
        "y": np.r_[u_y, r_y],
        "mean": np.zeros(n),
        "var_f": np.full(n, 0.01),
        "components": np.full((n, 1), 0.5),
        "groups": np.where(urban, "urban", "rural"),
        "tests": np.full(n, 5.0),
        "urban": urban,
    }


def _grouped_effect() -> TileEffect:
    """A tile effect with one tau² per urban / rural group on 40 training tiles."""
    params = TileEffectParameters(
        tau2={"urban": 0.25, "rural": 0.25},
        rho=0.9,
        noise_scale=(1.0,),
        components=("meas",),
        latent_scale=1.0,
    )
    tiles = np.repeat([f"a{j:03d}" for j in range(40)], 4)
    return TileEffect(
        params,
        tiles=tiles,
        times=np.tile(np.arange(4.0), 40),
        residual=np.random.default_rng(0).normal(0.0, 0.5, tiles.size),
        var_f=np.full(tiles.size, 0.01),
        components=np.full((tiles.size, 1), 0.5),
        groups=np.where(np.arange(tiles.size) % 8 < 4, "urban", "rural"),
    )


def test_urban_and_rural_tiles_each_get_their_own_place_share() -> None:
    """Urban validation tiles whose levels spread less than the prior, rural ones more: each
    group certifies its own share by the same rule on its tiles alone (urban below the pooled
    share, rural above it and above 1), which the effect's predictions then use row by row;
    a group with fewer than 19 such tiles takes the pooled share."""
    from pipelines.layers import MIN_PLACE_UNITS, choose_place_share, place_share_coverage

    effect = _grouped_effect()
    rows = _grouped_place_rows(100, 100)
    choice = choose_place_share(effect, **rows)
    assert choice.by_group is not None
    assert choice.by_group["urban"] < choice.share < choice.by_group["rural"]
    assert choice.by_group["rural"] > 1.0
    # each group's share is the pooled rule on that group's tiles alone
    for name, flag in (("urban", True), ("rural", False)):
        only = {
            k: (v[rows["urban"] == flag] if isinstance(v, np.ndarray) else v)
            for k, v in rows.items()
        }
        assert choose_place_share(effect, **only).share == choice.by_group[name]
    chosen = copy.copy(effect)
    chosen.params = replace(
        effect.params, place_share=choice.share, place_share_by_group=choice.by_group
    )
    kw = {"times": np.zeros(2), "var_f": np.full(2, 0.01), "components": np.full((2, 1), 0.5)}
    where = {"tiles": np.array(["new-u", "new-r"]), "groups": np.array(["urban", "rural"]), **kw}
    both = chosen.predict(**where)
    for i, name in enumerate(("urban", "rural")):
        alone = chosen.predict(**where, place_share=choice.by_group[name])
        assert both.tile_var[i] == pytest.approx(alone.tile_var[i])
        assert both.tile_var[i] + both.noise_var[i] == pytest.approx(
            alone.tile_var[i] + alone.noise_var[i]
        )
    assert both.tile_var[0] < both.tile_var[1]
    # too few rural tiles: only urban chooses its own; a rural row takes the pooled share
    few = _grouped_place_rows(100, MIN_PLACE_UNITS - 1)
    few_choice = choose_place_share(effect, **few)
    assert few_choice.by_group is not None and set(few_choice.by_group) == {"urban"}
    curve = place_share_coverage(effect, **few)
    assert curve["tiles"] == 100 + MIN_PLACE_UNITS - 1


def test_an_ungrouped_model_has_one_place_share() -> None:
    """Without one tau² per urban / rural group a row's group is not known where it is
    predicted, so no group gets its own share."""
    from pipelines.layers import choose_place_share

    params = TileEffectParameters(
        tau2=0.25, rho=0.9, noise_scale=(1.0,), components=("meas",), latent_scale=1.0
    )
    effect = _effect_on_training_tiles(params, var_f=0.01, seed=1)
    rows = {**_grouped_place_rows(100, 100), "groups": None}
    assert choose_place_share(effect, **rows).by_group is None


def test_group_place_shares_are_saved_and_read_back() -> None:
    """The tile effect's and the local layer's ``place_share_by_group`` survive their
    parameter files; files without it read as ``None``; a share out of range is refused."""

    effect = TileEffectParameters(
        tau2={"urban": 0.2, "rural": 0.3},
        rho=0.9,
        noise_scale=(1.0,),
        components=("meas",),
        place_share=0.5,
        place_share_by_group={"rural": 1.5},
    )
    again = TileEffectParameters.from_dict(json.loads(json.dumps(effect.to_dict())))
    assert again.place_share_by_group == {"rural": 1.5}
    old = effect.to_dict()
    old.pop("place_share_by_group")
    assert TileEffectParameters.from_dict(old).place_share_by_group is None
    assert "place_share_by_group" not in replace(effect, place_share_by_group=None).to_dict()
    layer = SpatialParameters(
        sigma2=0.1, range_km=1.0, tau2={"urban": 0.1}, place_share_by_group={"urban": 0.25}
    )
    assert SpatialParameters.from_dict(layer.to_dict()).place_share_by_group == {"urban": 0.25}
    with pytest.raises(ValueError, match="place_share"):
        replace(effect, place_share_by_group={"urban": 0.0})


def test_validation_tiles_are_scored_from_every_other_conditioning_row() -> None:
    """The place share's coverage scores each validation tile without training rows from
    the training rows and the other validation tiles, as a test tile is predicted from both,
    leaving out its held-out unit: pairs of adjacent validation tiles far above the training
    tiles are covered when each tile is its own unit (its neighbour pulls it up), and not
    when the pair is one held-out block (both left out; the training tiles pull to 0)."""
    from geodbk.geo.quadkey import lonlat_to_tile, tile_to_quadkey
    from geodbk.local_layer import LocalLayer, SpatialParameters
    from pipelines.layers import ValidationRows, validation_share_coverage

    def quadkeys(lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        x, y = lonlat_to_tile(lon, lat, 16)
        return tile_to_quadkey(x, y, np.full_like(x, 16))

    rng = np.random.default_rng(5)
    # 30 pairs of adjacent tiles (about 0.6 km apart), each pair 5 km from the next, with
    # training tiles at 0 between them
    pair_lon = -157.0 + 0.05 * np.arange(30)
    val_lon = np.r_[pair_lon, pair_lon + 0.006]
    val_qk = quadkeys(val_lon, np.full(60, 21.0))
    train_qk = quadkeys(pair_lon + 0.025, np.full(30, 21.0))
    rows = 8
    params = TileEffectParameters(
        tau2=0.01, rho=1.0, noise_scale=(1.0,), components=("meas",), latent_scale=1.0
    )
    level = 1.0 + rng.normal(0.0, 0.02, 30)
    val_y = np.repeat(np.r_[level, level], rows) + rng.normal(0.0, 0.05, 60 * rows)
    tiles = np.r_[np.repeat(train_qk, rows), np.repeat(val_qk, rows)]
    n_train = 30 * rows
    effect = TileEffect(
        params,
        tiles=tiles,
        times=np.tile(np.arange(float(rows)), 90),
        residual=np.r_[rng.normal(0.0, 0.05, n_train), val_y],
        var_f=np.full(tiles.size, 0.01),
        components=np.full((tiles.size, 1), 0.0025),
    )
    spatial = SpatialParameters(
        sigma2=0.5, range_km=2.0, tau2={"all": 0.01}, neighbours=4, lat0=21.0, lon0=-156.3
    )
    xy = tile_positions(np.unique(tiles), lat0=21.0, lon0=-156.3)
    layer = LocalLayer(effect, spatial, tile_xy=xy)
    n = 60 * rows
    val = ValidationRows(
        X=np.zeros((n, 2)),
        y=val_y,
        tiles=np.repeat(val_qk, rows),
        times=np.tile(np.arange(float(rows)), 60),
        noise={},
        tests=np.full(n, 5.0),
        urban=np.zeros(n, dtype=bool),
    )
    by_tile = validation_share_coverage(_LatentGP(), layer, n_train=n_train, val=val)
    pair = np.tile(np.repeat(np.arange(30), rows), 2)
    by_block = validation_share_coverage(
        _LatentGP(), layer, n_train=n_train, val=replace(val, units=pair)
    )
    assert by_tile["tiles"] == by_block["tiles"] == 60
    assert by_block["units"] == 30
    assert by_tile["coverage"][0.05] > 0.9
    assert by_block["coverage"][0.05] < 0.5
    # the same scoring tile by tile: its coverage is the curve's
    from pipelines.layers import validation_tile_levels

    for c in (0.05, 1.0, 3.0):
        levels = validation_tile_levels(
            _LatentGP(), layer, n_train=n_train, val=replace(val, units=pair), place_share=c
        )
        covered = np.abs(levels["error"]) <= 1.959963984540054 * levels["sd"]
        assert len(levels) == 60
        assert covered.mean() == pytest.approx(by_block["coverage"][c])


def test_the_place_share_is_chosen_on_the_map_as_drawn() -> None:
    """Under the GP's prior an unmeasured tile's variance follows its testers' noise. A map
    states it at a typical training row's (``tests_centre``), and the place share is chosen
    on that statement, not on the validation rows' own: busy validation tiles (small noise
    components of their own) whose levels spread by 0.1 need a share above 1 at their own
    testers and one below 1 as the map draws them."""
    from geodbk.tile_effect import UNSEEN_GP
    from pipelines.layers import choose_place_share, with_effect_place_share

    params = TileEffectParameters(
        tau2=5.0,  # the tile effect's own prior far too wide: the validation rows take the GP's
        rho=0.9,
        noise_scale=(0.2,),
        components=("meas",),
        latent_scale=0.2,
        unseen_prior=UNSEEN_GP,
        tests_centre=(0.5,),
    )
    effect = _effect_on_training_tiles(params, var_f=0.01, seed=2)
    val = _unmeasured_validation_rows()
    tiles, y, n = val.tiles, val.y, val.tiles.size
    rows = {
        "tiles": tiles,
        "times": val.times,
        "y": y,
        "mean": np.zeros(n),
        "var_f": np.full(n, 0.01),
        "components": np.full((n, 1), 0.05),
        "groups": None,
        "tests": val.tests,
        "urban": val.urban,
    }
    own = choose_place_share(effect, **rows).share  # type: ignore[arg-type]
    drawn = choose_place_share(effect, tile_components=(0.5,), **rows).share  # type: ignore[arg-type]
    assert drawn < 1.0 < own
    chosen = with_effect_place_share(_LatentGP(), effect, n_train=effect.tiles.size, val=val)
    assert chosen.params.unseen_prior == UNSEEN_GP
    assert chosen.params.place_share == drawn
