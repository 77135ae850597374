"""``geodbk service`` on the quick demo run: the grid, the rasters, ``--at``, the copula and the
errors (a missing model, bad tiers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import rasterio
import xarray as xr
from pipeline_helpers import copy_service_inputs

from geodbk.service import class_probabilities, tier_probabilities
from pipelines import cli
from pipelines.places import load_place_predictor
from pipelines.rundir import RunDir
from pipelines.service import run_service
from pipelines.service_at import output_columns
from pipelines.service_classes import SERVICE_TARGETS, load_service

CLASSES = ("unserved", "underserved", "served")


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the quick demo run with the default service outputs written by the CLI."""
    r = copy_service_inputs(tiny_run, tmp_path_factory.mktemp("service") / "run")
    assert cli.main(["service", "--run", str(r), "--headline-samples", "100"]) == 0
    return r


def test_grid_holds_class_probabilities_with_licence_and_quantity(run: Path) -> None:
    with xr.open_dataset(run / "service" / "classes.nc") as ds:
        inside = ds["in_region"].values
        assert inside.any() and (~inside).any()
        probs = np.stack([ds[f"p_{c}"].values for c in CLASSES])
        assert np.isfinite(probs[:, inside]).all() and np.isnan(probs[:, ~inside]).all()
        assert ((probs[:, inside] >= 0) & (probs[:, inside] <= 1)).all()
        np.testing.assert_allclose(probs[:, inside].sum(axis=0), 1.0, atol=1e-5)
        tiers = np.stack([ds["p_tier_1"].values, ds["p_tier_2"].values])
        np.testing.assert_allclose(probs[0][inside], 1 - tiers[0][inside], atol=1e-6)
        np.testing.assert_allclose(probs[2][inside], tiers[1][inside], atol=1e-6)
        code = ds["service_class"]
        assert code.attrs["flag_meanings"] == "unserved underserved served"
        assert code.attrs["flag_values"].tolist() == [0, 1, 2]
        assert code.encoding["dtype"] == np.int8
        np.testing.assert_array_equal(code.values[inside], probs[:, inside].argmax(axis=0))
        assert np.isnan(code.values[~inside]).all()  # -1 on disk, masked by xarray
        a = ds.attrs
        assert a["license"].startswith("no third-party licence")  # the demo region: synthetic
        assert "synthetic" in a["source"]
        assert a["quantity"] == "tile"
        assert a["quantity_description"].startswith("typical speed at the tile")
        assert a["tiers"] == "25/3,100/20" and float(a["latency_ms"]) == 100.0
        assert len(a["copula_correlation"]) == 9 and int(a["copula_rows"]) >= 30
        for name in (*(f"p_{c}" for c in CLASSES), "p_tier_1", "p_tier_2", "service_class"):
            assert ds[name].attrs["quantity"] == "tile: what the tile here typically gets", name
        assert "latency above 100 ms" in ds["p_unserved"].attrs["long_name"]


def test_rasters_carry_the_licence_and_quantity(run: Path) -> None:
    with xr.open_dataset(run / "service" / "classes.nc") as ds:
        grid_class = ds["service_class"].values
        grid_unserved = ds["p_unserved"].values
    with rasterio.open(run / "service" / "service_class.tif") as src:
        assert src.dtypes == ("uint8",) and src.nodata == 255
        tags = src.tags()
        band = src.read(1)
        (description,) = src.descriptions
    assert "tile: what the tile here typically gets" in description and "0 unserved" in description
    assert tags["license"].startswith("no third-party licence") and "synthetic" in tags["source"]
    assert tags["geodbk_quantity"] == "tile"
    assert tags["geodbk_quantity_description"].startswith("typical speed at the tile")
    assert tags["geodbk_tiers"] == "25/3,100/20"
    expected = np.where(np.isnan(grid_class), 255, grid_class).astype(np.uint8)
    np.testing.assert_array_equal(band, expected)
    with rasterio.open(run / "service" / "p_unserved.tif") as src:
        assert src.dtypes == ("float32",) and src.tags()["geodbk_quantity"] == "tile"
        assert "tile: what the tile here typically gets" in src.descriptions[0]
        values = src.read(1)
    np.testing.assert_array_equal(values, np.where(np.isnan(grid_unserved), -9999, grid_unserved))


