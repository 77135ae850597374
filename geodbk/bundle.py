"""Safe model bundles: a folder with ``weights.safetensors`` and ``model.json`` (no pickle).

``model.json`` records the format, the library version, the SHA-256 of the weights file and the
name/shape/dtype of every tensor, so :func:`load_bundle` can tell a corrupted, truncated, foreign
or incompatible bundle apart and say so in a :class:`~geodbk.errors.ModelFileError`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save

from geodbk._version import __version__
from geodbk.atomic import atomic_path, naming_errors
from geodbk.errors import ModelFileError

__all__ = ["FORMAT", "FORMAT_VERSION", "JSON_NAME", "WEIGHTS_NAME", "load_bundle", "save_bundle"]

FORMAT = "geodbk-model"
FORMAT_VERSION = 1
WEIGHTS_NAME = "weights.safetensors"
JSON_NAME = "model.json"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_bundle(
    path: str | Path, *, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> Path:
    """Write ``tensors`` and the JSON-serialisable ``meta`` into the folder ``path``.

    Both files are written in full before either replaces an old one (then the weights first,
    then the JSON that vouches for them), so a full disk leaves the old pair whole.

    Returns
    -------
    Path
        The bundle folder.
    """
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    cpu = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    weights = save(cpu, metadata={"format": FORMAT})
    doc = dict(meta)
    doc.update(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "library_version": __version__,
            "weights_sha256": hashlib.sha256(weights).hexdigest(),
            "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in cpu.items()},
        }
    )
    text = json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n"
    with atomic_path(folder / JSON_NAME) as json_tmp, atomic_path(folder / WEIGHTS_NAME) as tmp:
        with naming_errors(folder / WEIGHTS_NAME):
            tmp.write_bytes(weights)
        with naming_errors(folder / JSON_NAME):
            json_tmp.write_text(text, encoding="utf-8")
    return folder


def load_bundle(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read and validate a bundle written by :func:`save_bundle`.

    Returns
    -------
    tensors, meta
        The tensors (on the CPU) and the parsed ``model.json``.

    Raises
    ------
    ModelFileError
        When the folder or a file is missing, the JSON is unreadable or not a geodbk model, the
        format version is newer than this library understands, or the weights do not match the
        checksum / tensor list recorded in ``model.json``.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFileError(
            f"model bundle {folder} not found: expected a folder with {WEIGHTS_NAME} and "
            f"{JSON_NAME} (written by DBKRegressor.save)"
        )
    json_path, weights_path = folder / JSON_NAME, folder / WEIGHTS_NAME
    for required in (json_path, weights_path):
        if not required.is_file():
            raise ModelFileError(
                f"model bundle {folder} is incomplete: {required.name} is missing; "
                "re-save or retrain the model"
            )
    try:
        meta = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFileError(
            f"{json_path} is not valid JSON ({exc}); the bundle is corrupt"
        ) from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(
            f"{json_path} is not a geodbk model file (format={meta.get('format') if isinstance(meta, dict) else None!r}); "
            "point to a folder written by DBKRegressor.save"
        )
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ModelFileError(
            f"{json_path} has bundle format version {version!r}, but this geodbk understands "
            f"up to {FORMAT_VERSION}; upgrade geodbk"
        )
    expected = meta.get("weights_sha256")
    if expected != _sha256(weights_path):
        raise ModelFileError(
            f"{weights_path} does not match the checksum recorded in {JSON_NAME}: the file is "
            "corrupt, truncated or from another model; re-save or retrain"
        )
    try:
        tensors = load_file(str(weights_path), device="cpu")
    except Exception as exc:
        raise ModelFileError(f"cannot read {weights_path}: {exc}; the file is corrupt") from exc
    listed = meta.get("tensors", {})
    if not isinstance(listed, dict) or set(listed) != set(tensors):
        raise ModelFileError(f"{weights_path} does not hold the tensors listed in {JSON_NAME}")
    for name, spec in listed.items():
        if list(tensors[name].shape) != spec.get("shape") or str(tensors[name].dtype) != spec.get(
            "dtype"
        ):
            raise ModelFileError(
                f"tensor {name!r} in {weights_path} has shape {list(tensors[name].shape)} / "
                f"{tensors[name].dtype}, but {JSON_NAME} says {spec}"
            )
    return tensors, meta
