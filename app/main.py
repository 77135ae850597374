"""The page: sidebar, then the tabs; only the open tab runs (lazy tabs)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import streamlit as st

from app import warmup
from app.context import RunContext, sidebar
from app.tabs import kernel_tab, map_tab
from app.ui import guard

#: Tab label -> (module in ``app.tabs`` with a ``render(ctx)``, stage whose command rebuilds
#: its inputs). Modules are imported when their tab first opens, so the first page load of a
#: fresh server does not pay for the hidden tabs' imports (altair for the inspect chart, ...).
TABS: dict[str, tuple[str, str]] = {
    "Map": ("map_tab", "predict"),
    "Kernel slices": ("kernel_tab", "train"),
    "Inspect a point": ("inspect_tab", "predict"),
    "Service": ("service_tab", "service"),
    "Areas": ("areas_tab", "summarize"),
    "Places": ("places_tab", "predict"),
    "Coverage report": ("report_tab", "report"),
    "Model": ("model_tab", "train"),
}


def renderer(module: str) -> Callable[[RunContext], None]:
    """The ``render`` function of tab module ``app.tabs.MODULE`` (imported on first use)."""
    render: Callable[[RunContext], None] = importlib.import_module(f"app.tabs.{module}").render
    return render


def main() -> None:
    """Render the whole page."""
    st.set_page_config(
        page_title="geodbk · internet speed with honest error bars",
        layout="wide",
        initial_sidebar_state="expanded",
    )
    ctx: RunContext | None = None
    with guard("The run selector"):
        ctx = sidebar()
    if ctx is None:
        return
    if not ctx.inv.has_tiles and not ctx.inv.available_targets():
        st.title(ctx.inv.path.name)
        st.error(
            f"`{ctx.inv.path}` is not a geodbk run: it has no tiles.parquet and no model, grid "
            "or report."
        )
        st.info(f"Build a complete run with:\n\n```\n{ctx.inv.command('demo')}\n```")
        return
    st.markdown(
        f"### {ctx.target.capitalize()} ({ctx.unit}) · run `{ctx.inv.path.name}`",
    )
    stale = ctx.stale_model()
    if stale:
        st.warning(stale)
    tabs = st.tabs(list(TABS), key="view", bind="query-params")
    for tab, (label, (module, stage)) in zip(tabs, TABS.items(), strict=True):
        if tab.open is False:
            continue  # lazy: hidden tabs do no work
        with tab, guard(label, ctx.cmd(stage)):
            renderer(module)(ctx)
    # A page load draws a quick first frame (the raster alone) and reruns for the full map;
    # the model warm-up starts with that second run, so it does not compete with the first.
    map_tab.finish_first_paint()
    _warm(ctx)


def _warm(ctx: RunContext) -> None:
    """After the page is drawn, load the model and phi(grid) in the background (once)."""
    files = ctx.files
    if not (files.has_model and files.has_grid):
        return

    def job() -> object:
        return kernel_tab.features(ctx, kernel_tab.default_time(ctx))

    warmup.start(f"{files.model_dir}|{files.grid}", job)
