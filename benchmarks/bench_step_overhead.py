"""Is a small DBK training step bound by per-operator overhead? Three ways to take the step.

At r = 256, h = 64, b = 256 a DBK-SiLU dPPGP step makes about 150 MFLOP of matrix products
(backbone, SiLU layer, ``phi L`` and their backwards), and takes several times what those cost
at the machine's matrix-product rate. This script times, in one process, interleaved round by
round (``--rounds`` rounds of ``--steps`` steps each; the median step of each round, then the
median and minimum over rounds):

- ``autograd``: the step as ``geodbk train`` takes it (:func:`geodbk.objectives.batch_loss`,
  backward, torch's fused AdamW);
- ``fused backbone``: the same with the residual MLP's forward and backward written out by hand
  in one ``torch.autograd.Function`` (the same ATen kernels, one autograd node instead of
  about thirty, no module calls);
- ``flat optimiser``: every parameter a view into one buffer per parameter group, so that
  AdamW updates two tensors instead of thirty;
- both.

It also prints the step's phases (zero_grad, forward with the loss, backward, optimiser) and the
machine's fp32 matrix-product rate, and checks that the hand-written backward gives the same
weights as autograd after a few steps. The process keeps freed memory as the ``geodbk``
command does (:func:`pipelines.allocator.keep_freed_memory`)::

    OMP_NUM_THREADS=1 python benchmarks/bench_step_overhead.py --rank 256 --hidden 64 --batch 256
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from geodbk.backbone import ResidualMLP
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.objectives import batch_loss
from geodbk.training import LoopConfig
from pipelines.allocator import keep_freed_memory

_LN_EPS = 1e-5


class _FusedResidualMLP(torch.autograd.Function):
    """``ResidualMLP.forward`` (two blocks) with its backward written out: one autograd node."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        w0, b0 = params[:2]
        blocks = [params[2:8], params[8:14]]
        gamma_out, beta_out = params[14:16]
        shape = [w0.shape[0]]
        z = torch.addmm(b0, x, w0.t())
        saved: list[torch.Tensor] = [x, z]
        for gamma, beta, w1, b1, w2, b2 in blocks:
            normed, mu, rstd = torch.native_layer_norm(z, shape, gamma, beta, _LN_EPS)
            pre = torch.addmm(b1, normed, w1.t())
            act = F.silu(pre)
            z = torch.addmm(b2, act, w2.t()).add_(z)
            saved += [normed, mu, rstd, pre, act, z]
        out_normed, mu, rstd = torch.native_layer_norm(z, shape, gamma_out, beta_out, _LN_EPS)
        saved += [out_normed, mu, rstd]
        ctx.save_for_backward(*saved, *params)
        return F.silu(out_normed)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        x, z0 = saved[:2]
        acts = [saved[2:8], saved[8:14]]
        out_normed, mu_out, rstd_out = saved[14:17]
        params = saved[17:]
        blocks = [params[2:8], params[8:14]]
        shape = [params[0].shape[0]]
        aten = torch.ops.aten
        d_out = aten.silu_backward(grad_out, out_normed)
        dz, d_gamma_out, d_beta_out = aten.native_layer_norm_backward(
            d_out, acts[1][5], shape, mu_out, rstd_out, params[14], params[15], [True] * 3
        )
        inputs = [z0, acts[0][5]]
        grads: list[tuple[torch.Tensor, ...]] = [(), ()]
        for k in (1, 0):
            normed, mu, rstd, pre, act, _ = acts[k]
            gamma, beta, w1, _, w2, _ = blocks[k]
            d_pre = aten.silu_backward(dz @ w2, pre)
            d_normed = d_pre @ w1
            dz_in, d_gamma, d_beta = aten.native_layer_norm_backward(
                d_normed, inputs[k], shape, mu, rstd, gamma, beta, [True] * 3
            )
            grads[k] = (d_gamma, d_beta, d_pre.t() @ normed, d_pre.sum(0), dz.t() @ act, dz.sum(0))
            dz = dz + dz_in
        return (None, dz.t() @ x, dz.sum(0), *grads[0], *grads[1], d_gamma_out, d_beta_out)


def _fuse(backbone: ResidualMLP) -> None:
    """Route ``backbone``'s forward through :class:`_FusedResidualMLP` (two blocks only)."""
    if len(backbone.blocks) != 2:
        raise ValueError("the hand-written backward is for two residual blocks")
    params = [backbone.inp.weight, backbone.inp.bias]
    for block in backbone.blocks:
        params += [block.norm.weight, block.norm.bias, block.fc1.weight, block.fc1.bias]
        params += [block.fc2.weight, block.fc2.bias]
    params += [backbone.out_norm.weight, backbone.out_norm.bias]
    backbone.forward = lambda x: _FusedResidualMLP.apply(x, *params)  # type: ignore[method-assign]


