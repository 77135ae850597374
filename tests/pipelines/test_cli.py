"""The CLI of the batch stages: help, exit codes, errors naming paths and commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import make_run

from geodbk import __version__
from pipelines import cli

STAGES = cli.STAGES


@pytest.mark.parametrize("stage", STAGES)
def test_help_has_examples(stage: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([stage, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and f"geodbk {stage}" in out and "exit codes" in out
    # written for users: no Sphinx markup, no issue numbers, no project history
    for developer_text in ("``", ":class:", ":func:", ":mod:", ":data:", "issue ", "seed's"):
        assert developer_text not in out, (stage, developer_text)


def test_missing_run_exits_5(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["train", "--target", "download"],
        ["predict", "--target", "download"],
        ["export", "--all"],
        ["report", "--target", "download"],
    ):
        code = cli.main([argv[0], "--run", str(tmp_path / "absent"), *argv[1:]])
        assert code == 5, argv
        err = capsys.readouterr().err
        assert str(tmp_path / "absent") in err and "geodbk ingest" in err


def test_untrained_model_exits_4(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", n=80)
    assert cli.main(["predict", "--run", str(run), "--target", "latency"]) == 4
    assert "geodbk train --run" in capsys.readouterr().err
    assert cli.main(["export", "--run", str(run), "--all"]) == 4
    assert cli.main(["report", "--run", str(run)]) == 4


def test_bad_config_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = make_run(tmp_path / "run", n=80)
    bad = tmp_path / "bad.yaml"
    bad.write_text("rank: 8\nlearning_rate: 1\n")
    code = cli.main(["train", "--run", str(run), "--target", "download", "--config", str(bad)])
    assert code == 3
    err = capsys.readouterr().err
    assert str(bad) in err and "learning_rate" in err


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    for argv in (
        ["train", "--run", str(tmp_path), "--target", "speed"],
        [
            "predict",
            "--run",
            str(tmp_path),
            "--target",
            "upload",
            "--resolution",
            "0.1",
            "--tile-zoom",
            "12",
        ],
        ["export", "--run", str(tmp_path), "--all", "--target", "upload"],
    ):
        with pytest.raises(SystemExit) as info:
            cli.main(argv)
        assert info.value.code == 2


def test_module_entry_point_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "report", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "geodbk report --run" in proc.stdout


def test_cli_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out
    assert cli.main([]) == 2  # no stage: help and a usage exit code


def test_cli_runs_as_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "geodbk" in out.stdout
    assert "STAGE" in out.stdout
