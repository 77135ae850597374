"""Urban/rural labelling from urban areas, tracts + FCC list, counties + RUCC."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo import census

FCC_PREAMBLE = '''Paragraph 212 of the 3.5 GHz Report and Order states:
"""...rural area will be defined as any census tract which is not located within, or overlapping: "
""
The list below contains census tracts that meet this definition.
""
FIPS
15001021300
1001020100
15003980600
'''


def _squares(crs: str = "EPSG:4326", **cols: list[str]) -> gpd.GeoDataFrame:
    """Two unit squares: [0,1]x[0,1] and [2,3]x[0,1] (lon/lat), in ``crs``."""
    geoms = [shapely.box(0, 0, 1, 1), shapely.box(2, 0, 3, 1)]
    return gpd.GeoDataFrame(cols, geometry=geoms, crs="EPSG:4326").to_crs(crs)


LON = np.array([0.5, 2.5, 1.5, 5.0])
LAT = np.array([0.5, 0.5, 0.5, 0.5])


@pytest.mark.parametrize("code", ["UACE20", "UACE10"])
def test_urban_areas_any_crs(tmp_path: Path, code: str) -> None:
    path = tmp_path / "uac.gpkg"
    _squares("EPSG:3857", **{code: ["00001", "00002"], "NAME20": ["A", "B"]}).to_file(path)
    layer = census.read_urban_areas(path)
    assert layer.kind == "urban_areas"
    assert layer.label(LON, LAT).tolist() == [True, True, False, False]
    assert layer.polygons.crs == "EPSG:4326"
    assert len(layer.outlines()) == 2


def test_urban_areas_bbox_read_and_bad_schema(tmp_path: Path) -> None:
    path = tmp_path / "uac.geojson"
    _squares(UACE20=["1", "2"]).to_file(path)
    layer = census.read_urban_areas(path, bbox=(-0.5, -0.5, 1.5, 1.5))
    assert len(layer.polygons) == 1
    other = tmp_path / "other.geojson"
    _squares(FOO=["1", "2"]).to_file(other)
    with pytest.raises(DataError, match="not a Census urban-area layer"):
        census.read_urban_areas(other)


@pytest.mark.parametrize(
    "columns",
    [
        {"GEOID": ["15", "06"], "STUSPS": ["HI", "CA"], "NAME": ["Hawaii", "California"]},
        {"GEOID10": ["15003000100", "15003000200"], "NAME10": ["1", "2"]},
    ],
)
def test_a_state_or_tract_layer_is_not_taken_as_urban_areas(tmp_path: Path, columns: dict) -> None:
    path = tmp_path / "layer.geojson"
    _squares(**columns).to_file(path)
    with pytest.raises(DataError, match="not a Census urban-area layer") as info:
        census.read_urban_areas(path)
    message = str(info.value)
    assert str(path) in message and "UACE20" in message and "tl_2020_us_uac20" in message
    assert all(f"{c}" in message for c in columns)  # the columns it has


def test_fcc_rural_list_with_preamble(tmp_path: Path) -> None:
    path = tmp_path / "fcc.csv"
    path.write_text(FCC_PREAMBLE)
    ids = census.read_rural_tract_list(path)
    assert ids == {"15001021300", "01001020100", "15003980600"}
    bad = tmp_path / "bad.csv"
    bad.write_text("hello\nworld\n")
    with pytest.raises(DataError, match="FIPS"):
        census.read_rural_tract_list(bad)


def test_rural_lists_in_other_layouts(tmp_path: Path) -> None:
    """A table whose GEOID column is not the first, GEOIDs stored as numbers that lost their
    leading zero (Excel), and the same list as .xlsx: the same set as the FCC file."""
    import pandas as pd

    want = {"15001021300", "01001020100"}
    table = tmp_path / "rural.csv"
    table.write_text("state,county,GEOID,note\nHI,Hawaii,15001021300,x\nAL,Autauga,1001020100,y\n")
    assert census.read_rural_tract_list(table) == want
    frame = pd.DataFrame(
        {"State": ["HI", "AL"], "Tract FIPS": [15001021300, 1001020100], "Rural": [1, 1]}
    )
    sheet = tmp_path / "rural.xlsx"
    frame.to_excel(sheet, index=False)
    assert census.read_rural_tract_list(sheet) == want
    unreadable = tmp_path / "broken.xlsx"
    unreadable.write_text("not a workbook")
    with pytest.raises(DataError, match=r"broken\.xlsx: cannot read the rural-tract list"):
        census.read_rural_tract_list(unreadable)


def test_rucc_from_the_ers_excel_files(tmp_path: Path) -> None:
    """The ERS RUCC files come as Excel workbooks (2023 .xlsx; 2013 .xls): read like the CSV,
    the FIPS codes stored as numbers re-padded."""
    import pandas as pd

    frame = pd.DataFrame(
        {"FIPS": [1001, 15003], "State": ["AL", "HI"], "RUCC_2013": [2, 1], "Description": ["", ""]}
    )
    sheet = tmp_path / "ruralurbancodes2013.xlsx"
    frame.to_excel(sheet, index=False)
    assert census.read_rucc(sheet) == {"01001": 2, "15003": 1}


def test_tracts_plus_rural_list(tmp_path: Path) -> None:
    tracts = tmp_path / "tracts.geojson"
    _squares("EPSG:4269", GEOID10=["15001021300", "15001021400"]).to_file(tracts)
    rural = tmp_path / "fcc.csv"
    rural.write_text(FCC_PREAMBLE)
    layer = census.read_tract_urban(tracts, rural)
    # first square is rural (on the list), second urban
    assert layer.label(LON, LAT).tolist() == [False, True, False, False]
    assert layer.info["urban_units"] == 1 and layer.info["rural_units"] == 1
    assert len(layer.outlines()) == 1


def test_outlines_cut_to_the_region_keep_labels_inside_it(tmp_path: Path) -> None:
    """Outlines cut to a region end at its edge (a tract reaching into coastal water is drawn
    along the coast), a polygon outside it is dropped, one touching it only along an edge
    leaves no line behind, and points in the region label as before."""
    path = tmp_path / "uac.geojson"
    _squares(UACE20=["1", "2"]).to_file(path)
    layer = census.read_urban_areas(path)
    region = shapely.box(0.5, -1.0, 2.0, 2.0)  # half the first square; touches the second
    cut = layer.outlines(within=region)
    assert len(cut) == 1
    assert cut.geometry.iloc[0].equals(shapely.box(0.5, 0, 1, 1))
    inside = np.array([0.75, 1.5, 1.9]), np.array([0.5, 0.5, 0.5])
    relabel = census.UrbanLayer("urban_areas", cut, []).label(*inside)
    assert relabel.tolist() == layer.label(*inside).tolist() == [True, False, False]
    tracts = tmp_path / "tracts.geojson"
    _squares(GEOID10=["15001021400", "15001021500"]).to_file(tracts)
    rural = tmp_path / "fcc.csv"
    rural.write_text(FCC_PREAMBLE)
    dissolved = census.read_tract_urban(tracts, rural).outlines(within=region)
    assert len(dissolved) == 1 and dissolved.geometry.iloc[0].area == pytest.approx(0.5)
    assert len(layer.outlines(within=shapely.box(10, 10, 11, 11))) == 0


def test_counties_plus_rucc_wide_and_long(tmp_path: Path) -> None:
    counties = tmp_path / "counties.geojson"
    _squares(STATEFP=["15", "15"], COUNTYFP=["001", "003"]).to_file(counties)
    wide = tmp_path / "rucc.csv"
    wide.write_text(
        '"FIPS","State","County_Name","RUCC_2013"\n"15001","HI","Hawaii","4"\n"15003","HI","Honolulu","1"\n'
    )
    layer = census.read_county_urban(counties, wide)
    assert layer.label(LON, LAT).tolist() == [False, True, False, False]
    long = tmp_path / "rucc2023.csv"
    long.write_text(
        "FIPS,State,County_Name,Attribute,Value\n15001,HI,Hawaii,Population_2020,1\n15001,HI,Hawaii,RUCC_2023,2\n15003,HI,Honolulu,RUCC_2023,7\n"
    )
    assert census.read_county_urban(counties, long).label(LON, LAT).tolist() == [
        True,
        False,
        False,
        False,
    ]


def test_resolve_urban_requires_pairs_and_one_source(tmp_path: Path) -> None:
    assert census.resolve_urban() is None
    with pytest.raises(DataError, match="go together"):
        census.resolve_urban(tracts="t.zip")
    with pytest.raises(DataError, match="only one"):
        census.resolve_urban(urban_areas="u.zip", counties="c.zip", rucc="r.csv")
    with pytest.raises(DataError, match="no such urban-area file"):
        census.resolve_urban(urban_areas=tmp_path / "missing.zip")


def test_rural_list_column_of_geoids_among_other_code_columns(tmp_path: Path) -> None:
    """A table of State, County, Tract and GEOID (the 6-digit tract code first), headers such
    as ``GEOID_2010`` or ``Tract FIPS Code``, and a workbook whose first sheet is notes: the
    column holding 11-digit GEOIDs is read."""
    import pandas as pd

    want = {"15001021300", "01001020100"}
    parts = tmp_path / "parts.csv"
    parts.write_text(
        "State,County,Tract,GEOID\n15,001,021300,15001021300\n01,001,020100,1001020100\n"
    )
    assert census.read_rural_tract_list(parts) == want
    for header in ("GEOID_2010", "Tract FIPS Code", "Census Tract"):
        one = tmp_path / "one.csv"
        one.write_text(f"{header}\n15001021300\n01001020100\n")
        assert census.read_rural_tract_list(one) == want
    book = tmp_path / "two_sheets.xlsx"
    with pd.ExcelWriter(book) as writer:
        pd.DataFrame({"Notes": ["rural tracts, 2010 census"]}).to_excel(
            writer, sheet_name="notes", index=False
        )
        pd.DataFrame({"FIPS": ["15001021300", "01001020100"]}).to_excel(
            writer, sheet_name="list", index=False
        )
    assert census.read_rural_tract_list(book) == want
    codes = tmp_path / "codes.csv"
    codes.write_text("State,Tract\n15,021300\n")
    with pytest.raises(
        DataError, match=r"no column of 11-digit tract GEOIDs \(columns: State, Tract"
    ):
        census.read_rural_tract_list(codes)


def test_tract_geoids_stored_as_numbers(tmp_path: Path) -> None:
    """A tract layer whose GEOID field holds floats (15001021300.0) labels as the text one."""
    tracts = tmp_path / "tracts.gpkg"
    _squares(GEOID=[15001021300.0, 15001021400.0]).to_file(tracts)  # type: ignore[list-item]
    rural = tmp_path / "fcc.csv"
    rural.write_text(FCC_PREAMBLE)
    layer = census.read_tract_urban(tracts, rural)
    assert layer.label(LON, LAT).tolist() == [False, True, False, False]


def test_cartographic_tract_layer_with_geo_id(tmp_path: Path) -> None:
    """The Census cartographic tract files name a tract 1400000US15001021300 (field GEO_ID)."""
    tracts = tmp_path / "gz_2010_15_140_00_500k.geojson"
    _squares(GEO_ID=["1400000US15001021300", "1400000US15001021400"]).to_file(tracts)
    rural = tmp_path / "fcc.csv"
    rural.write_text(FCC_PREAMBLE)
    layer = census.read_tract_urban(tracts, rural)
    assert layer.label(LON, LAT).tolist() == [False, True, False, False]