def _flat_optimizer(
    groups: list[list[torch.nn.Parameter]], weight_decays: list[float]
) -> tuple[torch.optim.Optimizer, Callable[[], None]]:
    """AdamW over one flat buffer per group, every parameter (and its gradient) a view into it;
    returns the optimiser and the gradients' zeroing."""
    flats = []
    for params in groups:
        size = sum(p.numel() for p in params)
        data, grad = torch.zeros(size), torch.zeros(size)
        offset = 0
        for p in params:
            n = p.numel()
            data[offset : offset + n].copy_(p.detach().reshape(-1))
            p.data = data[offset : offset + n].view_as(p)
            p.grad = grad[offset : offset + n].view_as(p)
            offset += n
        flat = torch.nn.Parameter(data)
        flat.grad = grad
        flats.append(flat)
    opt = torch.optim.AdamW(
        [{"params": [f], "weight_decay": wd} for f, wd in zip(flats, weight_decays, strict=True)],
        lr=1e-3,
        fused=True,
    )

    def zero() -> None:
        for f in flats:
            assert f.grad is not None
            f.grad.zero_()

    return opt, zero


def make_step(
    args: argparse.Namespace, *, fused: bool, flat: bool
) -> tuple[DBKModel, Callable[[], None], dict[str, Callable[[], Any]]]:
    """A seeded DBK model, one training step on a fixed batch, and its phases."""
    torch.manual_seed(0)
    model = DBKModel(2, expansion=args.expansion, rank=args.rank, hidden=args.hidden)
    if fused:
        _fuse(model.backbone)
    config = LoopConfig.of(DBKHyperparameters(objective="dppgp", alpha=0.1, beta=0.01))
    groups = [model.backbone_parameters(), model.other_parameters()]
    if flat:
        opt, zero = _flat_optimizer(groups, [1e-2, 0.0])
    else:
        opt = torch.optim.AdamW(
            [{"params": groups[0], "weight_decay": 1e-2}, {"params": groups[1]}],
            lr=1e-3,
            weight_decay=0.0,
            fused=True,
        )

        def zero() -> None:
            opt.zero_grad(set_to_none=True)

    gen = torch.Generator().manual_seed(1)
    x = torch.rand(args.batch, 2, generator=gen) * 2 - 1
    y = torch.randn(args.batch, generator=gen)
    state: dict[str, torch.Tensor] = {}

    def forward() -> None:
        state["loss"] = batch_loss(model, x, y, n=100_000, config=config)

    phases: dict[str, Callable[[], Any]] = {
        "zero_grad": zero,
        "forward and loss": forward,
        "backward": lambda: state["loss"].backward(),
        "optimiser": opt.step,
    }

    def step() -> None:
        for phase in phases.values():
            phase()

    return model, step, phases


def matmul_gflops(size: int = 256, reps: int = 200) -> float:
    """fp32 rate of ``size``² matrix products on this thread count, GFLOP/s."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(20):
        a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2.0 * size**3 * reps / (time.perf_counter() - t) / 1e9


def main(argv: list[str] | None = None) -> int:
    """Print the phases, the weights check and the interleaved timings of the four variants."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--expansion", default="silu", choices=["silu", "rbf"])
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    kept = keep_freed_memory()
    print(f"threads {torch.get_num_threads()}, freed memory kept: {kept}")
    print(f"fp32 matrix products ({args.rank}²): {matmul_gflops(args.rank):.0f} GFLOP/s")

    reference, ref_step, _ = make_step(args, fused=False, flat=False)
    handwritten, hand_step, _ = make_step(args, fused=True, flat=True)
    for _ in range(5):
        ref_step()
        hand_step()
    diff = max(
        float((a - b).detach().abs().max())
        for a, b in zip(reference.parameters(), handwritten.parameters(), strict=True)
    )
    print(f"largest weight difference after 5 steps, autograd vs hand-written + flat: {diff:.2e}")

    _, _, phases = make_step(args, fused=False, flat=False)
    times: dict[str, list[float]] = {name: [] for name in phases}
    for i in range(300):
        for name, phase in phases.items():
            t = time.perf_counter()
            phase()
            if i >= 50:
                times[name].append(time.perf_counter() - t)
    print(
        "phases of the autograd step (median ms): "
        + ", ".join(f"{name} {1e3 * statistics.median(v):.2f}" for name, v in times.items())
    )

    variants = {
        "autograd": make_step(args, fused=False, flat=False)[1],
        "fused backbone": make_step(args, fused=True, flat=False)[1],
        "flat optimiser": make_step(args, fused=False, flat=True)[1],
        "both": make_step(args, fused=True, flat=True)[1],
    }
    for step in variants.values():
        for _ in range(30):
            step()
    medians: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, step in variants.items():
            round_times = []
            for _ in range(args.steps):
                t = time.perf_counter()
                step()
                round_times.append(time.perf_counter() - t)
            medians[name].append(statistics.median(round_times))
    for name, values in medians.items():
        print(
            f"{name:16s} step {1e3 * statistics.median(values):.3f} ms "
            f"(min over rounds {1e3 * min(values):.3f} ms)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
