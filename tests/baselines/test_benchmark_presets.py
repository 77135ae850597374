"""Presets (issue 24): ``paper`` vs ``tuned`` settings per model, and the benchmark's record of
each model's hyperparameters."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from geodbk.baselines.exact_rbf import ExactRBFModule
from geodbk.baselines.registry import (
    MODEL_NAMES,
    PAPER_PRESET,
    PRESETS,
    TUNED_PRESET,
    build_model,
    model_kwargs,
)
from geodbk.errors import DataError
from pipelines.benchmark import run_benchmark
from pipelines.cli import main

BUDGET = dict(epochs=1, batch_size=64, seed=0, rank=8, hidden=8)


def _params(name: str, preset: str) -> dict:
    return dict(build_model(name, preset=preset, **BUDGET).get_params())


def test_every_model_has_both_presets_and_builds_with_them() -> None:
    assert set(PRESETS) == {"paper", "tuned"}
    assert set(PAPER_PRESET) == set(TUNED_PRESET) == set(MODEL_NAMES)
    for name in MODEL_NAMES:
        for preset, settings in (("paper", PAPER_PRESET), ("tuned", TUNED_PRESET)):
            params = _params(name, preset)
            for key, value in settings[name].items():
                assert params[key] == value, (name, preset, key)
            assert params["epochs"] == 1 and params["batch_size"] == 64, name


@pytest.mark.parametrize(
    ("name", "key", "paper", "tuned"),
    [
        # the seed (000): noise 1e-2 and lr 1e-3 for its SVGP-ELBO comparison models
        ("sv-rbf", "noise_init", 1e-2, 0.5),
        ("sv-rbf", "lr", 1e-3, 0.01),
        ("sv-dkl", "noise_init", 1e-2, 0.5),
        ("vbll", "noise_init", 1e-2, 0.5),
        ("pp-dkl", "noise_init", 1e-2, 0.5),
        ("exact-dbk", "noise_init", 1e-2, 0.5),
        ("exact-rbf", "lr", 1e-3, 0.05),
        # paper 001: weight decay 1e-4, noise 1e-2
        ("svdbk", "weight_decay", 1e-4, 1e-2),
        ("svdbk", "noise_init", 1e-2, 0.5),
        # paper 002: lr from its sweep (0.1 on the large low-dimensional sets)
        ("cagp", "lr", 0.1, 0.05),
        # paper 004: beta² = 1e-3, fixed (learn_noise=False)
        ("softki", "noise_init", 1e-3, 0.5),
    ],
)
def test_presets_differ_where_the_papers_do(
    name: str, key: str, paper: float, tuned: float
) -> None:
    assert _params(name, "paper")[key] == pytest.approx(paper)
    assert _params(name, "tuned")[key] == pytest.approx(tuned)


@pytest.mark.parametrize(
    ("name", "key", "paper", "tuned"),
    [
        # paper 003 App. G: one lengthscale shared by all inputs, no whitening
        ("solve-gp", "ard", False, True),
        ("solve-gp", "whiten", False, True),
        # the seed (000) App. B: RBF lengthscales initialised at sqrt(d)
        ("exact-rbf", "lengthscale_init", "sqrt_d", "value"),
    ],
)
def test_presets_differ_in_options(name: str, key: str, paper: object, tuned: object) -> None:
    assert _params(name, "paper")[key] == paper
    assert _params(name, "tuned")[key] == tuned


def test_presets_agree_where_the_project_follows_the_paper() -> None:
    """DBK-RBF/SiLU are the seed's own models: tuned = paper."""
    for name in ("dbk-rbf", "dbk-silu"):
        assert _params(name, "paper") == _params(name, "tuned"), name


