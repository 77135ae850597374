"""Helpers to walk AppTest element trees."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from streamlit.testing.v1 import AppTest

#: The ``make_app`` fixture: ``make_app(runs_folder, run_name=None) -> AppTest``.
AppFactory = Callable[..., AppTest]


def element_types(node: Any) -> Counter[str]:
    """Count element types below a node (a tab, the main area, the app)."""
    found: Counter[str] = Counter()

    def walk(n: Any) -> None:
        for child in getattr(n, "children", {}).values():
            found[child.type] += 1
            walk(child)

    walk(node)
    return found


def tab(at: AppTest, label: str) -> Any:
    """The tab block with this label."""
    matches = [t for t in at.tabs if t.label == label]
    assert matches, f"no tab {label!r}; tabs: {[t.label for t in at.tabs]}"
    return matches[0]


def open_tab(at: AppTest, label: str) -> Any:
    """Switch the lazy tabs to ``label``, rerun, assert a clean run, return the tab."""
    at.session_state["view"] = label
    at.run()
    assert_clean(at)
    return tab(at, label)


def assert_clean(at: AppTest) -> None:
    """No uncaught exception and no st.error in the page."""
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def texts(node: Any, kind: str) -> list[str]:
    """Values of all elements of a kind (markdown, caption, info, error, ...) below a node."""
    return [str(e.value) for e in getattr(node, kind)]


def legend_titles(node: object) -> list[str]:
    """The map legends (their HTML) below a node."""
    return [m for m in texts(node, "markdown") if "geodbk-legend" in m]
