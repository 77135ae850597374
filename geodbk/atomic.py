"""Atomic file writes: write to a temporary file in the target's folder, then ``os.replace``.

A crash or a failed write never leaves a half-written file at the destination: readers see
either the old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success move it onto ``path`` atomically.

    The caller writes the complete file to the yielded path (any library that takes a filename
    works). If the block raises, the temporary file is removed and ``path`` is untouched.

    Parameters
    ----------
    path
        Final destination.
    suffix
        Suffix of the temporary file (default: the destination's suffix, so that libraries which
        pick a format by extension still work).
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    ext = dest.suffix if suffix is None else suffix
    # Hidden, unique, same folder (so os.replace is atomic), with the destination's extension.
    tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part{ext}")
    try:
        yield tmp
        if tmp.is_file():
            with open(tmp, "rb") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, dest)
    except BaseException:
        # the cleanup must not hide the original error (e.g. on a read-only or full disk)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> None:
    """Write ``obj`` as JSON (sorted keys, NaN rejected) to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False) + "\n")
