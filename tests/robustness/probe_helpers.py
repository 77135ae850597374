"""What every probe of the corpus checks, and the faults it simulates.

A probe builds its bad input in a temporary copy of the quick demo run, runs one stage through
``pipelines.cli.main`` and asserts three things: the exit code ``docs/cli.md`` documents, a
message naming the file, column or option and the fix (and no traceback), and every file the
run held before unchanged (no new file either: no temporary file left behind).
"""

from __future__ import annotations

import builtins
import errno
import hashlib
import io
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from pipelines import cli

#: Exit codes of docs/cli.md, "Exit codes".
USAGE, BAD_INPUT, BAD_MODEL, NO_RUN, DISK = 2, 3, 4, 5, 6


def snapshot(root: Path) -> dict[str, str]:
    """SHA-256 of every file below ``root`` by relative path (lock files left out: a stage
    takes its lock before it can refuse anything)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".locks" not in p.relative_to(root).parts
    }


def copy_run(source: Path, dest: Path) -> Path:
    """A private copy of a prepared run (cheaper than building one per probe)."""
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".locks"))
    return dest


def run_stage(argv: Sequence[str]) -> int:
    """``geodbk ARGV`` in this process; argparse's usage errors give their exit code."""
    try:
        return cli.main(list(argv))
    except SystemExit as exc:
        return int(exc.code or 0)


def probe(
    argv: Sequence[str],
    *,
    run: Path,
    code: int,
    names: Sequence[str],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture | None = None,
    watch: Path | None = None,
    changes: Sequence[str] = (),
) -> str:
    """Run ``argv`` and assert the corpus's three checks; return the error text.

    Parameters
    ----------
    run
        The run directory whose files must be unchanged (every one, and no new one).
    code
        The documented exit code.
    names
        Substrings the message must hold: the file, column or option, and the fix.
    watch
        Folder to snapshot instead of ``run`` (e.g. the parent of a run a stage would create).
    changes
        Prefixes of relative paths a failed stage may change legitimately (e.g. the resumable
        checkpoints of a training that failed while saving its model).
    """
    root = watch or run
    before = snapshot(root)
    got = run_stage(argv)
    err = capsys.readouterr().err
    logs = caplog.text if caplog is not None else ""
    assert "Traceback" not in err and "Traceback" not in logs, err + logs
    assert got == code, (got, err, logs[-2000:])
    text = err + logs
    missing = [n for n in names if n not in text]
    assert not missing, (missing, err)
    after = snapshot(root)
    changed = sorted(
        k
        for k in before.keys() | after.keys()
        if before.get(k) != after.get(k) and not k.startswith(tuple(changes))
    )
    assert not changed, changed
    return err


def disk_full(path: object = None) -> OSError:
    """The error a write on a full disk raises (no file name: writes do not name one)."""
    if path is None:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def make_read_only(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """Simulate a read-only file system below ``root``: tests run as root, whom permissions
    do not stop, and mounting needs privileges CI lacks. Every Python-level write below it
    (``open`` for writing, ``mkdir`` of a new folder, ``rename``/``replace``, ``unlink``)
    fails with ``EROFS``, as on a read-only mount. Each stage's first write is one of these
    (its lock, its staging folder or its output folder); a write made by a C library first
    would show up as a changed file in :func:`probe`."""
    top = root.resolve()

    def below(path: object) -> bool:
        if not isinstance(path, str | bytes | os.PathLike):
            return False  # a file descriptor
        return Path(os.fsdecode(path)).resolve().is_relative_to(top)

    def refuse(path: object) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))  # type: ignore[arg-type]

    real_open = builtins.open

    def ro_open(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        if any(c in mode for c in "wax+") and below(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", ro_open)
    monkeypatch.setattr(io, "open", ro_open)

    real_mkdir = os.mkdir

    def ro_mkdir(path: object, *args: object, **kwargs: object) -> None:
        if below(path):
            if Path(os.fsdecode(path)).exists():  # type: ignore[arg-type]
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            refuse(path)
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    for name in ("rename", "replace", "unlink", "remove", "rmdir"):
        real = getattr(os, name)

        def ro(path: object, *args: object, _real: object = real, **kwargs: object) -> object:
            if below(path):
                refuse(path)
            return _real(path, *args, **kwargs)  # type: ignore[operator]

        monkeypatch.setattr(os, name, ro)
