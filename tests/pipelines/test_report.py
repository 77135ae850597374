"""``geodbk report`` out of core (issue 8): no tile GeoDataFrame, same numbers as in memory.

The run has four quarters of the same tiles (so quadkeys repeat), tiny row groups (so every
streaming pass sees many record batches) and ``urban`` flipped in later quarters (so the
service-coverage table must take each tile's *first* values, as ``groupby().first()`` does).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pipeline_helpers import make_run
from scipy.special import ndtr

import geodbk.geo.table as tile_table
import pipelines.report
import pipelines.rundir
from geodbk import DBKRegressor
from geodbk.errors import DataError
from geodbk.geo.table import read_tile_table, write_tile_table
from geodbk.quantities import predict_quantity
from pipelines import figures
from pipelines.config import demo_config
from pipelines.predict import grid_bounds
from pipelines.report import PREDICTION_COLUMNS, SERVED_PROB, run_report, scan_tiles
from pipelines.run_inputs import read_region
from pipelines.rundir import RunDir, model_inputs, target_spec
from pipelines.scoring import by_quarter_scores, by_tests_scores, urban_rural_scores
from pipelines.train import run_train

CFG = demo_config(quick=True).replace(epochs=2)
QUARTERS = ("2023Q1", "2023Q2", "2023Q3", "2023Q4")
#: The report predicts per record batch; float32 kernels differ by ~1e-9 with the batch size.
ATOL = 1e-6


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four quarters of 240 tiles in row groups of 53 rows; a time-aware, tests-aware download
    model and a pooled upload model."""
    r = make_run(tmp_path_factory.mktemp("report_streaming") / "run", n=240, seed=4)
    table, meta = read_tile_table(r)
    rng = np.random.default_rng(7)
    parts = []
    for k, q in enumerate(QUARTERS):
        p = table.copy()
        p["quarter"] = q
        for col, step in (("log10_download", 0.06), ("log10_upload", 0.03)):
            p[col] = p[col] + step * k + 0.05 * rng.standard_normal(len(p))
        p["avg_d_kbps"] = 10 ** p["log10_download"]
        p["avg_u_kbps"] = 10 ** p["log10_upload"]
        p["split"] = rng.choice(["train", "val", "test"], size=len(p), p=[0.7, 0.15, 0.15])
        p["tests"] = rng.integers(1, 40, size=len(p))
        if k > 0:
            p["urban"] = ~table["urban"].to_numpy()  # only the first quarter's value counts
        parts.append(p)
    both = gpd.GeoDataFrame(pd.concat(parts, ignore_index=True), crs=table.crs)
    meta["quarters"] = list(QUARTERS)
    meta["split"]["counts"] = {s: int((both["split"] == s).sum()) for s in ("train", "val", "test")}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tile_table, "ROW_GROUP_SIZE", 53)
        write_tile_table(both, r / "tiles.parquet", meta)
    assert pq.ParquetFile(r / "tiles.parquet").num_row_groups > 10
    # the GP alone (tile_effect off): the scores are recomputed from model.predict below
    cfg = CFG.replace(tile_effect="off")
    run_train(r, target="download", config=cfg, time=True, progress=False)
    run_train(r, target="upload", config=cfg.replace(epochs=1, noise="constant"), progress=False)
    return r


def _forbid_table_loads(mp: pytest.MonkeyPatch) -> None:
    """Make every whole-table reader raise."""

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the report must not load the whole tile table")

    mp.setattr(pipelines.rundir, "load_tiles", boom)
    mp.setattr(pipelines.report, "load_tiles", boom, raising=False)
    mp.setattr(tile_table, "read_tile_table", boom)
    mp.setattr(gpd, "read_parquet", boom)
    mp.setattr(pd, "read_parquet", boom)


