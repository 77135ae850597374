"""Quarters in the dashboard: per-quarter grids, trend grids and a time-aware model's input t.

A time-aware model (``geodbk train --time``) takes ``[x1, x2, t]`` with

    t = 2 (i - i_first) / (i_last - i_first) - 1,        i = 4 * year + (quarter - 1)

over the training quarters ``first``..``last`` (``metadata["time_scaling"]``), so a quarter after
``last`` has t > 1 and is an extrapolation. ``geodbk predict --quarter Q`` writes
``grids/TARGET_Q.nc`` (the latest table quarter goes to ``grids/TARGET.nc``) and
``geodbk predict --trend Q1:Q2`` writes ``grids/TARGET_trend_Q1_Q2.nc``.

Sorting and labelling use only the file names and grid attributes (cheap, no geodbk import), so
the first paint of a pooled run does no extra work; the time scaling itself is
:class:`geodbk.geo.timeaxis.TimeScaling`, imported only where a model is evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from geodbk.geo.timeaxis import TimeScaling, extrapolation_of
from geodbk.geo.timeaxis import time_input as model_time

#: A quarter as the pipelines write it (``2023Q4``).
QUARTER_RE = re.compile(r"^(\d{4})Q([1-4])$")


def quarter_key(quarter: str) -> int:
    """Sort key ``4 * year + (q - 1)`` of ``YYYYQq``; unparsable strings sort last."""
    m = QUARTER_RE.match(str(quarter).strip())
    if m is None:
        return 1 << 30
    return 4 * int(m.group(1)) + int(m.group(2)) - 1


def is_quarter(text: str) -> bool:
    """Whether ``text`` is a single quarter ``YYYYQq`` (not ``pooled ...``)."""
    return QUARTER_RE.match(str(text).strip()) is not None


def years_between(first: str, last: str) -> float:
    """Years from quarter ``first`` to ``last``: (i_last - i_first) / 4."""
    return (quarter_key(last) - quarter_key(first)) / 4.0


def is_extrapolation(status: str) -> bool:
    """Whether a ``quarter_status`` attribute marks an extrapolation in time."""
    return str(status).strip().lower().startswith("extrapolation")


def extra_grid_paths(grids_dir: Path, target: str) -> dict[str, Path]:
    """``grids/TARGET_YYYYQq.nc`` files (other quarters than ``grids/TARGET.nc``), by quarter.

    Only names of exactly that form are taken (trend grids and anything else are ignored), so
    nothing outside ``grids/`` is reachable from a file name.
    """
    pattern = re.compile(rf"^{re.escape(target)}_(\d{{4}}Q[1-4])\.nc$")
    out: dict[str, Path] = {}
    if not grids_dir.is_dir():
        return out
    for child in grids_dir.iterdir():
        m = pattern.match(child.name)
        if m and child.is_file():
            out[m.group(1)] = child
    return dict(sorted(out.items(), key=lambda kv: quarter_key(kv[0])))


@dataclass(frozen=True)
class TrendFile:
    """A trend grid ``grids/TARGET_trend_FIRST_LAST.nc``."""

    first: str
    last: str
    path: Path

    @property
    def label(self) -> str:
        """``2023Q1 → 2023Q4``."""
        return f"{self.first} → {self.last}"

    @property
    def years(self) -> float:
        """Years between the two quarters."""
        return years_between(self.first, self.last)


def trend_grid_files(grids_dir: Path, target: str) -> list[TrendFile]:
    """Trend grids of a target, ordered by last then first quarter."""
    pattern = re.compile(rf"^{re.escape(target)}_trend_(\d{{4}}Q[1-4])_(\d{{4}}Q[1-4])\.nc$")
    out: list[TrendFile] = []
    if not grids_dir.is_dir():
        return out
    for child in grids_dir.iterdir():
        m = pattern.match(child.name)
        if m and child.is_file():
            out.append(TrendFile(m.group(1), m.group(2), child))
    return sorted(out, key=lambda f: (quarter_key(f.last), quarter_key(f.first)))


@dataclass(frozen=True)
class QuarterGrid:
    """One predictive grid of a target and the quarter it shows.

    Attributes
    ----------
    quarter
        ``2023Q4``, or ``pooled 2019Q1:2023Q4`` (a pooled model), or ``""`` when unrecorded.
    status
        ``observed``, ``extrapolation beyond 2023Q3``, ``pooled`` or ``""``.
    path
        The grid file.
    current
        Whether this is ``grids/TARGET.nc`` (the map shown by default).
    time_aware
        The grid's ``time_aware`` attribute (written by a model trained with ``--time``).
    """

    quarter: str
    status: str
    path: Path
    current: bool
    time_aware: bool = False

    @property
    def extrapolation(self) -> bool:
        """Whether the quarter lies outside the training quarters."""
        return is_extrapolation(self.status)

    @property
    def label(self) -> str:
        """Slider label: the quarter, marked when it is an extrapolation."""
        return f"{self.quarter} (extrapolation)" if self.extrapolation else self.quarter


def grid_quarter(attrs: Mapping[str, Any], fallback: str = "") -> tuple[str, str]:
    """``(quarter, quarter_status)`` from a grid's attributes (``fallback`` if unrecorded)."""
    quarter = str(attrs.get("quarter", "") or fallback).strip()
    status = str(attrs.get("quarter_status", "") or "").strip()
    if not status and quarter.startswith("pooled"):
        status = "pooled"
    return quarter, status


