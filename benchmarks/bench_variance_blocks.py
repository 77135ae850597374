"""The latent-variance product of a folded prediction: dense ``||B'u||^2`` against the
lower-triangular factor's column blocks (:meth:`geodbk.posterior.FoldedWeights.latent_variance`).

For r = 1024 (2,048 rows, a seed-size prediction chunk) and r = 256 (8,192 rows), random ``u``
and a random dense ``B``: microseconds per row for the dense product and for blocks of width
r/2, r/4, r/8 and r/16, best of three means of 20 calls, and the largest relative difference
from the float64 quadratic form ``u' B B' u``::

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/bench_variance_blocks.py --threads 1

Start it on a quiet machine (1-minute load below 0.5); the load at the start is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from geodbk.posterior import FoldedWeights, lower_triangular_factor


def _us_per_row(folded: FoldedWeights, u: torch.Tensor, *, calls: int = 20) -> float:
    """Best of three means of ``calls`` calls, in microseconds per row."""
    best = float("inf")
    with torch.no_grad():
        folded.latent_variance(u)
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                folded.latent_variance(u)
            best = min(best, (time.perf_counter() - start) / calls)
    return 1e6 * best / u.shape[0]


def main() -> None:
    """Command-line entry point."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(json.dumps({"load_before": os.getloadavg()[0], "threads": torch.get_num_threads()}))
    g = torch.Generator().manual_seed(0)
    for r, n in ((1024, 2048), (256, 8192)):
        u = torch.randn(n, r, generator=g)
        dense = torch.randn(r, r, generator=g) / r**0.5
        ref = torch.einsum("ni,ij,nj->n", u.double(), dense.double() @ dense.double().T, u.double())
        lower = lower_triangular_factor(dense)
        zero = torch.zeros(r)
        row: dict[str, float] = {"r": r, "rows": n}
        for blocks in (1, 2, 4, 8, 16):
            folded = (
                FoldedWeights(mean_vec=zero, factor=dense)
                if blocks == 1
                else FoldedWeights(mean_vec=zero, factor=lower, block_width=r // blocks)
            )
            with torch.no_grad():
                err = float(((folded.latent_variance(u).double() - ref).abs() / ref).max())
            row[f"blocks_{blocks}_us"] = round(_us_per_row(folded, u), 3)
            row[f"blocks_{blocks}_max_rel_err"] = err
        print(json.dumps(row))


if __name__ == "__main__":
    main()
