"""Agency files in the layouts they are published in: USDA ERS rural-urban continuum codes (the
RUCC files and the county-level data sets, wide and long, BOM, Latin-1, thousands separators),
shapefile zips made on other systems (a folder inside, macOS ``__MACOSX/._*`` entries, several
layers) and TIGER vintages (GEOID, GEOID10, GEOID20). Each file is made by the test."""

from __future__ import annotations

import zipfile
from pathlib import Path

import geopandas as gpd
import numpy as np
import pytest
import shapely

from geodbk.errors import DataError
from geodbk.geo import census
from geodbk.geo.regions import read_vector

LON = np.array([0.5, 2.5, 1.5])
LAT = np.array([0.5, 0.5, 0.5])


def _squares(**cols: list[str]) -> gpd.GeoDataFrame:
    """Two unit squares, [0,1]x[0,1] and [2,3]x[0,1] (lon/lat)."""
    geoms = [shapely.box(0, 0, 1, 1), shapely.box(2, 0, 3, 1)]
    return gpd.GeoDataFrame(cols, geometry=geoms, crs="EPSG:4326")


def _counties(tmp_path: Path) -> Path:
    path = tmp_path / "counties.geojson"
    _squares(GEOID=["01001", "15003"]).to_file(path)
    return path


RUCC_LAYOUTS = {
    # the 2013 RUCC file, wide, with a UTF-8 BOM (as Excel writes CSV)
    "rucc2013_bom.csv": (
        '\ufeff"FIPS","State","County_Name","Population_2010","RUCC_2013","Description"\n'
        '"01001","AL","Autauga County","54,571","2","Metro"\n'
        '"15003","HI","Honolulu County","953,207","6","Nonmetro"\n',
        "utf-8",
    ),
    # 2003 and 2013 side by side: the latest year wins; FIPS lost its leading zero
    "rucc_two_years.csv": (
        "FIPS,RUCC_2003,RUCC_2013\n1001,7,2\n15003,1,6\n",
        "utf-8",
    ),
    # the 2023 RUCC file, long
    "rucc2023_long.csv": (
        "FIPS,State,County_Name,Attribute,Value\n"
        '01001,AL,Autauga County,Population_2020,"58,805"\n'
        "01001,AL,Autauga County,RUCC_2023,2\n"
        "15003,HI,Honolulu County,RUCC_2023,6\n",
        "utf-8",
    ),
    # ERS county-level population data set, wide: FIPStxt, a spaced RUCC header, Latin-1
    "PopulationEstimates.csv": (
        "FIPStxt,State,Area_Name,Rural-urban_Continuum Code_2013,Urban_Influence_Code_2013,"
        "POP_ESTIMATE_2019\n"
        '1001,AL,Autauga County,2,2,"55,869"\n'
        '15003,HI,Honolulu County (Oʻahu),6,5,"974,563"\n'.replace("ʻ", "'")
        + "15000,HI,Hawaiʻi state,,,\n".replace("ʻ", "é"),
        "latin-1",
    ),
    # ERS unemployment data set, long: FIPS_Code and a spelled-out RUCC attribute
    "Unemployment.csv": (
        "FIPS_Code,State,Area_name,Attribute,Value\n"
        '1001,AL,"Autauga County, AL",Civilian_labor_force_2019,"26,172"\n'
        '1001,AL,"Autauga County, AL",Rural_urban_continuum_code_2013,2.0\n'
        '15003,HI,"Honolulu County, HI",Rural_urban_continuum_code_2013,6.0\n',
        "utf-8",
    ),
}


@pytest.mark.parametrize("name", list(RUCC_LAYOUTS))
def test_every_ers_rucc_layout_labels_the_counties(tmp_path: Path, name: str) -> None:
    text, encoding = RUCC_LAYOUTS[name]
    rucc = tmp_path / name
    rucc.write_bytes(text.encode(encoding))
    assert census.read_rucc(rucc) == {"01001": 2, "15003": 6}
    layer = census.read_county_urban(_counties(tmp_path), rucc)
    assert layer.label(LON, LAT).tolist() == [True, False, False]


def test_a_rucc_file_without_codes_names_its_columns(tmp_path: Path) -> None:
    bad = tmp_path / "not_rucc.csv"
    bad.write_text("FIPS,Population\n01001,5\n")
    with pytest.raises(
        DataError, match=r"not_rucc.csv: no RUCC column .*columns: FIPS, Population"
    ):
        census.read_rucc(bad)


