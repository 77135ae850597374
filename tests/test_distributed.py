"""Data-parallel training: a 2-process gloo run equals a 1-process run with the same global batch."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from geodbk.distributed import ShardPlan, shutdown_distributed
from geodbk.geo.parquet_shards import read_parquet_shard
from geodbk.model import DBKModel
from geodbk.training import TrainConfig, train_model

N, RANK_R, HIDDEN = 300, 16, 8
CONFIG = TrainConfig(objective="dppgp", batch_size=64, epochs=2, lr=1e-2, patience=5, seed=3)


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(N, 2))
    tests = rng.choice([1.0, 2.0, 4.0, 16.0], size=N)
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.3 / np.sqrt(tests) * rng.standard_normal(N)
    return torch.tensor(x), torch.tensor((y - y.mean()) / y.std()), torch.tensor(tests)


def _model(noise: str = "constant") -> DBKModel:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    return DBKModel(2, rank=RANK_R, hidden=HIDDEN, noise=noise, generator=gen).to(torch.float64)


def _sizes() -> tuple[int, int]:
    return (N // 2 + 7, N - N // 2 - 7)  # unequal shards on purpose


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, out_dir: str, noise: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        x, y, tests = _data()
        sizes = _sizes()
        lo = sum(sizes[:rank])
        xs, ys = x[lo : lo + sizes[rank]], y[lo : lo + sizes[rank]]
        ts = tests[lo : lo + sizes[rank]] if noise == "tests" else None
        model = _model(noise)
        result = train_model(
            model, xs, ys, config=CONFIG, shards=ShardPlan(sizes, rank=rank), tests=ts
        )
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        torch.save(
            {"state": state, "loss": [h["train_loss"] for h in result.history]},
            Path(out_dir) / f"rank{rank}.pt",
        )
        del result, model
        dist.barrier()  # both ranks finish their gloo traffic before either tears down
    finally:
        shutdown_distributed()
    # Results are saved and the group is gone: skip interpreter finalisation, where a gloo
    # thread still joinable can abort the process under load ("terminate called without an
    # active exception", SIGABRT after a successful run).
    os._exit(0)


def test_plan_batches_cover_every_row_once() -> None:
    plan = ShardPlan((10, 7))
    seen = torch.cat([idx for idx, _ in plan.epoch_batches(epoch=0, seed=1, batch_size=4)])
    assert sorted(seen.tolist()) == list(range(17))
    rank1 = list(ShardPlan((10, 7), rank=1).epoch_batches(epoch=0, seed=1, batch_size=4))
    assert sum(int(i.shape[0]) for i, _ in rank1) == 7
    with pytest.raises(ValueError, match="steps per epoch"):
        ShardPlan((2, 30)).steps(4)


@pytest.mark.parametrize("noise", ["constant", "tests"])
def test_two_process_gloo_equals_one_process(tmp_path: Path, noise: str) -> None:
    """Also with the tests-aware noise: each rank's loss uses its own rows' s2_i."""
    import torch.multiprocessing as mp

    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.spawn(_worker, args=(2, _free_port(), str(tmp_path), noise), nprocs=2, join=True)
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
    x, y, tests = _data()
    ref = _model(noise)
    result = train_model(
        ref,
        x,
        y,
        config=CONFIG,
        shards=ShardPlan(_sizes(), rank=None),
        tests=tests if noise == "tests" else None,
    )
    ref_loss = [h["train_loss"] for h in result.history]
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        np.testing.assert_allclose(got["loss"], ref_loss, rtol=1e-9, atol=1e-10)
        for key, value in ref.state_dict().items():
            torch.testing.assert_close(got["state"][key], value, rtol=1e-8, atol=1e-10)
    # and the sharded 1-process run is a genuine training run (loss moved)
    assert ref_loss[-1] < ref_loss[0]


def test_read_parquet_shard_row_groups_and_ranges(tmp_path: Path) -> None:
    table = pa.table({"a": np.arange(100, dtype=np.float64), "split": ["train", "val"] * 50})
    many = tmp_path / "many.parquet"
    pq.write_table(table, many, row_group_size=10)
    one = tmp_path / "one.parquet"
    pq.write_table(table, one)
    for path in (many, one):
        parts = [
            read_parquet_shard(path, columns=["a"], rank=k, world_size=3, batch_size=7)["a"]
            for k in range(3)
        ]
        assert sorted(np.concatenate(parts).tolist()) == list(range(100))
        assert max(len(p) for p in parts) <= 40
    import pyarrow.compute as pc

    train = read_parquet_shard(
        many, columns=["a"], rank=0, world_size=1, filters=pc.field("split") == "train"
    )["a"]
    assert train.tolist() == list(range(0, 100, 2))


def test_sharded_fit_takes_devices_and_urban_noise() -> None:
    """The sharded epoch indexes the (n, k) noise covariate like the in-memory one: two shards
    train with noise="tests+devices" and an urban floor."""
    from geodbk import DBKRegressor

    x, y, tests = (t.numpy() for t in _data())
    rng = np.random.default_rng(1)
    cov = {
        "tests": tests,
        "devices": np.maximum(1.0, tests // 2),
        "urban": rng.random(N) < 0.5,
    }
    opts: dict[str, Any] = {
        "rank": 8,
        "hidden": 8,
        "epochs": 2,
        "batch_size": 64,
        "dtype": "float64",
    }
    opts |= {"noise": "tests+devices", "noise_urban": True, "device": "cpu"}
    two = DBKRegressor(**opts).fit(x, y, **cov, shards=ShardPlan(_sizes()))
    assert len(two.history_) == 2 and all(np.isfinite(h["train_loss"]) for h in two.history_)
