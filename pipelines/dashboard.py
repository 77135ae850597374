"""Open the dashboard on this machine only.

Starts the Streamlit dashboard bound to 127.0.0.1 (reachable from this machine only) with
Streamlit's usage statistics off, whatever the working directory: the settings are passed on
the command line, so a ``.streamlit/config.toml`` of another directory cannot widen them.
Stop it with Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from geodbk.errors import DataError
from pipelines.cli import stage_parser

__all__ = ["LOCAL_ADDRESS", "dashboard_command", "register", "run_dashboard"]

#: The only address the launcher binds to.
LOCAL_ADDRESS = "127.0.0.1"
DEFAULT_PORT = 8501
APP_SCRIPT = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"

#: What ``geodbk dashboard --help`` says, for users (the module docstring is for developers).
DESCRIPTION = """\
Open the dashboard on this machine only.

Starts the Streamlit dashboard bound to 127.0.0.1 (reachable from this machine only) with
usage statistics off, whatever the working directory: the settings are passed on the command
line, so the .streamlit/config.toml of another directory cannot widen them. Stop it with
Ctrl-C.
"""

EPILOG = """examples:
  geodbk dashboard                          # runs/ of the working directory, port 8501
  geodbk dashboard --runs-dir /data/geodbk-runs --run hawaii --port 8600

then open http://127.0.0.1:PORT in a browser on this machine. To reach it from another
machine, use an SSH tunnel (ssh -L 8501:127.0.0.1:8501 HOST) rather than a public address.
exit codes: 0 stopped, 2 usage error, 3 bad option (runs folder missing, port out of range)."""


def register(subparsers: Any) -> None:
    """Add the ``dashboard`` sub-command."""
    p = stage_parser(
        subparsers,
        "dashboard",
        _main,
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    p.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        help="folder whose run directories the dashboard lists (default: ./runs or "
        "$GEODBK_RUNS_DIR)",
    )
    p.add_argument(
        "--run",
        default=None,
        help="run opened first: its name in the runs folder, or a run directory's path "
        "(default: demo)",
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8501)")


def _main(args: argparse.Namespace) -> int:
    return run_dashboard(runs_dir=args.runs_dir, run=args.run, port=args.port)


def dashboard_command(
    *, runs_dir: Path, run: str | None = None, port: int = DEFAULT_PORT
) -> list[str]:
    """The ``streamlit run`` command line: bound to :data:`LOCAL_ADDRESS`, headless, no usage
    statistics, no file watcher, the viewer's toolbar (no Deploy button or developer menu);
    the app's own options after ``--``."""
    if not 1 <= port <= 65535:
        raise DataError(f"--port must be between 1 and 65535, got {port}")
    cmd = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_SCRIPT),
        f"--server.address={LOCAL_ADDRESS}",
        f"--server.port={port}",
        "--server.headless=true",
        "--server.fileWatcherType=none",
        "--browser.gatherUsageStats=false",
        f"--browser.serverAddress={LOCAL_ADDRESS}",
        "--global.developmentMode=false",
        "--client.toolbarMode=viewer",
        "--",
        "--runs-dir",
        str(runs_dir),
    ]
    return cmd + (["--run", run] if run else [])


def run_dashboard(
    *, runs_dir: Path | None = None, run: str | None = None, port: int = DEFAULT_PORT
) -> int:
    """Run the dashboard until it is stopped; return its exit code (0 after Ctrl-C). ``run``
    may be a run directory's path (without ``runs_dir``): its folder is then the runs folder."""
    if runs_dir is None and run is not None and (Path(run) / "tiles.parquet").is_file():
        runs_dir, run = Path(run).resolve().parent, Path(run).resolve().name
    root = Path(runs_dir or os.environ.get("GEODBK_RUNS_DIR") or Path.cwd() / "runs").resolve()
    if not root.is_dir():
        raise DataError(
            f"runs folder {root} does not exist; build a run first (`geodbk demo --run "
            f"{root / 'demo'}`) or give --runs-dir"
        )
    cmd = dashboard_command(runs_dir=root, run=run, port=port)
    print(f"geodbk dashboard: http://{LOCAL_ADDRESS}:{port} (runs folder {root}); Ctrl-C stops it")
    proc = subprocess.Popen(cmd)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 0
