"""Where a DBK training step spends its time: ``torch.profiler`` over dPPGP steps.

Builds the model and step of ``benchmarks/bench_core.py`` (2-D inputs, AdamW, dPPGP with the
seed's alpha and beta), runs ``--warmup`` steps, then profiles ``--steps`` steps on the CPU and
prints the operators by self CPU time, and the share of the step in each of five groups:
Cholesky of Kzz, triangular solves, matrix products, the KL term's r² work (``tril`` and
``diag`` bookkeeping of q(w)'s factor) and the rest::

    OMP_NUM_THREADS=1 python benchmarks/profile_step.py --rank 1024 --hidden 256 --batch 1024

``--predict`` profiles the folded prediction (``latent_folded``) of ``--batch`` points instead,
the work of ``geodbk predict`` per chunk::

    OMP_NUM_THREADS=1 python benchmarks/profile_step.py --predict --batch 4096
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.objectives import batch_loss
from geodbk.training import LoopConfig

#: Operator name fragments of each group (first match wins).
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("cholesky", ("cholesky",)),
    ("triangular solve", ("triangular",)),
    ("matrix products", ("mm", "matmul", "addmm", "bmm", "linear", "dot")),
    ("q(w) factor", ("tril", "diag", "logdet", "log", "exp")),
)


def group_of(name: str) -> str:
    """The group an operator's name falls in, or ``rest``."""
    for group, keys in GROUPS:
        if any(k in name for k in keys):
            return group
    return "rest"


def step_setup(
    expansion: str, rank: int, hidden: int, batch: int, *, device: str = "cpu"
) -> tuple[DBKModel, LoopConfig, torch.optim.Optimizer, torch.Tensor, torch.Tensor]:
    """An untrained DBK model (seed 0), the seed's dPPGP settings, its AdamW optimiser (weight
    decay 1e-2 on the backbone) and one random batch of inputs in [-1, 1]^2 and targets, all on
    ``device``."""
    torch.manual_seed(0)
    model = DBKModel(2, expansion=expansion, rank=rank, hidden=hidden).to(device)
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", alpha=0.1, beta=0.01))
    opt = torch.optim.AdamW(
        [
            {"params": model.backbone_parameters(), "weight_decay": 1e-2},
            {"params": model.other_parameters(), "weight_decay": 0.0},
        ],
        lr=1e-3,
        fused=True,
    )
    x = torch.rand(batch, 2) * 2 - 1
    return model, config, opt, x.to(device), torch.randn(batch).to(device)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--expansion", default="rbf", choices=["rbf", "silu"])
    parser.add_argument("--rank", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument(
        "--predict", action="store_true", help="profile the folded prediction, not a step"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, config, opt, x, y = step_setup(args.expansion, args.rank, args.hidden, args.batch)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        batch_loss(model, x, y, n=100_000, config=config).backward()
        opt.step()

    if args.predict:
        model.eval()
        folded = model.fold()

        def step() -> None:
            with torch.no_grad():
                model.latent_folded(x, folded)

    for _ in range(args.warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    events: Any = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(
        f"{args.expansion} r={args.rank} h={args.hidden} b={args.batch} threads={args.threads}: "
        f"{total / args.steps / 1e3:.1f} ms of operator self time per "
        + ("prediction of the batch" if args.predict else "step")
    )
    shares: dict[str, float] = {}
    for e in events:
        g = group_of(e.key)
        shares[g] = shares.get(g, 0.0) + e.self_cpu_time_total
    for g, t in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {g:18s} {100 * t / total:5.1f}%  {t / args.steps / 1e3:8.1f} ms/step")
    print(f"top {args.top} operators by self CPU time per step:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[: args.top]:
        print(f"  {e.key:40s} {e.self_cpu_time_total / args.steps / 1e3:8.2f} ms  x{e.count}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
