"""Headline shares of the service classes: joint samples agree with the class map, intervals
are written with the grid, and the options are checked."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from pipeline_helpers import copy_service_inputs

from pipelines import cli
from pipelines.rundir import RunDir, run_licence
from pipelines.service_classes import load_service
from pipelines.service_headline import class_share_draws, region_cells, subsample


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The quick demo run's inputs and models, with the service outputs written by the CLI."""
    r = copy_service_inputs(tiny_run, tmp_path_factory.mktemp("headline") / "run")
    argv = ["service", "--run", str(r), "--max-cells", "3000", "--headline-samples", "200"]
    assert cli.main(argv) == 0
    return r


def test_headline_has_a_mean_and_interval_per_class(run: Path) -> None:
    headline = json.loads((run / "service" / "headline.json").read_text())
    assert headline["quantity"] == "tile" and headline["samples"] == 200
    assert headline["data_licence"] == run_licence(RunDir(run))
    for kind in ("area", "tiles"):
        shares = headline[kind]
        assert shares["used"] == shares["places"] > 0
        total = sum(shares[c]["mean"] for c in headline["classes"])
        assert total == pytest.approx(1.0, abs=1e-9)
        for c in headline["classes"]:
            # a skewed share (a rare class) can have its mean above the 95% quantile
            assert 0 <= shares[c]["lower"] <= shares[c]["upper"] <= 1
            assert 0 <= shares[c]["mean"] <= 1


def test_sampled_shares_agree_with_the_class_map(run: Path) -> None:
    """With independent targets (identity copula) the mean of the sampled shares is the map's
    expected share: the weighted mean of the cells' class probabilities."""
    rd = RunDir(run)
    service = load_service(rd)
    independent = dataclasses.replace(
        service, copula=dataclasses.replace(service.copula, correlation=np.eye(3))
    )
    lon, lat, weight, _ = region_cells(run / "service" / "classes.nc")
    keep = subsample(len(lon), limit=800)
    lon, lat, weight = lon[keep], lat[keep], weight[keep]
    draws = class_share_draws(independent, lon, lat, weight, samples=400, seed=3)
    np.testing.assert_allclose(draws.draws.sum(axis=0), 1.0, atol=1e-12)
    probs = independent.predict(lon, lat)
    for k, name in enumerate(independent.classes):
        expected = float(np.sum(weight * probs[f"p_{name}"]) / weight.sum())
        mc_error = draws.draws[k].std() / np.sqrt(draws.draws.shape[1]) + 1e-3
        assert abs(draws.draws[k].mean() - expected) < 4 * mc_error, name


@pytest.mark.parametrize("quantity", ["area", "tile"])
def test_sampled_shares_agree_with_the_class_map_under_a_strong_copula(
    run: Path, quantity: str
) -> None:
    """With correlated targets the samples correlate each place's whole deviation as the map
    does, so their mean is the map's expected share for the ``area`` quantity too, whose
    variance is mostly the latent GP's (correlating the tile-level parts alone misses it)."""
    service = load_service(RunDir(run))
    strong = np.array([[1.0, 0.8, -0.6], [0.8, 1.0, -0.5], [-0.6, -0.5, 1.0]])
    service = dataclasses.replace(
        service, quantity=quantity, copula=dataclasses.replace(service.copula, correlation=strong)
    )
    lon, lat, weight, _ = region_cells(run / "service" / "classes.nc")
    keep = subsample(len(lon), limit=800)
    lon, lat, weight = lon[keep], lat[keep], weight[keep]
    draws = class_share_draws(service, lon, lat, weight, samples=400, seed=5)
    probs = service.predict(lon, lat)
    for k, name in enumerate(service.classes):
        expected = float(np.sum(weight * probs[f"p_{name}"]) / weight.sum())
        mc_error = draws.draws[k].std() / np.sqrt(draws.draws.shape[1]) + 1e-3
        assert abs(draws.draws[k].mean() - expected) < 4 * mc_error, name


def test_one_cell_per_place_weights_matter(run: Path) -> None:
    rd = RunDir(run)
    service = load_service(rd)
    lon, lat, _, _ = region_cells(run / "service" / "classes.nc")
    lon, lat = lon[:2], lat[:2]
    only_first = class_share_draws(service, lon, lat, np.array([1.0, 0.0]), samples=50, seed=0)
    alone = class_share_draws(service, lon[:1], lat[:1], np.array([1.0]), samples=50, seed=0)
    np.testing.assert_array_equal(only_first.draws, alone.draws)  # one sample = one class
    assert set(np.unique(alone.draws)) <= {0.0, 1.0}


def test_no_headline_removes_the_earlier_one(run: Path, tmp_path: Path) -> None:
    r = shutil.copytree(run, tmp_path / "run")
    assert (r / "service" / "headline.json").is_file()
    argv = ["service", "--run", str(r), "--max-cells", "3000", "--headline-samples", "0"]
    assert cli.main(argv) == 0
    assert not (r / "service" / "headline.json").exists()
    with xr.open_dataset(r / "service" / "classes.nc") as ds:
        assert "p_served" in ds


@pytest.mark.parametrize("value", ["-1", "100001"])
def test_bad_headline_samples_exit_3(
    run: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (run / "service" / "headline.json").read_bytes()
    assert cli.main(["service", "--run", str(run), "--headline-samples", value]) == 3
    err = capsys.readouterr().err
    assert "--headline-samples" in err and "Traceback" not in err
    assert (run / "service" / "headline.json").read_bytes() == before


def test_a_share_piled_up_at_zero_keeps_its_mean_inside_the_interval() -> None:
    from pipelines.service_headline import ShareDraws

    draws = np.zeros((2, 100))
    draws[0, :3] = 0.5  # 97% of the samples at 0: both quantiles 0, mean 0.015
    draws[1] = np.linspace(0.2, 0.4, 100)
    got = ShareDraws(classes=("unserved", "served"), draws=draws, places=10).summary()
    assert got["unserved"]["mean"] == pytest.approx(0.015)
    for row in got.values():
        assert row["lower"] <= row["mean"] <= row["upper"]
    assert got["served"]["lower"] == pytest.approx(np.quantile(draws[1], 0.05))


def test_the_headline_point_is_the_class_maps_expected_share(run: Path) -> None:
    """One number for the area share: the class grid's exact cos-latitude-weighted mean
    probability over every in-region cell, inside its own interval."""
    headline = json.loads((run / "service" / "headline.json").read_text())
    service = load_service(RunDir(run))
    _, _, weight, probs = region_cells(run / "service" / "classes.nc", service.classes)
    for name in service.classes:
        row = headline["area"][name]
        expected = float(np.sum(weight * probs[name]) / weight.sum())
        assert row["mean"] == pytest.approx(expected, abs=1e-12)
        assert row["lower"] <= row["mean"] <= row["upper"]


def test_the_headline_names_the_status_of_its_quarter(run: Path) -> None:
    """An observed quarter is recorded as such; a quarter past the trained ones as an
    extrapolation, as the class grid's ``quarter_status`` attribute says."""
    headline = json.loads((run / "service" / "headline.json").read_text())
    assert headline["quarter_status"] == "observed"
    argv = ["service", "--run", str(run), "--max-cells", "3000", "--headline-samples", "20"]
    assert cli.main([*argv, "--quarter", "2024Q2"]) == 0
    later = json.loads((run / "service" / "headline_2024Q2.json").read_text())
    with xr.open_dataset(run / "service" / "classes_2024Q2.nc") as grid:
        status = str(grid.attrs["quarter_status"])
    assert status.startswith("extrapolation beyond") and later["quarter_status"] == status