def test_grid_matches_the_three_models_and_the_copula(run: Path) -> None:
    """The stage's numbers are the library's: each model's tile quantity at the cell centres,
    joined with the stored copula, at the log10 thresholds of 25/3, 100/20 Mbps and 100 ms."""
    copula = json.loads((run / "service" / "copula.json").read_text())
    R = np.array(copula["correlation"])
    assert copula["targets"] == list(SERVICE_TARGETS) and copula["split"] == "val"
    assert np.linalg.eigvalsh(R).min() > 0 and np.allclose(np.diag(R), 1)
    with xr.open_dataset(run / "service" / "classes.nc") as ds:
        np.testing.assert_allclose(np.reshape(ds.attrs["copula_correlation"], (3, 3)), R, atol=1e-6)
        rows, cols = np.nonzero(ds["in_region"].values)
        pick = np.random.default_rng(0).choice(rows.size, size=50, replace=False)
        lon, lat = ds["x"].values[cols[pick]], ds["y"].values[rows[pick]]
        grid = np.column_stack([ds[f"p_{c}"].values[rows[pick], cols[pick]] for c in CLASSES])
    rd = RunDir(run)
    mean, sd = np.empty((50, 3)), np.empty((50, 3))
    for i, t in enumerate(SERVICE_TARGETS):
        q = load_place_predictor(rd, t, quantity="tile").predict(lon, lat, quantity="tile")
        mean[:, i], sd[:, i] = q.mean, q.sd
    thr = np.array([[np.log10(25e3), np.log10(3e3), 2.0], [np.log10(100e3), np.log10(20e3), 2.0]])
    expected = class_probabilities(tier_probabilities(mean, sd, thr, R))
    np.testing.assert_allclose(grid, expected, atol=2e-6)


def test_copula_predicts_validation_rows_held_out(run: Path) -> None:
    """The saved tile effect conditions on the validation rows; the copula's predictor drops
    them (and is the same object when there is nothing to drop)."""
    rd = RunDir(run)
    predictor = load_place_predictor(rd, "download", quantity="test")
    assert predictor.effect is not None and predictor.layer is not None
    table = pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "quarter", "split"])
    val = table[table["split"] == "val"]
    held = predictor.without_rows(val["quadkey"], val["quarter"])
    assert held is not predictor and held.layer is not None
    from geodbk.geo.timeaxis import quarter_indices

    pairs = set(zip(val["quadkey"], quarter_indices(val["quarter"]).tolist(), strict=True))
    left = set(zip(held.effect.tiles.tolist(), held.effect.times.astype(int).tolist(), strict=True))
    assert not pairs & left
    assert held.effect.tiles.size < predictor.effect.tiles.size
    assert predictor.without_rows(["0" * 16], ["2023Q4"]) is predictor
    service = load_service(rd)
    assert service.copula.rows == int(val.index.size)  # every demo row has all three targets
    # held out, a calibrated model's standardised residuals have sd near 1
    assert all(0.7 < v < 1.3 for v in service.copula.residual_sd.values())


def test_at_file_writes_classes_with_licence(run: Path) -> None:
    tiles = pd.read_parquet(run / "tiles.parquet", columns=["quadkey", "lon", "lat"])
    tiles = tiles.drop_duplicates("quadkey").head(4)
    src = run.parent / "sites.csv"
    pd.DataFrame(
        {
            "site_id": ["a", "b", "c", "d", "far"],
            "lon": [*tiles["lon"], 10.0],
            "lat": [*tiles["lat"], 50.0],
        }
    ).to_csv(src, index=False)
    assert cli.main(["service", "--run", str(run), "--at", str(src)]) == 0
    out = run / "service" / "classes_sites.parquet"
    got = pd.read_parquet(out)
    service = load_service(RunDir(run))
    assert list(got.columns) == ["site_id", "input_lon", "input_lat", *output_columns(service)]
    assert got["site_id"].tolist() == ["a", "b", "c", "d", "far"]
    assert got["outside_region"].tolist() == [False] * 4 + [True]
    probs = got[[f"p_{c}" for c in CLASSES]].to_numpy()
    np.testing.assert_allclose(probs[:4].sum(axis=1), 1.0, atol=1e-12)
    assert np.isnan(probs[4]).all() and pd.isna(got.loc[4, "service_class"])
    assert got.loc[:3, "service_class"].isin(CLASSES).all()
    assert (got.loc[:3, "service_class"] == np.asarray(CLASSES)[probs[:4].argmax(axis=1)]).all()
    assert (got["quantity"] == "tile").all() and got["quarter"].nunique() == 1
    meta = pq.read_schema(out).metadata
    licence = json.loads(meta[b"geodbk_data_licence"])
    assert licence["license"].startswith("no third-party licence")
    described = json.loads(meta[b"geodbk_service"])
    assert described["quantity_description"].startswith("typical speed at the tile")
    assert described["tiers"] == "25/3,100/20" and len(described["copula_correlation"]) == 9


