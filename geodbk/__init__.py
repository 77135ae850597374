"""geodbk: internet-quality maps with calibrated uncertainty from deep basis kernel GPs.

``DBKRegressor`` and ``Prediction`` are imported on first use, so that the torch-free parts
(``geodbk.geo``, ``geodbk.atomic``, ``geodbk.errors``) start without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from geodbk._version import __version__

__all__ = ["DBKRegressor", "Prediction", "__version__"]

if TYPE_CHECKING:
    from geodbk.estimator import DBKRegressor
    from geodbk.predictive import Prediction


def __getattr__(name: str) -> Any:
    if name == "DBKRegressor":
        # local: the estimator imports torch; geodbk.geo and geodbk.errors start without it
        from geodbk.estimator import DBKRegressor

        return DBKRegressor
    if name == "Prediction":
        # local: geodbk.predictive imports torch, as above
        from geodbk.predictive import Prediction

        return Prediction
    raise AttributeError(f"module 'geodbk' has no attribute {name!r}")
