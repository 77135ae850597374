"""The data licence: which tiles are Ookla's, and the line outputs carry."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from geodbk.geo.licence import (
    OOKLA_LICENCE,
    SYNTHETIC_KEY,
    SYNTHETIC_LICENCE,
    data_licence,
    licence_line,
)

DATA = Path(__file__).resolve().parents[2] / "data"


def test_the_embedded_region_is_synthetic_and_marked() -> None:
    files = sorted(DATA.rglob("*.parquet"))
    assert files and all(SYNTHETIC_KEY in (pq.read_schema(f).metadata or {}) for f in files)
    assert data_licence(files) == SYNTHETIC_LICENCE


def test_any_other_tile_file_is_ookla_s(tmp_path: Path) -> None:
    plain = tmp_path / "2023-10-01_performance_mobile_tiles.parquet"
    pq.write_table(pa.table({"quadkey": ["0"]}), plain)
    csv = tmp_path / "tiles.csv"
    csv.write_text("quadkey\n0\n")
    synthetic = next(DATA.rglob("*.parquet"))
    assert data_licence([plain]) == OOKLA_LICENCE
    assert data_licence([csv]) == OOKLA_LICENCE
    assert data_licence([synthetic, plain]) == OOKLA_LICENCE  # a mix carries Ookla's terms
    assert data_licence([]) == OOKLA_LICENCE


def test_licence_line_names_source_licence_and_terms() -> None:
    line = licence_line(OOKLA_LICENCE)
    assert line.startswith("Data: Speedtest(R) by Ookla(R)") and "CC BY-NC-SA 4.0" in line
    assert "non-commercial" in line
    assert licence_line(None) == line  # older runs: Ookla's
    assert "no third-party licence" in licence_line(SYNTHETIC_LICENCE)
