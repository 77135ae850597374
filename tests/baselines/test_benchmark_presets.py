"""Presets (issue 24) in the benchmark: the record of each model's preset and hyperparameters
(also when a model fails), the CLI's --preset, and the paper preset's default sweeps (PP-DKL's
beta, CaGP's lr) with --sweep. The presets' settings themselves: test_registry.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from baseline_helpers import BUDGET

from geodbk.baselines.registry import PAPER_PRESET, build_model
from geodbk.errors import DataError
from pipelines.benchmark import run_benchmark
from pipelines.benchmark_protocols import format_stat
from pipelines.cli import main


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


def test_an_untrained_model_is_not_swept_over_a_training_option() -> None:
    """With epochs 0 (initialised, not trained) CaGP's lr and PP-DKL's beta change nothing:
    the paper grid is skipped, an explicit sweep of it refused, other sweeps kept."""
    from pipelines.benchmark import resolve_sweeps

    kw = dict(preset="paper", has_val=True)
    zero = {"cagp": {"epochs": 0}}
    assert resolve_sweeps(["cagp", "pp-dkl"], None, zero, **kw) == {
        "pp-dkl": {"beta": [0.0, 0.01, 0.1, 1.0]}
    }
    assert resolve_sweeps(["cagp", "pp-dkl"], None, None, epochs=0, **kw) == {}
    assert resolve_sweeps(["cagp"], None, {"cagp": {"epochs": 2}}, epochs=0, **kw) == {
        "cagp": {"lr": [1.0, 0.1, 0.01]}
    }
    with pytest.raises(DataError, match="epochs 0, so it is not trained"):
        resolve_sweeps(["cagp"], {"cagp": {"lr": [1.0, 0.1]}}, zero, **kw)
    actions = {"cagp": {"n_actions": [8, 16]}}
    assert resolve_sweeps(["cagp"], actions, zero, **kw) == actions


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


def test_a_model_that_refuses_the_noise_is_recorded_once_not_swept(
    tiny_run: Path, tmp_path: Path
) -> None:
    run = _copy_run(tiny_run, tmp_path / "run")
    report = run_benchmark(
        run,
        target="upload",
        models=["cagp"],
        seeds=[0, 1],
        epochs=1,
        rank=8,
        threads=1,
        isolate=False,
        noise="tests+devices",
        sweeps={"cagp": {"lr": [1.0, 0.1]}},
    )
    entry = report["models"]["cagp"]
    # refused before any training: one failure, no sweep, no swept value shown as chosen
    assert entry["status"] == "failed" and "sweep" not in entry
    assert entry["failures"] == [{"seed": None, "reason": entry["failures"][0]["reason"]}]
    assert "tests+devices" in entry["failures"][0]["reason"] and "lr" not in entry["overrides"]
    text = (run / "benchmark" / "upload.md").read_text()
    cost = next(line for line in text.splitlines() if line.startswith("| cagp | failed ("))
    assert "[lr=" not in cost and cost.count("(") == cost.count(")")


def test_one_seed_shows_no_spread_and_a_seedless_model_says_so() -> None:
    assert format_stat({"mean": 0.4, "sd": None}) == "0.400"
    assert format_stat({"mean": 0.4, "sd": 0.0}) == "0.400 (every seed)"
    assert format_stat({"mean": 0.4, "sd": 0.0}, same="") == "0.400"
    assert format_stat({"mean": 0.4, "sd": 0.02}) == "0.400 ± 0.020"
    assert format_stat({"mean": 0.95, "sd": 0.01}, 1, 100, unit="%") == "95.0% ± 1.0%"
    assert format_stat({"mean": 0.95, "sd": 0.0}, 1, 100, unit="%") == "95.0% (every seed)"