def _zip(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _shapefile_parts(tmp_path: Path, gdf: gpd.GeoDataFrame, stem: str) -> dict[str, bytes]:
    folder = tmp_path / f"shp_{stem}"
    folder.mkdir()
    gdf.to_file(folder / f"{stem}.shp")
    return {f.name: f.read_bytes() for f in folder.iterdir()}


def test_a_shapefile_in_a_folder_with_macos_entries_reads(tmp_path: Path) -> None:
    parts = _shapefile_parts(tmp_path, _squares(GEOID=["01001", "15003"]), "tl_2020_15_county")
    files = {f"tl_2020_15_county/{n}": b for n, b in parts.items()}
    files |= {f"__MACOSX/tl_2020_15_county/._{n}": b"\x00\x05\x16\x07" for n in parts}
    files["tl_2020_15_county/._tl_2020_15_county.shp"] = b"\x00\x05\x16\x07"
    archive = _zip(tmp_path / "counties_mac.zip", files)
    gdf = read_vector(archive, what="county")
    assert sorted(gdf["GEOID"]) == ["01001", "15003"]


def test_a_zip_with_several_layers_lists_them_and_one_can_be_chosen(tmp_path: Path) -> None:
    a = _shapefile_parts(tmp_path, _squares(GEOID=["01001", "15003"]), "counties")
    b = _shapefile_parts(tmp_path, _squares(NAME=["x", "y"]), "roads")
    archive = _zip(tmp_path / "bundle.zip", {**a, **b})
    with pytest.raises(
        DataError,
        match=r"bundle.zip: the zip archive holds 2 layers .*"
        r"counties.shp.*roads.shp.*bundle.zip!",
    ):
        read_vector(archive, what="county")
    gdf = read_vector(f"{archive}!counties.shp", what="county")
    assert sorted(gdf["GEOID"]) == ["01001", "15003"]
    with pytest.raises(DataError, match=r"no single layer 'rivers\.shp'"):
        read_vector(f"{archive}!rivers.shp", what="county")


def test_a_zip_without_a_layer_says_what_it_holds(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "docs.zip", {"readme.txt": b"hello"})
    with pytest.raises(DataError, match=r"docs.zip: the zip archive holds no tract layer .*readme"):
        read_vector(archive, what="tract")


@pytest.mark.parametrize("field", ["GEOID", "GEOID10", "GEOID20"])
def test_tract_layers_of_every_tiger_vintage_join_the_rural_list(
    tmp_path: Path, field: str
) -> None:
    parts = _shapefile_parts(tmp_path, _squares(**{field: ["15001021300", "15001021400"]}), "t")
    archive = _zip(tmp_path / f"tracts_{field}.zip", {f"tracts/{n}": b for n, b in parts.items()})
    rural = tmp_path / "rural.csv"
    rural.write_text("FIPS\n15001021300\n")
    layer = census.read_tract_urban(archive, rural)
    assert layer.label(LON, LAT).tolist() == [False, True, False]


def test_tracts_of_another_census_than_the_rural_list_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert census.census_vintage("tl_2010_15_tract10.zip") == 2010
    assert census.census_vintage("tl_2019_15_tract.zip") == 2010
    assert census.census_vintage("tl_2023_15_tract.zip") == 2020
    assert census.census_vintage("fcc_rural_census_tracts_2010.csv") == 2010
    assert (
        census.census_vintage("tracts.zip") is None and census.census_vintage("x12010.csv") is None
    )
    rural = tmp_path / "fcc_rural_census_tracts_2010.csv"
    rural.write_text("FIPS\n15001021300\n")
    for field, warned in (("GEOID20", True), ("GEOID10", False), ("GEOID", False)):
        folder = tmp_path / field
        folder.mkdir()
        parts = _shapefile_parts(folder, _squares(**{field: ["15001021300", "15001021400"]}), "t")
        archive = _zip(tmp_path / f"t_{field}.zip", {f"t/{n}": b for n, b in parts.items()})
        caplog.clear()
        with caplog.at_level("WARNING", logger="geodbk"):
            layer = census.read_tract_urban(archive, rural)
        messages = [r.message for r in caplog.records if "renumbered" in r.message]
        assert bool(messages) == warned, field
        if warned:
            assert "2020 census tracts" in messages[0] and "tl_2010_SS_tract10.zip" in messages[0]
        assert layer.info["rural_list_vintage"] == 2010
        assert layer.info["tract_vintage"] == {"GEOID20": 2020, "GEOID10": 2010}.get(field)


def test_a_renamed_rural_list_of_another_census_is_told_by_its_tracts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tracts = tmp_path / "tracts.geojson"  # names say nothing of either file's census
    boxes = [shapely.box(i, 0, i + 1, 1) for i in range(4)]
    ids = [f"150010{i}0100" for i in range(1, 5)]
    gpd.GeoDataFrame({"GEOID": ids}, geometry=boxes, crs="EPSG:4326").to_file(tracts)
    other = tmp_path / "rural.csv"  # one tract in the layer, three renumbered away from it
    other.write_text("FIPS\n15001010100\n15001990100\n15001990200\n15001990300\n06001990100\n")
    same = tmp_path / "rural_same.csv"
    same.write_text("FIPS\n15001010100\n15001020100\n06001990100\n")

    def warned(rural: Path, **kw: object) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="geodbk"):
            census.read_tract_urban(tracts, rural, **kw)  # type: ignore[arg-type]
        return [r.message for r in caplog.records if "different censuses" in r.message]

    [message] = warned(other)
    assert message.startswith("3 of the 4 rural tracts") and "15001990100" in message
    assert not warned(same)  # another state's tract on the list is not counted
    # a layer read in part (a --bbox region) cannot tell a renumbered tract from one left out
    assert not warned(other, bbox=(0.1, 0.1, 1.9, 0.9))