def test_other_tiers_quantity_and_quarter(tiny_run: Path, tmp_path: Path) -> None:
    r = copy_service_inputs(tiny_run, tmp_path / "run")
    first = sorted(pd.read_parquet(r / "tiles.parquet", columns=["quarter"])["quarter"].unique())[0]
    out = run_service(
        r,
        tiers="10/1,25/3,100/20",
        latency_ms=50,
        quantity="area",
        quarter=first,
        fmt="cog",
        headline_samples=20,
    )
    # another quarter than the latest and another quantity than tile: both in every name
    assert out == r / "service" / f"classes_{first}_area.nc"
    assert (r / "service" / f"service_class_{first}_area.tif").is_file()
    assert (r / "service" / f"p_unserved_{first}_area.tif").is_file()
    with xr.open_dataset(out) as ds:
        names = ("unserved", "underserved_1", "underserved_2", "served")
        inside = ds["in_region"].values
        total = sum(ds[f"p_{c}"].values[inside] for c in names)
        np.testing.assert_allclose(total, 1.0, atol=1e-5)
        assert "p_tier_3" in ds and ds["service_class"].attrs["flag_meanings"] == " ".join(names)
        assert ds.attrs["quantity"] == "area" and ds.attrs["quarter"] == first
        assert ds.attrs["quantity_description"].startswith("level of the area")
        assert float(ds.attrs["latency_ms"]) == 50.0
        assert ds["p_unserved"].attrs["quantity"].startswith("area")
    headline = json.loads((r / "service" / f"headline_{first}_area.json").read_text())
    assert headline["classes"] == list(names) and headline["quantity"] == "area"


