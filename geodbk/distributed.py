"""Data-parallel training with ``torch.distributed`` (DDP) and per-rank data shards.

The design makes each step of a W-process run the step of the in-memory run on the shards
concatenated in rank order (same seed), with its sums taken in another order. In float64 the
two runs stay equal over a whole fit (``tests/test_distributed.py``, to a relative 1e-9); in
float32 the rounding differences grow over the epochs, as between two thread counts of one
in-memory run, so long runs can choose another best epoch:

- Each rank holds one shard of the training rows (parquet row groups, or a contiguous row range
  when the file has fewer row groups than ranks; see
  :func:`geodbk.geo.parquet_shards.read_parquet_shard`). Shard sizes are exchanged once, so every
  rank knows the global ``n`` (the KL term is scaled by it) and its rows' global range.
- Every epoch draws the in-memory permutation of the ``n`` global rows from the loop's generator
  (seeded with ``seed``; the same on every rank) and cuts it into the in-memory batches; each
  rank takes the members of each global batch that fall in its shard (possibly none).
- Rank k minimises ``W P_k``, ``P_k = sum_{i in B_k} l_i / |B| + (β / n) KL / W``, so that
  DDP's gradient *average* is the gradient of the global batch loss ``sum_k P_k``. The dPPGP
  trace term uses the *global* batch maximum of ``||phi||^2``, built with an autograd-aware
  all-reduce. A rank without rows in a batch still joins every all-reduce with a zero loss.
- :class:`ShardPlan` with ``rank=None`` (one process holding all shards) walks exactly the
  in-memory batches.

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
from geodbk.objectives import batch_loss
from geodbk.steps import minibatch_step

__all__ = [
    "DistributedContext",
    "ShardPlan",
    "global_mean_std",
    "init_distributed",
    "seed_rank",
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
@dataclass(frozen=True)
class ShardPlan:
    """How the global training set is split into shards and walked through in an epoch.

    The global rows are the shards concatenated in rank order; shard ``k`` holds the rows
    ``[offset_k, offset_k + size_k)``. Every epoch walks the in-memory batches of
    :func:`geodbk.training.shuffled_batches`: one permutation of the ``n`` global rows from the
    loop's generator, cut every ``batch_size`` rows; each rank takes the members of every global
    batch that fall in its shard.

    Attributes
    ----------
    sizes
        Rows of each shard (one shard per rank), in rank order.
    rank
        This process's shard, or ``None`` when this process holds *all* shards concatenated in
        order (then the batches are the in-memory ones).
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
    def offset(self) -> int:
        """First global row of this process's shard (0 with ``rank=None``)."""
        return 0 if self.rank is None else int(sum(self.sizes[: self.rank]))

    @property
    def is_main(self) -> bool:
        """Whether this process writes files (rank 0 or the 1-process reference)."""
        return self.rank in (None, 0)

    def steps(self, batch_size: int) -> int:
        """Optimiser steps per epoch: ``ceil(n / batch_size)``."""
        return max(1, math.ceil(self.n_global / int(batch_size)))

    def epoch_batches(
        self, *, generator: torch.Generator, batch_size: int
    ) -> Iterator[tuple[torch.Tensor, int]]:
        """Yield ``(local row indices, global batch size)`` for every step of one epoch.

        Draws ``perm = randperm(n, generator)`` (the in-memory draw) and cuts it into the global
        batches ``B_s = perm[s b : (s + 1) b]``. With ``rank=None`` each yield is ``B_s`` itself;
        else it is ``{i - offset : i in B_s, offset <= i < offset + size}`` in the order of
        ``B_s`` (possibly empty) and ``|B_s|``. Holds ``n`` indices, not ``n`` rows.
        """
        b = int(batch_size)
        perm = torch.randperm(self.n_global, generator=generator)
        if self.rank is None:
            for idx in perm.split(b):
                yield idx, int(idx.shape[0])
            return
        lo = self.offset
        mine = (perm >= lo) & (perm < lo + self.sizes[self.rank])
        step_of = torch.nonzero(mine).squeeze(1) // b
        local = perm[mine] - lo
        del perm, mine
        steps = self.steps(b)
        counts = torch.bincount(step_of, minlength=steps).tolist()
        for s, idx in enumerate(local.split(counts)):
            yield idx, min(b, self.n_global - s * b)


