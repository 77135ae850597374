"""Out-of-core training (train_streaming) over a table's row groups: deterministic, resumable,
tests-aware, and a divergence is a TrainingDivergedError."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from geo_helpers import write_xy_table

from geodbk.errors import TrainingDivergedError
from geodbk.geo.parquet_batches import ParquetRowGroups
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.streaming import train_streaming
from geodbk.training import LoopConfig


def _fit(
    src: Path, config: LoopConfig, *, input_dim: int = 2, noise: str = "constant", **kw: object
) -> tuple[list[dict[str, object]], DBKModel]:
    """A seeded float64 DBKModel (r = h = 8) trained by :func:`train_streaming` on ``src``'s
    train split, with the target standardised by the whole column's mean and sd."""
    y_all = pq.read_table(src)["y"].to_numpy()
    torch.manual_seed(0)
    model = DBKModel(
        input_dim, rank=8, hidden=8, noise=noise, generator=torch.Generator().manual_seed(0)
    ).to(torch.float64)
    hist = train_streaming(
        model,
        ParquetRowGroups(src, filters=pc.field("split") == "train"),
        x_columns=["x1", "x2"],
        y_column="y",
        y_mean=float(y_all.mean()),
        y_std=float(y_all.std()),
        config=config,
        dtype=torch.float64,
        **kw,  # type: ignore[arg-type]
    )
    return hist, model


def test_train_streaming_is_deterministic_and_learns(tmp_path: Path) -> None:
    src = write_xy_table(tmp_path / "t.parquet")
    y_all = pq.read_table(src)["y"].to_numpy()
    val = pq.read_table(src, filters=[("split", "=", "val")])
    xv = torch.tensor(np.column_stack([val["x1"].to_numpy(), val["x2"].to_numpy()]))
    yv = torch.tensor((val["y"].to_numpy() - y_all.mean()) / y_all.std())
    cfg = LoopConfig.of(DBKHyperparameters(batch_size=64, epochs=4, lr=1e-2, patience=10, seed=2))

    def fit() -> tuple[list[dict[str, object]], DBKModel]:
        return _fit(src, cfg, x_val=xv, y_val=yv)

    h1, m1 = fit()
    h2, m2 = fit()
    assert [r["train_loss"] for r in h1] == [r["train_loss"] for r in h2]
    for k, v in m1.state_dict().items():
        torch.testing.assert_close(v, m2.state_dict()[k], rtol=0, atol=0)
    losses = [float(r["train_loss"]) for r in h1]  # type: ignore[arg-type]
    assert losses[-1] < losses[0]


def _val(src: Path, y_all: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    val = pq.read_table(src, filters=[("split", "=", "val")])
    xv = torch.tensor(np.column_stack([val["x1"].to_numpy(), val["x2"].to_numpy()]))
    yv = torch.tensor((val["y"].to_numpy() - y_all.mean()) / y_all.std())
    tv = torch.tensor(val["tests"].to_numpy().astype(np.float64))
    return xv, yv, tv


def _tests_table(path: Path, n: int = 1200) -> Path:
    """Rows whose noise sd is 0.4 / sqrt(tests): the tests-aware noise should learn s2_meas."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, size=(n, 2))
    tests = rng.choice([1, 2, 4, 16, 64], size=n)
    y = 4.0 + 0.3 * np.sin(3 * x[:, 0]) + 0.4 / np.sqrt(tests) * rng.standard_normal(n)
    split = np.where(np.arange(n) % 10 == 0, "val", "train")
    pq.write_table(
        pa.table({"x1": x[:, 0], "x2": x[:, 1], "y": y, "tests": tests, "split": split}),
        path,
        row_group_size=200,
    )
    return path


def test_train_streaming_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    """Checkpoints after every epoch; stopping after 2 of 4 epochs and resuming gives the same
    model as 4 uninterrupted epochs (the batch order depends only on seed, epoch and rank)."""
    src = _tests_table(tmp_path / "t.parquet")
    y_all = pq.read_table(src)["y"].to_numpy()
    xv, yv, tv = _val(src, y_all)

    def run(epochs: int, ckpt: Path, resume: bool) -> tuple[list[dict[str, object]], DBKModel]:
        cfg = LoopConfig.of(
            DBKHyperparameters(batch_size=64, epochs=epochs, lr=1e-2, patience=10, seed=3)
        )
        return _fit(
            src,
            cfg,
            noise="tests",
            x_val=xv,
            y_val=yv,
            tests_column="tests",
            tests_val=tv,
            checkpoint_dir=ckpt,
            resume=resume,
        )

    h_full, m_full = run(4, tmp_path / "a", False)
    run(2, tmp_path / "b", False)
    assert (tmp_path / "b" / "last.pt").is_file()
    h_res, m_res = run(4, tmp_path / "b", True)
    assert [r["train_loss"] for r in h_res] == [r["train_loss"] for r in h_full]
    assert [r["epoch"] for r in h_res] == [1, 2, 3, 4]
    for k, v in m_full.state_dict().items():
        torch.testing.assert_close(v, m_res.state_dict()[k], rtol=0, atol=0)


def test_streaming_inputs_callable_and_tests_column(tmp_path: Path) -> None:
    """A custom input map (here a third, constant column) and the tests column reach the loss:
    with the column the learned measurement share s2_meas / s2_floor grows, without it it does
    not (every row then counts as one test and the noise cannot tell the rows apart)."""
    src = _tests_table(tmp_path / "t.parquet")

    def inputs(cols: dict[str, np.ndarray]) -> np.ndarray:
        return np.column_stack([cols["x1"], cols["x2"], np.full(len(cols["x1"]), 0.5)])

    def fit(tests_column: str | None) -> float:
        cfg = LoopConfig.of(
            DBKHyperparameters(batch_size=64, epochs=6, lr=0.1, patience=10, seed=0)
        )
        hist, model = _fit(
            src, cfg, input_dim=3, noise="tests", inputs=inputs, tests_column=tests_column
        )
        assert len(hist) == 6
        with torch.no_grad():
            s1 = float(model.noise_var(torch.tensor([1.0], dtype=torch.float64)))
            s_inf = float(model.noise_var(torch.tensor([1e9], dtype=torch.float64)))
        return (s1 - s_inf) / s_inf

    with_tests, without = fit("tests"), fit(None)
    assert with_tests > 1.5 * without  # measured: 2.8 vs 1.0


def test_train_streaming_divergence_is_training_diverged_error(tmp_path: Path) -> None:
    src = write_xy_table(tmp_path / "t.parquet", n=200)
    model = DBKModel(2, expansion="silu", rank=8, hidden=8).to(torch.float64)
    with torch.no_grad():
        model.q.mean.fill_(float("nan"))
    with pytest.raises(TrainingDivergedError, match="streaming: the training loss became nan"):
        train_streaming(
            model,
            ParquetRowGroups(src),
            x_columns=["x1", "x2"],
            y_column="y",
            y_mean=4.0,
            y_std=0.5,
            config=LoopConfig.of(DBKHyperparameters(batch_size=64, epochs=2)),
            dtype=torch.float64,
        )
