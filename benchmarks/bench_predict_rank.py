"""Prediction with the truncated variance factor: its rank, its error and its speed.

For a saved model bundle (``--model runs/X/models/download``) or a freshly trained random
DBK model (``--rank``/``--hidden``, ``--steps`` dPPGP steps on synthetic data), fold the
weights exactly (``variance_rtol=0``) and truncated (``variance_rtol=--rtol``,
:func:`geodbk.posterior.fold_into_basis`) and print

* ``k`` and ``r``: the eigenpairs kept by the bound ``lambda_{k+1} C <= rtol min s2``
  (``C >= ||phi||^2``: ``sk2`` for DBK-RBF), and ``variance_bound = lambda_{k+1} C``;
* ``k_empirical``: the smallest rank whose dropped variance ``sum_{j>k} lambda_j
  (v_j'phi)^2`` is ``<= rtol min s2`` at every one of the ``--points`` random inputs in the box
  (an a-posteriori figure for those points only, not a bound);
* the max relative error of the predictive variance ``var_f + s2`` over the points, with
  ``s2 = min s2`` (the largest relative error any noise level gives);
* µs/point of the exact and of the truncated prediction (mean and variance, one backbone pass
  each) at ``--threads`` threads, median of ``--reps`` (skipped with ``--no-timing``).

``--force-rank K`` times and measures a factor truncated at K whatever the bound says (to see
what a looser criterion would buy).

Usage::

    .venv/bin/python benchmarks/bench_predict_rank.py --model runs/X/models/download --threads 1
    .venv/bin/python benchmarks/bench_predict_rank.py --rank 1024 --hidden 256 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from geodbk.model import DBKModel
from geodbk.posterior import (
    VARIANCE_RTOL,
    FoldedWeights,
    feature_sq_bound,
)


def _random_model(rank: int, hidden: int, steps: int, *, batch: int, seed: int) -> DBKModel:
    """A DBK-RBF model trained ``steps`` dPPGP steps on ``y = sin(3 x1) cos(2 x2) + noise``."""
    from geodbk.hyperparameters import DBKHyperparameters
    from geodbk.training import LoopConfig, _make_optimizer, batch_loss

    torch.manual_seed(seed)
    model = DBKModel(2, expansion="rbf", rank=rank, hidden=hidden)
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", batch_size=batch))
    opt = _make_optimizer(model, config)
    n = 100 * batch
    for _ in range(steps):
        x = torch.rand(batch, 2) * 2 - 1
        y = torch.sin(3 * x[:, 0]) * torch.cos(2 * x[:, 1]) + 0.1 * torch.randn(batch)
        opt.zero_grad(set_to_none=True)
        batch_loss(model, x, y, n=n, config=config).backward()
        opt.step()
    return model.eval()


def _load(path: str) -> DBKModel:
    from geodbk import DBKRegressor

    est = DBKRegressor.load(path, device="cpu")
    return est.model_.eval()


def _eigen(model: DBKModel) -> tuple[torch.Tensor, torch.Tensor]:
    lt = model.q.scale_tril().detach().to(torch.float64)
    cov = lt @ lt.T
    evals, evecs = torch.linalg.eigh(0.5 * (cov + cov.T))
    return evals.flip(0).clamp_min(0.0), evecs.flip(1)


def _forced(model: DBKModel, k: int, evals: torch.Tensor, evecs: torch.Tensor) -> FoldedWeights:
    exact = model.fold(variance_rtol=0.0)
    dtype = exact.factor.dtype
    factor = model.basis.pullback((evecs[:, :k] * evals[:k].sqrt()).to(dtype))
    c = feature_sq_bound(model.basis, out_norm=model.backbone.out_norm) or float("inf")
    bound = float(evals[k]) * c if k < evals.numel() else 0.0
    return FoldedWeights(mean_vec=exact.mean_vec, factor=factor, variance_bound=bound)


@torch.no_grad()
def _errors(
    model: DBKModel,
    x: torch.Tensor,
    exact: FoldedWeights,
    trunc: FoldedWeights,
    evals: torch.Tensor,
    evecs: torch.Tensor,
    *,
    s2: float,
    chunk: int,
) -> tuple[float, torch.Tensor]:
    """Max relative error of ``var_f + s2`` and the max over x of the dropped variance per k."""
    rel = 0.0
    dropped = torch.zeros(evals.numel() + 1, dtype=torch.float64)
    for i in range(0, x.shape[0], chunk):
        xb = x[i : i + chunk]
        _, vf0 = model.latent_folded(xb, exact)
        _, vf1 = model.latent_folded(xb, trunc)
        v0 = vf0.double() + s2
        rel = max(rel, float(((v0 - vf1.double() - s2).abs() / v0).max()))
        phi = model.features(xb).double()
        per_dir = (phi @ evecs) ** 2 * evals  # lambda_j (v_j'phi)^2
        tail = per_dir.flip(1).cumsum(1).flip(1)  # tail[:, k] = dropped when keeping k
        tail = torch.cat([tail, torch.zeros(tail.shape[0], 1, dtype=tail.dtype)], 1)
        dropped = torch.maximum(dropped, tail.max(0).values)
    return rel, dropped


@torch.no_grad()
def _time(
    model: DBKModel, x: torch.Tensor, folded: FoldedWeights, *, chunk: int, reps: int
) -> float:
    def run() -> None:
        for i in range(0, x.shape[0], chunk):
            model.predict_folded(x[i : i + chunk], folded)

    run()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times) / x.shape[0]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, run the measurement, print and return the results."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="saved model bundle (DBKRegressor.save directory)")
    p.add_argument("--rank", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=300, help="dPPGP steps of the random model")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--rtol", type=float, default=VARIANCE_RTOL)
    p.add_argument("--force-rank", type=int, default=None)
    p.add_argument("--points", type=int, default=100_000)
    p.add_argument("--box", type=float, nargs=2, default=(-1.0, 1.0), metavar=("LO", "HI"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--chunk", type=int, default=8192)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--no-timing", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    if args.model:
        model = _load(args.model)
    else:
        model = _random_model(args.rank, args.hidden, args.steps, batch=args.batch, seed=args.seed)
    dtype = model.const_mean.dtype
    r = model.rank
    exact = model.fold(variance_rtol=0.0)
    evals, evecs = _eigen(model)
    if args.force_rank is not None:
        trunc = _forced(model, args.force_rank, evals, evecs)
    else:
        trunc = model.fold(variance_rtol=args.rtol)
    s2 = model.min_noise_var()
    g = torch.Generator().manual_seed(args.seed + 1)
    lo, hi = args.box
    x = (lo + (hi - lo) * torch.rand(args.points, model.backbone.input_dim, generator=g)).to(dtype)
    rel, dropped = _errors(model, x, exact, trunc, evals, evecs, s2=s2, chunk=args.chunk)
    above = (dropped > args.rtol * s2).nonzero()
    k_emp = int(above.max()) + 1 if above.numel() else 0
    out: dict[str, Any] = {
        "source": args.model or f"random r={args.rank} h={args.hidden} steps={args.steps}",
        "expansion": model.expansion,
        "r": r,
        "k": int(trunc.factor.shape[1]),
        "truncated": trunc.truncated,
        "rtol": args.rtol,
        "min_noise_var": s2,
        "feature_sq_bound": feature_sq_bound(model.basis, out_norm=model.backbone.out_norm),
        "variance_bound": trunc.variance_bound,
        "k_empirical": min(k_emp, r),
        "points": args.points,
        "max_rel_var_error": rel,
        "threads": args.threads,
    }
    if not args.no_timing:
        out["us_per_point_exact"] = _time(model, x, exact, chunk=args.chunk, reps=args.reps)
        out["us_per_point_truncated"] = _time(model, x, trunc, chunk=args.chunk, reps=args.reps)
    for key, val in out.items():
        print(f"{key:>24}: {val}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)
    return out


if __name__ == "__main__":
    main()