# ---------------------------------------------------------------- the sharded epoch
def _global_max(values: torch.Tensor, *, rank: int, world: int) -> torch.Tensor:
    """Differentiable ``max`` of ``values`` over all ranks' rows (some ranks may have none).

    The value is an all-reduce MAX; the gradient goes to the lowest rank holding it: that rank
    contributes its local maximum, the others ``0 * (their maximum, or their empty sum)``, and
    the contributions are summed with the autograd-aware all-reduce, which every rank must join.
    """
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    has_rows = values.numel() > 0
    local = values.max() if has_rows else values.sum()
    gmax = local.detach().clone() if has_rows else torch.full_like(local, -math.inf).detach()
    dist.all_reduce(gmax, op=dist.ReduceOp.MAX)
    mine = has_rows and bool(local.detach() == gmax)
    cand = torch.tensor([rank if mine else world], dtype=torch.int64)
    dist.all_reduce(cand, op=dist.ReduceOp.MIN)
    contribution = local if rank == int(cand) else local * 0.0
    with warnings.catch_warnings():  # deprecated in favour of a private API; still autograd-aware
        warnings.simplefilter("ignore", FutureWarning)
        return dnn.all_reduce(contribution, op=dist.ReduceOp.SUM)


def ddp_buffer_options() -> dict[str, Any]:
    """DistributedDataParallel's option that keeps module buffers out of each forward's
    broadcast (every rank keeps its own): ``forward_sync_buffers=False`` where torch has it
    (2.13 on; it still syncs them once at start, when every rank holds the same seeded
    initial values), else the older ``broadcast_buffers=False``, which 2.13 deprecates."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    options = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in options:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def make_epoch_runner(
    model: Any, plan: ShardPlan, config: Any, *, generator: torch.Generator
) -> Callable[[torch.Tensor, torch.Tensor, torch.optim.Optimizer, torch.Tensor | None], float]:
    """Return ``run(x, y, optimizer, tests) -> mean training loss`` of one sharded epoch.

    ``x, y, tests`` are this rank's shard (``tests``: the optional per-row noise covariate);
    ``generator`` draws the epoch's permutation (:meth:`ShardPlan.epoch_batches`). With
    ``plan.rank=None`` (or one shard) each global batch is evaluated in one piece, as in memory.
    With a process group of ``plan.world_size`` ranks the model is wrapped in
    :class:`torch.nn.parallel.DistributedDataParallel` and rank k minimises
    ``W P_k``, ``P_k = sum_{i in B_k} l_i / |B| + (β / n) KL / W`` (:func:`batch_loss` with
    ``size=|B|``, ``kl_share=1/W``; dPPGP's ``max_B ||phi||^2`` from :func:`_global_max`), so
    DDP's gradient average ``(1/W) sum_k grad(W P_k)`` is the gradient of the global batch loss
    ``sum_k P_k``; a rank without rows in B contributes a zero loss that still takes part in
    the all-reduces. The returned mean training loss is ``sum_s |B_s| sum_k P_k,s / n``.
    """
    if config.objective == "exact":
        raise ValueError("sharded training supports the mini-batch objectives, not 'exact'")
    distributed = plan.rank is not None and plan.world_size > 1
    forward: Callable[[torch.Tensor], Any] = model
    if distributed:
        if not _dist_active():
            raise RuntimeError("a ShardPlan with a rank needs an initialised process group")
        from torch.nn.parallel import DistributedDataParallel

        forward = DistributedDataParallel(model, **ddp_buffer_options())
    n, world = plan.n_global, plan.world_size

    def run(
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        tests: torch.Tensor | None = None,
    ) -> float:
        total = 0.0
        batches = plan.epoch_batches(generator=generator, batch_size=config.batch_size)
        for i, (idx, b_global) in enumerate(batches):
            idx = idx.to(x.device)
            tb = None if tests is None else tests[idx]
            if not distributed:  # the whole batch is here (b_global rows)
                total += minibatch_step(
                    model, optimizer, x[idx], y[idx], n=n, config=config, batch=i, tests=tb
                )
                continue
            assert plan.rank is not None
            optimizer.zero_grad(set_to_none=True)
            # DDP's reducer waits for every parameter's gradient, and the loss reaches q(w) and
            # the noise outside its forward: a held kernel stays in the graph there
            with model.kernel_held(config.holds_kernel(i), keep_graph=True):
                out = forward(x[idx])
                phi_sq_max = None
                if config.objective == "dppgp":
                    phi_sq_max = _global_max(out.phi_sq, rank=plan.rank, world=world)
                loss = batch_loss(
                    model,
                    x[idx],
                    y[idx],
                    n=n,
                    config=config,
                    tests=tb,
                    out=out,
                    phi_sq_max=phi_sq_max,
                    size=b_global,
                    kl_share=1.0 / world,
                )
                (world * loss).backward()
            optimizer.step()
            total += float(loss.detach()) * b_global
        if distributed:
            import torch.distributed as dist

            summed = torch.tensor([total], dtype=torch.float64)
            dist.all_reduce(summed)
            total = float(summed)
        return total / n

    return run


# ---------------------------------------------------------------- reading a shard
