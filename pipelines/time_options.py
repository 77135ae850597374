"""The ``--quarter`` and ``--trend`` options of the stages that read time-aware grids.

Kept apart from :mod:`pipelines.predict` so that ``geodbk export``, which only reads grids,
does not import the model stack (torch, scikit-learn) for them.
"""

from __future__ import annotations

import argparse

from geodbk.errors import DataError
from geodbk.geo.timeaxis import format_quarter, quarter_index

__all__ = ["add_time_options", "parse_trend"]


def parse_trend(spec: str) -> tuple[str, str]:
    """``"2019Q4:2023Q4"`` -> ``("2019Q4", "2023Q4")``; the second quarter must be later.

    Raises
    ------
    DataError
        On a malformed spec or a second quarter that is not after the first.
    """
    parts = str(spec).split(":")
    if len(parts) != 2:
        raise DataError(f"--trend needs two quarters FIRST:LAST (e.g. 2019Q4:2023Q4), got {spec!r}")
    first, last = (format_quarter(quarter_index(q.strip())) for q in parts)
    if quarter_index(last) <= quarter_index(first):
        raise DataError(f"--trend {spec}: the second quarter {last} must be after {first}")
    return first, last


def add_time_options(parser: argparse.ArgumentParser, *, quarter: str, trend: str) -> None:
    """``--quarter SPEC`` or ``--trend Q1:Q2`` (not both) of the stages that read the grids of
    time-aware models (predict, export), with their help texts."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--quarter", default=None, metavar="SPEC", help=quarter)
    group.add_argument("--trend", default=None, metavar="Q1:Q2", help=trend)
