"""A large region end to end: does every stage run, in what time and memory?

Generates a synthetic Ookla-style region far larger than the embedded one
(:func:`geodbk.geo.synthetic.generate`: a 6° x 4.4° box, about 100,000 mobile tiles a quarter,
8 quarters, so about 700,000 tile-quarters inside the state), then runs ``geodbk ingest``,
``geodbk train`` for the three targets with a small GP (the stages after the GP, the tile
effect and the local layer, run in full), ``geodbk predict`` (the default grid, about 10^6
cells), ``geodbk report`` and ``geodbk service``, each in its own process started once the
1-minute load is below 0.5, and records each stage's wall time, peak resident memory
(``os.wait4``) and starting load::

    OMP_NUM_THREADS=2 python benchmarks/bench_large_region.py --work /tmp/large \\
        --out /tmp/large/large_region.json

The GP is trained for 2 epochs (``--epochs``): the point is whether the data-sized stages
scale, not the model's quality.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_tile_maps import QUIET_LOAD, _wait_for_quiet

from geodbk.geo.synthetic import SyntheticConfig, generate


def _stage(name: str, argv: list[str], log: Path) -> dict[str, Any]:
    """Run ``geodbk ARGV`` in its own process once the 1-minute load is below 0.5; its wall
    seconds, peak RSS (MB) and the load it started at."""
    load = _wait_for_quiet(QUIET_LOAD)
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *argv], stdout=out, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    print(f"{name}: {seconds:.1f} s, {usage.ru_maxrss / 1024:.0f} MB, exit {code}", flush=True)
    if code != 0:
        raise SystemExit(f"{name} failed (exit {code}); see {log}")
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "load_at_start": round(load, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Generate the region, run the stages, write the JSON; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, required=True, help="scratch folder (data and run)")
    p.add_argument("--out", type=Path, required=True, help="result JSON")
    p.add_argument("--tiles", type=int, default=100_000, help="mobile tiles a quarter")
    p.add_argument("--quarters", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args(argv)
    data, run = args.work / "data", args.work / "run"
    config = SyntheticConfig(
        half_width=3.0,
        half_height=2.2,
        mobile_tiles=args.tiles,
        fixed_tiles=500,
        n_quarters=args.quarters,
    )
    t0 = time.perf_counter()
    summary = generate(data, config=config)
    stages: dict[str, Any] = {"generate": {"seconds": round(time.perf_counter() - t0, 1)}}
    last_year = config.year + (config.n_quarters - 1) // 4
    last_quarter = (config.n_quarters - 1) % 4 + 1
    cfg = args.work / "small.yaml"
    cfg.write_text(f"rank: 64\nhidden: 32\nepochs: {args.epochs}\nbatch_size: 4096\ndevice: cpu\n")
    census = data / "census"
    logs = args.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stages["ingest"] = _stage(
        "ingest",
        [
            "ingest",
            "--run",
            str(run),
            "--tiles",
            str(data / "ookla/parquet"),
            "--type",
            "mobile",
            "--state",
            "SY",
            "--states-file",
            str(census / "synthetic_state_boundaries.geojson"),
            "--urban-areas",
            str(census / "synthetic_uac20.geojson"),
            "--quarters",
            f"{config.year}Q1:{last_year}Q{last_quarter}",
            "--split",
            "random",
        ],
        logs / "ingest.log",
    )
    for target in ("download", "upload", "latency"):
        stages[f"train {target}"] = _stage(
            f"train {target}",
            ["train", "--run", str(run), "--target", target, "--config", str(cfg), "--no-progress"],
            logs / f"train_{target}.log",
        )
    stages["predict"] = _stage(
        "predict", ["predict", "--run", str(run), "--target", "download"], logs / "predict.log"
    )
    stages["report"] = _stage(
        "report", ["report", "--run", str(run), "--target", "download"], logs / "report.log"
    )
    stages["service"] = _stage("service", ["service", "--run", str(run)], logs / "service.log")
    ingest = json.loads((run / "ingest_report.json").read_text())
    result = {
        "tile_quarters_generated": sum(v for k, v in summary["tiles"].items() if "mobile" in k),
        "ingest_counts": ingest["counts"],
        "stages": stages,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}",
        "command": "python benchmarks/bench_large_region.py " + " ".join(argv or sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
