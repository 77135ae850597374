"""Quarters as a model input: the time axis of a time-aware model (``geodbk train --time``).

A quarter ``YYYYQk`` has the integer index ``4 * YYYY + (k - 1)``. The time input is that index
scaled linearly to [-1, 1] over the training table's quarter range (like lon/lat over the
region's box)::

    t = 2 (i - i_first) / (i_last - i_first) - 1        (t = 0 when the range is one quarter)

so a quarter after the range gets t > 1 (an extrapolation, which every product flags). One year
is 4 quarters, i.e. ``8 / (i_last - i_first)`` in t.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from geodbk.errors import DataError

__all__ = [
    "EXTRAPOLATIONS",
    "TimeScaling",
    "extrapolation_of",
    "format_quarter",
    "parse_quarter",
    "parse_quarters",
    "quarter_index",
    "quarter_indices",
    "quarter_text",
    "resolve_quarters",
    "time_input",
    "years_between",
]

_QUARTER_RE = re.compile(r"^(\d{4})\s*-?\s*Q([1-4])$", re.IGNORECASE)


def parse_quarter(text: str) -> str:
    """Normalise a quarter like ``2023Q4``, ``2023-q4`` or ``2023 Q4`` to ``2023Q4``."""
    m = _QUARTER_RE.match(str(text).strip())
    if not m:
        raise DataError(f"bad quarter {text!r}: write it like 2023Q4")
    return f"{m.group(1)}Q{m.group(2)}"


def parse_quarters(spec: str | Sequence[str] | None) -> list[str] | None:
    """Parse a quarter selection: ``2019Q1:2023Q4`` (inclusive range), ``2023Q4`` or a list.

    Returns the sorted list of quarters, or ``None`` for no selection.
    """
    if spec is None:
        return None
    items = [spec] if isinstance(spec, str) else list(spec)
    out: set[str] = set()
    for item in items:
        for part in str(item).split(","):
            part = part.strip()
            if not part:
                continue
            if ":" in part:
                lo_s, hi_s = (parse_quarter(p) for p in part.split(":", 1))
                lo = int(lo_s[:4]) * 4 + int(lo_s[5]) - 1
                hi = int(hi_s[:4]) * 4 + int(hi_s[5]) - 1
                if hi < lo:
                    raise DataError(f"empty quarter range {part!r}: the first must not be later")
                out.update(f"{k // 4}Q{k % 4 + 1}" for k in range(lo, hi + 1))
            else:
                out.add(parse_quarter(part))
    return sorted(out)


#: What a time-aware model does for a quarter outside its training range: ``hold`` evaluates the
#: nearest trained quarter (the last map persists), ``trend`` feeds the scaled t as it is (the
#: backbone extrapolates the trend). ``geodbk train --time`` picks one by validation NLL when the
#: validation quarters lie outside the training range (a forecast split), else ``hold``.
EXTRAPOLATIONS = ("hold", "trend")


def quarter_index(quarter: str) -> int:
    """Integer index ``4 * year + (q - 1)`` of a quarter like ``2023Q4`` (``2023-q4`` works too)."""
    q = parse_quarter(quarter)
    return 4 * int(q[:4]) + int(q[5]) - 1


def format_quarter(index: int) -> str:
    """Inverse of :func:`quarter_index`: ``8095`` -> ``2023Q4``."""
    year, k = divmod(int(index), 4)
    return f"{year}Q{k + 1}"


def quarter_indices(quarters: Iterable[str]) -> npt.NDArray[np.int64]:
    """Indices of many quarters (vectorised over the distinct values)."""
    arr = np.asarray(list(quarters), dtype=object)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    uniq, inv = np.unique(arr.astype(str), return_inverse=True)
    idx = np.array([quarter_index(u) for u in uniq], dtype=np.int64)
    return idx[inv]


def years_between(first: str, last: str) -> float:
    """Years from quarter ``first`` to quarter ``last`` (quarters / 4; negative if earlier)."""
    return (quarter_index(last) - quarter_index(first)) / 4.0


@dataclass(frozen=True)
class TimeScaling:
    """Map quarters to the model's time input t in [-1, 1] over ``first``..``last``.

    Attributes
    ----------
    first, last
        First and last quarter of the training table (``2019Q1``, ``2023Q4``).
    """

    first: str
    last: str

    def __post_init__(self) -> None:
        if quarter_index(self.last) < quarter_index(self.first):
            raise DataError(f"time scaling: last quarter {self.last} is before {self.first}")

    @classmethod
    def from_quarters(cls, quarters: Iterable[str]) -> TimeScaling:
        """The range of the quarters present (e.g. a tile table's ``quarter`` column)."""
        idx = np.unique(quarter_indices(quarters))
        if idx.size == 0:
            raise DataError("time scaling: no quarters given")
        return cls(format_quarter(int(idx[0])), format_quarter(int(idx[-1])))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimeScaling:
        """Inverse of :meth:`to_dict`."""
        try:
            return cls(parse_quarter(d["first"]), parse_quarter(d["last"]))
        except (KeyError, TypeError) as exc:
            raise DataError(f"time scaling needs 'first' and 'last' quarters, got {d!r}") from exc

    def to_dict(self) -> dict[str, str]:
        """``{"first": ..., "last": ...}`` (stored in the model metadata as ``time_scaling``)."""
        return {"first": self.first, "last": self.last}

    @property
    def span(self) -> int:
        """Number of quarter steps between first and last (0 for a single quarter)."""
        return quarter_index(self.last) - quarter_index(self.first)

    def scale_index(self, index: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """t = 2 (i - i_first) / (i_last - i_first) - 1 for quarter indices ``i``."""
        i = np.asarray(index, dtype=np.float64)
        if self.span == 0:
            return np.zeros_like(i)
        return 2.0 * (i - quarter_index(self.first)) / self.span - 1.0

    def scale(self, quarters: Iterable[str] | str) -> npt.NDArray[np.float64]:
        """Time inputs of quarter strings (a single quarter gives a 0-d array)."""
        if isinstance(quarters, str):
            return self.scale_index(quarter_index(quarters))
        return self.scale_index(quarter_indices(quarters))

    def per_year(self) -> float:
        """Change of t over one year (4 quarters); ``0`` when the range is one quarter."""
        return 0.0 if self.span == 0 else 8.0 / self.span

    def is_extrapolation(self, quarter: str) -> bool:
        """True when ``quarter`` lies outside ``first``..``last``."""
        i = quarter_index(quarter)
        return i < quarter_index(self.first) or i > quarter_index(self.last)

    def describe(self, quarter: str) -> str:
        """``observed`` (inside the range) or ``extrapolation beyond LAST`` / ``before FIRST``."""
        i = quarter_index(quarter)
        if i > quarter_index(self.last):
            return f"extrapolation beyond {self.last}"
        if i < quarter_index(self.first):
            return f"extrapolation before {self.first}"
        return "observed"


def quarter_text(quarter: Any, status: Any = None) -> str:
    """A quarter label with its ``quarter_status`` (:meth:`TimeScaling.describe`, or a pooled
    map's) where that adds to the label: ``2024Q2 (extrapolation beyond 2023Q4)``,
    ``pooled 2022Q1:2023Q4 (tile offsets at 2023Q4)``; the label alone when the status is
    ``observed``, ``pooled`` or unrecorded; ``?`` without a label."""
    label = str(quarter) if quarter not in (None, "") else "?"
    note = str(status or "").strip().removeprefix("pooled; ")
    if note in ("", "observed", "pooled"):
        return label
    return f"{label} ({note})"


def resolve_quarters(
    spec: str | Sequence[str] | None, *, observed: Sequence[str], default: str | None = None
) -> list[str]:
    """Quarters a user asked for: ``None`` -> ``[default or latest observed]``; ``all`` -> the
    observed quarters; ``2019Q1:2023Q4`` (inclusive range, may reach past the data), ``2023Q4``
    or a list of these.

    Raises
    ------
    DataError
        On a malformed quarter or an empty selection.
    """
    obs = sorted({parse_quarter(q) for q in observed}, key=quarter_index)
    if spec is None or (not isinstance(spec, str) and len(spec) == 0):
        if default is not None:
            return [parse_quarter(default)]
        if not obs:
            raise DataError("no quarters observed and none given")
        return [obs[-1]]
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for item in items:
        if str(item).strip().lower() == "all":
            out.extend(obs)
        elif ":" in str(item):
            a, b = (parse_quarter(s) for s in str(item).split(":", 1))
            if quarter_index(b) < quarter_index(a):
                raise DataError(f"bad quarter range {item!r}: {b} is before {a}")
            out.extend(format_quarter(i) for i in range(quarter_index(a), quarter_index(b) + 1))
        else:
            got = parse_quarters(str(item))
            out.extend(got or [])
    uniq = sorted(set(out), key=quarter_index)
    if not uniq:
        raise DataError(f"no quarters selected by {spec!r}")
    return uniq


def time_input(
    scaling: TimeScaling, quarters: Iterable[str] | str, *, extrapolation: str = "trend"
) -> npt.NDArray[np.float64]:
    """The model's time input for ``quarters`` under an extrapolation policy.

    ``t = scaling.scale(q)`` (``trend``), or ``clip(t, -1, 1)`` (``hold``: a quarter after
    the training range is evaluated at the last trained quarter, one before it at the first).
    """
    if extrapolation not in EXTRAPOLATIONS:
        raise DataError(
            f"time extrapolation must be one of {EXTRAPOLATIONS}, got {extrapolation!r}"
        )
    t = scaling.scale(quarters)
    return np.clip(t, -1.0, 1.0) if extrapolation == "hold" else t


def extrapolation_of(metadata: dict[str, Any]) -> str:
    """The policy recorded in a time-aware model's metadata (``time_extrapolation``);
    ``trend`` when it records none or an unknown one."""
    entry = metadata.get("time_extrapolation") or {}
    policy = entry.get("policy", "trend") if isinstance(entry, dict) else str(entry)
    return policy if policy in EXTRAPOLATIONS else "trend"
