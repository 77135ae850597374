"""``geodbk dashboard``: the dashboard listens on 127.0.0.1 only, whatever the working
directory, with usage statistics off."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.dashboard import LOCAL_ADDRESS, dashboard_command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* writes them) of sockets listening on ``port``."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        with open(table) as fh:
            next(fh)
            for line in fh:
                fields = line.split()
                addr, hexport = fields[1].rsplit(":", 1)
                if int(hexport, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                    out.append(addr)
    return out


def test_the_command_binds_to_localhost_and_turns_statistics_off(tmp_path: Path) -> None:
    cmd = dashboard_command(runs_dir=tmp_path, run="demo", port=8600)
    assert f"--server.address={LOCAL_ADDRESS}" in cmd
    assert "--browser.gatherUsageStats=false" in cmd
    assert "--client.toolbarMode=viewer" in cmd  # no Deploy button
    assert cmd[cmd.index("--") :] == ["--", "--runs-dir", str(tmp_path), "--run", "demo"]


@pytest.mark.parametrize("port", [0, 70000])
def test_a_bad_port_or_missing_runs_folder_is_refused(
    tmp_path: Path, port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["dashboard", "--runs-dir", str(tmp_path), "--port", str(port)]) == 3
    assert "--port must be between 1 and 65535" in capsys.readouterr().err
    assert main(["dashboard", "--runs-dir", str(tmp_path / "nope")]) == 3
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux /proc/net/tcp")
def test_started_from_another_directory_it_listens_on_127_0_0_1_only(tmp_path: Path) -> None:
    # A hostile config in the working directory must not widen the binding.
    (tmp_path / ".streamlit").mkdir()
    (tmp_path / ".streamlit" / "config.toml").write_text(
        '[server]\naddress = "0.0.0.0"\n[browser]\ngatherUsageStats = true\n'
    )
    (tmp_path / "runs").mkdir()
    port = _free_port()
    env = {**os.environ, "GEODBK_BASEMAP": "off"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "dashboard",
            "--runs-dir",
            "runs",
            "--port",
            str(port),
        ],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        addrs: list[str] = []
        while time.monotonic() < deadline and not addrs:
            time.sleep(0.5)
            assert proc.poll() is None, "the dashboard exited early"
            addrs = _listening(port)
        assert addrs, "the dashboard never listened"
        assert set(addrs) == {"0100007F"}, addrs  # 127.0.0.1, nothing else
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_run_directorys_path_opens_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--run /path/to/run`` (a run directory) lists the runs beside it and opens that one."""
    import pipelines.dashboard as dashboard

    run = tmp_path / "runs" / "hawaii"
    run.mkdir(parents=True)
    (run / "tiles.parquet").write_bytes(b"")
    seen: list[list[str]] = []

    class Done:
        def __init__(self, cmd: list[str]) -> None:
            seen.append(cmd)

        def wait(self) -> int:
            return 0

    monkeypatch.setattr(dashboard.subprocess, "Popen", Done)
    assert main(["dashboard", "--run", str(run)]) == 0
    assert seen[0][seen[0].index("--") :] == [
        "--",
        "--runs-dir",
        str(run.parent),
        "--run",
        "hawaii",
    ]
