"""The training loop of every model: :func:`fit` keeps the best epoch by validation NLL (else
training loss), stops early, records the history, shows progress, raises
:class:`~geodbk.errors.TrainingDivergedError` on a non-finite loss, writes a checkpoint after
every epoch and resumes from it bit-identically. A data source is an epoch function: in memory
or DDP shards (:func:`train_model`), parquet streaming (:func:`geodbk.streaming.train_streaming`)
or a baseline's batches (:meth:`geodbk.baselines.base.TorchBaseline.fit`).

The DBK loop works on standardised targets; the estimator converts to and from y's units.
"""

from __future__ import annotations

import copy
import io
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple, get_type_hints

import torch
from torch import nn
from tqdm.auto import tqdm

from geodbk.atomic import atomic_path
from geodbk.distributed import ShardPlan, make_epoch_runner
from geodbk.errors import ModelFileError, TrainingDivergedError
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.objectives import (
    batch_loss,
    exact_marginal_log_likelihood,
    gaussian_nll,
)
from geodbk.posterior import accumulate_statistics, posterior_from_statistics
from geodbk.steps import minibatch_step

__all__ = [
    "CHECKPOINT_NAME",
    "OBJECTIVES",
    "Epoch",
    "LoopConfig",
    "TrainResult",
    "batch_loss",
    "evaluate_nll",
    "exact_posterior_from_data",
    "fit",
    "train_model",
]

OBJECTIVES = ("dppgp", "exact", "ppgp", "elbo")
CHECKPOINT_NAME = "last.pt"
_CHECKPOINT_FORMAT = "geodbk-checkpoint-v2"


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """What the DBK training loop needs (:func:`train_model`,
    :func:`geodbk.streaming.train_streaming`, :func:`geodbk.objectives.batch_loss`): the
    hyperparameters of the same names (their meaning and defaults:
    :class:`~geodbk.hyperparameters.DBKHyperparameters`), built from them by :meth:`of`, and
    the rows per chunk of the validation NLL and the exact posterior."""

    objective: str
    alpha: float
    beta: float
    batch_size: int
    epochs: int
    lr: float
    weight_decay: float
    patience: int
    seed: int
    variance_correction: bool
    kernel_update_every: int = 1
    eval_chunk_size: int = 65536

    @classmethod
    def of(cls, hyperparameters: DBKHyperparameters, **changes: Any) -> LoopConfig:
        """The loop options of ``hyperparameters`` (its fields and ``variance_correction``,
        cast to the types here; ``kernel_update_every`` resolved), ``changes`` replacing
        some."""
        types = get_type_hints(cls)
        values = {
            f.name: types[f.name](getattr(hyperparameters, f.name))
            for f in fields(cls)
            if hasattr(hyperparameters, f.name)
        }
        values["kernel_update_every"] = hyperparameters.resolved_kernel_update_every()
        return cls(**{**values, **changes})

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.batch_size < 1 or self.epochs < 0 or self.patience < 1:
            raise ValueError("batch_size and patience must be >= 1 and epochs >= 0")
        if self.kernel_update_every < 1:
            raise ValueError(f"kernel_update_every must be >= 1, got {self.kernel_update_every}")

    def holds_kernel(self, batch: int) -> bool:
        """Whether the ``batch``-th mini-batch of an epoch (from 0) holds the RBF basis's
        kernel fixed: all but every ``kernel_update_every``-th, the first of each epoch
        updating it."""
        return batch % self.kernel_update_every != 0


@dataclass
class TrainResult:
    """Outcome of :func:`train_model`: per-epoch history and the selected (best) epoch."""

    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int = 0
    stopped_early: bool = False


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


def _make_optimizer(model: DBKModel, config: LoopConfig) -> torch.optim.AdamW:
    """AdamW with ``config.weight_decay`` on the backbone only; torch's fused kernel (one pass
    per parameter instead of about ten) on the CPU and CUDA."""
    groups = [
        {"params": model.backbone_parameters(), "weight_decay": config.weight_decay},
        {"params": model.other_parameters(), "weight_decay": 0.0},
    ]
    fused = all(p.device.type in ("cpu", "cuda") for p in model.parameters())
    return torch.optim.AdamW(groups, lr=config.lr, fused=fused)


