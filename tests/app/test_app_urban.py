"""The dashboard with a model whose noise floor depends on the urban/rural class."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from apptest_helpers import AppFactory, assert_clean, open_tab, tab, texts

from pipelines.config import TrainConfig
from pipelines.predict import run_predict
from pipelines.train import run_train


@pytest.fixture(scope="module")
def urban_root(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the quick demo run whose download model has a floor per urban/rural class."""
    root = tmp_path_factory.mktemp("urban_runs")
    run = root / "demo"
    shutil.copytree(tiny_run, run)
    cfg = TrainConfig(rank=16, hidden=8, epochs=3, patience=3, batch_size=256, device="cpu")
    run_train(run, target="download", config=cfg, noise="tests+devices+urban", progress=False)
    run_predict(run, target="download")
    return root, "demo"


def test_map_and_inspect_use_the_class_floor(
    make_app: AppFactory, urban_root: tuple[Path, str]
) -> None:
    from app import loaders, maps

    root, name = urban_root
    path = root / name / "grids" / "download.nc"
    grid = loaders.load_grid(str(path), loaders.stamp(path), "download")
    inside = grid.in_region
    urban = grid.arrays["urban"][inside] == 1.0
    assert 0 < urban.mean() < 1
    # the K-tests layer: each cell's floor, a step between the classes at equal std_f
    sd = maps.layer_values(grid, maps.LayerSpec("std", quantity="average", tests=4))[inside]
    s2 = sd**2 - grid.arrays["std_f"][inside] ** 2
    a = grid.attrs
    step = a["noise_s2_floor_urban"] - a["noise_s2_floor"]
    np.testing.assert_allclose(s2[urban] - s2[~urban].mean(), step, atol=1e-5)

    at = make_app(root, name)
    at.run()
    assert_clean(at)
    at.selectbox(key="layer").set_value("pi_width").run()
    at.selectbox(key="quantity").set_value("single").run()
    assert_clean(at)
    # a town point: the model is evaluated there with the urban floor (no fallback warning)
    rows, cols = np.nonzero(inside & (np.nan_to_num(grid.arrays["urban"]) == 1.0))
    at.session_state["inspect_point"] = (float(grid.lon[cols[0]]), float(grid.lat[rows[0]]))
    at.run()
    inspect = open_tab(at, "Inspect a point")
    # the headline is the Map tab's single test at the cell; the caption the GP at the point
    assert "**test: single speed test**" in texts(inspect, "markdown")
    assert any("The GP alone at this exact point" in c for c in texts(inspect, "caption"))
    assert not texts(tab(at, "Inspect a point"), "warning")
    area = [m for m in texts(inspect, "markdown") if m.startswith("**Area:**")]
    assert area and "urban" in area[0]
