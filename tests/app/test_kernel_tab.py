"""The kernel slices tab: the presets' slices, a clicked slice and clearing them."""

from __future__ import annotations

from pathlib import Path

from apptest_helpers import (
    AppFactory,
    assert_clean,
    element_types,
    legend_titles,
    open_tab,
    tab,
    texts,
)


def test_demo_kernel_slices_presets_clicks_and_clear(
    make_app: AppFactory, demo_root: tuple[Path, str]
) -> None:
    root, name = demo_root
    at = make_app(root, name)
    at.run()
    kernel = open_tab(at, "Kernel slices")
    assert element_types(kernel)["deck_gl_json_chart"] == 3
    titles = [m for m in texts(kernel, "markdown") if m.startswith("**")]
    assert [t.split("**")[1] for t in titles] == ["Urban", "Rural", "Remote"]
    assert any("k(x, x_ref) / max over the region" in m for m in legend_titles(kernel))
    assert any("Each slice:" in c for c in texts(kernel, "caption"))
    # A click adds a slice (the chart callback stores clicks in session state).
    at.session_state["kernel_clicks"] = [
        (at.session_state["inspect_point"] if "inspect_point" in at.session_state else (0.0, 0.0))
    ]
    presets = at.multiselect(key="kernel_presets_download")
    presets.set_value(["Urban"]).run()
    assert_clean(at)
    assert element_types(tab(at, "Kernel slices"))["deck_gl_json_chart"] == 2
    at.button(key="kernel_clear").click().run()
    assert_clean(at)
    assert element_types(tab(at, "Kernel slices"))["deck_gl_json_chart"] == 1
    at.multiselect(key="kernel_presets_download").set_value([]).run()
    assert_clean(at)
    kernel = tab(at, "Kernel slices")
    assert element_types(kernel)["deck_gl_json_chart"] == 1  # the map to click on
    assert texts(kernel, "info")
