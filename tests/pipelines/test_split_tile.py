"""``geodbk ingest --split tile`` on the embedded synthetic region (leave-tile-out)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from geodbk.geo.splits import split_sentence
from geodbk.geo.table import read_tile_table, tile_split
from pipelines import cli
from pipelines.ingest import demo_ingest_kwargs, run_ingest


@pytest.fixture(scope="module")
def tile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("tile_split") / "run"
    run_ingest(run=run, **{**demo_ingest_kwargs(), "split": "tile", "seed": 3})
    return run


def test_every_quarter_of_a_held_out_tile_is_held_out(tile_run: Path) -> None:
    t, meta = read_tile_table(tile_run / "tiles.parquet")
    info = meta["split"]
    assert info["kind"] == "tile" and info["unit"] == "tile" and info["seed"] == 3
    labels = t.groupby("quadkey")["split"].agg(lambda s: set(s))
    assert (labels.map(len) == 1).all()  # one label per tile, whichever quarters it has
    per_tile = labels.map(lambda s: next(iter(s))).value_counts().to_dict()
    n_tiles = t["quadkey"].nunique()
    assert per_tile == info["tiles"]
    assert info["tiles"]["test"] == info["tiles"]["val"] == round(0.1 * n_tiles)
    assert info["counts"] == t["split"].value_counts().to_dict()
    assert sum(info["counts"].values()) == len(t)
    train = set(t.loc[t["split"] == "train", "quadkey"])
    for name in ("val", "test"):
        assert not set(t.loc[t["split"] == name, "quadkey"]) & train
    # the labels are tile_split's, seeded
    again, _ = tile_split(t["quadkey"].to_numpy(), seed=3)
    assert (np.asarray(again) == t["split"].to_numpy()).all()
    on_disk = json.loads((tile_run / "ingest_report.json").read_text())
    assert on_disk["split"]["tiles"] == info["tiles"]


def test_the_split_is_named_in_the_log_and_the_report(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="geodbk"):
        run_ingest(
            run=tmp_path / "r", **{**demo_ingest_kwargs(), "split": "tile", "quarters": "2023Q4"}
        )
    line = next(r.getMessage() for r in caplog.records if "ingest: split" in r.getMessage())
    assert line.startswith("ingest: split tile (seed 0); tiles train/val/test ")
    _, meta = read_tile_table(tmp_path / "r" / "tiles.parquet")
    sentence = split_sentence(meta["split"])
    assert "whole tiles held out" in sentence and "never measured" in sentence


def test_cli_accepts_and_documents_the_tile_split(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["ingest", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "{random,tile,block,forecast}" in out and "10% of the tiles" in out
