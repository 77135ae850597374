"""The synthetic generator's true field (``latent_field``) is what its tiles scatter around."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from geodbk.geo.quadkey import quadkey_centroid
from geodbk.geo.synthetic import SyntheticConfig, latent_field

DATA = Path(__file__).resolve().parents[2] / "data" / "ookla" / "parquet" / "performance"


def test_embedded_tiles_scatter_around_the_latent_field_with_the_generator_s_noise() -> None:
    path = next((DATA / "type=mobile" / "year=2023" / "quarter=4").glob("*.parquet"))
    tiles = pd.read_parquet(path, columns=["quadkey", "avg_d_kbps", "tests"])
    lon, lat = quadkey_centroid(tiles["quadkey"].to_numpy().astype(str))
    truth = latent_field(lon, lat, target="download", quarter=3)  # 2023Q4: the 4th quarter
    cfg = SyntheticConfig()
    sd = np.sqrt(cfg.s2_floor_download + cfg.s2_meas_download / tiles["tests"].to_numpy())
    z = (np.log10(tiles["avg_d_kbps"].to_numpy()) - truth) / sd
    assert len(z) > 1000
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.1
    # another quarter's field is off by the trend, another seed's is another region
    shifted = latent_field(lon, lat, target="download", quarter=0)
    np.testing.assert_allclose(truth - shifted, 3 * cfg.trend_per_quarter, atol=1e-12)
    other = latent_field(lon, lat, target="download", quarter=3, config=SyntheticConfig(seed=1))
    assert np.abs(other - truth).mean() > 0.05
