"""Fixtures of the geo tests."""

from __future__ import annotations

import pandas as pd
import pytest
from geo_helpers import make_tiles


@pytest.fixture
def tiles_df() -> pd.DataFrame:
    return make_tiles(60)
