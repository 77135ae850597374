"""The package version: one value, the project's, importable without the model stack."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import geodbk
from geodbk._version import __version__

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_is_the_projects() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert __version__ == project["version"]
    assert geodbk.__version__ is __version__


def test_the_version_is_read_without_importing_torch() -> None:
    code = "import sys, geodbk; print(geodbk.__version__, 'torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.split() == [__version__, "False"]
