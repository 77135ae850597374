"""Report sections for the policy outputs: area summaries of one target and the service headline.

Both read what ``geodbk summarize`` and ``geodbk service`` wrote into the run directory
(``RUN/summaries/TARGET_<stem>[_<quarter>][_<quantity>].parquet``, ``RUN/service/headline.json``);
a run without them gets a one-line pointer to the command instead. Each summary's heading names
its areas file, quantity and quarter (with its status when it is not observed), so several
summaries of one file read apart.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from geodbk.geo.timeaxis import quarter_text
from geodbk.service import HELD_OUT_CLASS_HEADER, held_out_class_rows, held_out_group_text
from pipelines.report_doc import Doc
from pipelines.run_inputs import region_area_caveat
from pipelines.rundir import RunDir, TargetSpec

__all__ = ["area_summaries_section", "service_headline_section"]

log = logging.getLogger("geodbk")

#: Areas listed per summary file in the report (those with the worst typical level first).
REPORT_AREAS = 15
_COLUMNS = ("id", "name", "n_cells", "n_tiles", "mean_natural", "lower_natural", "upper_natural")


def summary_files(rd: RunDir, target: str) -> list[Path]:
    """``RUN/summaries/TARGET_*.parquet``, sorted by name."""
    return sorted((rd.root / "summaries").glob(f"{target}_*.parquet"))


def _interval(mean: Any, lower: Any, upper: Any, *, pct: bool = False) -> str:
    values = [float(v) if v is not None else math.nan for v in (mean, lower, upper)]
    if not math.isfinite(values[0]):
        return "–"
    if pct:
        return f"{100 * values[0]:.1f}% ({100 * values[1]:.1f}–{100 * values[2]:.1f}%)"
    digits = 1 if abs(values[0]) >= 10 else 2
    return f"{values[0]:.{digits}f} ({values[1]:.{digits}f}–{values[2]:.{digits}f})"


def share_label(column: str) -> str:
    """``share_ge_25mbps`` -> ``share ≥ 25 Mbps``; ``share_le_100ms`` -> ``share ≤ 100 ms``."""
    text = column.replace("share_ge_", "share ≥ ").replace("share_le_", "share ≤ ")
    if text.endswith("mbps"):
        return text.removesuffix("mbps") + " Mbps"
    if text.endswith("ms"):
        return text.removesuffix("ms") + " ms"
    return text.replace("_", " ")


def area_summaries_section(doc: Doc, rd: RunDir, spec: TargetSpec) -> None:
    """ "Area summaries": per summary file of the target, a heading naming its areas file,
    quantity and quarter, what it holds and the areas with the lowest typical level (area mean
    with its 90% joint interval, the first tier's share)."""
    doc.heading("Area summaries")
    files = summary_files(rd, spec.name)
    if not files:
        doc.para(
            "No area summaries for this target. Write them with "
            f"`geodbk summarize --run {rd.root.name} --target {spec.name} --areas FILE` "
            "(counties, tracts or your service areas)."
        )
        return
    headings: set[str] = set()
    for path in files:
        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            log.warning("report: cannot read %s (%s); its section is left out", path, exc)
            doc.para(f"`{rd.relative(path)}` could not be read ({exc}); run summarize again.")
            continue
        meta = json.loads((table.schema.metadata or {}).get(b"geodbk_summary", b"{}"))
        names = set(table.column_names)
        shares = [c for c in table.column_names if c.startswith("share_") and c + "_lower" in names]
        rows = table.select([c for c in table.column_names if c != "geometry"]).to_pylist()
        covered = [r for r in rows if r.get("n_cells") and r.get("mean_natural") is not None]
        covered.sort(key=lambda r: float(r["mean_natural"]), reverse=not spec.higher_is_better)
        samples = meta.get("samples") or (rows[0].get("samples") if rows else "?")
        first = rows[0] if rows else {}
        quantity = meta.get("quantity") or first.get("quantity") or "tile"
        quarter = quarter_text(
            meta.get("quarter") or first.get("quarter"),
            meta.get("quarter_status") or first.get("quarter_status"),
        )
        worst = "lowest" if spec.higher_is_better else "highest"
        heading = f"{meta.get('areas_file', path.name)}: {quantity} quantity, {quarter}"
        if heading in headings:  # e.g. an older run's file of the same quantity and quarter
            heading += f" ({path.name})"
        headings.add(heading)
        doc.heading(heading, 3)
        doc.para(
            f"`{rd.relative(path)}` (and `.csv`): {len(rows)} areas, {len(covered)} holding map "
            f"cells; {samples} joint posterior samples of the {quantity} quantity, quarter "
            f"{quarter}. Listed: the {min(REPORT_AREAS, len(covered))} "
            f"areas with the {worst} area mean ({spec.unit}, geometric mean over the area's "
            "cells, with its 90% interval); the share of area at or beyond the first tier with "
            "its 90% interval. Every area is in the file."
        )
        header = ["area", "cells", "tiles", f"area mean ({spec.unit})"]
        if shares:
            header.append(share_label(shares[0]))
        table_rows = []
        area_names = [str(r.get("name") or "") for r in rows]
        for r in covered[:REPORT_AREAS]:
            label = str(r.get("name") or r.get("id"))
            if r.get("name") and r.get("id") and area_names.count(str(r["name"])) > 1:
                label += f" ({r['id']})"  # tracts of one name in several counties
            line = [
                label,
                str(r.get("n_cells", "")),
                str(r.get("n_tiles", "")),
                _interval(r["mean_natural"], r.get("lower_natural"), r.get("upper_natural")),
            ]
            if shares:
                s = shares[0]
                line.append(_interval(r.get(s), r.get(f"{s}_lower"), r.get(f"{s}_upper"), pct=True))
            table_rows.append(line)
        doc.table(header, table_rows)


def service_headline_section(doc: Doc, rd: RunDir) -> None:
    """ "Service classes (all three targets)": the shares of area and of observed tiles in each
    class with their 90% intervals, from each headline ``geodbk service`` wrote:
    ``RUN/service/headline.json`` (the tile quantity at the latest quarter) first, then those
    of other quantities and quarters (``headline_2022Q4_area.json``), each in its own section."""
    folder = rd.root / "service"
    paths = sorted(folder.glob("headline*.json"), key=lambda p: (p.name != "headline.json", p.name))
    for path in paths:
        _headline_section(doc, rd, path, named=len(paths) > 1)


def _headline_section(doc: Doc, rd: RunDir, path: Path, *, named: bool) -> None:
    """One headline's section (:func:`service_headline_section`); ``named``: its heading names
    the quantity and quarter, as the run holds more than one. A quarter that is not observed
    (an extrapolation) is named with its status in the heading and the text, whatever
    ``named``."""
    try:
        headline = json.loads(path.read_text(encoding="utf-8"))
        classes = list(headline["classes"])
        area, tiles = headline["area"], headline["tiles"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("report: cannot read %s (%s); its section is left out", path, exc)
        return
    quarter = quarter_text(headline.get("quarter"), headline.get("quarter_status"))
    status = quarter != str(headline.get("quarter"))  # not observed: named everywhere
    which = f", {headline.get('quantity')} quantity, {quarter}" if named or status else ""
    doc.heading(f"Service classes (download, upload and latency together{which})")
    doc.para(
        f"From `{rd.relative(path)}` (`geodbk service`): tiers {headline.get('tiers')} Mbps with "
        f"latency at most {float(headline.get('latency_ms', 'nan')):g} ms, judged on the "
        f"{headline.get('quantity_description', headline.get('quantity'))}; quarter "
        f"{quarter}. Each share is the expected share (every place's class "
        "probabilities averaged over the region), with a 90% interval from "
        f"{headline.get('samples')} joint posterior samples of the three models. The class map "
        "shows each place's most probable class, so a class that is often likely but seldom "
        "the most likely has a larger share here than on the map."
        + (f" {caveat}" if (caveat := region_area_caveat(rd)) else "")
    )
    doc.table(
        ["class", "share of area", "share of observed tiles"],
        [
            [
                c,
                _interval(area[c]["mean"], area[c]["lower"], area[c]["upper"], pct=True),
                _interval(tiles[c]["mean"], tiles[c]["lower"], tiles[c]["upper"], pct=True),
            ]
            for c in classes
        ],
    )
    _held_out_section(doc, headline.get("held_out_check"))


def _held_out_section(doc: Doc, check: Any) -> None:
    """The classes' held-out check (:mod:`pipelines.service_check`): a paragraph and a table
    of the whole region per group of tiles; nothing for a headline without one."""
    if not isinstance(check, dict):
        return
    parts = [p for p in (check.get("well_measured"), check.get("less_measured")) if p]
    if not parts:
        return
    doc.para(
        "Held-out check of the classes, on the test tiles with all three targets measured. A "
        "tile's class is that of its tests-weighted download, upload and latency levels; the "
        "expected share is the mean of the map's probability of the class at those tiles "
        "(each model's prediction of the tile's level, with the level's own noise, joined by "
        "the copula). An observed share whose 95% interval (counted by place) leaves out the "
        "expected one is marked: there the map's class probabilities are off for those tiles. "
        "Tiles with fewer tests are more like the map's typical tile; on real data a busy "
        "tile tends to do better than its neighbourhood."
    )
    for part in parts:
        whole = part["all"]
        groups = "; ".join(
            f"{name} {part[name]['tiles']} tiles, {100 * part[name]['most_probable_agrees']:.1f}%"
            for name in ("urban", "rural")
            if isinstance(part.get(name), dict)
        )
        doc.para(
            f"{held_out_group_text(part)} ({groups}); the mean probability it gave a tile's "
            f"own class {whole['p_observed_class']:.2f}, the Brier score {whole['brier']:.3f}."
        )
        doc.table(list(HELD_OUT_CLASS_HEADER), held_out_class_rows(whole, check["classes"]))
