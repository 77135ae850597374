"""The seed's 1-D heteroscedastic toy with every benchmark model (issue 3 / issue 7).

x ~ U(-1, 1); f(x) = 0.3 (1 - s1) + 0.9 (s1 - s2) - 0.6 (s2 - s3) with s1 = σ(200 (x + 0.6)),
s2 = σ(200 x), s3 = σ(200 (x - 0.4)); y = f(x) + |2 sin(10 x)| ε. DBK settings from the seed
(h = 64, r = 128, α = β = 0.01, batch 200); every model gets the same epochs, batch and seed.

Reports test MAE / NLL / CRPS / coverage / PI width, the spread of the PI widths, and the
Spearman rank correlation between the predictive sd and the true noise sd (does the interval
track the heteroscedastic noise?), plus training seconds. Writes JSON and Markdown.

    OMP_NUM_THREADS=1 python -m benchmarks.bench_baselines --epochs 100 --out runs/benchmarks/toy1d
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from geodbk.atomic import atomic_write_json, atomic_write_text
from geodbk.baselines.registry import MODEL_NAMES, build_model
from geodbk.metrics import COVERAGE95, CRPS, MAE, NLL, WIDTH95, WIDTH_SD, canonical_keys
from pipelines.benchmark import group_metrics, machine_info


def toy(n: int, *, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Inputs (n, 1), targets and the true noise sd of the seed's 1-D experiment."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, n)

    def sig(z: np.ndarray) -> np.ndarray:
        return 0.5 * (1.0 + np.tanh(0.5 * z))

    s1, s2, s3 = sig(200 * (x + 0.6)), sig(200 * x), sig(200 * (x - 0.4))
    f = 0.3 * (1 - s1) + 0.9 * (s1 - s2) - 0.6 * (s2 - s3)
    sd = np.abs(2.0 * np.sin(10.0 * x))
    return x[:, None], f + sd * rng.standard_normal(n), sd


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--models", default="all")
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=Path("runs/benchmarks/toy1d"))
    p.add_argument("--merge", action="store_true", help="keep other models' results in OUT.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    names = list(MODEL_NAMES) if args.models == "all" else args.models.split(",")
    X, y, _ = toy(args.n_train, seed=args.seed)
    Xv, yv, _ = toy(args.n_train // 4, seed=args.seed + 1)
    Xt, yt, sdt = toy(2000, seed=args.seed + 2)
    log_sd = math.log(float(np.std(y)))
    results: dict[str, Any] = {}
    if args.merge and args.out.with_suffix(".json").is_file():
        old = canonical_keys(json.loads(args.out.with_suffix(".json").read_text(encoding="utf-8")))[
            "models"
        ]
        results = {k: v for k, v in old.items() if k not in names}
    dbk_opts = {"alpha": 0.01, "beta": 0.01}
    for name in names:
        overrides = dict(dbk_opts) if name in ("dbk-rbf", "dbk-silu") else {}
        try:
            model = build_model(
                name,
                epochs=args.epochs,
                batch_size=200,
                seed=args.seed,
                rank=128,
                hidden=64,
                overrides=overrides,
            )
            t0 = time.perf_counter()
            model.fit(X, y, Xv, yv)
            secs = time.perf_counter() - t0
            pred = model.predict_dist(Xt)
            m = group_metrics(yt, pred.mean, pred.var, log_sd_train=log_sd)
            hi = sdt > 1.0
            m["nll_high_noise"] = group_metrics(
                yt[hi], pred.mean[hi], pred.var[hi], log_sd_train=log_sd
            )[NLL]
            m["nll_low_noise"] = group_metrics(
                yt[~hi], pred.mean[~hi], pred.var[~hi], log_sd_train=log_sd
            )[NLL]
            m["spearman_sd_vs_true_noise"] = float(spearmanr(np.sqrt(pred.var), sdt).statistic)
            m["train_seconds"] = secs
            m["epochs_run"] = len(model.history_)
            results[name] = {"status": "ok", "metrics": m}
            print(
                f"{name}: NLL {m[NLL]:.3f} cov {m[COVERAGE95]:.3f} rho {m['spearman_sd_vs_true_noise']:.2f} ({secs:.1f}s)",
                flush=True,
            )
        except Exception as exc:
            results[name] = {"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
            print(f"{name}: FAILED {exc}\n{traceback.format_exc(limit=3)}", flush=True)
    report = {
        "experiment": "seed 1-D heteroscedastic toy",
        "budget": {
            "epochs": args.epochs,
            "batch_size": 200,
            "rank": 128,
            "hidden": 64,
            "alpha": 0.01,
            "beta": 0.01,
            "n_train": args.n_train,
            "n_val": args.n_train // 4,
            "n_test": 2000,
            "seed": args.seed,
        },
        "machine": machine_info(args.threads, "cpu"),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "models": results,
    }
    atomic_write_json(args.out.with_suffix(".json"), report)
    lines = [
        "| model | MAE | NLL | NLL (sd>1) | NLL (sd≤1) | CRPS | coverage | PI width | width sd | Spearman(sd, true sd) | train s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        if r["status"] != "ok":
            lines.append(f"| {name} | failed: {r['reason'][:100]} |||||||||| ")
            continue
        m = r["metrics"]
        lines.append(
            f"| {name} | {m[MAE]:.3f} | {m[NLL]:.3f} | {m['nll_high_noise']:.3f} | {m['nll_low_noise']:.3f} | {m[CRPS]:.3f} | "
            f"{100 * m[COVERAGE95]:.1f}% | {m[WIDTH95]:.3f} | {m[WIDTH_SD]:.3f} | {m['spearman_sd_vs_true_noise']:.2f} | {m['train_seconds']:.1f} |"
        )
    atomic_write_text(args.out.with_suffix(".md"), "\n".join(lines) + "\n")
    print(json.dumps({k: v.get("metrics", {}).get(NLL) for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
