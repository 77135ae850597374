"""The training step with the blocked ``||L'phi||^2`` against one dense product, in one process.

``DBKModel.forward`` sums the latent variance over q(w)'s lower-triangular column blocks when
``r >= geodbk.model.TRAINING_BLOCK_MIN_RANK`` (:func:`geodbk.triangular.latent_moments`). This
script times the step of ``benchmarks/profile_step.py`` (dPPGP, AdamW, one random batch) with
the threshold set so that each size runs dense, then blocked, alternating, ``--rounds`` times,
and prints the median step of each round in ms::

    OMP_NUM_THREADS=1 python benchmarks/bench_training_blocks.py --threads 1

``--test-nll RUN [RUN ...]`` instead prints the test-row NLL and 95% coverage of each run's
trained GP (``models/TARGET``; noise included, no tile effect), to compare two trainings of one
ingest, e.g. one made with the previous commit's dense product::

    python benchmarks/bench_training_blocks.py --test-nll runs/q/dense runs/q/blocked

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profile_step import step_setup

import geodbk.model as model_module
from geodbk.geo.contract import Z95
from geodbk.objectives import batch_loss

SIZES = ((1024, 256, 1024), (256, 64, 256))


def median_step_ms(expansion: str, rank: int, hidden: int, batch: int, *, steps: int) -> float:
    """Median wall time of ``steps`` training steps after two warm-up steps."""
    model, config, opt, x, y = step_setup(expansion, rank, hidden, batch)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        batch_loss(model, x, y, n=100_000, config=config).backward()
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def test_nll(runs: list[Path], target: str) -> None:
    """Print each run's test NLL and 95% coverage (GP only, noise included)."""
    from bench_local_layer import _gp_parts, _rows

    from geodbk import DBKRegressor

    for run in runs:
        model = DBKRegressor.load(run / "models" / target, device="cpu")
        frame = _rows(run, target)
        gp = _gp_parts(model, frame)
        test = (frame["split"] == "test").to_numpy()
        var = gp["var_f"][test] + gp["comp"][test].sum(1)
        resid = gp["residual"][test]
        nll = 0.5 * (np.log(2 * np.pi * var) + resid**2 / var)
        cover = np.abs(resid) <= Z95 * np.sqrt(var)
        print(
            f"{run}: best epoch {model.metadata_.get('best_epoch')}, test NLL "
            f"{nll.mean():.4f}, coverage {cover.mean():.4f} ({test.sum()} rows)"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the A/B (or ``--test-nll``); see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--test-nll", type=Path, nargs="+", default=None)
    p.add_argument("--target", default="download")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.test_nll:
        test_nll(args.test_nll, args.target)
        return 0
    print(f"load {os.getloadavg()[0]:.2f}, threads {args.threads}")
    results: dict[tuple, list[float]] = {}
    for _ in range(args.rounds):
        for rank, hidden, batch in SIZES:
            for expansion in ("rbf", "silu"):
                for mode, min_rank in (("dense", 10**9), ("blocked", 1)):
                    model_module.TRAINING_BLOCK_MIN_RANK = min_rank
                    ms = median_step_ms(
                        expansion, rank, hidden, batch, steps=10 if rank >= 1024 else 60
                    )
                    results.setdefault((expansion, rank, hidden, batch, mode), []).append(ms)
    for (expansion, rank, hidden, batch, mode), values in results.items():
        print(
            f"{expansion} r={rank} h={hidden} b={batch} {mode:8s} "
            + " ".join(f"{v:.1f}" for v in values)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
