"""Seconds of a DBK-RBF prediction by chunk size on the CPU: the fastest chunk keeps its
widest intermediate (rows x r) near ``geodbk.predictive.CPU_CHUNK_VALUES`` values.

Times ``DBKModel.latent_folded`` through :func:`geodbk.predictive.predict_in_chunks` (what
``DBKRegressor.predict_dist`` and ``geodbk predict`` run) on ``--points`` random inputs, for an
untrained model of each rank (the cost does not depend on the weights), best of ``--repeat``::

    OMP_NUM_THREADS=2 python benchmarks/bench_predict_chunk.py --threads 2

Start it on a quiet machine (nothing else running, 1-minute load below 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from geodbk.model import DBKModel
from geodbk.predictive import chunk_rows_for, predict_in_chunks


def seconds(model: DBKModel, x: np.ndarray, chunk: int, repeat: int) -> float:
    """Best wall time of predicting ``x`` in chunks of ``chunk`` rows (no cap)."""
    folded = model.fold()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        predict_in_chunks(
            lambda xb: model.latent_folded(xb, folded),
            x,
            chunk_size=chunk,
            device=torch.device("cpu"),
            dtype=torch.float32,
        )
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    """Print one JSON line per (rank, chunk) and the chunk :func:`chunk_rows_for` picks."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--points", type=int, default=262_144)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--configs", default="256:64,512:128,1024:256", help="rank:hidden pairs")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    x = np.random.default_rng(0).uniform(-1.0, 1.0, size=(args.points, 2))
    print(json.dumps({"threads": args.threads, "load": os.getloadavg()[0], "points": args.points}))
    for pair in args.configs.split(","):
        rank, hidden = (int(v) for v in pair.split(":"))
        torch.manual_seed(0)
        model = DBKModel(2, expansion="rbf", rank=rank, hidden=hidden).eval()
        picked = chunk_rows_for(65536, device="cpu", width=rank)
        for chunk in (65536, 16384, 8192, 4096, 2048, 1024):
            s = seconds(model, x, chunk, args.repeat)
            print(
                json.dumps(
                    {
                        "rank": rank,
                        "hidden": hidden,
                        "chunk": chunk,
                        "us_per_point": 1e6 * s / args.points,
                        "picked": chunk == picked,
                    }
                )
            )


if __name__ == "__main__":
    main()
