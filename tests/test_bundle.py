"""Model bundles: tensors and metadata round trip; a bundle that does not vouch for its weights,
or is newer than this library, is refused with a ModelFileError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from geodbk._version import __version__
from geodbk.bundle import FORMAT, FORMAT_VERSION, JSON_NAME, WEIGHTS_NAME, load_bundle, save_bundle
from geodbk.errors import ModelFileError

TENSORS = {
    "w": torch.arange(6, dtype=torch.float64).reshape(2, 3),
    "b": torch.tensor([1, 2], dtype=torch.int32),
}


def _edit_json(folder: Path, **changes: object) -> None:
    doc = json.loads((folder / JSON_NAME).read_text())
    doc.update(changes)
    (folder / JSON_NAME).write_text(json.dumps(doc))


def test_round_trip_records_format_version_and_tensors(tmp_path: Path) -> None:
    folder = save_bundle(tmp_path / "m", tensors=TENSORS, meta={"target": "download"})
    assert sorted(p.name for p in folder.iterdir()) == sorted([JSON_NAME, WEIGHTS_NAME])
    tensors, meta = load_bundle(folder)
    assert tensors.keys() == TENSORS.keys()
    for name, value in TENSORS.items():
        assert torch.equal(tensors[name], value) and tensors[name].dtype == value.dtype
    assert meta["target"] == "download"
    assert (meta["format"], meta["format_version"]) == (FORMAT, FORMAT_VERSION)
    assert meta["library_version"] == __version__
    assert meta["tensors"]["w"] == {"shape": [2, 3], "dtype": "torch.float64"}
    save_bundle(folder, tensors={"w": torch.zeros(1)}, meta={})  # a new save replaces both
    assert list(load_bundle(folder)[0]) == ["w"]


def test_a_newer_format_version_is_refused(tmp_path: Path) -> None:
    folder = save_bundle(tmp_path / "m", tensors=TENSORS, meta={})
    _edit_json(folder, format_version=FORMAT_VERSION + 1)
    with pytest.raises(ModelFileError, match="upgrade geodbk"):
        load_bundle(folder)


def test_weights_must_match_the_recorded_checksum_and_tensor_list(tmp_path: Path) -> None:
    folder = save_bundle(tmp_path / "m", tensors=TENSORS, meta={})
    other = save_bundle(tmp_path / "other", tensors={"w": TENSORS["w"]}, meta={})
    (folder / WEIGHTS_NAME).write_bytes((other / WEIGHTS_NAME).read_bytes())
    with pytest.raises(ModelFileError, match="checksum"):
        load_bundle(folder)
    # a model.json that vouches for the new weights but lists other tensors
    _edit_json(folder, weights_sha256=json.loads((other / JSON_NAME).read_text())["weights_sha256"])
    with pytest.raises(ModelFileError, match="does not hold the tensors listed"):
        load_bundle(folder)
    spec = json.loads((other / JSON_NAME).read_text())["tensors"]
    _edit_json(other, tensors={"w": {**spec["w"], "shape": [3, 2]}})
    with pytest.raises(ModelFileError, match="has shape"):
        load_bundle(other)
