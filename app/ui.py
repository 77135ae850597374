"""Shared page helpers: the error guard, "missing output" messages and small formatters."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from app.loaders import LoadError


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
