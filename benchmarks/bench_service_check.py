"""The service classes' held-out check of several runs as one markdown table.

Reads what ``geodbk service`` wrote (``RUN/service/headline.json`` ``held_out_check``,
:mod:`pipelines.service_check`) and prints, per run and group of test tiles, the tiles, the
places, each class's expected and observed share (starred where the observed share's 95%
interval by place leaves out the expected one), the share whose most probable class was their
own and the Brier score. Run ``geodbk service --run RUN`` on each run first::

    python benchmarks/bench_service_check.py runs/svc-r runs/svc-t runs/svc-b
    python benchmarks/bench_service_check.py --headline headline_area.json runs/svc-t
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geodbk.metrics import tests_range


def table_rows(run: Path, *, name: str = "headline.json") -> list[str]:
    """The markdown rows of one run's check in ``RUN/service/name`` (none without one)."""
    headline = json.loads((run / "service" / name).read_text(encoding="utf-8"))
    check = headline.get("held_out_check")
    if not check:
        return []
    rows = []
    for part in (check.get("well_measured"), check.get("less_measured")):
        if not part:
            continue
        whole = part["all"]
        shares = [
            f"{100 * c['expected_share']:.1f} / {100 * c['observed_share']:.1f}"
            + ("" if c["consistent"] else "*")
            for c in (whole["classes"][name] for name in check["classes"])
        ]
        rows.append(
            f"| {run.name} | {tests_range(part)} | {whole['tiles']} ({whole['places']}) | "
            + " | ".join(shares)
            + f" | {100 * whole['most_probable_agrees']:.1f} | {whole['brier']:.3f} |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories after geodbk service")
    parser.add_argument(
        "--headline",
        default="headline.json",
        help="the headline file in RUN/service (headline_area.json for --quantity area)",
    )
    args = parser.parse_args()
    first = json.loads((args.runs[0] / "service" / args.headline).read_text(encoding="utf-8"))
    names = first.get("classes", ["unserved", "underserved", "served"])
    print(
        "| run | tests | tiles (places) | "
        + " | ".join(f"{n}: expected / observed %" for n in names)
        + " | most probable right % | Brier |"
    )
    print("|---|---|---:|" + "---:|" * len(names) + "---:|---:|")
    for run in args.runs:
        for row in table_rows(run, name=args.headline):
            print(row)


if __name__ == "__main__":
    main()
