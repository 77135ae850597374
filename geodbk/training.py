"""The training loop: AdamW, shuffled mini-batches, best-by-validation-NLL, early stopping,
per-epoch atomic checkpoints and bit-identical resume.

The loop works on standardised targets; the estimator converts to and from y's units.
"""

from __future__ import annotations

import copy
import io
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from geodbk.atomic import atomic_path
from geodbk.distributed import ShardPlan, make_epoch_runner
from geodbk.errors import ModelFileError
from geodbk.model import DBKModel, ModelOutput
from geodbk.objectives import (
    dppgp_loss,
    elbo_loss,
    exact_marginal_log_likelihood,
    gaussian_kl_standard,
    gaussian_nll,
    ppgp_loss,
)
from geodbk.posterior import accumulate_statistics, posterior_from_statistics

__all__ = [
    "CHECKPOINT_NAME",
    "OBJECTIVES",
    "TrainConfig",
    "TrainResult",
    "batch_loss",
    "evaluate_nll",
    "exact_posterior_from_data",
    "train_model",
]

OBJECTIVES = ("dppgp", "exact", "ppgp", "elbo")
CHECKPOINT_NAME = "last.pt"
_CHECKPOINT_FORMAT = "geodbk-checkpoint-v1"


@dataclass(frozen=True)
class TrainConfig:
    """Options of :func:`train_model` (see the estimator for their meaning)."""

    objective: str = "dppgp"
    alpha: float = 0.1
    beta: float = 0.01
    batch_size: int = 1024
    epochs: int = 400
    lr: float = 1e-3
    weight_decay: float = 1e-2
    patience: int = 50
    seed: int = 0
    variance_correction: bool = False
    eval_chunk_size: int = 65536

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.batch_size < 1 or self.epochs < 0 or self.patience < 1:
            raise ValueError("batch_size and patience must be >= 1 and epochs >= 0")


