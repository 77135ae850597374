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

#: Stage modules in the order ``--help`` lists them, each with the line it shows there.
STAGES: dict[str, str] = {
    "download": "fetch Ookla open-data tiles and Census files into a cache",
    "ingest": "Ookla tiles + urban/rural layer -> RUN/tiles.parquet",
    "train": "train a DBK-RBF (dPPGP) model for one target",
    "predict": "predict a target on a regular grid over the region (grids/TARGET.nc)",
    "service": "probability of each service class (BEAD tiers) per cell or place (service/)",
    "summarize": "area summaries (counties, tracts, service areas) with joint uncertainty",
    "export": "write GeoTIFF/COG uncertainty maps (exports/TARGET.tif + .json)",
    "report": "test metrics urban/rural, calibration and coverage figures (report/TARGET/)",
    "benchmark": "compare DBK with the baseline GPs on one run's split (quality, time, memory)",
    "demo": "run every stage on the embedded synthetic region (runs/demo)",
    "dashboard": "open the dashboard on this machine (127.0.0.1, no usage statistics)",
}

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
    description: str,
    epilog: str,
    run: str | None = None,
    target: str | None = None,
) -> argparse.ArgumentParser:
    """Add stage ``name``'s sub-command, run by ``main``: the top-level ``--help`` lists it with
    its line in ``STAGES``, its own ``--help`` shows ``description`` and ``epilog`` as written;
    ``run`` and ``target``, when given, are the help of its first options, a required ``--run``
    directory and a required ``--target`` (one of ``TARGETS``)."""
    parser = subparsers.add_parser(
        name,
        help=STAGES[name],
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


def build_parser(*, stage: str | None = None) -> argparse.ArgumentParser:
    """Build the top-level parser with one sub-parser per available stage.

    ``stage``: the stage named on the command line (:func:`stage_named`). Only its module is
    imported, and its sub-parser built in full; each other stage gets a parser that only lists
    it. The stages' modules import torch, scikit-learn, geopandas and xarray, about 3 s
    for all of them. ``None``: every stage in full.
    """
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
        if stage is not None and name != stage:
            subparsers.add_parser(name, help=STAGES[name], add_help=False)
            continue
        try:
            module = importlib.import_module(f"pipelines.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"pipelines.{name}":
                continue  # stage not built yet
            raise
        module.register(subparsers)
    return parser


def stage_named(argv: Sequence[str]) -> str:
    """The stage a command line names: its first word that is not an option (the top-level
    options take no value), ``""`` when it names none or an unknown one (then every stage
    gets a listing parser only, and argparse says what is wrong)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in STAGES else ""
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``geodbk`` console script; returns the process exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(stage=stage_named(words))
    args = parser.parse_args(words)
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
