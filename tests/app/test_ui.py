"""The page helpers: the error guard (a message, never a traceback), the "missing output"
message, and the quarter slider whose choice the tabs share."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from app.ui import selected_quarter_key


def _guarded(kind: str) -> None:
    import streamlit as st

    from app.loaders import LoadError
    from app.ui import guard, missing

    with guard("The map", "geodbk predict --run r"):
        if kind == "load":
            raise LoadError("grids/download.nc is not a NetCDF file")
        if kind == "bug":
            raise KeyError("std")
        if kind == "stop":
            st.stop()
        missing("No grid yet.", "geodbk predict --run r")
    st.write("after the guard")


def test_errors_become_messages_with_the_rebuild_command() -> None:
    at = AppTest.from_function(_guarded, args=("load",)).run()
    assert not at.exception
    assert [e.value for e in at.error] == ["The map: grids/download.nc is not a NetCDF file"]
    assert "geodbk predict --run r" in at.info[0].value
    at = AppTest.from_function(_guarded, args=("bug",)).run()
    assert not at.exception
    assert at.error[0].value == "The map could not be shown: KeyError: 'std'"
    assert "If the run is incomplete or outdated" in at.info[0].value
    assert "after the guard" in [m.value for m in at.markdown]  # the page goes on


def test_streamlit_s_stop_passes_through_and_missing_names_the_command() -> None:
    at = AppTest.from_function(_guarded, args=("stop",)).run()
    assert not at.exception and not at.error
    assert "after the guard" not in [m.value for m in at.markdown]
    at = AppTest.from_function(_guarded, args=("none",)).run()
    assert (
        at.info[0].value.startswith("No grid yet.") and "geodbk predict --run r" in at.info[0].value
    )


def _sliders() -> None:
    from app.ui import quarter_slider

    quarters = ["2023Q1", "2023Q2", "2023Q3"]
    quarter_slider("download", quarters, where="map", default="2023Q3")
    quarter_slider("download", quarters[:2], where="kernel", default="2023Q1")


def test_the_quarter_choice_is_shared_by_the_tabs_sliders() -> None:
    at = AppTest.from_function(_sliders).run()
    assert [s.value for s in at.select_slider] == ["2023Q3", "2023Q1"]  # each its default
    at.select_slider(key="quarter_map_download").set_value("2023Q2").run()
    assert at.session_state[selected_quarter_key("download")] == "2023Q2"
    assert [s.value for s in at.select_slider] == ["2023Q2", "2023Q2"]  # the other follows


def test_lazy_reader_reads_the_file_only_when_called(tmp_path: Path) -> None:
    from app.ui import lazy_reader

    path = tmp_path / "table.csv"
    read = lazy_reader(path)  # no file yet: nothing is read when the button is built
    path.write_text("id,mean\n1,2\n")
    assert read() == b"id,mean\n1,2\n"