@dataclass
class TrainResult:
    """Outcome of :func:`train_model`: per-epoch history and the selected (best) epoch."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int = 0
    stopped_early: bool = False


def batch_loss(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    n: int,
    config: TrainConfig,
    tests: torch.Tensor | None = None,
    out: ModelOutput | None = None,
    phi_sq_max: torch.Tensor | None = None,
) -> torch.Tensor:
    """The mini-batch loss of ``config.objective`` (not ``"exact"``) on ``(x, y)``.

    ``tests`` (b,), the noise covariate of the batch, gives the per-point noise
    ``s2_i = model.noise_var(tests)`` (ignored by the constant noise). ``out``: the model's
    output on ``x`` when already computed (e.g. through DDP); ``phi_sq_max``: the global-batch
    maximum of ``||phi||^2`` for dPPGP when the batch is split over processes.
    """
    out = model(x) if out is None else out
    s2 = model.noise_var(tests)
    kl = gaussian_kl_standard(model.q.mean, model.q.scale_tril())
    corr = out.var_correction if config.variance_correction else None
    if config.objective == "dppgp":
        return dppgp_loss(
            out.mean,
            out.var_f,
            out.phi_sq,
            y,
            s2,
            kl=kl,
            n=n,
            alpha=config.alpha,
            beta=config.beta,
            phi_sq_max=phi_sq_max,
        )
    if config.objective == "ppgp":
        return ppgp_loss(
            out.mean, out.var_f, y, s2, kl=kl, n=n, beta=config.beta, var_correction=corr
        )
    if config.objective == "elbo":
        return elbo_loss(out.mean, out.var_f, y, s2, kl=kl, n=n, var_correction=corr)
    raise ValueError(f"batch_loss does not handle objective {config.objective!r}")


@torch.no_grad()
def exact_posterior_from_data(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    chunk_size: int = 65536,
    tests: torch.Tensor | None = None,
) -> None:
    """Set ``q(w)`` to the exact posterior ``p(w | y)`` under the current basis (chunked).

    With ``tests`` the noise is ``D = diag(s2_i)``, ``s2_i = model.noise_var(tests_i)``.
    """
    c = model.const_mean
    batches = (
        (
            model.features(x[i : i + chunk_size]),
            y[i : i + chunk_size],
            model.noise_var(None if tests is None else tests[i : i + chunk_size]),
        )
        for i in range(0, x.shape[0], chunk_size)
    )
    gram, proj = accumulate_statistics(batches, mean=c)
    model.set_weight_posterior(posterior_from_statistics(gram, proj))


@torch.no_grad()
def evaluate_nll(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    variance_correction: bool = False,
    chunk_size: int = 65536,
    tests: torch.Tensor | None = None,
) -> float:
    """Mean Gaussian NLL of ``y`` under the model's predictive distribution (standardised units).

    ``tests`` (n,): per-point noise covariate (``var = var_f + s2_i``).
    """
    folded = model.fold(variance_correction=variance_correction)
    total = 0.0
    for i in range(0, x.shape[0], chunk_size):
        tb = None if tests is None else tests[i : i + chunk_size]
        mean, _, var = model.predict_folded(x[i : i + chunk_size], folded, tests=tb)
        total += float(gaussian_nll(y[i : i + chunk_size], mean, var).sum())
    return total / max(x.shape[0], 1)


def _make_optimizer(model: DBKModel, config: TrainConfig) -> torch.optim.AdamW:
    groups = [
        {"params": model.backbone_parameters(), "weight_decay": config.weight_decay},
        {"params": model.other_parameters(), "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr)


def _clone_state(model: DBKModel) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    # serialised in memory first: torch.save reports a full disk as a RuntimeError of its zip
    # writer, a plain write as the OSError it is (the command line names the file and the fix)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    with atomic_path(directory / CHECKPOINT_NAME) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def _load_checkpoint(path: Path, config: TrainConfig) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated or foreign file
        raise ModelFileError(
            f"cannot read the training checkpoint {path}: {exc}. Delete it to start afresh."
        ) from exc
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        raise ModelFileError(
            f"{path} is not a geodbk training checkpoint; delete it to start afresh"
        )
    saved = dict(state.get("config", {}))
    wanted = asdict(config)
    keys = [k for k in wanted if k not in ("epochs", "patience", "eval_chunk_size")]
    diff = [k for k in keys if saved.get(k) != wanted[k]]
    if diff:
        raise ModelFileError(
            f"the checkpoint {path} was written with different options ({', '.join(diff)}); "
            "resume with the same options or delete it to start afresh"
        )
    return state


@dataclass
class LoopState:
    """Bookkeeping of a training loop that a checkpoint restores (after ``epoch`` epochs)."""

    history: list[dict[str, Any]]
    best_state: dict[str, torch.Tensor]
    best_score: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    epoch: int = 0
    stopped: bool = False


def restore_loop_state(
    ckpt_dir: Path | None,
    resume: bool,
    config: TrainConfig,
    model: DBKModel,
    optimizer: torch.optim.Optimizer,
    *,
    generator: torch.Generator | None = None,
) -> LoopState:
    """A fresh :class:`LoopState`, or with ``resume`` and ``ckpt_dir/last.pt`` present the saved
    one, after loading the model, optimiser (and ``generator``) state from that checkpoint."""
    fresh = LoopState(history=[], best_state=_clone_state(model))
    if ckpt_dir is None or not resume or not (ckpt_dir / CHECKPOINT_NAME).is_file():
        return fresh
    state = _load_checkpoint(ckpt_dir / CHECKPOINT_NAME, config)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if generator is not None:
        generator.set_state(state["generator"])
    device = next(model.parameters()).device
    return LoopState(
        history=list(state["history"]),
        best_state={k: v.to(device) for k, v in state["best_state"].items()},
        best_score=float(state["best_score"]),
        best_epoch=int(state["best_epoch"]),
        bad_epochs=int(state["bad_epochs"]),
        epoch=int(state["epoch"]),
        stopped=bool(state["stopped"]),
    )


def save_loop_checkpoint(
    ckpt_dir: Path,
    config: TrainConfig,
    model: DBKModel,
    optimizer: torch.optim.Optimizer,
    loop: LoopState,
    *,
    generator: torch.Generator | None = None,
) -> None:
    """Write ``ckpt_dir/last.pt`` atomically: model, optimiser, generator and loop state after
    ``loop.epoch`` epochs (read back by :func:`restore_loop_state`)."""
    gen = generator if generator is not None else torch.Generator()
    _save_checkpoint(
        ckpt_dir,
        {
            "format": _CHECKPOINT_FORMAT,
            "config": asdict(config),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "generator": gen.get_state(),
            "epoch": loop.epoch,
            "history": loop.history,
            "best_state": loop.best_state,
            "best_score": loop.best_score,
            "best_epoch": loop.best_epoch,
            "bad_epochs": loop.bad_epochs,
            "stopped": loop.stopped,
        },
    )


def train_model(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    config: TrainConfig,
    x_val: torch.Tensor | None = None,
    y_val: torch.Tensor | None = None,
    nll_offset: float = 0.0,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
    callback: Callable[[dict[str, Any]], None] | None = None,
    tests: torch.Tensor | None = None,
    tests_val: torch.Tensor | None = None,
    shards: ShardPlan | None = None,
) -> TrainResult:
    """Train ``model`` in place and leave it at the best epoch.

    Mini-batch objectives (``dppgp``, ``ppgp``, ``elbo``): each epoch draws a permutation from a
    ``torch.Generator`` seeded with ``config.seed`` and takes one AdamW step per batch.
    ``exact``: one full-batch step per epoch on ``-log p(y) / n``, after which ``q(w)`` is set to
    the exact posterior. AdamW applies ``weight_decay`` to the backbone only.

    The selected state is the one with the lowest validation NLL (``nll_offset`` is added to the
    recorded ``val_nll``, e.g. ``log sd_y`` to report it in y's units) or, without validation
    data, the lowest training loss. Training stops after ``patience`` epochs without improvement.

    With ``checkpoint_dir`` a checkpoint (model and optimizer state, generator state, epoch,
    best state, history, patience counter) is written atomically after every epoch; with
    ``resume=True`` an existing one is continued, giving bit-identical results to an
    uninterrupted run (on the same device and thread count).

    Parameters
    ----------
    model
        The model, on the device and dtype of ``x``.
    x, y
        Training inputs (n, d) and standardised targets (n,).
    config
        Optimisation options.
    x_val, y_val
        Optional validation data (standardised targets).
    nll_offset
        Added to the recorded validation NLL (does not change the selection).
    checkpoint_dir
        Folder for ``last.pt``; ``None`` disables checkpoints.
    resume
        Continue from ``checkpoint_dir/last.pt`` when it exists.
    progress
        Show a tqdm bar with the training loss and validation NLL.
    callback
        Called after every epoch with that epoch's history record.
    tests, tests_val
        Optional noise covariate (number of tests per row, (n,)) of the training and validation
        rows, passed to ``model.noise_var`` so the loss uses ``s2_i``.
    shards
        Sharded (data-parallel) training: ``x, y`` are this rank's shard and the epochs walk
        the plan's global batches (see :mod:`geodbk.distributed`); only the main rank writes
        checkpoints and shows progress.
    """
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("cannot train on an empty data set")
    has_val = x_val is not None and y_val is not None and int(x_val.shape[0]) > 0
    optimizer = _make_optimizer(model, config)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(config.seed))
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    loop = restore_loop_state(ckpt_dir, resume, config, model, optimizer, generator=gen)
    history, best_state, best_score = loop.history, loop.best_state, loop.best_score
    best_epoch, bad_epochs, start_epoch, stopped = (
        loop.best_epoch,
        loop.bad_epochs,
        loop.epoch,
        loop.stopped,
    )

    runner = None if shards is None else make_epoch_runner(model, shards, config)
    is_main = shards is None or shards.is_main
    bar = None
    if progress and is_main:
        from tqdm.auto import tqdm

        bar = tqdm(total=config.epochs, initial=start_epoch, desc=f"{config.objective}", unit="ep")

    try:
        epoch = start_epoch
        while epoch < config.epochs and not stopped:
            t0 = time.perf_counter()
            model.train()
            if config.objective == "exact":
                optimizer.zero_grad(set_to_none=True)
                phi = model.features(x)
                loss = (
                    -exact_marginal_log_likelihood(
                        phi, y, model.noise_var(tests), mean=model.const_mean
                    )
                    / n
                )
                loss.backward()
                optimizer.step()
                train_loss = float(loss.detach())
                exact_posterior_from_data(
                    model, x, y, chunk_size=config.eval_chunk_size, tests=tests
                )
            elif runner is not None:
                train_loss = runner(x, y, optimizer, epoch, tests)
            else:
                perm = torch.randperm(n, generator=gen).to(x.device)
                total = 0.0
                for i in range(0, n, config.batch_size):
                    idx = perm[i : i + config.batch_size]
                    optimizer.zero_grad(set_to_none=True)
                    tb = None if tests is None else tests[idx]
                    loss = batch_loss(model, x[idx], y[idx], n=n, config=config, tests=tb)
                    loss.backward()
                    optimizer.step()
                    total += float(loss.detach()) * int(idx.shape[0])
                train_loss = total / n
            if not math.isfinite(train_loss):
                raise FloatingPointError(
                    f"the training loss became {train_loss} at epoch {epoch + 1}; "
                    "try a smaller lr or a larger jitter"
                )
            model.eval()
            val_nll = None
            if has_val:
                assert x_val is not None and y_val is not None
                val_nll = (
                    evaluate_nll(
                        model,
                        x_val,
                        y_val,
                        variance_correction=config.variance_correction,
                        chunk_size=config.eval_chunk_size,
                        tests=tests_val,
                    )
                    + nll_offset
                )
            score = val_nll if val_nll is not None else train_loss
            epoch += 1
            if score < best_score:
                best_score, best_epoch, bad_epochs = score, epoch, 0
                best_state = _clone_state(model)
            else:
                bad_epochs += 1
            record = {
                "epoch": epoch,
                "train_loss": _finite_or_none(train_loss),
                "val_nll": _finite_or_none(val_nll),
                "seconds": time.perf_counter() - t0,
            }
            history.append(record)
            if bad_epochs >= config.patience:
                stopped = True
            if ckpt_dir is not None and is_main:
                save_loop_checkpoint(
                    ckpt_dir,
                    config,
                    model,
                    optimizer,
                    LoopState(
                        history, best_state, best_score, best_epoch, bad_epochs, epoch, stopped
                    ),
                    generator=gen,
                )
            if bar is not None:
                post = {"loss": f"{train_loss:.4f}"}
                if val_nll is not None:
                    post["val_nll"] = f"{val_nll:.4f}"
                bar.set_postfix(post)
                bar.update(1)
            if callback is not None:
                callback(dict(record))
    finally:
        if bar is not None:
            bar.close()

    model.load_state_dict(best_state)
    model.eval()
    return TrainResult(history=copy.deepcopy(history), best_epoch=best_epoch, stopped_early=stopped)
