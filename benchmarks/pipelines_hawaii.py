"""Full pipeline on the real Hawaii mobile data: ingest -> train -> predict -> report, timed.

Usage::

    OMP_NUM_THREADS=2 python -m benchmarks.pipelines_hawaii --run runs/hawaii \
        --targets download upload --rank 512 --hidden 128 --epochs 100

Needs ``../shared/data/hawaii`` (see ``tests/conftest.py``). Writes the run directory and
``RUN/pipeline_benchmark.json`` (settings, per-stage seconds, metrics and constant-mean
baselines per target), which ``docs/benchmarks/pipelines.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from geodbk.atomic import atomic_write_json

HAWAII = Path(__file__).resolve().parents[2] / "shared" / "data" / "hawaii"


def hawaii_ingest_kwargs(data: Path = HAWAII) -> dict[str, Any]:
    """Arguments of :func:`pipelines.ingest.run_ingest` for the Hawaii mobile tiles."""
    return {
        "tiles": [data / "ookla" / "parquet"],
        "type": "mobile",
        "state": "HI",
        "states_file": data / "census" / "cb_2018_us_state_500k.zip",
        "tracts": data / "census" / "tl_2010_15_tract10.zip",
        "rural_tracts": data / "census" / "fcc_rural_census_tracts_2010.csv",
        "split": "random",
        "seed": 0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; see the module docstring."""
    import torch

    from pipelines.config import TrainConfig
    from pipelines.ingest import run_ingest
    from pipelines.predict import run_predict
    from pipelines.report import run_report
    from pipelines.train import run_train

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--run", type=Path, default=Path("runs/hawaii"))
    p.add_argument("--targets", nargs="+", default=["download", "upload"])
    p.add_argument("--rank", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--patience", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--skip-ingest", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = TrainConfig(
        rank=args.rank,
        hidden=args.hidden,
        epochs=args.epochs,
        patience=args.patience,
        batch_size=args.batch_size,
        device="cpu",
    )
    seconds: dict[str, float] = {}
    if not args.skip_ingest:
        t0 = time.perf_counter()
        run_ingest(run=args.run, **hawaii_ingest_kwargs())
        seconds["ingest"] = time.perf_counter() - t0
    results: dict[str, Any] = {}
    for target in args.targets:
        stages: tuple[tuple[str, Any, dict[str, Any]], ...] = (
            ("train", run_train, {"config": cfg, "progress": False}),
            ("predict", run_predict, {}),
            ("report", run_report, {}),
        )
        for stage, fn, kw in stages:
            t0 = time.perf_counter()
            fn(args.run, target=target, **kw)
            seconds[f"{stage}_{target}"] = time.perf_counter() - t0
        summary = json.loads((args.run / "report" / target / "summary.json").read_text())
        model = json.loads((args.run / "models" / target / "model.json").read_text())
        results[target] = {
            "metrics": summary["metrics"],
            "baseline_constant_mean": summary["baseline_constant_mean"],
            "service_coverage": summary["service_coverage"],
            "best_epoch": summary["best_epoch"],
            "epochs_run": model["metadata"]["timings"]["epochs_run"],
            "seconds_per_epoch": model["metadata"]["timings"]["seconds_per_epoch"],
            "n_train": model["metadata"]["n_train"],
            "n_val": model["metadata"]["n_val"],
        }
    out = {
        "config": cfg.to_dict(),
        "seconds": seconds,
        "results": results,
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
    }
    atomic_write_json(args.run / "pipeline_benchmark.json", out)
    print(json.dumps(out["seconds"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
