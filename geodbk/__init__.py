"""geodbk: internet-quality maps with calibrated uncertainty from deep basis kernel GPs."""

from __future__ import annotations

__version__ = "0.1.0"

from geodbk.estimator import DBKRegressor
from geodbk.predictive import Prediction

__all__ = ["DBKRegressor", "Prediction", "__version__"]