def test_classes_of_other_tiers_replace_the_grid_with_a_warning(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    r = Path(shutil.copytree(run, tmp_path / "run"))
    with caplog.at_level("WARNING", logger="geodbk"):
        run_service(r, headline_samples=0)  # the same tiers again: nothing to say
    assert "replaced" not in caplog.text
    with caplog.at_level("WARNING", logger="geodbk"):
        run_service(r, tiers="100/20", latency_ms=50, headline_samples=0)
    assert "holds the classes of tiers 25/3,100/20 Mbps with latency <= 100 ms" in caplog.text
    assert "replaced by those of 100/20 Mbps with latency <= 50 ms" in caplog.text


def test_no_quantity_or_quarter_replaces_another_s_classes(run: Path, tmp_path: Path) -> None:
    import shutil

    r = Path(shutil.copytree(run, tmp_path / "run"))
    folder = r / "service"
    tile_grid = folder / "classes.nc"
    with xr.open_dataset(tile_grid) as ds:
        tile_p = ds["p_served"].values
    first = sorted(pd.read_parquet(r / "tiles.parquet", columns=["quarter"])["quarter"].unique())[0]
    assert run_service(r, quantity="area", headline_samples=10) == folder / "classes_area.nc"
    with xr.open_dataset(tile_grid) as ds:  # the tile quantity's grid is still the tile's
        assert ds.attrs["quantity"] == "tile"
        np.testing.assert_array_equal(ds["p_served"].values, tile_p)
    assert json.loads((folder / "headline.json").read_text())["quantity"] == "tile"
    assert json.loads((folder / "headline_area.json").read_text())["quantity"] == "area"
    with xr.open_dataset(folder / "classes_area.nc") as ds:
        assert ds.attrs["quantity"] == "area"
    # --at of another quarter names the quarter; the latest's file is left alone
    places = tmp_path / "sites.csv"
    tiles = pd.read_parquet(r / "tiles.parquet", columns=["lon", "lat"])
    tiles.head(1).to_csv(places, index=False)
    copula = (folder / "copula.json").read_text()
    latest = run_service(r, at=str(places))
    older = run_service(r, at=str(places), quarter=first)
    assert latest == folder / "classes_sites.parquet"
    assert older == folder / f"classes_sites_{first}.parquet"
    assert pd.read_parquet(older)["quarter"].tolist() == [first]
    assert pd.read_parquet(latest)["quarter"].tolist() != [first]
    # the grid set's copula stays the grid's; the places file is named in the output
    assert (folder / "copula.json").read_text() == copula
    assert json.loads((folder / "copula_area.json").read_text())["quarter"] != first
    described = json.loads(pq.read_schema(older).metadata[b"geodbk_service"])
    assert described["at"] == "sites.csv" and len(described["at_sha256"]) == 64
    csv_path = older.with_suffix(".csv")  # the spreadsheet's copy, with what it holds
    assert csv_path.read_text().startswith("# geodbk service --at sites.csv: service classes")
    table = pd.read_csv(csv_path, comment="#", dtype={"quadkey": str})
    np.testing.assert_allclose(table["p_served"], pd.read_parquet(older)["p_served"], rtol=1e-6)


def test_missing_model_names_it_and_the_train_command(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    r = copy_service_inputs(tiny_run, tmp_path / "run", targets=("download", "latency"))
    assert cli.main(["service", "--run", str(r)]) == 5
    err = capsys.readouterr().err
    assert "no trained upload model" in err
    assert f"geodbk train --run {r} --target upload" in err
    assert "download" not in err.split("no trained")[1].split("(")[0]
    assert "Traceback" not in err
    assert not (r / "service").exists()


def test_too_few_validation_rows_stop_with_exit_3(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa

    r = copy_service_inputs(tiny_run, tmp_path / "run")
    table = pq.read_table(r / "tiles.parquet")
    split = np.asarray(table["split"].to_pylist(), dtype=object)
    val = np.flatnonzero(split == "val")
    split[val[10:]] = "test"  # 10 validation rows left
    i = table.schema.get_field_index("split")
    table = table.set_column(i, "split", pa.array(split.tolist(), type=table["split"].type))
    pq.write_table(table, r / "tiles.parquet")
    assert cli.main(["service", "--run", str(r)]) == 3
    err = capsys.readouterr().err
    assert "has 10 rows with download, upload and latency" in err and "at least 30" in err
    assert not (r / "service" / "classes.nc").exists()


@pytest.mark.parametrize(
    ("argv", "code", "match"),
    [
        (["--tiers", "100/20,25/3"], 3, "--tiers: tiers must be nested"),
        (["--tiers", "25-3"], 3, "not DOWN/UP"),
        (["--latency-ms", "0"], 3, "--latency-ms must be a positive"),
        (["--quarter", "2023Q1:2023Q4"], 3, "one quarter"),
    ],
)
def test_bad_options_exit_with_a_message(
    run: Path, argv: list[str], code: int, match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (run / "service" / "classes.nc").stat().st_mtime_ns
    assert cli.main(["service", "--run", str(run), *argv]) == code
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert (run / "service" / "classes.nc").stat().st_mtime_ns == before  # kept


def test_unparsable_latency_is_a_usage_error(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["service", "--run", str(run), "--latency-ms", "fast"])
    assert exc.value.code == 2
    assert "--latency-ms" in capsys.readouterr().err


def test_help_lists_options_and_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["service", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for word in ("--tiers", "--latency-ms", "--quantity", "--at", "examples:", "copula"):
        assert word in text


def test_no_service_output_holds_an_absolute_path(run: Path) -> None:
    needle = str(run.resolve()).encode()
    files = [p for p in (run / "service").iterdir() if p.is_file()]
    assert {"classes.nc", "copula.json", "service_class.tif", "p_unserved.tif"} <= {
        p.name for p in files
    }
    assert not [p.name for p in files if needle in p.read_bytes()]
