"""Data-parallel training: a gloo DDP run on shards equals the in-memory run on their
concatenation (same seed; dPPGP and PPGP, each basis, uneven shards, steps where a rank has no
rows). With tests/test_training.py (in-memory == streaming) in-memory, streaming and DDP training
give the same best epoch and weights to floating-point noise."""

from __future__ import annotations

import os
import socket
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from geodbk.distributed import ShardPlan, shutdown_distributed
from geodbk.hyperparameters import DBKHyperparameters
from geodbk.model import DBKModel
from geodbk.training import LoopConfig, shuffled_batches, train_model

N, N_VAL, RANK_R, HIDDEN = 300, 60, 16, 8


def _rows() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """N training then N_VAL validation rows: inputs, raw targets, test counts."""
    rng = np.random.default_rng(0)
    m = N + N_VAL
    x = rng.uniform(-1, 1, size=(m, 2))
    tests = rng.choice([1.0, 2.0, 4.0, 16.0], size=m)
    y = np.sin(3 * x[:, 0]) * np.cos(2 * x[:, 1]) + 0.3 / np.sqrt(tests) * rng.standard_normal(m)
    return x, y, tests


def _data(part: slice = slice(0, N)) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``part`` with targets standardised by the training rows' mean and sd."""
    x, y, tests = _rows()
    ys = (y - y[:N].mean()) / y[:N].std()
    return torch.tensor(x[part]), torch.tensor(ys[part]), torch.tensor(tests[part])


def _model(noise: str = "constant", expansion: str = "rbf") -> DBKModel:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    model = DBKModel(2, expansion=expansion, rank=RANK_R, hidden=HIDDEN, noise=noise, generator=gen)
    return model.to(torch.float64)


def _sizes() -> tuple[int, int]:
    return (N // 2 + 7, N - N // 2 - 7)  # unequal shards on purpose


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# (objective, expansion, noise, shard sizes, batch size, kernel_update_every): uneven shards;
# the (N - 5, 5) split leaves rank 1 without rows in most global batches (checked in the test)
Case = tuple[str, str, str, tuple[int, int], int, int]
CASES: tuple[Case, ...] = (
    ("dppgp", "rbf", "constant", _sizes(), 64, 1),
    ("dppgp", "silu", "constant", _sizes(), 64, 1),
    ("ppgp", "rbf", "constant", _sizes(), 64, 1),
    ("ppgp", "silu", "constant", _sizes(), 64, 1),
    ("dppgp", "rbf", "tests", (N - 5, 5), 32, 1),
    ("ppgp", "silu", "tests", (N - 5, 5), 32, 1),
    ("dppgp", "rbf", "constant", _sizes(), 64, 2),
)


def _case_config(objective: str, batch_size: int, kernel_update_every: int = 1) -> LoopConfig:
    return LoopConfig.of(
        DBKHyperparameters(
            objective=objective,
            batch_size=batch_size,
            epochs=3,
            lr=2e-2,
            patience=5,
            seed=3,
            kernel_update_every=kernel_update_every,
        ),
        variance_correction=True,
    )


def _train_case(case: Case, rank: int | None, *, shards: bool) -> dict[str, Any]:
    """Train one case on rank ``rank``'s rows (``None``: all rows; ``shards=False``: in memory)."""
    objective, expansion, noise, sizes, batch_size, kernel_update_every = case
    x, y, tests = _data()
    xv, yv, tv = _data(slice(N, N + N_VAL))
    lo, hi = (0, N) if rank is None else (sum(sizes[:rank]), sum(sizes[: rank + 1]))
    model = _model(noise, expansion)
    use_tests = noise == "tests"
    result = train_model(
        model,
        x[lo:hi],
        y[lo:hi],
        config=_case_config(objective, batch_size, kernel_update_every),
        x_val=xv,
        y_val=yv,
        tests=tests[lo:hi] if use_tests else None,
        tests_val=tv if use_tests else None,
        shards=ShardPlan(sizes, rank=rank) if shards else None,
    )
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "train_loss": [h["train_loss"] for h in result.history],
        "val_nll": [h["val_nll"] for h in result.history],
        "best_epoch": result.best_epoch,
    }


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Train every case of :data:`CASES` on this rank's shard; save the results."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    warnings.simplefilter("error", FutureWarning)  # a deprecated DDP option fails the run
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),  # a mismatched collective fails, not hangs
    )
    try:
        results = [_train_case(case, rank, shards=True) for case in CASES]
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        del results
        dist.barrier()  # both ranks finish their gloo traffic before either tears down
    finally:
        shutdown_distributed()
    # Results are saved and the group is gone: skip interpreter finalisation, where a gloo
    # thread still joinable can abort the process under load ("terminate called without an
    # active exception", SIGABRT after a successful run).
    os._exit(0)