def _expected(run: Path, target: str) -> dict[str, Any]:
    """Everything the report computes, recomputed in memory from the GeoDataFrame."""
    table, _ = read_tile_table(run)
    spec = target_spec(target)
    model = DBKRegressor.load(run / "models" / target, device="cpu")
    md = model.metadata_

    def predict(rows: pd.DataFrame, quarter: Any) -> Any:
        X = model_inputs(rows[["x1", "x2"]].to_numpy(dtype=float), md, quarter=quarter)
        tests = rows["tests"].to_numpy(dtype=float) if model.tests_aware else None
        devices = rows["devices"].to_numpy(dtype=float) if model.devices_aware else None
        return model.predict_dist(X, tests=tests, devices=devices)

    y_train = table.loc[table["split"] == "train", spec.log_column].to_numpy(dtype=float)
    test = table[table["split"] == "test"].reset_index(drop=True)
    pred = predict(test, test["quarter"].to_numpy())
    tiles = table.groupby("quadkey", sort=True).agg(
        x1=("x1", "first"), x2=("x2", "first"), urban=("urban", "first")
    )
    time_aware = "t" in md["inputs"]
    # service coverage judges a tile on the tile quantity (no tile effect: f + noise floor)
    tile_pred = predict_quantity(
        model,
        model_inputs(tiles[["x1", "x2"]].to_numpy(dtype=float), md, quarter="2023Q4"),
        quantity="tile",
    )
    held = table[table["split"].isin(["val", "test"])]
    h_pred = predict(held, held["quarter"].to_numpy())
    bounds = grid_bounds(RunDir(run), read_region(RunDir(run)).bounds, extent="tiles")
    emp, _, _ = figures.binned_sd(
        held["lon"].to_numpy(),
        held["lat"].to_numpy(),
        held[spec.log_column].to_numpy() - h_pred.mean,
        h_pred.std,
        bounds,
    )
    return {
        "spec": spec,
        "time_aware": time_aware,
        "devices_aware": model.devices_aware,
        "sd_train": float(np.std(y_train)),
        "mean_train": float(np.mean(y_train)),
        "test": test,
        "mean": pred.mean,
        "std": pred.std,
        "tiles": tiles,
        "tile_mean": tile_pred.mean,
        "tile_std": tile_pred.sd,
        "n_cells": int(np.isfinite(emp).sum()),
    }


def _close(got: Any, want: Any, path: str = "") -> None:
    """Recursive comparison: ints and strings exact, floats to :data:`ATOL`, NaN as None."""
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), path  # metrics.json has sorted keys
        for k in want:
            _close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, float | np.floating) and not np.isfinite(want):
        assert got is None, path
    elif isinstance(want, float | np.floating):
        assert got == pytest.approx(float(want), rel=ATOL, abs=ATOL), path
    else:
        assert got == want, path


