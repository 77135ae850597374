"""Folded CPU prediction time per point against the rows of one block
(``geodbk.model.CPU_PREDICT_BLOCK_ROWS``).

``DBKModel.latent_folded`` splits a chunk of inputs into blocks of that many rows on the CPU.
For each block size this times ``latent_folded`` on ``--points`` random inputs in [-1, 1]²,
passed in chunks of ``--chunk`` rows (as ``bench_core.py`` and ``geodbk predict`` pass them),
and prints the best of ``--repeats`` passes in µs per point, at the seed's size and at
r = 256::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_predict_rows.py --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch

from geodbk import model as model_module
from geodbk.model import DBKModel

SIZES = ((1024, 256), (256, 64))


def us_per_point(model: DBKModel, x: torch.Tensor, *, chunk: int, repeats: int) -> float:
    """Best time of ``repeats`` folded passes over ``x`` in chunks of ``chunk``, µs per point."""
    folded = model.fold()
    best = float("inf")
    for _ in range(repeats + 1):  # the first pass warms up
        start = time.perf_counter()
        with torch.no_grad():
            for i in range(0, x.shape[0], chunk):
                model.latent_folded(x[i : i + chunk], folded)
        best = min(best, time.perf_counter() - start)
    return best / x.shape[0] * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--points", type=int, default=20_000)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 1024, 2048, 4096, 65536])
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.rand(args.points, 2) * 2 - 1
    for rank, hidden in SIZES:
        model = DBKModel(2, expansion="rbf", rank=rank, hidden=hidden).eval()
        for rows in args.rows:
            model_module.CPU_PREDICT_BLOCK_ROWS = rows
            t = us_per_point(model, x, chunk=args.chunk, repeats=args.repeats)
            print(f"r={rank} h={hidden} chunk={args.chunk} block rows={rows}: {t:.2f} µs/point")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