def _assert_same_run(got: dict[str, Any], want: dict[str, Any], rtol: float) -> None:
    assert got["best_epoch"] == want["best_epoch"]
    np.testing.assert_allclose(got["train_loss"], want["train_loss"], rtol=rtol, atol=0)
    np.testing.assert_allclose(got["val_nll"], want["val_nll"], rtol=rtol, atol=0)
    assert set(got["state"]) == set(want["state"])
    for key, value in want["state"].items():
        torch.testing.assert_close(got["state"][key], value, rtol=rtol, atol=1e-12, msg=key)


def test_plan_batches_are_the_in_memory_batches() -> None:
    """rank=None yields the in-memory batches; each rank yields its rows of every global batch
    (local indices, in the batch's order, some steps empty), so the ranks cover every row once."""
    sizes, b = (15, 2), 4

    def gen() -> torch.Generator:
        return torch.Generator().manual_seed(1)

    want = shuffled_batches(17, b, gen())
    got = list(ShardPlan(sizes).epoch_batches(generator=gen(), batch_size=b))
    assert [i.tolist() for i, _ in got] == [i.tolist() for i in want]
    assert [n for _, n in got] == [int(i.shape[0]) for i in want] == [4, 4, 4, 4, 1]
    parts = [
        list(ShardPlan(sizes, rank=k).epoch_batches(generator=gen(), batch_size=b)) for k in (0, 1)
    ]
    for s, batch in enumerate(want):
        (i0, n0), (i1, n1) = parts[0][s], parts[1][s]
        assert n0 == n1 == int(batch.shape[0])
        assert i0.tolist() == [i for i in batch.tolist() if i < 15]
        assert (i1 + 15).tolist() == [i for i in batch.tolist() if i >= 15]
    assert sorted(torch.cat([i for i, _ in parts[0]]).tolist()) == list(range(15))
    assert sorted(torch.cat([i for i, _ in parts[1]]).tolist()) == [0, 1]
    assert sum(int(i.shape[0]) == 0 for i, _ in parts[1]) >= 3  # rank 1 idles in most steps
    assert ShardPlan((2, 30)).steps(4) == 8  # a small shard does not limit the steps


@pytest.mark.parametrize(
    "case", (*CASES[:4], CASES[6]), ids=lambda c: f"{c[0]}-{c[1]}-kernel{c[5]}"
)
def test_unranked_plan_equals_in_memory(case: Case) -> None:
    """ShardPlan(sizes, rank=None) walks the in-memory batches: bit-identical training."""
    _assert_same_run(
        _train_case(case, None, shards=True), _train_case(case, None, shards=False), rtol=0
    )


def test_two_process_gloo_equals_in_memory(tmp_path: Path) -> None:
    """One spawn, seven trainings: 2-process DDP == in-memory train_model (no shards) in
    float64, dPPGP and PPGP, RBF and SiLU bases, constant and tests-aware noise, uneven shards,
    and the RBF kernel held on every other step (kept in DDP's graph, its gradient dropped)."""
    import torch.multiprocessing as mp

    for _, _, _, sizes, b, _ in CASES[4:6]:  # these cases exercise the empty-rank steps
        steps = ShardPlan(sizes, rank=1).epoch_batches(
            generator=torch.Generator().manual_seed(3), batch_size=b
        )
        assert sum(int(i.shape[0]) == 0 for i, _ in steps) >= 2
    old = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        mp.spawn(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    finally:
        if old is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = old
    got = [torch.load(tmp_path / f"rank{k}.pt", weights_only=True) for k in (0, 1)]
    wants = [_train_case(case, None, shards=False) for case in CASES]
    for c, want in enumerate(wants):
        assert want["train_loss"][-1] < want["train_loss"][0]  # a genuine training run
        for rank in (0, 1):
            _assert_same_run(got[rank][c], want, rtol=1e-9)
    # some runs keep an earlier epoch than the last: the best-epoch comparison means something
    assert min(w["best_epoch"] for w in wants) < _case_config("dppgp", 1).epochs


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


def test_ddp_buffer_options_name_an_option_torch_has() -> None:
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    from geodbk.distributed import ddp_buffer_options

    (name, value), *_ = ddp_buffer_options().items()
    assert value is False
    assert name in inspect.signature(DistributedDataParallel.__init__).parameters
