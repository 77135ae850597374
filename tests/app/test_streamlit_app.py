"""The entry point (app/streamlit_app.py): the runs folder and the first run come from the
options after ``--``, which win over the environment."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from apptest_helpers import assert_clean
from streamlit.testing.v1 import AppTest

APP_FILE = str(Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py")


def test_options_after_the_double_dash_choose_the_folder_and_the_run(
    synthetic_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``streamlit run app/streamlit_app.py -- --runs-dir DIR --run NAME`` opens NAME in DIR,
    although ``$GEODBK_RUNS_DIR`` names another folder and ``$GEODBK_RUN`` another run."""
    other = tmp_path / "other_runs"
    shutil.copytree(synthetic_root / "synth", other / "synth")
    shutil.copytree(synthetic_root / "synth", other / "second")
    monkeypatch.setenv("GEODBK_RUNS_DIR", str(synthetic_root))
    monkeypatch.setenv("GEODBK_RUN", "synth")
    monkeypatch.setenv("GEODBK_APP_WARMUP", "0")
    monkeypatch.setenv("GEODBK_APP_REFINE_S", "0")
    monkeypatch.setattr(
        "sys.argv", ["streamlit_app.py", "--runs-dir", str(other), "--run", "second"]
    )
    at = AppTest.from_file(APP_FILE, default_timeout=120).run()
    assert_clean(at)
    run = at.sidebar.selectbox(key="run")
    assert run.value == "second"
    assert set(run.options) == {"second", "synth"}
