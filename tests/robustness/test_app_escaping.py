"""Text from run files (a quarter label, a unit) reaches HTML legends only escaped."""

from __future__ import annotations

from app.colormaps import ColorScale, Legend, legend_html


def test_legend_text_is_escaped() -> None:
    evil = '2023Q4<script>alert("x")</script>'
    html = legend_html(
        Legend(
            f"Observed download, {evil}",
            ColorScale("viridis", 1.0, 100.0, True),
            unit="<b>Mbps</b>",
            note="<img src=x onerror=alert(1)>",
        )
    )
    assert "<script>" not in html and "<img" not in html and "<b>" not in html
    assert "&lt;script&gt;" in html and "&lt;b&gt;Mbps&lt;/b&gt;" in html
