"""The two triangular solves of DBK-RBF's ``dl/dKzz`` (``L^{-T} D' L^{-1}``): the first taken
from the left (``L^{-T} D'``) or from the right (``(D L^{-1})'``), the second from the right.

Times both forms on one CPU thread for r = 256, 512, 768 and 1024 (``L`` the Cholesky factor
of a random positive-definite matrix, ``D`` a random lower-triangular matrix, float32), in
three alternating rounds, and prints one JSON line per rank: milliseconds per sandwich of each
form, per round. ``geodbk.bases.RIGHT_SOLVES_MAX_RANK`` is set from these figures::

    OMP_NUM_THREADS=1 python benchmarks/bench_whiten_solves.py

``--step`` times whole DBK-RBF training steps instead (``profile_step.py``'s model and batch,
r = 256, h = 64, b = 256 by default): 20 alternating blocks of 50 steps with each form in one
process, so that the machine's drift between processes does not enter the comparison::

    OMP_NUM_THREADS=1 python benchmarks/bench_whiten_solves.py --step

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from functools import partial

import torch

solve = torch.linalg.solve_triangular


def left(chol: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """``L^{-T} D' L^{-1}`` with the first solve from the left."""
    half = solve(chol.T, lower.mT, upper=True)
    return solve(chol, half, upper=False, left=False)


def right(chol: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """``L^{-T} D' L^{-1}`` with both solves from the right."""
    half = solve(chol, lower, upper=False, left=False).mT
    return solve(chol, half, upper=False, left=False)


def _ms(fn: Callable[[], torch.Tensor], calls: int) -> float:
    """Milliseconds per call of ``fn`` (after three warm-up calls)."""
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def step_ab(rank: int, hidden: int, batch: int, *, blocks: int = 20, steps: int = 50) -> dict:
    """Median and min milliseconds per training step with the first solve from the right (up
    to :data:`geodbk.bases.RIGHT_SOLVES_MAX_RANK`) and from the left, in alternating blocks."""
    import statistics

    from profile_step import step_setup

    import geodbk.bases as bases
    from geodbk.objectives import batch_loss

    model, config, opt, x, y = step_setup("rbf", rank, hidden, batch)
    default = bases.RIGHT_SOLVES_MAX_RANK

    def run(n: int) -> float:
        start = time.perf_counter()
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            batch_loss(model, x, y, n=100_000, config=config).backward()
            opt.step()
        return (time.perf_counter() - start) / n * 1e3

    run(steps)
    times: dict[str, list[float]] = {"right": [], "left": []}
    try:
        for _ in range(blocks):
            for form in times:
                bases.RIGHT_SOLVES_MAX_RANK = max(default, rank) if form == "right" else 0
                times[form].append(run(steps))
    finally:
        bases.RIGHT_SOLVES_MAX_RANK = default
    return {
        "rank": rank,
        **{f"{k}_median_ms": statistics.median(v) for k, v in times.items()},
        **{f"{k}_min_ms": min(v) for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> int:
    """Run the timings; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[256, 512, 768, 1024])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--step", action="store_true", help="time whole training steps (see above)")
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(json.dumps({"load_before": os.getloadavg()[0], "threads": 1, "torch": torch.__version__}))
    if args.step:
        print(json.dumps(step_ab(args.rank, args.hidden, args.batch)))
        return 0
    for rank in args.ranks:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(rank, rank, generator=gen)
        chol = torch.linalg.cholesky(a @ a.T + rank * torch.eye(rank))
        lower = torch.tril(torch.randn(rank, rank, generator=gen))
        calls = max(10, int(2e10 // rank**3))

        rounds = [
            {
                "left_ms": _ms(partial(left, chol, lower), calls),
                "right_ms": _ms(partial(right, chol, lower), calls),
            }
            for _ in range(args.rounds)
        ]
        print(json.dumps({"rank": rank, "calls": calls, "rounds": rounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