def _clone_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _save_checkpoint(directory: Path, state: dict[str, Any]) -> None:
    # serialised in memory first: torch.save reports a full disk as a RuntimeError of its zip
    # writer, a plain write as the OSError it is (the command line names the file and the fix)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / CHECKPOINT_NAME) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def _load_checkpoint(path: Path, options: dict[str, Any]) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt, truncated or foreign file
        raise ModelFileError(
            f"cannot read the training checkpoint {path}: {exc}. Delete it to start afresh."
        ) from exc
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        raise ModelFileError(
            f"{path} is not a geodbk training checkpoint of this version; delete it to start afresh"
        )
    saved = dict(state.get("options", {}))
    diff = [k for k in options if saved.get(k) != options[k]]
    if diff:
        raise ModelFileError(
            f"the checkpoint {path} was written with different options ({', '.join(diff)}); "
            "resume with the same options or delete it to start afresh"
        )
    return state


class Epoch(NamedTuple):
    """What one epoch of :func:`fit` reports.

    ``apply``, when given, is the epoch's optimiser step, taken after the loop has scored and
    possibly kept the parameters (full-batch models that cache their posterior in the forward
    pass score the parameters before their step).
    """

    train_loss: float
    apply: Callable[[], None] | None = None


@dataclass
class _Loop:
    """Bookkeeping of :func:`fit` that a checkpoint restores (after ``epoch`` epochs)."""

    history: list[dict[str, Any]]
    best_state: dict[str, torch.Tensor]
    best_score: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    epoch: int = 0
    stopped: bool = False


