"""What an exported tile map says of its own honesty: the report's held-out check.

``geodbk report`` scores the tile quantity against the levels of held-out test tiles
(:mod:`pipelines.map_calibration`). An export of a tile map of the same training carries that
check with it, so that a map handed on says how often its 95% interval held what places got:
in the sidecar JSON (``held_out_check``) and as GeoTIFF tags.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from geodbk.metrics import (
    COVERAGE95,
    COVERAGE95_INTERVAL,
    COVERAGE95_INTERVAL_BY_PLACE,
    tests_range,
)
from pipelines.rundir import RunDir

__all__ = ["held_out_check", "held_out_tags"]

_KEPT = ("tiles", COVERAGE95, COVERAGE95_INTERVAL, COVERAGE95_INTERVAL_BY_PLACE)


def held_out_check(rd: RunDir, target: str, *, quantity: Any, model_created: Any) -> dict | None:
    """The report's check of ``target``'s tile quantity, when a map of the ``tile`` quantity
    comes from the training the report scored (``summary.json`` ``model_created`` equal to
    the grid's): ``{"report", "model_created", "well_measured", "less_measured"}``, each part
    ``{"min_tests", "max_tests", "tiles", "coverage95", "coverage95_interval",
    "coverage95_interval_by_place"}`` (``less_measured`` ``None`` in reports written before
    it), and ``thresholds``, the report's threshold check (``map_calibration.thresholds``,
    :mod:`pipelines.threshold_check`; ``None`` in reports written before it). ``None`` for
    another quantity, without a report or its check, or for a report of another training."""
    if quantity != "tile" or not model_created:
        return None
    folder = rd.report_dir(target)
    summary, metrics = (_read(folder / name) for name in ("summary.json", "metrics.json"))
    if summary is None or metrics is None or summary.get("model_created") != model_created:
        return None
    cal = metrics.get("map_calibration")
    if not isinstance(cal, dict):
        return None
    well = _part(cal.get("tile"), min_tests=cal.get("min_tests"), max_tests=None)
    if well is None:
        return None
    less = cal.get("tile_less_measured") or {}
    thresholds = cal.get("thresholds")
    return {
        "report": rd.relative(folder),
        "model_created": str(model_created),
        "well_measured": well,
        "less_measured": _part(
            less, min_tests=less.get("min_tests"), max_tests=less.get("max_tests")
        ),
        "thresholds": thresholds if isinstance(thresholds, dict) else None,
    }


def held_out_tags(check: dict | None) -> dict[str, str]:
    """GeoTIFF tags of a :func:`held_out_check`: ``geodbk_held_out_check`` (one sentence),
    per part its coverage, tiles and the coverage's 95% confidence interval counted by place
    (else by tile), and ``geodbk_held_out_thresholds`` (the sure calls at each threshold,
    one sentence) when the report checked its thresholds."""
    if not check:
        return {}
    parts = [("well_measured", check["well_measured"]), ("less_measured", check["less_measured"])]
    tags: dict[str, str] = {}
    said = []
    for name, part in parts:
        if not part:
            continue
        interval = part.get(COVERAGE95_INTERVAL_BY_PLACE) or part.get(COVERAGE95_INTERVAL)
        how = "by place" if part.get(COVERAGE95_INTERVAL_BY_PLACE) else "by tile"
        tests = tests_range(part, dash="-")
        tags[f"geodbk_held_out_{name}_coverage95"] = f"{part[COVERAGE95]:.4f}"
        tags[f"geodbk_held_out_{name}_tiles"] = str(part["tiles"])
        if interval:
            tags[f"geodbk_held_out_{name}_coverage95_ci"] = f"{interval[0]:.4f}-{interval[1]:.4f}"
        said.append(
            f"{100 * part[COVERAGE95]:.1f}% of {part['tiles']} test tiles with {tests} tests"
            + (f" (its 95% confidence interval {how} {_pct(interval)})" if interval else "")
        )
    tags["geodbk_held_out_check"] = (
        "geodbk report: the tile quantity's 95% interval held the level of " + " and ".join(said)
    )
    if calls := _threshold_sentence(check.get("thresholds")):
        tags["geodbk_held_out_thresholds"] = calls
    return tags


def _threshold_sentence(block: Any) -> str:
    """The report's threshold check on the well-measured test tiles in one sentence: per
    threshold, the tiles the map was sure were served (or not) and the share it was right
    about; ``""`` without one."""
    if not isinstance(block, dict):
        return ""
    sure = float(block.get("sure", 0.9))
    parts = []
    for row in block.get("rows", []):
        well = row.get("well_measured")
        if not well:
            continue
        calls = [
            f"sure {c['tiles']} {what}, right about {100 * c['held']:.1f}%"
            if c.get("tiles")
            else f"sure of none {what}"
            for c, what in (
                (well["sure_served"], "served"),
                (well["sure_not_served"], "not served"),
            )
        ]
        parts.append(f"at {row['label']} of {well['tiles']} tiles: " + ", ".join(calls))
    if not parts:
        return ""
    return f"geodbk report, well-measured test tiles, calls at least {sure:.0%} sure: " + "; ".join(
        parts
    )


def _part(block: Any, *, min_tests: Any, max_tests: Any) -> dict | None:
    """The whole-map group of one calibration block, with its tests range."""
    group = (block or {}).get("all") if isinstance(block, dict) else None
    if not isinstance(group, dict) or COVERAGE95 not in group:
        return None
    return {"min_tests": min_tests, "max_tests": max_tests} | {k: group.get(k) for k in _KEPT}


def _pct(interval: Any) -> str:
    return f"{100 * interval[0]:.1f}-{100 * interval[1]:.1f}%"


def _read(path: Path) -> dict | None:
    """A report JSON as a dict, ``None`` when absent or unreadable (the check is left out)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
