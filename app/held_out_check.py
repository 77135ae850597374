"""The Map tab's line on how the tile quantity fared on held-out tiles (the report's check).

Reads what ``geodbk report`` wrote (``metrics.json`` ``map_calibration``, ``summary.json``
``model_created``); computes nothing about the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    coverage_verdict,
    tests_range,
)

__all__ = ["held_out_check_caption", "threshold_check_caption"]


def held_out_check_caption(
    metrics: Mapping[str, Any] | None,
    summary: Mapping[str, Any] | None,
    grid_attrs: Mapping[str, Any] | None,
) -> str | None:
    """``Held-out check (geodbk report): ...``: the share of well-measured (and of less
    measured) test tiles whose level the tile quantity's 95% interval held, and whether 95%
    lies inside the coverage's confidence interval (counted by place where the file has it).
    ``None`` for a grid of another quantity, without the report's check, or when the report
    and the grid come from different trainings (``model_created`` differs)."""
    cal = _calibration_of_map(metrics, summary, grid_attrs)
    if cal is None:
        return None
    busy = cal["tile"]["all"]
    text = (
        "Held-out check (geodbk report): the tile quantity's 95% interval held the level of "
        f"{_share(busy)} of {busy.get('tiles')} well-measured test tiles "
        f"({tests_range(cal)} tests{_reading(busy)})"
    )
    less = cal.get("tile_less_measured") or {}
    fewer = less.get("all") if isinstance(less, Mapping) else None
    if isinstance(fewer, Mapping) and COVERAGE95 in fewer and "max_tests" in less:
        text += (
            f" and of {_share(fewer)} of {fewer.get('tiles')} less measured ones "
            f"({tests_range(less)} tests{_reading(fewer)})"
        )
    return text + ". The Coverage report tab has the table."


def _calibration_of_map(
    metrics: Mapping[str, Any] | None,
    summary: Mapping[str, Any] | None,
    grid_attrs: Mapping[str, Any] | None,
) -> Mapping[str, Any] | None:
    """The report's ``map_calibration`` when it checked this grid: a tile map of the
    training the report scored, with a well-measured check; else ``None``."""
    attrs = grid_attrs or {}
    if attrs.get("quantity") != "tile" or not metrics:
        return None
    made = (summary or {}).get("model_created")
    if made and attrs.get("model_created") and made != attrs["model_created"]:
        return None
    cal = metrics.get("map_calibration")
    if not isinstance(cal, Mapping):
        return None
    busy = (cal.get("tile") or {}).get("all")
    if not isinstance(busy, Mapping) or COVERAGE95 not in busy:
        return None
    return cal


def _share(group: Mapping[str, Any]) -> str:
    return f"{100 * float(group[COVERAGE95]):.1f}%"


def _reading(group: Mapping[str, Any]) -> str:
    """``; by place: consistent`` (or ``too wide``, ``too narrow``; by tile without places)."""
    by_place = group.get(COVERAGE95_INTERVAL_BY_PLACE)
    interval = by_place or group.get(COVERAGE95_INTERVAL)
    if not isinstance(interval, list | tuple):
        return ""
    verdict = coverage_verdict(list(interval))
    how = "by place" if by_place else "by tile"
    said = "95% inside its interval" if verdict == "consistent" else f"the intervals {verdict}"
    return f"; {how}: {said}"


def threshold_check_caption(
    metrics: Mapping[str, Any] | None,
    summary: Mapping[str, Any] | None,
    grid_attrs: Mapping[str, Any] | None,
    threshold: float,
) -> str | None:
    """``Held-out check at ≥ 25 Mbps (geodbk report): ...``: for the report's threshold
    ``threshold`` (natural units), how many well-measured test tiles the tile quantity was at
    least 90% sure were served (or were not) and the share of them it was right about, and the
    expected against the observed share served. ``None`` when the report did not check that
    threshold, under :func:`held_out_check_caption`'s conditions (another quantity, another
    training, no check)."""
    cal = _calibration_of_map(metrics, summary, grid_attrs)
    block = cal.get("thresholds") if cal is not None else None
    if not isinstance(block, Mapping):
        return None
    row = next(
        (
            r
            for r in block.get("rows", [])
            if math.isclose(float(r.get("threshold", math.nan)), float(threshold), rel_tol=1e-9)
        ),
        None,
    )
    if row is None or not isinstance(row.get("well_measured"), Mapping):
        return None
    well = row["well_measured"]
    sure = float(block.get("sure", 0.9))
    calls = []
    for key, what in (("sure_served", "served"), ("sure_not_served", "not served")):
        part = well.get(key) or {}
        if part.get("tiles"):
            calls.append(
                f"that {part['tiles']} were {what}, and right about "
                f"{100 * part['held']:.1f}% of them"
            )
    said = (
        f"at least {sure:.0%} sure " + "; and ".join(calls)
        if calls
        else f"at least {sure:.0%} sure of none of them"
    )
    return (
        f"Held-out check at {row['label']} (geodbk report), on {well['tiles']} well-measured "
        f"test tiles: the map was {said}. It expected {100 * well['expected_share']:.1f}% of "
        f"them served; {100 * well['observed_share']:.1f}% were."
    )