class _Progress:
    """A tqdm bar on a terminal, else one line per epoch on stderr."""

    def __init__(self, name: str, total: int, initial: int) -> None:
        self.name = name
        tty = sys.stderr.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=name, unit="ep") if tty else None

    def update(self, record: dict[str, Any]) -> None:
        post = {k: f"{record[k]:.4f}" for k in ("train_loss", "val_nll") if record[k] is not None}
        if self.bar is None:
            text = " ".join(f"{k} {v}" for k, v in post.items())
            print(f"[{self.name}] epoch {record['epoch']}: {text}", file=sys.stderr)
            return
        self.bar.set_postfix(post)
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def fit(
    module: nn.Module,
    epoch_step: Callable[[int], float | Epoch],
    *,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    patience: int | None,
    validate: Callable[[], float | None] | None = None,
    nll_offset: float = 0.0,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    options: dict[str, Any] | None = None,
    progress: bool = False,
    is_main: bool = True,
    callback: Callable[[dict[str, Any]], None] | None = None,
    name: str = "train",
    generator: torch.Generator | None = None,
) -> TrainResult:
    """Run ``epoch_step`` for up to ``epochs`` epochs and leave ``module`` at the best one.

    Each epoch: ``epoch_step(e)`` (``e`` counts from 0) trains and returns the mean training
    loss (or an :class:`Epoch`); a non-finite loss, or a failed Cholesky after the parameters
    became non-finite, raises :class:`TrainingDivergedError`. Then
    ``validate()`` gives the validation NLL (``None``: no validation data; NaN raises
    :class:`TrainingDivergedError`, +inf is recorded as ``None`` and never kept). The score is
    ``val_nll + nll_offset``, else the training loss; the lowest-scoring state is kept, and
    training stops after ``patience`` epochs without a lower score. ``scheduler`` is stepped
    once per epoch (``ReduceLROnPlateau`` with the score).

    With ``checkpoint_dir`` the main process writes ``last.pt`` atomically after every epoch
    (module, optimiser, scheduler, ``generator`` (the batch order), torch's CPU random state and
    this bookkeeping); with
    ``resume=True`` an existing one whose ``options`` match is continued, bit-identical to an
    uninterrupted run on the same device and thread count when ``epoch_step`` depends only on
    the epoch index and that state. ``progress`` shows a tqdm bar on a terminal (else a line per
    epoch on stderr) on the main process; ``callback`` gets each epoch's history record
    (``epoch``, ``train_loss``, ``val_nll``, ``seconds``).
    """
    options = dict(options or {})
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    loop = _Loop(history=[], best_state=_clone_state(module))
    if ckpt_dir is not None and resume and (ckpt_dir / CHECKPOINT_NAME).is_file():
        saved = _load_checkpoint(ckpt_dir / CHECKPOINT_NAME, options)
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        if scheduler is not None and saved["scheduler"] is not None:
            scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        if generator is not None:
            generator.set_state(saved["generator"])
        device = next(iter(module.state_dict().values())).device
        loop = _Loop(
            **{k: saved[k] for k in ("history", "best_score", "best_epoch", "bad_epochs")},
            best_state={k: v.to(device) for k, v in saved["best_state"].items()},
            epoch=saved["epoch"],
            stopped=saved["stopped"],
        )
    bar = _Progress(name, epochs, loop.epoch) if progress and is_main else None
    try:
        while loop.epoch < epochs and not loop.stopped:
            t0 = time.perf_counter()
            module.train()
            epoch = loop.epoch + 1
            try:
                out = epoch_step(loop.epoch)
            except torch.linalg.LinAlgError as exc:
                bad = [k for k, v in module.named_parameters() if not bool(torch.isfinite(v).all())]
                if not bad:
                    raise
                raise TrainingDivergedError(
                    f"{name}: the parameters became non-finite during epoch {epoch} "
                    f"({', '.join(bad[:3])}{', ...' if len(bad) > 3 else ''}), and then {exc}; "
                    "try dtype float64, a smaller lr or a larger jitter"
                ) from exc
            out = out if isinstance(out, Epoch) else Epoch(float(out))
            if not math.isfinite(out.train_loss):
                raise TrainingDivergedError(
                    f"{name}: the training loss became {out.train_loss} at epoch {epoch}; "
                    "try a smaller lr or a larger jitter"
                )
            module.eval()
            val = validate() if validate is not None else None
            if val is not None and math.isnan(val):
                raise TrainingDivergedError(f"{name}: the validation NLL is NaN at epoch {epoch}")
            val = None if val is None else val + nll_offset
            score = out.train_loss if val is None else val
            if score < loop.best_score:
                loop.best_score, loop.best_epoch, loop.bad_epochs = score, epoch, 0
                loop.best_state = _clone_state(module)
            else:
                loop.bad_epochs += 1
            if out.apply is not None:
                out.apply()
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(score)
            elif scheduler is not None:
                scheduler.step()
            loop.epoch, loop.stopped = epoch, patience is not None and loop.bad_epochs >= patience
            record = {
                "epoch": epoch,
                "train_loss": out.train_loss,
                "val_nll": val if val is not None and math.isfinite(val) else None,
                "seconds": time.perf_counter() - t0,
            }
            loop.history.append(record)
            if ckpt_dir is not None and is_main:
                _save_checkpoint(
                    ckpt_dir,
                    {
                        **vars(loop),
                        "format": _CHECKPOINT_FORMAT,
                        "options": options,
                        "model": module.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "scheduler": None if scheduler is None else scheduler.state_dict(),
                        "rng": torch.get_rng_state(),
                        "generator": None if generator is None else generator.get_state(),
                    },
                )
            if bar is not None:
                bar.update(record)
            if callback is not None:
                callback(dict(record))
    finally:
        if bar is not None:
            bar.close()
    module.load_state_dict(loop.best_state)
    module.eval()
    return TrainResult(
        history=copy.deepcopy(loop.history), best_epoch=loop.best_epoch, stopped_early=loop.stopped
    )


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """One epoch's mini-batches: a permutation of ``n`` rows from ``generator``, cut every
    ``batch_size`` rows (the batch order of every in-memory and streaming loop)."""
    return list(torch.randperm(n, generator=generator).split(batch_size))


