"""Data-parallel training with ``torch.distributed`` (DDP) and per-rank data shards.

The design makes a W-process run equal to a 1-process run with the same *global* batch, up to
floating-point noise:

- Each rank holds one shard of the training rows (parquet row groups, or a contiguous row range
  when the file has fewer row groups than ranks; see :func:`geodbk.geo.parquet_shards.read_parquet_shard`). Shard sizes are
  exchanged once, so every rank knows the global ``n`` (the KL term is scaled by it).
- An epoch has ``ceil(n / batch_size)`` steps. At every step each shard contributes a slice of its
  own permutation (seeded by ``(seed, epoch, shard)``, so the same on every rank and in a
  1-process run); the union of the slices is the global batch.
- The local loss is rescaled so that DDP's gradient *average* equals the gradient of the global
  batch loss: ``L_k = s_k (loss_k - kl) + kl`` with ``s_k = W b_k / B``. The dPPGP trace term
  uses the *global* batch maximum of ``||phi||^2``, built with an autograd-aware all-reduce.
- A 1-process reference run is :class:`ShardPlan` with ``rank=None``: one process holds all
  shards and steps through exactly the same global batches (used by the equality test).

Only rank 0 writes checkpoints and bundles (``ShardPlan.is_main``); every rank evaluates the full
validation set, so the best-epoch choice is identical on all ranks.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from geodbk.device import resolve_device
from geodbk.objectives import batch_loss, gaussian_kl_standard

__all__ = [
    "DistributedContext",
    "ShardPlan",
    "global_mean_std",
    "init_distributed",
    "seed_rank",
    "shard_seed",
    "shutdown_distributed",
]

log = logging.getLogger("geodbk")


# ---------------------------------------------------------------- process group
@dataclass(frozen=True)
class DistributedContext:
    """This process's place in a (possibly 1-process) run.

    Attributes
    ----------
    rank, world_size, local_rank
        From ``torchrun``'s ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``.
    device
        The device this rank trains on (``cuda:LOCAL_RANK`` or the CPU).
    backend
        ``nccl`` (CUDA) or ``gloo`` (CPU); ``none`` when no process group was started.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        """True on rank 0 (the only rank that writes files)."""
        return self.rank == 0


def init_distributed(
    *,
    device: str = "auto",
    backend: str | None = None,
    world_size: int = 1,
    local_rank: int = 0,
) -> DistributedContext:
    """Start the default process group from ``torchrun``'s environment variables.

    Without ``WORLD_SIZE`` (a plain ``python -m pipelines.cli`` run) nothing is started and a
    1-process context is returned. A ``cuda`` request on a machine without CUDA falls back to
    the CPU and the ``gloo`` backend with a warning (:func:`geodbk.device.resolve_device`).

    Parameters
    ----------
    device
        ``auto``, ``cpu`` or ``cuda``.
    backend
        Force a backend; default ``nccl`` on CUDA, ``gloo`` on the CPU.
    world_size, local_rank
        The launcher's ``WORLD_SIZE`` and ``LOCAL_RANK`` (torchrun sets them in the
        environment; the caller reads them).
    """
    import torch.distributed as dist

    world = int(world_size)
    dev = resolve_device(device)
    if dev.type == "cuda":
        dev = torch.device(f"cuda:{local_rank % max(torch.cuda.device_count(), 1)}")
        torch.cuda.set_device(dev)
    if world <= 1 and not dist.is_initialized():
        return DistributedContext(0, 1, 0, dev, "none")
    chosen = backend or ("nccl" if dev.type == "cuda" else "gloo")
    if not dist.is_initialized():
        dist.init_process_group(backend=chosen)
    ctx = DistributedContext(dist.get_rank(), dist.get_world_size(), local_rank, dev, chosen)
    log.info("rank %d of %d on %s (%s)", ctx.rank, ctx.world_size, dev, chosen)
    return ctx


def seed_rank(seed: int, rank: int) -> None:
    """Seed torch and numpy's global generators with ``seed + rank`` (per-rank determinism).

    Model initialisation and batch order do not use these (they are seeded from ``seed``
    alone, identical on every rank); this covers anything else drawn at random.
    """
    torch.manual_seed(int(seed) + int(rank))
    np.random.seed((int(seed) + int(rank)) % 2**32)  # noqa: NPY002  (the legacy global state)