#: The tuned preset's SOLVE-GP and exact-RBF options before the paper options existed, and
#: the new options at the values that keep that behaviour (whitened, ARD, lengthscale 0.3).
TUNED_BEFORE = {
    "solve-gp": {
        "num_inducing": 8,
        "num_orthogonal": 8,
        "lengthscale": 0.3,
        "noise_init": 0.5,
        "epochs": 1,
        "batch_size": 64,
        "lr": 0.01,
        "patience": 1,
        "seed": 0,
        "device": "cpu",
        "dtype": "float32",
        "noise": "constant",
        "noise_power": False,
    },
    "exact-rbf": {
        "max_n": 5000,
        "lengthscale": 0.3,
        "noise_init": 0.5,
        "epochs": 1,
        "batch_size": 64,
        "lr": 0.05,
        "patience": 1,
        "seed": 0,
        "device": "cpu",
        "dtype": "float64",
        "noise": "constant",
        "noise_power": False,
    },
}
NEW_OPTIONS = {
    "solve-gp": {"ard": True, "whiten": True},
    "exact-rbf": {"lengthscale_init": "value"},
}


@pytest.mark.parametrize("name", ["solve-gp", "exact-rbf"])
def test_tuned_preset_keeps_its_hyperparameters(name: str) -> None:
    assert TUNED_PRESET[name] == {}
    assert _params(name, "tuned") == {**TUNED_BEFORE[name], **NEW_OPTIONS[name]}
    # the new options' defaults are the tuned behaviour (library default and old bundles)
    assert {k: _params(name, "tuned")[k] for k in NEW_OPTIONS[name]} == NEW_OPTIONS[name]


@pytest.mark.parametrize("d", [1, 2, 5])
def test_exact_rbf_paper_preset_starts_the_lengthscales_at_sqrt_d(d: int) -> None:
    """000 App. B: l_j = sqrt(d) for every input j (the tuned preset: 0.3)."""
    rng = np.random.default_rng(d)
    X, y = rng.uniform(-1, 1, (40, d)), rng.standard_normal(40)
    for preset, expected in (("paper", math.sqrt(d)), ("tuned", 0.3)):
        est = build_model("exact-rbf", preset=preset, **{**BUDGET, "epochs": 0}).fit(X, y)
        assert est.initial_lengthscale(d) == pytest.approx(expected)
        module = est.module_
        assert isinstance(module, ExactRBFModule)
        with torch.no_grad():  # no optimiser step taken: the initial value
            ls = module.lengthscale().double().numpy()
        np.testing.assert_allclose(ls, np.full(d, expected), rtol=1e-6)  # raw made in float32
    with pytest.raises(ValueError, match="lengthscale_init"):
        build_model("exact-rbf", overrides={"lengthscale_init": "nope"}, **BUDGET).fit(X, y)


def test_overrides_win_over_the_preset_and_the_budget_is_shared() -> None:
    kw = model_kwargs("sv-rbf", preset="paper", overrides={"lr": 0.2}, **BUDGET)
    assert kw["lr"] == 0.2 and kw["noise_init"] == 1e-2 and kw["rank"] == 8
    with pytest.raises(ValueError, match="unknown preset"):
        model_kwargs("sv-rbf", preset="nope", **BUDGET)


