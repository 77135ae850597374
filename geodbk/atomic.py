"""Atomic file writes: write to a temporary file in the target's folder, then ``os.replace``.

A crash or a failed write never leaves a half-written file at the destination: readers see
either the old file or the complete new one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: ``errno`` values of a write the disk refused: full, over quota, read-only, no permission.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def disk_error(exc: OSError, path: str | os.PathLike[str]) -> OSError:
    """``exc`` as a plain ``OSError`` naming ``path`` (the destination, not a hidden temporary
    file or a library's long message) when the disk refused the write, else ``exc`` itself."""
    if exc.errno not in DISK_ERRNOS:
        return exc
    if exc.filename is not None and not Path(str(exc.filename)).name.startswith("."):
        return exc  # already names a file the user knows
    return OSError(exc.errno, os.strerror(exc.errno), str(path))


@contextlib.contextmanager
def naming_errors(path: str | os.PathLike[str]) -> Iterator[None]:
    """Name ``path`` in a write the disk refuses inside the block (a write error names no
    file). For writers that fill several temporary files at once (:func:`atomic_path` alone
    cannot tell which of them failed)."""
    try:
        yield
    except OSError as exc:
        named = disk_error(exc, path)
        if named is exc:
            raise
        raise named from exc


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
    except OSError as exc:
        # the cleanup must not hide the original error (e.g. on a read-only or full disk)
        with contextlib.suppress(OSError):
            tmp.unlink()
        named = disk_error(exc, dest)
        if named is exc:
            raise
        raise named from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def staged_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty hidden folder beside ``folder`` to write a set of outputs into; when the
    block succeeds, move every file written there into ``folder`` (same relative paths; files
    of ``folder`` not written again are kept), so that readers never find new files beside old
    ones of the same set. If the block raises, ``folder`` is untouched. What a killed writer
    left (``.NAME.staging-*``) is removed first: callers hold the folder's lock.
    """
    dest = Path(folder)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for leftover in dest.parent.glob(f".{dest.name}.staging-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.staging-", dir=dest.parent))
    except OSError as exc:
        raise disk_error(exc, dest) from exc
    try:
        yield staging
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            final = dest / path.relative_to(staging)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, final)
    except OSError as exc:  # name the file the set was writing, not its staged copy
        name = Path(os.fsdecode(exc.filename)) if exc.filename is not None else None
        if exc.errno not in DISK_ERRNOS or name is None or not name.is_relative_to(staging):
            raise
        final_name = str(dest / name.relative_to(staging))
        raise OSError(exc.errno, os.strerror(exc.errno), final_name) from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def json_text(obj: Any, *, indent: int = 2) -> str:
    """``obj`` as the JSON text :func:`atomic_write_json` writes (sorted keys, NaN rejected)."""
    return json.dumps(obj, indent=indent, sort_keys=True, allow_nan=False) + "\n"


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int = 2) -> None:
    """Write ``obj`` as JSON (sorted keys, NaN rejected) to ``path`` atomically."""
    atomic_write_text(path, json_text(obj, indent=indent))
