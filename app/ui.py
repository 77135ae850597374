"""Shared page helpers: the error guard, "missing output" messages and small formatters."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import streamlit as st

from app.loaders import LoadError


def lazy_reader(path: Path) -> Callable[[], bytes]:
    """A callable a download button calls only when clicked (no file read on each rerun)."""

    def read() -> bytes:
        return path.read_bytes()

    return read


def table_csv_button(csv: Path, *, run_name: str, key: str) -> None:
    """A ``Download the table (CSV)`` button for ``csv`` (named ``RUN_NAME_FILE`` when
    saved), read only when clicked and without rerunning the page; nothing when the file is
    absent."""
    if csv.is_file():
        st.download_button(
            "Download the table (CSV)",
            data=lazy_reader(csv),
            file_name=f"{run_name}_{csv.name}",
            mime="text/csv",
            key=key,
            on_click="ignore",
        )


def missing(what: str, command: str) -> None:
    """Tell the user what is missing and the one command that makes it."""
    st.info(f"{what}\n\nBuild it with:\n\n```\n{command}\n```")


@contextmanager
def guard(section: str, command: str | None = None) -> Iterator[None]:
    """Show any error raised inside the block as a message in the page, never a traceback.

    Streamlit's own control-flow exceptions (``st.stop``, ``st.rerun``) derive from
    ``BaseException`` and pass through untouched.

    Parameters
    ----------
    section
        What the block renders (named in the message).
    command
        A command that rebuilds the files the block reads, shown with the error.
    """
    try:
        yield
    except LoadError as exc:
        st.error(f"{section}: {exc}")
        if command:
            st.info(f"Rebuild it with:\n\n```\n{command}\n```")
    except Exception as exc:
        st.error(f"{section} could not be shown: {type(exc).__name__}: {exc}")
        if command:
            st.info(
                f"If the run is incomplete or outdated, rebuild it with:\n\n```\n{command}\n```"
            )


#: Session-state keys of the Map tab's "What the map shows" choice and its K tests, kept apart
#: from the widgets' own keys (Streamlit drops a widget's state after a run that does not draw
#: it), so that the Inspect tab reads the choice however many times it reruns.
MAP_QUANTITY_KEY = "map_quantity"
MAP_TESTS_KEY = "map_quantity_tests"


def selected_quarter_key(target: str) -> str:
    """Session-state key of the quarter chosen for a target (shared by the tabs)."""
    return f"selected_quarter_{target}"


def quarter_slider(
    target: str,
    options: list[str],
    *,
    where: str,
    default: str,
    labels: dict[str, str] | None = None,
    help: str | None = None,
    disabled: bool = False,
) -> str:
    """A ``st.select_slider`` over quarters whose choice is shared by the tabs.

    The tabs are lazy (a hidden tab renders no widgets, and Streamlit drops the state of
    widgets that were not rendered), so each tab has its own slider (key
    ``quarter_<where>_<target>``) and the choice lives in :func:`selected_quarter_key`, which
    every slider starts from and writes back to on change.

    Parameters
    ----------
    target
        The target (the choice is per target).
    options
        Quarters in time order (at least one).
    where
        The tab (part of the widget key).
    default
        Used when the shared choice is not among ``options``.
    labels
        Display text per quarter (e.g. ``2023Q4 (extrapolation)``).
    help
        Tooltip.
    disabled
        Show the slider greyed out (a single quarter).

    Returns
    -------
    str
        The chosen quarter.
    """
    shared = selected_quarter_key(target)
    wkey = f"quarter_{where}_{target}"
    current = st.session_state.get(shared)
    if current not in options:
        current = default if default in options else options[-1]
    st.session_state[wkey] = current

    def changed() -> None:
        st.session_state[shared] = st.session_state[wkey]

    names = labels or {}
    value = st.select_slider(
        "Quarter",
        options,
        format_func=lambda q: names.get(q, q),
        key=wkey,
        on_change=changed,
        help=help,
        disabled=disabled,
    )
    return str(value)
