"""The ``geodbk`` command line: one sub-command per pipeline stage.

Each stage lives in its own module ``pipelines/<stage>.py`` exposing
``register(subparsers) -> None``, which adds its parser with :func:`stage_parser` and sets
``func`` (a callable taking the parsed arguments and returning an exit code, most often
through :func:`call_with_options`). Run as ``geodbk STAGE ...`` or
``python -m pipelines.cli STAGE ...``.

Exit codes: 0 success, 1 unexpected geodbk error, 2 usage error, 3 bad input data,
4 bad model file, 5 missing or partial run directory, 6 the disk refused a write (full,
read-only, no permission), 130 interrupted.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import inspect
import logging
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from geodbk import __version__
from geodbk.errors import GeodbkError
from geodbk.geo.contract import TARGETS
from pipelines.allocator import keep_freed_memory

#: Stage modules in the order ``--help`` lists them.
STAGES: tuple[str, ...] = (
    "download",
    "ingest",
    "train",
    "predict",
    "service",
    "summarize",
    "export",
    "report",
    "benchmark",
    "demo",
    "dashboard",
)

log = logging.getLogger("geodbk")

#: ``errno`` values of a write the disk refused, and what to do about each.
DISK_ERRORS: dict[int, str] = {
    errno.ENOSPC: "free some space (or write the run elsewhere)",
    errno.EDQUOT: "free some space within your quota (or write the run elsewhere)",
    errno.EROFS: "the file system is read-only: copy the run to a writable place",
    errno.EACCES: "you may not write there: fix the permissions or copy the run",
    errno.EPERM: "you may not write there: fix the permissions or copy the run",
}
#: Exit code of a write the disk refused.
DISK_EXIT_CODE = 6

T = TypeVar("T")

#: The ``--run`` and ``--target`` of the stages that fit models on an ingested run (train,
#: benchmark), as keyword arguments of :func:`stage_parser`.
FITTING = {"run": "run directory (from geodbk ingest)", "target": "what to model"}


def add_bbox_option(group: Any) -> None:
    """``--bbox W S E N`` on ``group`` (a parser or an argument group): a region given as a
    box in degrees."""
    group.add_argument(
        "--bbox",
        nargs=4,
        type=float,
        metavar=("W", "S", "E", "N"),
        help="bounding box in degrees (W > E: a box across the 180° meridian)",
    )


def add_progress_option(parser: Any) -> None:
    """``--no-progress`` (``args.progress = False``): no progress bar. Bars are drawn only when
    stderr is a terminal in any case."""
    parser.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )


def stage_parser(
    subparsers: Any,
    name: str,
    main: Callable[[argparse.Namespace], int],
    *,
    help: str,
    description: str,
    epilog: str,
    run: str | None = None,
    target: str | None = None,
) -> argparse.ArgumentParser:
    """Add stage ``name``'s sub-command, run by ``main``: its ``--help`` shows ``description``
    and ``epilog`` as written; ``run`` and ``target``, when given, are the help of its first
    options, a required ``--run`` directory and a required ``--target`` (one of ``TARGETS``)."""
    parser = subparsers.add_parser(
        name,
        help=help,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=main)
    if run is not None:
        parser.add_argument("--run", required=True, type=Path, help=run)
    if target is not None:
        parser.add_argument("--target", required=True, choices=list(TARGETS), help=target)
    return parser


def call_with_options(func: Callable[..., T], args: argparse.Namespace, **given: Any) -> T:
    """``func`` called with the parsed option of each of its parameters (``args.NAME`` for a
    parameter ``NAME``; options it has no parameter for are left out) and ``given``, which
    wins over an option of the same name (an option the stage has turned into something
    else first)."""
    parameters = inspect.signature(func).parameters
    options = {name: value for name, value in vars(args).items() if name in parameters}
    return func(**{**options, **given})


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per available stage."""
    parser = argparse.ArgumentParser(
        prog="geodbk",
        description=(
            "Internet-quality maps with calibrated uncertainty. Stages read and write a run "
            "directory: download -> ingest -> train -> predict -> export / report, and for "
            "policy answers service (BEAD service classes) and summarize (area summaries with "
            "joint uncertainty). `geodbk demo` runs the main stages on the embedded synthetic "
            "region; `geodbk dashboard` shows the runs. `geodbk STAGE --help` for each stage."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"geodbk {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    subparsers = parser.add_subparsers(dest="stage", metavar="STAGE")
    for name in STAGES:
        try:
            module = importlib.import_module(f"pipelines.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"pipelines.{name}":
                continue  # stage not built yet
            raise
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``geodbk`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    keep_freed_memory()
    try:
        previous = signal.signal(signal.SIGTERM, _interrupt)
    except ValueError:  # not the main thread: leave SIGTERM alone
        previous = None
    try:
        return int(args.func(args) or 0)
    except GeodbkError as exc:
        print(f"geodbk {args.stage}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"geodbk {args.stage}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in DISK_ERRORS:
            raise
        where = _written_path(exc) or "the run directory"
        print(
            f"geodbk {args.stage}: error: cannot write {where} ({os.strerror(exc.errno)}); "
            f"{DISK_ERRORS[exc.errno]}, then run the command again. Outputs written before "
            "are unchanged (each is replaced only once complete).",
            file=sys.stderr,
        )
        return DISK_EXIT_CODE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


#: Where libraries name the file in a write error's text (HDF5, Arrow, GDAL).
_PATH_IN_MESSAGE = re.compile(r"(?:name = |file |tiff file )'([^']+)'")
#: A hidden temporary file of :func:`geodbk.atomic.atomic_path` or a grid writer.
_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.[0-9a-f]{32}\.part(?:\.[^.]+)*$")


def _written_path(exc: OSError) -> str | None:
    """The file a refused write was for: the error's file name, or a path quoted in its
    text (HDF5 and Arrow put it there), a hidden temporary file named as its destination."""
    name = exc.filename
    if name is None:
        found = _PATH_IN_MESSAGE.search(str(exc))
        name = found.group(1) if found else None
    if name is None:
        return None
    path = Path(str(name))
    temporary = _TEMPORARY.match(path.name)
    return str(path.with_name(temporary["name"])) if temporary else str(path)


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a stage like Ctrl-C: its temporary files are removed on the way out."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