def attr_flag(attrs: Mapping[str, Any], name: str) -> bool:
    """A 0/1 (or true/false) NetCDF attribute as a bool; absent or unreadable: False."""
    value = attrs.get(name, 0)
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    try:
        return bool(int(value))
    except (TypeError, ValueError):
        return False


def describe_quarter(quarter: str, status: str) -> str:
    """Caption text: ``quarter 2023Q4 (observed)``, ``pooled 2019Q1:2023Q4``, or ``""``."""
    if not quarter:
        return ""
    if quarter.startswith("pooled") or status.startswith("pooled"):
        text = quarter if quarter.startswith("pooled") else f"pooled {quarter}"
        offsets = status.partition(";")[2].strip()  # "tile offsets at 2023Q4"
        if offsets:
            return f"{text} (one surface for all quarters; {offsets})"
        return f"{text} (one map for all quarters)"
    return f"quarter {quarter}" + (f" ({status})" if status else "")


def sort_quarter_grids(grids: list[QuarterGrid]) -> list[QuarterGrid]:
    """Order by the ``quarter`` attribute; a duplicated quarter keeps the ``TARGET.nc`` one."""
    seen: dict[str, QuarterGrid] = {}
    for g in sorted(grids, key=lambda g: (not g.current,)):
        seen.setdefault(g.quarter, g)
    return sorted(seen.values(), key=lambda g: (quarter_key(g.quarter), g.quarter))


# --------------------------------------------------------------------------------------------
# The time-aware model's inputs


def is_time_aware(metadata: Mapping[str, Any] | None) -> bool:
    """Whether the model metadata lists the time input ``t`` (``geodbk train --time``)."""
    inputs = (metadata or {}).get("inputs") or []
    return isinstance(inputs, list | tuple) and "t" in inputs


def time_scaling(metadata: Mapping[str, Any] | None) -> Any:
    """The model's :class:`~geodbk.geo.timeaxis.TimeScaling`, or ``None`` for a pooled model.

    Raises
    ------
    ValueError
        When a time-aware model's metadata lacks ``time_scaling`` (retrain the model).
    """
    if not is_time_aware(metadata):
        return None
    ts = (metadata or {}).get("time_scaling")
    if not isinstance(ts, dict):
        raise ValueError(
            "the time-aware model's metadata lacks 'time_scaling'; retrain it with "
            "`geodbk train --time`"
        )

    return TimeScaling.from_dict(ts)


def model_quarters(metadata: Mapping[str, Any] | None) -> list[str]:
    """Quarters a time-aware model knows: ``metadata["quarters"]`` plus its scaling range."""
    md = metadata or {}
    out = {str(q) for q in (md.get("quarters") or []) if is_quarter(str(q))}
    ts = md.get("time_scaling")
    if isinstance(ts, dict):
        out |= {str(ts[k]) for k in ("first", "last") if is_quarter(str(ts.get(k, "")))}
    return sorted(out, key=quarter_key)


def time_input(metadata: Mapping[str, Any] | None, quarter: str | None) -> float | None:
    """t of ``quarter`` for a time-aware model; ``None`` when pooled.

    Follows the model's time-extrapolation policy (``metadata["time_extrapolation"]``, see
    :func:`geodbk.geo.timeaxis.time_input`): under ``hold`` a quarter outside the trained range
    is evaluated at the nearest trained quarter, as the pipelines' grids are.

    Raises
    ------
    ValueError
        A time-aware model and no quarter.
    """
    ts = time_scaling(metadata)
    if ts is None:
        return None
    if not quarter or not is_quarter(quarter):
        raise ValueError("this model is time-aware (trained with --time): choose a quarter")

    return float(model_time(ts, quarter, extrapolation=extrapolation_of(dict(metadata or {}))))


def with_time(X2: NDArray[np.floating], t: float | None) -> NDArray[np.float64]:
    """``[x1, x2]`` (``t`` is None: a pooled model) or ``[x1, x2, t]`` with one t for all rows."""
    X = np.asarray(X2, dtype=np.float64)
    if t is None:
        return X
    out: NDArray[np.float64] = np.column_stack([X, np.full(X.shape[0], float(t))])
    return out
