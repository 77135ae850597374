"""geodbk: internet-quality maps with calibrated uncertainty from deep basis kernel GPs."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
