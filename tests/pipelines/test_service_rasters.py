"""``geodbk service``'s rasters and log: the class raster's colour table and class tags, the
bands' units, the class grid's CF flags, and log lines naming the files where they end up."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import rasterio
import xarray as xr
from pipeline_helpers import copy_service_inputs

from pipelines import cli
from pipelines.service import CLASS_NODATA, class_colours


def test_class_colours_run_from_red_to_green_with_transparent_nodata() -> None:
    for n in (2, 3, 5):
        table = class_colours(n)
        assert sorted(table) == [*range(n), CLASS_NODATA]
        red, green = table[0], table[n - 1]
        assert red[0] > red[1] and green[1] > green[0]  # unserved red, served green
        assert table[CLASS_NODATA][3] == 0 and all(table[c][3] == 255 for c in range(n))
        assert len({table[c] for c in range(n)}) == n


class _Messages(logging.Handler):
    """Keeps the messages logged to it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def service_run(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A copy of the quick demo run with ``geodbk service`` written, and its log messages."""
    run = copy_service_inputs(tiny_run, tmp_path_factory.mktemp("service_rasters") / "run")
    handler = _Messages()
    logger = logging.getLogger("geodbk")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert cli.main(["service", "--run", str(run), "--headline-samples", "0"]) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return run / "service", handler.messages


def test_class_raster_has_a_colour_table_and_class_tags(
    service_run: tuple[Path, list[str]],
) -> None:
    service, _ = service_run
    with xr.open_dataset(service / "classes.nc", mask_and_scale=False) as ds:
        code = ds["service_class"]
        names = code.attrs["flag_meanings"].split()
        # CF: flag_values and _FillValue of the variable's own type
        assert code.dtype == code.attrs["flag_values"].dtype == np.int8
        assert np.asarray(code.attrs["_FillValue"]).dtype == np.int8
    with rasterio.open(service / "service_class.tif") as src:
        table = src.colormap(1)
        tags = src.tags(1)
    expected = class_colours(len(names))
    assert {c: table[c] for c in expected} == expected
    assert tags["flag_meanings"].split() == names
    assert tags["flag_values"].split() == [str(i) for i in range(len(names))]
    # GDAL's category names (QGIS's class labels) in the sidecar, moved in with the set
    import xml.etree.ElementTree as ET

    sidecar = ET.parse(service / "service_class.tif.aux.xml").getroot()
    assert [c.text for c in sidecar.iter("Category")] == names
    with rasterio.open(service / "p_unserved.tif") as src:
        assert src.units == ("1",)
        # what the band holds and of which quantity, read without the NetCDF grid
        assert "P(unserved)" in src.tags(1)["long_name"]
        assert src.tags(1)["quantity"]


def test_log_names_the_files_where_they_end_up(service_run: tuple[Path, list[str]]) -> None:
    service, messages = service_run
    assert not [m for m in messages if ".staging-" in m], messages
    for name in ("classes.nc", "service_class.tif", "p_unserved.tif"):
        wrote = [m for m in messages if m.startswith(f"wrote {service / name}")]
        assert len(wrote) == 1, (name, messages)