def shutdown_distributed() -> None:
    """Destroy the default process group if one is running.

    Unreachable ``DistributedDataParallel`` wrappers (their reducers hold gloo work handles) are
    collected first, while the group is alive: left to interpreter finalisation they can abort
    the process (SIGABRT, "terminate called without an active exception"; seen here under load).
    """
    import gc

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def _dist_active() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def global_mean_std(values: np.ndarray) -> tuple[float, float, int]:
    """Mean, population sd and count of ``values`` over all ranks (float64 all-reduce).

    Without a process group these are the local ``mean``, ``std`` and ``len``.
    """
    v = np.asarray(values, dtype=np.float64)
    if not _dist_active():
        return float(v.mean()), float(v.std()), int(v.size)
    import torch.distributed as dist

    n = torch.tensor([float(v.size)], dtype=torch.float64)
    dist.all_reduce(n)
    s = torch.tensor([v.sum()], dtype=torch.float64)
    dist.all_reduce(s)
    mean = float(s) / float(n)
    ss = torch.tensor([((v - mean) ** 2).sum()], dtype=torch.float64)
    dist.all_reduce(ss)
    return mean, math.sqrt(float(ss) / float(n)), int(n)


def gather_sizes(n_local: int) -> tuple[int, ...]:
    """Rows held by every rank, in rank order (``(n_local,)`` without a process group)."""
    if not _dist_active():
        return (int(n_local),)
    import torch.distributed as dist

    sizes = torch.zeros(dist.get_world_size(), dtype=torch.int64)
    sizes[dist.get_rank()] = int(n_local)
    dist.all_reduce(sizes)
    return tuple(int(s) for s in sizes.tolist())


# ---------------------------------------------------------------- shards and batches
def shard_seed(seed: int, epoch: int, shard: int) -> int:
    """Deterministic 63-bit seed of the permutation of ``shard`` in ``epoch``."""
    return int(np.random.SeedSequence([int(seed), int(epoch), int(shard)]).generate_state(1)[0])


def _split_sizes(n: int, steps: int) -> list[int]:
    """Sizes of ``torch.tensor_split(range(n), steps)``."""
    q, r = divmod(n, steps)
    return [q + 1 if s < r else q for s in range(steps)]


@dataclass(frozen=True)
class ShardPlan:
    """How the global training set is split into shards and walked through in an epoch.

    Attributes
    ----------
    sizes
        Rows of each shard (one shard per rank), in rank order.
    rank
        This process's shard, or ``None`` when this process holds *all* shards concatenated in
        order (the 1-process reference with the same global batches).
    """

    sizes: tuple[int, ...]
    rank: int | None = None

    def __post_init__(self) -> None:
        if not self.sizes or min(self.sizes) < 1:
            raise ValueError(f"every shard needs at least one row, got sizes {self.sizes}")
        if self.rank is not None and not 0 <= self.rank < len(self.sizes):
            raise ValueError(f"rank {self.rank} outside 0..{len(self.sizes) - 1}")

    @property
    def world_size(self) -> int:
        """Number of shards."""
        return len(self.sizes)

    @property
    def n_global(self) -> int:
        """Rows over all shards (the ``n`` of the KL term)."""
        return int(sum(self.sizes))

    @property
    def is_main(self) -> bool:
        """Whether this process writes files (rank 0 or the 1-process reference)."""
        return self.rank in (None, 0)

    def steps(self, batch_size: int) -> int:
        """Optimiser steps per epoch: ``ceil(n / batch_size)``, checked against the shards."""
        steps = max(1, math.ceil(self.n_global / int(batch_size)))
        if min(self.sizes) < steps:
            raise ValueError(
                f"a shard of {min(self.sizes)} rows cannot feed {steps} steps per epoch "
                f"(n={self.n_global}, batch_size={batch_size}); use fewer processes or a larger "
                "batch_size"
            )
        return steps

    def epoch_batches(
        self, *, epoch: int, seed: int, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, int]]:
        """Yield ``(local row indices, global batch size)`` for every step of ``epoch``.

        With ``rank=None`` the indices address the concatenation of all shards and each batch
        is the whole global batch.
        """
        steps = self.steps(batch_size)
        shards = range(self.world_size) if self.rank is None else (self.rank,)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        pieces: dict[int, tuple[torch.Tensor, ...]] = {}
        for k in shards:
            gen = torch.Generator(device="cpu").manual_seed(shard_seed(seed, epoch, k))
            perm = torch.randperm(self.sizes[k], generator=gen)
            if self.rank is None:
                perm = perm + int(offsets[k])
            pieces[k] = torch.tensor_split(perm, steps)
        totals = np.sum([_split_sizes(n, steps) for n in self.sizes], axis=0)
        for s in range(steps):
            idx = torch.cat([pieces[k][s] for k in shards])
            yield idx, int(totals[s])


