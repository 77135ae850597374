"""The CLI of the batch stages: help, exit codes, errors naming paths and commands."""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def _help_examples(stage: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The example commands of ``geodbk STAGE --help``, continuation lines joined."""
    with pytest.raises(SystemExit):
        cli.main([stage, "--help"])
    block = capsys.readouterr().out.split("examples:\n", 1)[1].split("\n\n")
    lines = [line.strip() for part in block if "geodbk " in part for line in part.splitlines()]
    commands: list[str] = []
    joined = ""
    for line in lines:
        if not joined and not line.startswith("geodbk "):
            continue
        joined += line
        if joined.endswith("\\"):
            joined = joined[:-1]
            continue
        commands.append(joined)
        joined = ""
    return commands


@pytest.mark.parametrize("stage", STAGES)
def test_help_examples_are_valid_command_lines(
    stage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each example of a stage's help parses, one space between its words as a user types
    them (a run of spaces inside a command is a continuation line whose backslash was lost)."""
    import re
    import shlex

    commands = _help_examples(stage, capsys)
    assert commands, stage
    for command in commands:
        words = command.split("#", 1)[0].rstrip()
        assert not re.search(r"\S {2,}\S", words), command
        cli.build_parser().parse_args(shlex.split(words)[1:])


def _stage(*, run: str | None = None, target: str | None = None) -> argparse.ArgumentParser:
    def stage_main(args: argparse.Namespace) -> int:
        return 0

    parser = argparse.ArgumentParser(prog="geodbk")
    p = cli.stage_parser(
        parser.add_subparsers(dest="stage"),
        "train",
        stage_main,
        description="Fit a thing.\n  kept as written",
        epilog="examples:\n  geodbk train --run R",
        run=run,
        target=target,
    )
    assert p.get_default("func") is stage_main
    return parser


def test_stage_parser_adds_run_and_target(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _stage(run="run directory", target="what to fit")
    args = parser.parse_args(["train", "--run", "runs/x", "--target", "upload"])
    assert args.run == Path("runs/x") and args.target == "upload" and args.func(args) == 0
    for missing in (["train", "--run", "r"], ["train", "--target", "upload"]):
        with pytest.raises(SystemExit) as info:
            parser.parse_args(missing)
        assert info.value.code == 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        parser.parse_args(["train", "--help"])
    out = capsys.readouterr().out
    # description and epilog as written (raw), the two options first with their help
    assert "Fit a thing.\n  kept as written" in out and "examples:\n  geodbk train --run R" in out
    assert "--run RUN" in out and "run directory" in out and "what to fit" in out
    assert "{download,upload,latency}" in out


def test_stage_parser_without_run_or_target() -> None:
    args = _stage().parse_args(["train"])
    assert not hasattr(args, "run") and not hasattr(args, "target")
    with pytest.raises(SystemExit):
        _stage(run="run directory").parse_args(["train", "--run", "r", "--target", "upload"])


def test_call_with_options_passes_the_parameters_named() -> None:
    def run_fit(
        run: str, *, epochs: int = 1, fmt: str = "gtiff", seed: int = 0
    ) -> dict[str, object]:
        return {"run": run, "epochs": epochs, "fmt": fmt, "seed": seed}

    args = argparse.Namespace(run="r", epochs=3, fmt="cog", verbose=True, func=print)
    # options the function has no parameter for are left out; its defaults stay
    assert cli.call_with_options(run_fit, args) == {
        "run": "r",
        "epochs": 3,
        "fmt": "cog",
        "seed": 0,
    }
    # a given value wins over the option of the same name
    got = cli.call_with_options(run_fit, args, epochs=7, seed=2)
    assert got == {"run": "r", "epochs": 7, "fmt": "cog", "seed": 2}


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            "train --run r --target upload --config c.yaml --no-progress --no-tile-effect",
            {
                "run": Path("r"),
                "config_path": Path("c.yaml"),
                "progress": False,
                "tile_effect": "off",
            },
        ),
        ("train --run r --target upload", {"config_path": None, "progress": True, "time": None}),
        (
            "download --cache c --quarters 2023Q4 --no-census --no-progress",
            {"cache": "c", "census": False, "progress": False},
        ),
        (
            "service --run r --format cog --tile-zoom 12",
            {"run": Path("r"), "fmt": "cog", "tile_zoom": 12},
        ),
        ("service --run r --no-progress", {"progress": False}),
        ("predict --run r --target download", {"progress": True, "quantity": "tile"}),
        ("predict --run r --target download --no-progress", {"progress": False}),
        (
            "predict --run r --target latency --at p.csv --tests 2",
            {"run": Path("r"), "at": Path("p.csv"), "tests": 2.0},
        ),
        (
            "benchmark --run r --target download --models dbk-rbf --no-isolate",
            {"isolate": False, "models": ["dbk-rbf"], "epochs": 20},
        ),
    ],
)
def test_stage_options_reach_the_run_function(
    argv: str, expected: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    stage = argv.split()[0]
    name = f"run_{stage}_at" if "--at" in argv else f"run_{stage}"
    module = importlib.import_module(f"pipelines.{stage}")
    real = getattr(module, name)
    got: dict[str, Any] = {}

    @functools.wraps(real)
    def record(*args: Any, **kwargs: Any) -> Any:
        got.update(inspect.signature(real).bind(*args, **kwargs).arguments)
        return {"census": {}, "tiles_dir": "t", "quarters": ["2023Q4"], "models": {}}

    monkeypatch.setattr(module, name, record)
    assert cli.main(argv.split()) == 0
    assert {k: got[k] for k in expected} == expected


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


def _imports_of(words: list[str]) -> tuple[int, set[str], str]:
    """Exit code, the heavy or stage modules imported, and stdout of ``geodbk WORDS`` in a
    fresh interpreter."""
    code = (
        "import sys\n"
        "from pipelines import cli\n"
        "try:\n"
        f"    rc = cli.main({words!r})\n"
        "except SystemExit as exc:\n"
        "    rc = exc.code\n"
        "heavy = {'torch', 'sklearn', 'geopandas', 'xarray'}\n"
        "stages = {f'pipelines.{s}' for s in cli.STAGES}\n"
        "print('IMPORTED', *sorted(m for m in sys.modules if m in heavy | stages))\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    lines = proc.stdout.splitlines()
    imported = set(lines[-1].split()[1:]) if lines and lines[-1].startswith("IMPORTED") else set()
    return proc.returncode, imported, proc.stdout


def test_a_command_imports_only_the_stage_it_names() -> None:
    rc, imported, out = _imports_of(["--help"])
    assert rc == 0 and imported == set(), imported  # the listing imports no stage
    assert all(name in out for name in cli.STAGES) and cli.STAGES["predict"][:30] in out
    rc, imported, out = _imports_of(["-v", "export", "--help"])
    assert rc == 0 and "geodbk export --run" in out
    assert {m for m in imported if m.startswith("pipelines.")} == {"pipelines.export"}
    assert "torch" not in imported and "sklearn" not in imported  # export reads grids only
    rc, imported, _ = _imports_of(["predikt"])
    assert rc == 2 and imported == set()


def test_the_listing_is_the_full_parsers() -> None:
    """Each stage's line in ``geodbk --help`` is the one its full sub-parser registers."""
    full = cli.build_parser()
    listed = cli.build_parser(stage="")

    def lines(parser: argparse.ArgumentParser) -> dict[str, str]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {c.dest: str(c.help) for c in sub._choices_actions}

    assert lines(full) == lines(listed) == dict(cli.STAGES)
