"""The one training loop (:func:`geodbk.training.fit`): in-memory and streaming training agree,
early stopping, divergence and checkpoint/resume of the loop itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from geodbk.errors import TrainingDivergedError
from geodbk.geo.parquet_batches import ParquetRowGroups
from geodbk.hyperparameters import KERNEL_UPDATE_EVERY_DPPGP_RBF, DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.streaming import train_streaming
from geodbk.training import Epoch, LoopConfig, TrainResult, fit, train_model

N_TRAIN, N_VAL = 192, 48


def _rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(4)
    n = N_TRAIN + N_VAL
    x = rng.uniform(-1, 1, size=(n, 2))
    y = np.sin(3 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.standard_normal(n)
    return x, y, np.where(np.arange(n) < N_TRAIN, "train", "val")


def _model(expansion: str) -> DBKModel:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return DBKModel(2, expansion=expansion, rank=8, hidden=8, noise_init=0.3, generator=gen).to(
        torch.float64
    )


@pytest.mark.parametrize(
    ("objective", "expansion", "kernel_update_every"),
    [
        ("dppgp", "rbf", 1),
        ("dppgp", "silu", 1),
        ("ppgp", "rbf", 1),
        ("ppgp", "silu", 1),
        ("dppgp", "rbf", 2),
    ],
)
def test_in_memory_and_streaming_training_agree(
    tmp_path: Path, objective: str, expansion: str, kernel_update_every: int
) -> None:
    """Same rows, seed and options: one streaming window walks the in-memory batches, so both
    keep the same epoch and the same weights (variance correction on, as the RBF basis uses;
    with the RBF kernel held on every other step too)."""
    x, y, split = _rows()
    src = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"x1": x[:, 0], "x2": x[:, 1], "y": y, "split": split}), src, row_group_size=60
    )
    mean, sd = float(y.mean()), float(y.std())
    ys = (y - mean) / sd
    cfg = LoopConfig.of(
        DBKHyperparameters(
            objective=objective,
            batch_size=64,
            epochs=4,
            lr=3e-2,
            patience=10,
            seed=5,
            kernel_update_every=kernel_update_every,
        ),
        variance_correction=True,
    )
    xv, yv = torch.tensor(x[N_TRAIN:]), torch.tensor(ys[N_TRAIN:])
    mem = _model(expansion)
    res = train_model(
        mem,
        torch.tensor(x[:N_TRAIN]),
        torch.tensor(ys[:N_TRAIN]),
        config=cfg,
        x_val=xv,
        y_val=yv,
        nll_offset=float(np.log(sd)),
    )
    stream = _model(expansion)
    hist = train_streaming(
        stream,
        ParquetRowGroups(src, filters=pc.field("split") == "train"),
        x_columns=["x1", "x2"],
        y_column="y",
        y_mean=mean,
        y_std=sd,
        config=cfg,
        x_val=xv,
        y_val=yv,
        dtype=torch.float64,
        shuffle_groups=100,
    )
    best = min(hist, key=lambda r: r["val_nll"])["epoch"]
    assert best == res.best_epoch
    np.testing.assert_allclose(
        [r["val_nll"] for r in hist], [r["val_nll"] for r in res.history], rtol=1e-9
    )
    for k, v in mem.state_dict().items():
        torch.testing.assert_close(stream.state_dict()[k], v, rtol=1e-9, atol=1e-11)


def test_a_held_kernel_takes_one_step_in_k_and_the_rest_train_every_step() -> None:
    """kernel_update_every=4 with 6 batches an epoch: Z, l and sk2 get a gradient on batches
    0 and 4 of each epoch, the backbone and q(w) on all; the kernel still learns."""
    x, y, _ = _rows()
    ys = torch.tensor((y - y.mean()) / y.std())
    model = _model("rbf")
    z0 = model.basis.inducing.detach().clone()
    counts = {"kernel": 0, "backbone": 0, "q": 0}

    def counter(key: str) -> Any:
        def hook(_: torch.Tensor) -> None:
            counts[key] += 1

        return hook

    model.basis.inducing.register_post_accumulate_grad_hook(counter("kernel"))
    model.backbone.inp.weight.register_post_accumulate_grad_hook(counter("backbone"))
    model.q.mean.register_post_accumulate_grad_hook(counter("q"))
    cfg = LoopConfig.of(
        DBKHyperparameters(batch_size=32, epochs=2, lr=1e-2, patience=5, kernel_update_every=4),
        variance_correction=False,
    )
    train_model(model, torch.tensor(x[:N_TRAIN]), ys[:N_TRAIN], config=cfg)
    assert counts == {"kernel": 4, "backbone": 12, "q": 12}
    assert not torch.equal(model.basis.inducing.detach(), z0)
    # the factor the held steps use is that of the kernel's current values (fused AdamW
    # updates the parameters in place without bumping their version counters)
    torch.testing.assert_close(
        model.basis.fixed_chol(), model.basis.chol().detach(), rtol=0, atol=0
    )
    assert all(p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="kernel_update_every"):
        LoopConfig.of(DBKHyperparameters(kernel_update_every=-1), variance_correction=False)


@pytest.mark.parametrize(
    ("expansion", "objective", "given", "resolved"),
    [
        ("rbf", "dppgp", 0, KERNEL_UPDATE_EVERY_DPPGP_RBF),
        ("rbf", "dppgp", 1, 1),
        ("rbf", "ppgp", 0, 1),
        ("rbf", "elbo", 0, 1),
        ("rbf", "exact", 0, 1),
        ("silu", "dppgp", 0, 1),
        ("rbf", "ppgp", 3, 3),
    ],
)
def test_the_default_holds_the_kernel_only_for_dppgp_with_the_rbf_basis(
    expansion: str, objective: str, given: int, resolved: int
) -> None:
    """``kernel_update_every: 0`` (default) resolves to 4 for DBK-RBF under dPPGP (measured
    there) and to 1 elsewhere; a value given is kept."""
    hyper = DBKHyperparameters(expansion=expansion, objective=objective, kernel_update_every=given)
    assert DBKHyperparameters().kernel_update_every == 0
    assert LoopConfig.of(hyper, variance_correction=False).kernel_update_every == resolved


class _Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([2.0], dtype=torch.float64))


def _toy_fit(module: _Toy, epochs: int, **kw: Any) -> tuple[list[float], TrainResult]:
    """Gradient steps on w² with a random kick per epoch (torch's global generator)."""
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    seen: list[float] = []

    def step(epoch: int) -> float:
        opt.zero_grad()
        loss = (module.w**2).sum() + 0.01 * torch.randn(())
        loss.backward()
        opt.step()
        seen.append(float(loss.detach()))
        return float(loss.detach())

    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    return seen, fit(
        module, step, optimizer=opt, epochs=epochs, patience=None, scheduler=sched, **kw
    )


def test_fit_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    torch.manual_seed(1)
    full = _Toy()
    losses, result = _toy_fit(full, 5)
    torch.manual_seed(1)
    _toy_fit(_Toy(), 3, checkpoint_dir=tmp_path)
    torch.manual_seed(99)  # the checkpoint restores torch's random state
    resumed = _Toy()
    tail, again = _toy_fit(resumed, 5, checkpoint_dir=tmp_path, resume=True)
    assert tail == losses[3:]
    assert torch.equal(full.w, resumed.w)

    def strip(res: TrainResult) -> list[dict[str, Any]]:
        return [{k: v for k, v in r.items() if k != "seconds"} for r in res.history]

    assert strip(again) == strip(result)


def test_fit_early_stopping_and_deferred_step(capsys: pytest.CaptureFixture[str]) -> None:
    """No improvement after epoch 1: stops after 1 + patience epochs and keeps epoch 1's state,
    scored before the epoch's deferred step."""
    module = _Toy()
    opt = torch.optim.SGD(module.parameters(), lr=1.0)

    def step(epoch: int) -> Epoch:
        def apply() -> None:
            with torch.no_grad():
                module.w.add_(1.0)

        return Epoch(1.0, apply)

    res = fit(
        module,
        step,
        optimizer=opt,
        epochs=10,
        patience=3,
        validate=lambda: 0.5,
        progress=True,
        name="toy",
    )
    assert [r["epoch"] for r in res.history] == [1, 2, 3, 4] and res.stopped_early
    assert res.best_epoch == 1 and float(module.w.detach()) == 2.0
    assert "[toy] epoch 4: train_loss 1.0000 val_nll 0.5000" in capsys.readouterr().err


def test_divergence_raises_training_diverged_error() -> None:
    x, y, _ = _rows()
    model = _model("silu")
    with torch.no_grad():
        model.q.mean.fill_(float("nan"))
    cfg = LoopConfig.of(DBKHyperparameters(batch_size=64, epochs=2, seed=0))
    with pytest.raises(TrainingDivergedError, match="training loss became nan at epoch 1"):
        train_model(model, torch.tensor(x), torch.tensor(y), config=cfg)
    assert issubclass(TrainingDivergedError, FloatingPointError)
    # non-finite parameters that make the next Kzz Cholesky fail (the loss never reported)
    rbf = _model("rbf")
    with torch.no_grad():
        rbf.basis.inducing.fill_(float("nan"))
    with pytest.raises(
        TrainingDivergedError, match=r"non-finite during epoch 1 \(basis\.inducing\)"
    ):
        train_model(rbf, torch.tensor(x), torch.tensor(y), config=cfg)
    with pytest.raises(torch.linalg.LinAlgError):  # finite parameters: the error as it was
        fit(
            _Toy(),
            lambda e: float(torch.linalg.cholesky(-torch.eye(2)).sum()),
            optimizer=torch.optim.SGD(_Toy().parameters(), lr=1.0),
            epochs=1,
            patience=None,
        )
    with pytest.raises(TrainingDivergedError, match="validation NLL is NaN"):
        fit(
            _Toy(),
            lambda e: 1.0,
            optimizer=torch.optim.SGD(_Toy().parameters(), lr=1.0),
            epochs=2,
            patience=None,
            validate=lambda: float("nan"),
        )
