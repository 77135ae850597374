"""geodbk: internet-quality maps with calibrated uncertainty from deep basis kernel GPs.

``DBKRegressor`` and ``Prediction`` are imported on first use, so that the torch-free parts
(``geodbk.geo``, ``geodbk.atomic``, ``geodbk.errors``) start without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["DBKRegressor", "Prediction", "__version__"]

if TYPE_CHECKING:
    from geodbk.estimator import DBKRegressor
    from geodbk.predictive import Prediction


def __getattr__(name: str) -> Any:
    if name == "DBKRegressor":
        from geodbk.estimator import DBKRegressor

        return DBKRegressor
    if name == "Prediction":
        from geodbk.predictive import Prediction

        return Prediction
    raise AttributeError(f"module 'geodbk' has no attribute {name!r}")