def _copy_run(tiny_run: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copy2(tiny_run / "tiles.parquet", dest / "tiles.parquet")
    return dest


def test_benchmark_records_preset_and_hyperparameters(tiny_run: Path, tmp_path: Path) -> None:
    """A 1-epoch benchmark of two models on the demo run, paper vs tuned preset."""
    run = _copy_run(tiny_run, tmp_path / "run")
    names = ["sv-rbf", "softki", "solve-gp"]
    # exact-rbf refuses the run's 8.6k training rows (max_n) but records its hyperparameters
    kw = dict(target="download", models=[*names, "exact-rbf"], epochs=1, rank=8, hidden=8)
    kw |= dict(batch_size=256, threads=1, isolate=False)
    paper = run_benchmark(run, **kw)  # default preset: paper
    on_disk = json.loads((run / "benchmark" / "download.json").read_text())
    assert on_disk["preset"] == "paper" and on_disk["budget"]["preset"] == "paper"
    tuned = run_benchmark(run, preset="tuned", **kw)
    for name in names:
        entry = on_disk["models"][name]
        assert entry["status"] == "ok", entry["failures"]
        assert entry["preset"] == "paper"
        hp = entry["hyperparameters"]
        # the full constructor options, as trained (the estimator's get_params())
        expected = build_model(name, preset="paper", device="cpu", **BUDGET).get_params()
        assert set(hp) == set(expected) - {"seed"}
        assert hp["epochs"] == 1 and hp["lr"] == PAPER_PRESET[name]["lr"]
        assert entry["runs"][0]["hyperparameters"]["seed"] == 0
        assert entry["runs"][0]["val_nll"] is not None
        assert tuned["models"][name]["preset"] == "tuned"
        assert paper["models"][name]["hyperparameters"] == hp
    assert paper["models"]["sv-rbf"]["hyperparameters"]["noise_init"] == 1e-2
    assert tuned["models"]["sv-rbf"]["hyperparameters"]["noise_init"] == 0.5
    assert tuned["models"]["softki"]["hyperparameters"]["noise_init"] == 0.5
    # SOLVE-GP: one lengthscale and the unwhitened q under paper (003 App. G), as written to disk
    sgp_paper = on_disk["models"]["solve-gp"]["hyperparameters"]
    sgp_tuned = tuned["models"]["solve-gp"]["hyperparameters"]
    assert (sgp_paper["ard"], sgp_paper["whiten"]) == (False, False)
    assert (sgp_tuned["ard"], sgp_tuned["whiten"]) == (True, True)
    # exact RBF: lengthscales from sqrt(d) under paper (000 App. B)
    assert on_disk["models"]["exact-rbf"]["status"] == "failed"
    assert on_disk["models"]["exact-rbf"]["hyperparameters"]["lengthscale_init"] == "sqrt_d"
    assert tuned["models"]["exact-rbf"]["hyperparameters"]["lengthscale_init"] == "value"


def test_failed_model_still_records_its_hyperparameters(tiny_run: Path, tmp_path: Path) -> None:
    run = _copy_run(tiny_run, tmp_path / "run")
    report = run_benchmark(
        run,
        target="upload",
        models=["exact-rbf"],
        epochs=1,
        threads=1,
        isolate=False,
        overrides={"exact-rbf": {"max_n": 5}},
    )
    entry = report["models"]["exact-rbf"]
    assert entry["status"] == "failed"
    assert entry["hyperparameters"]["max_n"] == 5 and entry["hyperparameters"]["lr"] == 1e-3
    assert entry["hyperparameters"]["lengthscale_init"] == "sqrt_d"


def test_cli_preset_option(tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = _copy_run(tiny_run, tmp_path / "run")
    args = ["benchmark", "--run", str(run), "--target", "upload", "--models", "sv-rbf"]
    args += ["--epochs", "1", "--rank", "8", "--threads", "1", "--no-isolate"]
    assert main([*args, "--preset", "tuned"]) == 0
    report = json.loads((run / "benchmark" / "upload.json").read_text())
    assert report["preset"] == "tuned"
    assert report["models"]["sv-rbf"]["hyperparameters"]["lr"] == 0.01
    with pytest.raises(SystemExit):
        main([*args, "--preset", "nope"])
    with pytest.raises(DataError, match="unknown preset"):
        run_benchmark(run, target="upload", models=["sv-rbf"], preset="nope")


# ------------------------------------------------------------------ PP-DKL beta sweep
def test_paper_preset_sweeps_pp_dkl_beta_over_the_seed_grid(tiny_run: Path, tmp_path: Path) -> None:
    """One PP-DKL per beta in {0, 0.01, 0.1, 1}; the lowest validation NLL is kept and every
    value is recorded."""
    run = _copy_run(tiny_run, tmp_path / "run")
    report = run_benchmark(
        run,
        target="download",
        models=["pp-dkl"],
        epochs=1,
        rank=8,
        hidden=8,
        batch_size=256,
        threads=1,
        isolate=False,
    )
    entry = report["models"]["pp-dkl"]
    assert entry["status"] == "ok", entry["failures"]
    sweep = entry["sweep"]
    assert sweep["option"] == "beta" and sweep["values"] == [0.0, 0.01, 0.1, 1.0]
    assert report["sweeps"] == {"pp-dkl": {"beta": [0.0, 0.01, 0.1, 1.0]}}
    vals = {v["value"]: v["val_nll"] for v in sweep["by_value"]}
    assert all(v is not None for v in vals.values()) and len(vals) == 4
    assert sweep["chosen"] == min(vals, key=lambda b: vals[b])
    # the entry's runs are the chosen beta's, and say so
    assert entry["hyperparameters"]["beta"] == sweep["chosen"]
    assert entry["overrides"] == {"beta": sweep["chosen"]}
    assert entry["runs"][0]["val_nll"] == pytest.approx(vals[sweep["chosen"]])
    md = (run / "benchmark" / "download.md").read_text()
    assert "## sweeps" in md and f"chosen {sweep['chosen']}" in md


def test_no_default_sweep_with_tuned_preset_or_a_set_beta(tiny_run: Path, tmp_path: Path) -> None:
    from pipelines.benchmark import resolve_sweeps

    kw = dict(has_val=True)
    assert resolve_sweeps(["pp-dkl"], None, None, preset="tuned", **kw) == {}
    assert resolve_sweeps(["pp-dkl"], None, {"pp-dkl": {"beta": 0.1}}, preset="paper", **kw) == {}
    assert resolve_sweeps(["dbk-rbf"], None, None, preset="paper", **kw) == {}
    with pytest.raises(DataError, match="not among --models"):
        resolve_sweeps(["dbk-rbf"], {"pp-dkl": {"beta": [0, 1]}}, None, preset="paper", **kw)
    with pytest.raises(DataError, match="both --set and --sweep"):
        resolve_sweeps(
            ["pp-dkl"], {"pp-dkl": {"beta": [0, 1]}}, {"pp-dkl": {"beta": 1}}, preset="paper", **kw
        )
    with pytest.raises(DataError, match="val split is empty"):
        resolve_sweeps(["pp-dkl"], None, None, preset="paper", has_val=False)


def test_paper_preset_sweeps_cagp_lr_over_its_papers_grid() -> None:
    """Paper 002 picks CaGP's initial lr from {1, 0.1, 0.01}: swept by default with the paper
    preset, with PP-DKL's beta beside it; not with tuned, a --set lr or a --sweep of cagp."""
    from pipelines.benchmark import resolve_sweeps

    both = resolve_sweeps(["cagp", "pp-dkl", "dbk-rbf"], None, None, preset="paper", has_val=True)
    assert both == {"cagp": {"lr": [1.0, 0.1, 0.01]}, "pp-dkl": {"beta": [0.0, 0.01, 0.1, 1.0]}}
    assert resolve_sweeps(["cagp"], None, None, preset="tuned", has_val=True) == {}
    assert resolve_sweeps(["cagp"], None, {"cagp": {"lr": 0.1}}, preset="paper", has_val=True) == {}
    mine = {"cagp": {"n_actions": [8, 16]}}
    assert resolve_sweeps(["cagp"], mine, None, preset="paper", has_val=True) == mine


def test_cli_sweep_option(tiny_run: Path, tmp_path: Path) -> None:
    """--sweep MODEL.OPTION=V1,V2 through the CLI (generic: here PP-DKL's beta, tuned preset)."""
    run = _copy_run(tiny_run, tmp_path / "run")
    args = ["benchmark", "--run", str(run), "--target", "upload", "--models", "pp-dkl"]
    args += ["--epochs", "1", "--rank", "8", "--hidden", "8", "--threads", "1", "--no-isolate"]
    assert main([*args, "--preset", "tuned", "--sweep", "pp-dkl.beta=0,1"]) == 0
    report = json.loads((run / "benchmark" / "upload.json").read_text())
    sweep = report["models"]["pp-dkl"]["sweep"]
    assert sweep["values"] == [0, 1] and sweep["chosen"] in (0, 1)
    assert main([*args, "--sweep", "pp-dkl.nope=1,2"]) == 3  # refused before training