@pytest.mark.parametrize("target", ["download", "upload"])
def test_report_streams_and_matches_in_memory_scores(run: Path, target: str) -> None:
    exp = _expected(run, target)
    # thresholds (natural units) at quartiles of the tiles' served limits: shares inside (0, 1)
    limit = exp["spec"].to_natural(exp["tile_mean"] - 1.2816 * exp["tile_std"])
    thresholds = [float(v) for v in np.quantile(limit, [0.25, 0.5, 0.75])]
    with pytest.MonkeyPatch.context() as mp:
        _forbid_table_loads(mp)
        out = run_report(run, target=target, thresholds=thresholds)
    test = exp["test"]
    y = test[exp["spec"].log_column].to_numpy(dtype=float)
    urban = test["urban"].to_numpy(dtype=bool)
    tests = test["tests"].to_numpy(dtype=float)

    # predictions.parquet: every test row, in table order, with the model's own predictions
    preds = pq.read_table(out / "predictions.parquet").to_pandas()
    # a tests+devices model (the in-memory default on these tiles) adds each row's devices
    extra = ["devices"] if exp["devices_aware"] else []
    assert list(preds.columns) == [*PREDICTION_COLUMNS, *extra]
    assert len(preds) == len(test) > 100
    for col in ("quadkey", "quarter", "urban", "lon", "lat"):
        assert (preds[col].to_numpy() == test[col].to_numpy()).all(), col
    assert np.array_equal(preds["y"].to_numpy(), y)
    assert np.array_equal(preds["tests"].to_numpy(), tests)
    assert np.allclose(preds["mean"], exp["mean"], rtol=0, atol=ATOL)
    assert np.allclose(preds["std"], exp["std"], rtol=0, atol=ATOL)

    # metrics.json: urban / rural / all, by_tests and by_quarter from the in-memory predictions
    sd = exp["sd_train"]
    want = dict(urban_rural_scores(y, exp["mean"], exp["std"], urban, sd_train=sd))
    want["by_tests"] = by_tests_scores(y, exp["mean"], exp["std"], urban, tests)
    want["by_quarter"] = by_quarter_scores(y, exp["mean"], exp["std"], urban, test["quarter"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert list(metrics["by_quarter"]) == list(QUARTERS)
    calibration = metrics.pop("map_calibration")
    assert calibration["quantity"] == "tile" and {"tile", "area"} <= set(calibration)
    _close(metrics, want)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["y_train_mean"] == pytest.approx(exp["mean_train"], rel=1e-12)
    assert summary["y_train_sd"] == pytest.approx(sd, rel=1e-12)
    base = urban_rural_scores(
        y, np.full_like(y, exp["mean_train"]), np.full_like(y, sd), urban, sd_train=sd
    )
    _close(summary["baseline_constant_mean"], base)

    # service coverage over the distinct tiles (first values), at the latest quarter if timed
    assert summary["time"]["service_coverage_quarter"] == ("2023Q4" if exp["time_aware"] else None)
    # ... and every row, the section's text and the figure name that quarter (no grid: no area's)
    quarter = "2023Q4" if exp["time_aware"] else f"pooled {QUARTERS[0]}:{QUARTERS[-1]}"
    for r in summary["service_coverage"]:
        assert r["quarter"] == quarter and r["area_quarter"] is None
        assert r["quarter_status"] in (
            ("observed",)
            if exp["time_aware"]
            else ("pooled", f"pooled; tile offsets at {QUARTERS[-1]}")
        )
    judged = f"Judged at {'quarter ' if exp['time_aware'] else ''}{quarter}"
    assert judged in (out / "report.md").read_text(encoding="utf-8")
    # the NLL's unit, in the benchmark's words
    assert "NLL = mean Gaussian negative log-likelihood in nats per test row" in (
        out / "report.md"
    ).read_text(encoding="utf-8")
    spec, tiles = exp["spec"], exp["tiles"]
    t_urban = tiles["urban"].to_numpy(dtype=bool)
    assert 0 < t_urban.sum() < len(tiles) == 240
    rows = summary["service_coverage"]
    assert [r["threshold"] for r in rows] == thresholds
    shares = []
    for r in rows:
        z = (spec.natural_to_log10(r["threshold"]) - exp["tile_mean"]) / exp["tile_std"]
        served = (1.0 - ndtr(z)) >= SERVED_PROB
        assert r["n_tiles"] == len(tiles)
        assert r["tiles"] == pytest.approx(served.mean(), abs=1e-12)
        assert r["urban"] == pytest.approx(served[t_urban].mean(), abs=1e-12)
        assert r["rural"] == pytest.approx(served[~t_urban].mean(), abs=1e-12)
        shares.append(r["tiles"])
    assert all(0.1 < s < 0.9 for s in shares), shares  # the comparison is not trivially 0 or 1

    # sd maps of the held-out rows, on the grid cut to the tiles
    assert summary["sd_map"]["n_cells"] == exp["n_cells"] > 0
    assert (out / "figures" / "sd_maps.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.glob(".*"))  # no temporary file left behind


def test_report_errors_without_test_rows_or_split(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("report"))
    table = pq.read_table(copy / "tiles.parquet")
    split = table.column("split").to_numpy(zero_copy_only=False)
    split = np.where(split == "test", "val", split)
    relabel = table.set_column(
        table.schema.get_field_index("split"), "split", pa.array(split.astype(object))
    )
    pq.write_table(relabel, copy / "tiles.parquet")
    with pytest.raises(DataError, match="no test rows"):
        run_report(copy, target="download")
    pq.write_table(table.drop_columns(["split"]), copy / "tiles.parquet")
    with pytest.raises(DataError, match="no 'split' column"):
        run_report(copy, target="download")


def test_scan_tiles_matches_groupby_first(tmp_path: Path) -> None:
    """Tiny batches and merges: first values per quadkey in order of appearance, as pandas."""
    rng = np.random.default_rng(3)
    n = 400
    df = pd.DataFrame(
        {
            "quadkey": rng.choice([f"0231{i:03d}" for i in range(90)], size=n),
            "quarter": rng.choice(["2022Q4", "2023Q2", "2021Q1"], size=n),
            "x1": rng.uniform(-1, 1, n),
            "x2": rng.uniform(-1, 1, n),
            "urban": rng.random(n) < 0.5,
            "lon": rng.uniform(-158, -157, n),
            "lat": rng.uniform(21, 22, n),
        }
    )
    path = tmp_path / "t.parquet"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=23)
    want = df.groupby("quadkey", sort=False)[["x1", "x2", "urban"]].first()
    for compact in (1, 10, 1 << 20):
        scan = scan_tiles(path, quarters=True, batch_size=7, compact_rows=compact)
        got = scan.tiles.to_pandas()
        assert got["quadkey"].tolist() == want.index.tolist()
        for col in ("x1", "x2", "urban"):
            assert np.array_equal(got[col].to_numpy(), want[col].to_numpy()), (compact, col)
        assert scan.quarters == ["2021Q1", "2022Q4", "2023Q2"]
        assert scan.extent == (df["lon"].min(), df["lat"].min(), df["lon"].max(), df["lat"].max())


def test_the_tile_effect_section_names_its_tests_shift() -> None:
    from pipelines.report import _tests_shift_text

    params = {"components": ["floor", "meas", "dev"], "tests_shift": [0.0, -1.25, -0.5]}
    text = _tests_shift_text(params)
    assert "meas × -1.25" in text and "dev × -0.50" in text and "floor" not in text
    assert _tests_shift_text({"components": ["floor"], "tests_shift": [0.0]}) == ""
    assert _tests_shift_text({"components": ["floor", "meas"]}) == ""  # files before it
    dropped = {
        "components": ["floor", "meas", "dev"],
        "tests_shift": [0.0, 0.0, 0.0],
        "tests_shift_dropped": [0.0, 0.28, -2.2],
    }
    text = _tests_shift_text(dropped)
    assert "meas × +0.28" in text and "dev × -2.20" in text and "was dropped" in text


#: A local layer's parameters as ``metrics.json`` holds them, for the section's tests.
_LAYER_PARAMS = {
    "range_km": 1.5,
    "sigma2": 0.05,
    "neighbours": 16,
    "tau2": {"all": 0.1},
    "val_nll": 0.6,
    "val_nll_without": 0.62,
}


def test_the_local_layer_section_states_the_place_share() -> None:
    """The share an unmeasured tile keeps, and the rule that chose it; 1 (or a file without
    it) says the whole prior is kept."""
    from pipelines.report import _local_layer_section
    from pipelines.report_doc import Doc

    params = _LAYER_PARAMS
    for share, want in ((0.25, "place share 0.25"), (1.0, "whole prior"), (None, "whole prior")):
        doc = Doc("r")
        _local_layer_section(doc, {**params, "place_share": share})
        text = doc.markdown()
        assert want in text
        assert ("0.95 (K + 1) / K" in text) == (share == 0.25)
    for share, basis, want in (
        (
            1.0,
            {"tiles": 151, "units": 7},
            "151 well-measured validation tiles without training "
            "rows, which lie in 7 held-out blocks, cannot certify another (19 blocks are needed)",
        ),
        (1.0, {"tiles": 12, "units": 12}, "only 12 well-measured validation tiles"),
        (1.0, {"tiles": 115, "units": 115}, "place share 1.00 of its prior offset variance"),
        (1.0, {"tiles": 115, "units": 115}, "the prior as stated"),
        (1.5, {"tiles": 115, "units": 115}, "taken from one test's own noise"),
        (1.5, {"tiles": 115, "units": 115}, "chosen on 115 well-measured validation tiles"),
        (3.0, {"tiles": 115, "units": 115}, "where none covers that many, the widest, 3"),
        (0.2, {"tiles": 115, "units": 115}, "chosen on 115 well-measured validation tiles"),
        (0.3, {"tiles": 400, "units": 40}, "which lie in 40 held-out blocks."),
    ):
        doc = Doc("r")
        _local_layer_section(doc, {**params, "place_share": share, "place_share_basis": basis})
        assert want in doc.markdown(), (basis, doc.markdown())
        assert "their tiles alone" not in doc.markdown()  # no group chose its own
    doc = Doc("r")
    basis = {"tiles": 115, "units": 115}
    own = {"place_share_by_group": {"urban": 0.05, "rural": 1.25}}
    _local_layer_section(doc, {**params, "place_share": 0.1, "place_share_basis": basis, **own})
    assert "by the same rule on their tiles alone: rural 1.25, urban 0.05." in doc.markdown()


def test_the_place_share_sentence_names_the_split_s_unit() -> None:
    """Blocks are named only on a block split (elsewhere each tile is its own unit and only the
    number of tiles can fall short), and one block is 'block'."""
    from geodbk.metrics import clustered_checks_caveat
    from pipelines.report import _local_layer_section
    from pipelines.report_doc import Doc

    params = {**_LAYER_PARAMS, "place_share": 1.0, "place_share_basis": None}
    for kind in ("random", "forecast", "tile"):
        doc = Doc("r")
        _local_layer_section(doc, params, split_kind=kind)
        text = doc.markdown()
        assert "too few well-measured validation tiles without training rows (30 are needed)" in (
            text
        )
        assert "block" not in text, (kind, text)
    doc = Doc("r")
    _local_layer_section(doc, params, split_kind="block")
    assert "too few held-out blocks holding them (19 are needed)" in doc.markdown()
    doc = Doc("r")
    _local_layer_section(doc, {**params, "place_share": 0.4, "place_share_basis": {"tiles": 60, "units": 60}}, split_kind="tile")  # fmt: skip
    text = doc.markdown()
    assert "of the K well-measured validation tiles without training rows (split conformal)" in (
        text
    )
    assert "block" not in text
    doc = Doc("r")
    basis = {"tiles": 16, "units": 1}
    _local_layer_section(doc, {**params, "place_share_basis": basis}, split_kind="block")
    assert "which lie in 1 held-out block," in doc.markdown()
    caveat = clustered_checks_caveat(16, 1)
    assert (
        "lie in 1 held-out block, and" in caveat and "nearer 1 independent place than 16" in caveat
    )
    assert "lie in 4 held-out blocks" in clustered_checks_caveat(16, 4)


def test_the_local_layer_section_sets_the_gp_alone_beside_it() -> None:
    """The GP alone's validation NLL is stated beside the layer's; files without it read as
    before."""
    from pipelines.report import _local_layer_section
    from pipelines.report_doc import Doc

    params = {**_LAYER_PARAMS, "place_share": 1.0}
    for gp, stated in ((0.372, "0.372 for the GP alone"), (None, None)):
        doc = Doc("r")
        _local_layer_section(doc, {**params, "val_nll_gp": gp})
        text = doc.markdown()
        assert ("for the GP alone" in text) == (stated is not None)
        assert stated is None or stated in text


def test_the_local_layer_section_names_the_prior_of_a_tile_never_measured() -> None:
    """The unseen prior the layer chose is stated with both validation NLLs; files without
    the choice say nothing of it."""
    from pipelines.report import _local_layer_section
    from pipelines.report_doc import Doc

    params = {**_LAYER_PARAMS, "place_share": 1.0}
    scores = {"gp": 0.353, "tile effect": 0.390}
    for prior, says in (("gp", "the GP's own spread"), ("tile effect", "the tile effect's τ²")):
        doc = Doc("r")
        _local_layer_section(doc, {**params, "unseen_prior": prior, "val_nll_unseen": scores})
        text = doc.markdown()
        assert f"gets {says}" in text
        assert "validation NLL 0.353 with the GP's, 0.390 with the tile effect's" in text
    doc = Doc("r")
    _local_layer_section(doc, params)
    assert "never measured gets" not in doc.markdown()


#: A tile effect's saved parameters, as the report's tile-effect section reads them.
_EFFECT_PARAMS: dict[str, Any] = {
    "components": ["floor", "meas"],
    "noise_scale": [0.0, 0.9],
    "tau2": {"rural": 0.1, "urban": 0.2},
    "rho": 0.9,
    "val_nll": 0.6,
    "val_nll_without": 0.8,
}


def test_the_tile_effect_alone_names_the_prior_of_a_tile_never_measured() -> None:
    """Without a local layer the tile effect's section states the unmeasured prior it chose;
    with one, the layer's section does."""
    from pipelines.report import _tile_effect_section
    from pipelines.report_doc import Doc

    params = {
        **_EFFECT_PARAMS,
        "unseen_prior": "gp",
        "val_nll_unseen": {"gp": 0.5, "tile effect": 0.6},
    }
    for with_layer in (False, True):
        doc = Doc("r")
        _tile_effect_section(doc, params, with_layer=with_layer)
        assert ("gets the GP's own spread" in doc.markdown()) != with_layer


def test_the_tile_effect_section_says_what_an_unseen_tile_gets() -> None:
    from pipelines.report import _tile_effect_section
    from pipelines.report_doc import Doc

    params = _EFFECT_PARAMS
    for with_layer in (False, True):
        doc = Doc("r")
        _tile_effect_section(doc, params, with_layer=with_layer)
        text = doc.markdown()
        assert "prior variance of error and offset" in text
        assert ("measured neighbours' pull (local layer, below)" in text) == with_layer


def test_the_tile_effect_section_of_a_training_holdout_says_so() -> None:
    """On a tile or block split no test tile has quarters to learn from, and the NLL quoted is
    the training hold-out's, not a validation NLL."""
    from pipelines.report import _tile_effect_section
    from pipelines.report_doc import Doc

    params = {
        "components": ["floor", "meas"],
        "noise_scale": [1e-8, 1.57],
        "tau2": {"all": 0.1},
        "rho": 0.9,
        "latent_scale": 1e-6,
        "val_nll": 0.6,
        "val_nll_without": 0.8,
        "objective": "training hold-out",
        "objective_rows": 282,
    }
    doc = Doc("r")
    _tile_effect_section(doc, params)
    text = doc.markdown()
    assert "no test tile has any" in text and "Held-out training NLL 0.800" in text
    assert "Validation NLL" not in text and "× 1e-06" in text  # not "× 0.00"
    doc = Doc("r")
    _tile_effect_section(doc, {**params, "objective": "validation"})
    assert "Validation NLL" in doc.markdown() and "its other quarters" in doc.markdown()


def test_the_tests_section_says_when_the_tile_effect_rescaled_the_noise() -> None:
    from pipelines.report import _by_tests_section
    from pipelines.report_doc import Doc

    noise = {"noise": "tests", "s2_floor": 0.1, "s2_meas": 0.14, "power": 1.0}
    for rescaled in (False, True):
        doc = Doc("r")
        _by_tests_section(doc, {}, noise, rescaled=rescaled)
        assert ("rescaled by the tile effect" in doc.markdown()) == rescaled


def test_the_coverage_quarter_names_the_tiles_and_a_differing_map() -> None:
    from pipelines.report import coverage_quarter_text

    row = {"quarter": "2023Q4", "quarter_status": "observed", "area_quarter": "2023Q4"}
    assert coverage_quarter_text([row]) == "2023Q4"
    old_map = {**row, "area_quarter": "2023Q3", "area_quarter_status": "observed"}
    assert coverage_quarter_text([old_map]) == "2023Q4; area: 2023Q3"
    pooled = {"quarter": "pooled 2022Q1:2023Q4", "quarter_status": "pooled; tile offsets at 2023Q4"}
    assert coverage_quarter_text([pooled]) == "pooled 2022Q1:2023Q4 (tile offsets at 2023Q4)"
    assert coverage_quarter_text([{"label": "≥ 25 Mbps"}]) is None  # an older summary.json
