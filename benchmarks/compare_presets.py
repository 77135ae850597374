"""Set two ``geodbk benchmark`` reports side by side (e.g. ``--preset paper`` against ``tuned``).

Prints a Markdown table with, per model and report: test NLL, 95% coverage (all, urban,
rural), the mean 95% interval width and the sd of the per-tile widths (near 0: the
near-constant intervals of the SVGP-ELBO models)::

    python benchmarks/compare_presets.py paper=runs/hi/benchmark/download_paper.json \\
        tuned=runs/hi/benchmark/download_tuned.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from geodbk.metrics import COVERAGE95, NLL, WIDTH95, WIDTH_SD, canonical_keys


def _mean(stat: dict[str, Any] | None, scale: float = 1.0, digits: int = 3) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    return f"{scale * stat['mean']:.{digits}f}"


def rows(label: str, report: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """``(model, label, cells)`` for every model of ``report``."""
    out = []
    for name, entry in report["models"].items():
        s = entry.get("summary")
        if not s:
            out.append((name, label, ["failed"] + ["–"] * 6))
            continue
        cov = [_mean(s[g][COVERAGE95], 100, 1) for g in ("all", "urban", "rural")]
        out.append(
            (
                name,
                label,
                [
                    _mean(s["all"][NLL]),
                    *cov,
                    _mean(s["all"][WIDTH95]),
                    _mean(s["all"][WIDTH_SD]),
                    str(entry.get("overrides") or ""),
                ],
            )
        )
    return out


def table(reports: dict[str, dict[str, Any]]) -> str:
    """The Markdown table, models in the first report's order, one row per report."""
    lines = [
        "| model | preset | test NLL | coverage | urban | rural | PI width | width sd | chosen |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    by_model: dict[str, list[tuple[str, list[str]]]] = {}
    for label, report in reports.items():
        for name, lab, cells in rows(label, report):
            by_model.setdefault(name, []).append((lab, cells))
    for name, entries in by_model.items():
        for lab, cells in entries:
            lines.append(f"| {name} | {lab} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reports", nargs="+", help="LABEL=PATH of a benchmark JSON report")
    args = parser.parse_args(argv)
    reports = {}
    for item in args.reports:
        label, _, path = item.partition("=")
        reports[label] = canonical_keys(json.loads(Path(path).read_text(encoding="utf-8")))
    print(table(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
