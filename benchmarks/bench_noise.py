"""Constant vs tests-aware observation noise on an ingested run (issue 9).

Fits ``DBKRegressor`` variants on the run's train split (best epoch by validation NLL), scores
the test split overall, urban/rural and by tests bucket, and prints one JSON line per variant
(stdout) and a one-line summary (stderr). A tests-aware model predicts each test tile as the
average of its own number of tests; ``"covariate": "devices"`` uses the ``devices`` column in
place of ``tests`` as the noise covariate.

Example (figures: docs/decisions/noise_model.md)::

    OMP_NUM_THREADS=1 python benchmarks/bench_noise.py --run runs/h9 --target download \\
        --configs '[{"name": "tests", "noise": "tests", "noise_init": 0.5, "rank": 256,
                     "hidden": 64, "epochs": 60, "patience": 15, "batch_size": 512}]'
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np

from geodbk import DBKRegressor
from geodbk.metrics import COVERAGE95, MAE, NLL
from pipelines.rundir import load_tiles, require_run, target_spec
from pipelines.scoring import by_tests_scores, urban_rural_scores
from pipelines.training_data import split_arrays, split_tests


def main(argv: list[str] | None = None) -> int:
    """Run the variants given as a JSON list of ``DBKRegressor`` options (plus name/covariate)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--configs", required=True, help="JSON list of option dicts")
    args = p.parse_args(argv)
    rd = require_run(args.run)
    spec = target_spec(args.target)
    gdf, _ = load_tiles(rd)
    parts = split_arrays(gdf, args.target, source=rd.tiles)
    tp = split_tests(gdf, args.target)
    ok = np.isfinite(gdf[spec.log_column].to_numpy(dtype=np.float64))
    rows = {s: gdf[(gdf["split"] == s) & ok] for s in ("train", "val", "test")}
    devices = {s: np.maximum(r["devices"].to_numpy(dtype=np.float64), 1.0) for s, r in rows.items()}
    urban = rows["test"]["urban"].to_numpy(dtype=bool)
    (X, y), (Xv, yv), (Xt, yt) = parts["train"], parts["val"], parts["test"]
    for raw in json.loads(args.configs):
        cfg: dict[str, Any] = dict(raw)
        name = cfg.pop("name")
        cov = cfg.pop("covariate", "tests")
        T = tp if cov == "tests" else devices
        model = DBKRegressor(device="cpu", seed=0, **cfg)
        t0 = time.time()
        model.fit(X, y, Xv, yv, tests=T["train"], tests_val=T["val"])
        fit_s = time.time() - t0
        pred = (
            model.predict_dist(Xt, tests=T["test"]) if model.tests_aware else model.predict_dist(Xt)
        )
        sd = np.sqrt(pred.var)
        ur = urban_rural_scores(yt, pred.mean, sd, urban, sd_train=float(np.std(y)))
        bt = by_tests_scores(yt, pred.mean, sd, urban, tp["test"])
        out = {
            "name": name,
            "target": args.target,
            "covariate": cov,
            "config": cfg,
            "fit_seconds": fit_s,
            "best_epoch": model.best_epoch_,
            "epochs_run": len(model.history_),
            "noise": model.noise_parameters(),
            "val_nll_best": min(h["val_nll"] for h in model.history_),
            "metrics": ur,
            "by_tests": bt,
            "mean_var_f": float(pred.var_f.mean()),
        }
        print(json.dumps(out), flush=True)
        buckets = [(k, round(v[NLL], 3), round(v[COVERAGE95], 3)) for k, v in bt.items()]
        print(
            name,
            "val",
            round(out["val_nll_best"], 4),
            "test nll",
            round(ur["all"][NLL], 4),
            "mae",
            round(ur["all"][MAE], 4),
            "cov",
            round(ur["all"][COVERAGE95], 3),
            "buckets",
            buckets,
            out["noise"],
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
