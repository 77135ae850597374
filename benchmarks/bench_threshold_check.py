"""The report's threshold check of several runs and targets as one markdown table.

Reads ``RUN/report/TARGET/metrics.json`` ``map_calibration.thresholds`` (written by
``geodbk report``, :mod:`pipelines.threshold_check`) and prints its rows
(:func:`geodbk.metrics.threshold_check_rows`) with the run and target in front::

    python benchmarks/bench_threshold_check.py --targets download upload \\
        runs/svc-r runs/svc-t runs/svc-tt runs/svc-b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from geodbk.metrics import THRESHOLD_CHECK_HEADER, threshold_check_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run directories after geodbk report")
    parser.add_argument("--targets", nargs="+", default=["download"], help="targets to read")
    args = parser.parse_args()
    print("| run | target | " + " | ".join(THRESHOLD_CHECK_HEADER) + " |")
    print("|---|---|" + "---|" * len(THRESHOLD_CHECK_HEADER))
    for run in args.runs:
        for target in args.targets:
            path = run / "report" / target / "metrics.json"
            metrics = json.loads(path.read_text(encoding="utf-8"))
            block = (metrics.get("map_calibration") or {}).get("thresholds") or {}
            for row in threshold_check_rows(block):
                print(f"| {run.name} | {target} | " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