def checkpoint_options(config: LoopConfig) -> dict[str, Any]:
    """The options of ``config`` a checkpoint must match to be resumed (not the budget;
    ``kernel_update_every`` only when not 1, so checkpoints written before it match)."""
    skip = ("epochs", "patience", "eval_chunk_size")
    options = {k: v for k, v in asdict(config).items() if k not in skip}
    if options["kernel_update_every"] == 1:
        del options["kernel_update_every"]
    return options


def validator(
    model: DBKModel,
    config: LoopConfig,
    x_val: torch.Tensor | None,
    y_val: torch.Tensor | None,
    tests_val: torch.Tensor | None = None,
) -> Callable[[], float | None]:
    """The validation NLL of :func:`fit` for a DBK model (``None`` without validation rows)."""

    def validate() -> float | None:
        if x_val is None or y_val is None or int(x_val.shape[0]) == 0:
            return None
        return evaluate_nll(
            model,
            x_val,
            y_val,
            variance_correction=config.variance_correction,
            chunk_size=config.eval_chunk_size,
            tests=tests_val,
        )

    return validate


def train_model(
    model: DBKModel,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    config: LoopConfig,
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
    """Train ``model`` in place with :func:`fit` and leave it at the best epoch.

    Mini-batch objectives (``dppgp``, ``ppgp``, ``elbo``): each epoch draws a permutation from a
    ``torch.Generator`` seeded with ``config.seed`` (:func:`shuffled_batches`; with ``shards``
    the same global batches, each rank taking its shard's rows of each) and takes one AdamW step
    per batch. ``exact``: one full-batch
    step per epoch on ``-log p(y) / n``, after which ``q(w)`` is set to the exact posterior.
    AdamW applies ``weight_decay`` to the backbone only. Selection (lowest validation NLL +
    ``nll_offset``, else training loss), early stopping, checkpoints in ``checkpoint_dir``,
    ``resume``, ``progress``, ``callback`` and divergence errors are those of :func:`fit`.

    Parameters
    ----------
    model
        The model, on the device and dtype of ``x``.
    x, y, x_val, y_val
        Training and optional validation inputs (n, d) and standardised targets (n,).
    tests, tests_val
        Optional noise covariate ((n,) or (n, k)) of the training and validation rows, passed
        to ``model.noise_var`` so the loss uses ``s2_i``.
    shards
        Sharded (data-parallel) training: ``x, y`` are this rank's shard and the epochs walk
        the in-memory batches of the shards concatenated in rank order
        (:mod:`geodbk.distributed`); only the main rank writes checkpoints and shows progress.
    """
    n = int(x.shape[0])
    if n == 0:
        raise ValueError("cannot train on an empty data set")
    optimizer = _make_optimizer(model, config)

    def exact_step(epoch: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        mll = exact_marginal_log_likelihood(
            model.features(x), y, model.noise_var(tests), mean=model.const_mean
        )
        loss = -mll / n
        loss.backward()
        optimizer.step()
        exact_posterior_from_data(model, x, y, chunk_size=config.eval_chunk_size, tests=tests)
        return float(loss.detach())

    def batch_step(epoch: int) -> float:
        if runner is not None:
            return runner(x, y, optimizer, tests)
        total = 0.0
        for i, idx in enumerate(shuffled_batches(n, config.batch_size, gen)):
            idx = idx.to(x.device)
            tb = None if tests is None else tests[idx]
            total += minibatch_step(
                model, optimizer, x[idx], y[idx], n=n, config=config, batch=i, tests=tb
            )
        return total / n

    gen = torch.Generator(device="cpu").manual_seed(int(config.seed))
    runner = None if shards is None else make_epoch_runner(model, shards, config, generator=gen)
    return fit(
        model,
        exact_step if config.objective == "exact" else batch_step,
        optimizer=optimizer,
        epochs=config.epochs,
        patience=config.patience,
        validate=validator(model, config, x_val, y_val, tests_val),
        nll_offset=nll_offset,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        options=checkpoint_options(config),
        progress=progress,
        is_main=shards is None or shards.is_main,
        callback=callback,
        name=config.objective,
        generator=gen,
    )
