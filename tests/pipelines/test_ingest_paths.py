"""``geodbk ingest`` given paths that are not what they should be: a file as ``--run``, a run
directory inside (or as) the ``--tiles`` folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from geo_helpers import make_tiles, write_hive

from pipelines import cli

BBOX = ["--bbox", "-158.3", "21.2", "-157.6", "21.8"]


def _tiles(folder: Path) -> Path:
    write_hive(folder, make_tiles(40).drop(columns="tile"), kind="fixed", year=2023, q=4)
    return folder


@pytest.mark.parametrize("below", ["", "sub"])
def test_a_file_as_the_run_directory_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], below: str
) -> None:
    tiles = _tiles(tmp_path / "tiles")
    points = tmp_path / "pts.csv"
    points.write_text("lon,lat\n-157.9,21.4\n")
    run = points / below if below else points
    code = cli.main(["ingest", "--tiles", str(tiles), "--run", str(run), *BBOX])
    err = capsys.readouterr().err
    assert code == 3 and "Traceback" not in err
    assert f"{points} is a file, not a folder" in err and "--run" in err
    assert points.read_text() == "lon,lat\n-157.9,21.4\n"
    code = cli.main(["train", "--run", str(run), "--target", "download"])
    err = capsys.readouterr().err
    assert code == 5 and f"{points} is a file, not a folder" in err
    assert "does not exist" not in err


def test_a_run_inside_the_tiles_folder_is_left_out_of_the_next_ingest(tmp_path: Path) -> None:
    tiles = _tiles(tmp_path / "tiles")
    argv = ["ingest", "--tiles", str(tiles), "--run", str(tiles / "run"), *BBOX]
    assert cli.main(argv) == 0
    first = json.loads((tiles / "run" / "ingest_report.json").read_text())
    assert cli.main(argv) == 0  # the run's own tables are not read as tiles
    second = json.loads((tiles / "run" / "ingest_report.json").read_text())
    assert second["counts"] == first["counts"] and second["sources"] == first["sources"]
    other = tmp_path / "other"
    assert cli.main(["ingest", "--tiles", str(tiles), "--run", str(other), *BBOX]) == 0
    assert json.loads((other / "ingest_report.json").read_text())["counts"] == first["counts"]


def test_a_run_directory_as_the_tiles_or_the_tiles_folder_as_the_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiles = _tiles(tmp_path / "tiles")
    run = tmp_path / "run"
    assert cli.main(["ingest", "--tiles", str(tiles), "--run", str(run), *BBOX]) == 0
    capsys.readouterr()
    assert cli.main(["ingest", "--tiles", str(run), "--run", str(tmp_path / "r2"), *BBOX]) == 3
    err = capsys.readouterr().err
    assert f"{run}: a geodbk run directory" in err and "--tiles" in err
    assert cli.main(["ingest", "--tiles", str(tiles), "--run", str(tiles), *BBOX]) == 3
    err = capsys.readouterr().err
    assert "is the --tiles folder" in err and "--run" in err
    assert not (tiles / "tiles.parquet").exists()
