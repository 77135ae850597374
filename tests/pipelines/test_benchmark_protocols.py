"""``geodbk benchmark --protocol seed-table2``: the DBK paper's Table 2 with its settings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from geodbk.errors import DataError
from pipelines.benchmark_protocols import PROTOCOLS, apply_protocol, table2_lines
from pipelines.cli import main

NO_FLAGS = dict(models=None, epochs=None, preset=None, noise=None, time=False, tile_effect=False)


def test_protocol_fixes_models_and_settings() -> None:
    fixed = apply_protocol("seed-table2", **NO_FLAGS)
    assert fixed == {
        "models": ["sv-rbf", "sv-dkl", "dbk-rbf"],
        "epochs": 400,
        "preset": "paper",
        "noise": "constant",
    }
    # the same models in another order, the same preset and noise: accepted
    same = {**NO_FLAGS, "models": "dbk-rbf,sv-rbf,sv-dkl", "preset": "paper", "noise": "constant"}
    assert apply_protocol("seed-table2", **same)["models"] == fixed["models"]
    assert apply_protocol("seed-table2", **{**NO_FLAGS, "epochs": 3})["epochs"] == 3
    # a subset, for one process per model merged into one report: the protocol's order kept
    subset = apply_protocol("seed-table2", **{**NO_FLAGS, "models": "dbk-rbf, sv-rbf"})
    assert subset["models"] == ["sv-rbf", "dbk-rbf"] and subset["epochs"] == 400


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("models", "dbk-rbf,cagp", "--models dbk-rbf,cagp"),
        ("models", " , ", "--models  , "),
        ("preset", "tuned", "--preset tuned"),
        ("noise", "tests", "--noise tests"),
        ("time", True, "--time"),
        ("tile_effect", True, "--tile-effect"),
    ],
)
def test_protocol_refuses_a_setting_that_changes_its_table(
    flag: str, value: object, named: str
) -> None:
    with pytest.raises(DataError, match=f"--protocol seed-table2 fixes.*{named}"):
        apply_protocol("seed-table2", **{**NO_FLAGS, flag: value})
    with pytest.raises(DataError, match="unknown --protocol"):
        apply_protocol("table-9", **NO_FLAGS)


def _summary(mae: float, width_sd: float) -> dict:
    """One seed's summary (no spread)."""
    group = {
        "mae": {"mean": mae, "sd": None},
        "nll": {"mean": 1.0, "sd": None},
        "coverage95": {"mean": 0.95, "sd": None},
        "width95": {"mean": 2.0, "sd": None},
        "width_sd": {"mean": width_sd, "sd": None},
        "width_iqr": {"mean": width_sd, "sd": None},
    }
    return {"urban": group, "rural": {**group, "mae": {"mean": mae + 0.1, "sd": None}}}


def test_table2_layout_rows_in_the_papers_order() -> None:
    report = {
        "protocol": "seed-table2",
        "target": "download",
        "preset": "paper",
        "budget": {"epochs": 400, "noise": "constant"},
        "models": {
            "dbk-rbf": {"summary": _summary(0.512, 0.05), "failures": []},
            "sv-rbf": {"summary": _summary(0.520, 0.0), "failures": []},
            "sv-dkl": {"summary": None, "failures": [{"reason": "diverged at epoch 3"}]},
        },
    }
    lines = table2_lines(report)
    rows = [line for line in lines if line.startswith("| SV-") or line.startswith("| DBK")]
    assert [r.split("|")[1].strip() for r in rows[:3]] == ["SV-RBF", "SV-DKL", "DBK"]
    assert rows[0] == "| SV-RBF | 0.520 | 1.000 | 95.0% | 0.620 | 1.000 | 95.0% |"
    assert "failed: diverged at epoch 3" in rows[1]
    assert rows[5] == "| DBK | 2.000 | 0.050 | 0.050 | 2.000 | 0.050 | 0.050 |"
    assert "shortened" not in "\n".join(lines)
    del report["models"]["dbk-rbf"]  # written after each model: the rest are not run yet
    assert "| DBK | not run yet |" in "\n".join(table2_lines(report))
    report["budget"]["epochs"] = 2
    assert "(the protocol's 400 shortened)" in "\n".join(table2_lines(report))


def test_cli_protocol_writes_its_own_report(
    tiny_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A 1-epoch run of the protocol on the demo tiles: its own files, the table, the settings."""
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy2(tiny_run / "tiles.parquet", run / "tiles.parquet")
    args = ["benchmark", "--run", str(run), "--target", "upload", "--protocol", "seed-table2"]
    args += ["--epochs", "1", "--rank", "8", "--hidden", "8", "--threads", "1", "--no-isolate"]
    assert main(args) == 0
    assert not (run / "benchmark" / "upload.json").exists()
    report = json.loads((run / "benchmark" / "upload_seed-table2.json").read_text())
    assert report["protocol"] == "seed-table2" and report["preset"] == "paper"
    assert set(report["models"]) == set(PROTOCOLS["seed-table2"].models)
    for entry in report["models"].values():
        assert entry["status"] == "ok", entry["failures"]
        assert entry["hyperparameters"]["patience"] >= 1  # = epochs: no early stopping
    md = (run / "benchmark" / "upload_seed-table2.md").read_text()
    assert "Table 2" in md and "| method | urban MAE |" in md and "shortened" in md
    capsys.readouterr()
    assert main([*args, "--preset", "tuned"]) == 3
    assert "leave out --preset tuned" in capsys.readouterr().err
    assert main(["benchmark", "--run", str(run), "--target", "upload"]) == 3
    assert "give --models" in capsys.readouterr().err