# ---------------------------------------------------------------- the sharded epoch
def _global_max(local_max: torch.Tensor, *, rank: int, world: int) -> torch.Tensor:
    """Differentiable maximum over ranks: the owner's value, summed with autograd all-reduce."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    gmax = local_max.detach().clone()
    dist.all_reduce(gmax, op=dist.ReduceOp.MAX)
    cand = torch.tensor([rank if bool(local_max.detach() == gmax) else world], dtype=torch.int64)
    dist.all_reduce(cand, op=dist.ReduceOp.MIN)
    owner = int(cand)
    contribution = local_max if rank == owner else local_max * 0.0
    with warnings.catch_warnings():  # deprecated in favour of a private API; still autograd-aware
        warnings.simplefilter("ignore", FutureWarning)
        return dnn.all_reduce(contribution, op=dist.ReduceOp.SUM)


def _kl_term(model: Any, config: Any, n: int) -> torch.Tensor:
    weight = 1.0 if config.objective == "elbo" else float(config.beta)
    return (weight / n) * gaussian_kl_standard(model.q.mean, model.q.scale_tril())


def make_epoch_runner(
    model: Any, plan: ShardPlan, config: Any
) -> Callable[[torch.Tensor, torch.Tensor, torch.optim.Optimizer, int, Any], float]:
    """Return ``run(x, y, optimizer, epoch, tests) -> mean training loss`` (sharded training).

    ``tests`` is the optional per-row noise covariate of the shard (or ``None``).

    With a process group of ``plan.world_size`` ranks the model is wrapped in
    :class:`torch.nn.parallel.DistributedDataParallel`; with ``plan.rank=None`` (the 1-process
    reference) the global batch is evaluated in one piece.
    """
    if config.objective == "exact":
        raise ValueError("sharded training supports the mini-batch objectives, not 'exact'")
    distributed = plan.rank is not None and plan.world_size > 1
    forward: Callable[[torch.Tensor], Any] = model
    if distributed:
        if not _dist_active():
            raise RuntimeError("a ShardPlan with a rank needs an initialised process group")
        from torch.nn.parallel import DistributedDataParallel

        forward = DistributedDataParallel(model, broadcast_buffers=False)
    n = plan.n_global

    def run(
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        epoch: int,
        tests: torch.Tensor | None = None,
    ) -> float:
        total = torch.zeros((), dtype=torch.float64)
        for idx, b_global in plan.epoch_batches(
            epoch=epoch, seed=config.seed, batch_size=config.batch_size
        ):
            idx = idx.to(x.device)
            optimizer.zero_grad(set_to_none=True)
            out = forward(x[idx])
            tb = None if tests is None else tests[idx]
            if not distributed:
                loss = batch_loss(model, x[idx], y[idx], n=n, config=config, tests=tb, out=out)
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * b_global
                continue
            assert plan.rank is not None
            phi_sq_max = None
            if config.objective == "dppgp":
                phi_sq_max = _global_max(out.phi_sq.max(), rank=plan.rank, world=plan.world_size)
            loss = batch_loss(
                model,
                x[idx],
                y[idx],
                n=n,
                config=config,
                tests=tb,
                out=out,
                phi_sq_max=phi_sq_max,
            )
            kl = _kl_term(model, config, n)
            scale = plan.world_size * int(idx.shape[0]) / b_global
            (scale * (loss - kl) + kl).backward()
            optimizer.step()
            # global batch loss = sum_k (b_k / B) data_k + kl, for the history
            part = torch.tensor(
                [float((loss - kl).detach()) * int(idx.shape[0]) / b_global], dtype=torch.float64
            )
            import torch.distributed as dist

            dist.all_reduce(part)
            total += (float(part) + float(kl.detach())) * b_global
        return float(total) / n

    return run


# ---------------------------------------------------------------- reading a shard
