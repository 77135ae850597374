"""Baseline GP models behind the ``DBKRegressor`` estimator contract.

``build_model(name, ...)`` / ``MODEL_NAMES`` in :mod:`geodbk.baselines.registry`; one module per
family: :mod:`~geodbk.baselines.svgp` (SV-RBF, SV-DKL, PP-DKL, VBLL on the core's DBK model),
:mod:`~geodbk.baselines.svdbk` (SVDBK and its exact variant, paper 001),
:mod:`~geodbk.baselines.cagp` (CaGP-Opt), :mod:`~geodbk.baselines.solvegp` (SOLVE-GP),
:mod:`~geodbk.baselines.softki` (SoftKI), :mod:`~geodbk.baselines.exact_rbf` (exact RBF GP).
"""

from __future__ import annotations

from geodbk.baselines.registry import MODEL_NAMES, build_model, parse_model_list

__all__ = ["MODEL_NAMES", "build_model", "parse_model_list"]
