"""Pooled versus time-aware DBK-RBF on an ingested run (issue 10).

Fits two ``DBKRegressor`` variants on the run's train split (best epoch by validation NLL): the
pooled model on ``[x1, x2]`` and the time-aware model on ``[x1, x2, t]``, with t the quarter
scaled to [-1, 1] over the train split's quarter range (:class:`geodbk.geo.timeaxis.TimeScaling`,
as ``geodbk train --time`` does). Both use the same noise model (tests-aware by default: each test
tile is predicted as the average of its own ``tests``). Scores the test split overall, urban and
rural, and per quarter, and prints one JSON line per variant (stdout) and a summary (stderr).

Run it on a random split and on a forecast split (``geodbk ingest --split forecast``: the last
quarter is the test set, the one before validation)::

    OMP_NUM_THREADS=1 python benchmarks/bench_time.py --run runs/h10r --variants pooled,time \\
        --rank 256 --hidden 64 --epochs 150 --patience 20 --batch-size 512
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import numpy as np
import torch

from geodbk import DBKRegressor
from geodbk.geo.timeaxis import TimeScaling
from geodbk.metrics import COVERAGE95, MAE, NLL
from pipelines.benchmark import machine_info
from pipelines.rundir import load_tiles, require_run, target_spec
from pipelines.scoring import by_tests_scores, urban_rural_scores


def _rows(gdf: Any, log_column: str) -> dict[str, Any]:
    y = gdf[log_column].to_numpy(dtype=np.float64)
    X = gdf[["x1", "x2"]].to_numpy(dtype=np.float64)
    ok = np.isfinite(y) & np.isfinite(X).all(axis=1)
    return {s: gdf[(gdf["split"] == s).to_numpy() & ok] for s in ("train", "val", "test")}


def main(argv: list[str] | None = None) -> int:
    """Fit the variants and print their scores."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True)
    p.add_argument("--target", default="download")
    p.add_argument("--variants", default="pooled,time", help="comma list of pooled, time")
    p.add_argument("--noise", default="tests", choices=["tests", "tests+devices", "constant"])
    p.add_argument("--noise-power", action="store_true", help="learn the powers of tests/devices")
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=150)
    p.add_argument("--patience", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rd = require_run(args.run)
    spec = target_spec(args.target)
    gdf, meta = load_tiles(rd)
    rows = _rows(gdf, spec.log_column)
    ts = TimeScaling.from_quarters(rows["train"]["quarter"].astype(str))
    tests = {s: np.maximum(r["tests"].to_numpy(dtype=np.float64), 1.0) for s, r in rows.items()}
    devices = {s: np.maximum(r["devices"].to_numpy(dtype=np.float64), 1.0) for s, r in rows.items()}
    y = {s: r[spec.log_column].to_numpy(dtype=np.float64) for s, r in rows.items()}
    X2 = {s: r[["x1", "x2"]].to_numpy(dtype=np.float64) for s, r in rows.items()}
    X3 = {
        s: np.column_stack([X2[s], ts.scale(r["quarter"].astype(str).to_numpy())])
        for s, r in rows.items()
    }
    urban = rows["test"]["urban"].to_numpy(dtype=bool)
    q_test = rows["test"]["quarter"].astype(str).to_numpy()
    sd_train = float(np.std(y["train"]))
    noise_init = 0.01 if args.noise == "constant" else 0.5
    for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
        X = X3 if variant == "time" else X2
        model = DBKRegressor(
            rank=args.rank,
            hidden=args.hidden,
            epochs=args.epochs,
            patience=args.patience,
            batch_size=args.batch_size,
            lr=args.lr,
            noise=args.noise,
            noise_init=noise_init,
            noise_power=args.noise_power,
            device="cpu",
            seed=args.seed,
        )
        noise_kw: dict[str, Any] = {}
        predict_kw: dict[str, Any] = {}
        if args.noise != "constant":
            noise_kw = {"tests": tests["train"], "tests_val": tests["val"]}
            predict_kw = {"tests": tests["test"]}
        if args.noise == "tests+devices":
            noise_kw |= {"devices": devices["train"], "devices_val": devices["val"]}
            predict_kw["devices"] = devices["test"]
        t0 = time.time()
        model.fit(X["train"], y["train"], X["val"], y["val"], **noise_kw)
        fit_s = time.time() - t0
        pred = model.predict_dist(X["test"], **predict_kw)
        sd = np.sqrt(pred.var)
        scores = urban_rural_scores(y["test"], pred.mean, sd, urban, sd_train=sd_train)
        by_quarter = {}
        for q in sorted(set(q_test)):
            m = q_test == q
            by_quarter[q] = urban_rural_scores(
                y["test"][m], pred.mean[m], sd[m], urban[m], sd_train=sd_train
            )
        out = {
            "variant": variant,
            "run": str(rd.root),
            "split": meta.get("split"),
            "target": args.target,
            "noise": args.noise,
            "noise_power": args.noise_power,
            "time_scaling": ts.to_dict() if variant == "time" else None,
            "n": {s: len(v) for s, v in y.items()},
            "config": {
                k: getattr(args, k) for k in ("rank", "hidden", "epochs", "patience", "batch_size")
            },
            "fit_seconds": fit_s,
            "best_epoch": model.best_epoch_,
            "epochs_run": len(model.history_),
            "val_nll_best": min(h["val_nll"] for h in model.history_),
            "noise_parameters": model.noise_parameters(),
            "metrics": scores,
            "by_quarter": by_quarter,
            "by_tests": by_tests_scores(y["test"], pred.mean, sd, urban, tests["test"]),
            "torch_threads": torch.get_num_threads(),
            "machine": machine_info(torch.get_num_threads(), "cpu"),
        }
        print(json.dumps(out, default=str), flush=True)
        a, u, r = scores["all"], scores["urban"], scores["rural"]
        print(
            f"{variant}: test NLL {a[NLL]:.3f} MAE {a[MAE]:.3f} coverage {a[COVERAGE95]:.3f} "
            f"(urban {u[COVERAGE95]:.3f}, rural {r[COVERAGE95]:.3f}); "
            f"val {out['val_nll_best']:.3f};"
            f" best epoch {model.best_epoch_}/{len(model.history_)}; {fit_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
