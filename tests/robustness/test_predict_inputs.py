"""Probes of ``geodbk predict``: bad numeric options, damaged model files and outputs that
would be empty or non-finite. Each probe checks the documented exit code, a message naming the
option or file and the fix (no traceback), and that the grid written before is unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelines import cli


@pytest.fixture(scope="module")
def run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    r = tmp_path_factory.mktemp("probe_predict") / "run"
    shutil.copytree(tiny_run, r)
    return r


def _predict(run: Path, *extra: str) -> list[str]:
    return ["predict", "--run", str(run), "--target", "download", *extra]


def _probe(
    run: Path, argv: list[str], capsys: pytest.CaptureFixture, *, code: int, names: tuple[str, ...]
) -> str:
    grid = run / "grids" / "download.nc"
    before = grid.read_bytes()
    try:
        got = cli.main(argv)
    except SystemExit as exc:  # argparse's usage errors exit with 2 after printing usage
        got = int(exc.code or 0)
    assert got == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for name in names:
        assert name in err, (name, err)
    assert grid.read_bytes() == before  # the earlier output is untouched
    return err


@pytest.mark.parametrize(
    ("option", "value", "names"),
    [
        ("--resolution", "0", ("--resolution", "positive")),
        ("--resolution", "-0.01", ("--resolution", "positive")),
        ("--resolution", "nan", ("--resolution", "positive")),
        ("--resolution", "inf", ("--resolution", "positive")),
        ("--resolution", "1000", ("too coarse", "--resolution below")),
        ("--tile-zoom", "-1", ("--tile-zoom", "1 to 23")),
        ("--tile-zoom", "30", ("--tile-zoom", "1 to 23")),
        ("--max-cells", "0", ("--max-cells", "at least 1")),
        ("--max-cells", "-5", ("--max-cells", "at least 1")),
        ("--quantity", "latent", ("--quantity",)),
    ],
)
def test_bad_grid_options_are_refused(
    run: Path, option: str, value: str, names: tuple[str, ...], capsys: pytest.CaptureFixture
) -> None:
    code = 2 if option == "--quantity" else 3  # argparse choices: usage error
    _probe(run, _predict(run, option, value), capsys, code=code, names=names)


def test_a_grid_beyond_max_cells_needs_force(run: Path, capsys: pytest.CaptureFixture) -> None:
    err = _probe(
        run,
        _predict(run, "--resolution", "0.0001"),
        capsys,
        code=3,
        names=("--max-cells 1,000,000", "--force", "GB of output"),
    )
    assert "cells" in err


def test_a_damaged_model_scale_is_refused(
    run: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    path = broken / "models" / "download" / "model.json"
    doc = json.loads(path.read_text())
    doc["standardization"]["y_std"] = float("nan")
    path.write_text(json.dumps(doc))
    _probe(broken, _predict(broken), capsys, code=4, names=("model.json", "retrain"))


def test_non_finite_predictions_keep_the_earlier_grid(
    run: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import numpy as np

    from pipelines import predict

    real = predict.predict_block

    def broken(*args: object, **kwargs: object) -> dict:
        out = real(*args, **kwargs)  # type: ignore[arg-type]
        out["mean"] = np.full_like(out["mean"], np.nan)
        return out

    monkeypatch.setattr(predict, "predict_block", broken)
    _probe(run, _predict(run), capsys, code=3, names=("non-finite 'mean'", "earlier file"))
    assert not list((run / "grids").glob(".download.nc.*"))  # no spool left behind


def test_a_run_path_with_any_unicode_predicts_and_exports(tiny_run: Path, tmp_path: Path) -> None:
    import xarray as xr

    r = tmp_path / "rün ✓ 東京" / "run"
    shutil.copytree(tiny_run, r)
    (r / "grids" / "download.nc").unlink()
    assert cli.main(_predict(r)) == 0
    assert cli.main(["export", "--run", str(r), "--target", "download"]) == 0
    with xr.open_dataset(r / "grids" / "download.nc") as ds:
        assert ds.attrs["Conventions"].startswith("CF-")
        assert ds["mean"].encoding.get("zlib") or ds["mean"].encoding.get("compression")
        assert int(ds["in_region"].sum()) > 0
    assert (r / "exports" / "download.tif").stat().st_size > 0
