"""Urban/rural labelling from US Census layers.

Three sources, whichever the user has; each reduces to a set of *urban polygons* and a tile is
urban when its centroid lies in (or on the edge of) one of them (a vectorised spatial-index join):

- Census urban areas (TIGER ``tl_2020_us_uac20``: ``UACE20``/``NAME20``; 2010: ``UACE10``):
  inside an urban area = urban;
- census tracts plus a list of rural tract GEOIDs (the FCC list, prose preamble then ``FIPS``):
  tracts not on the list are urban;
- counties plus USDA rural-urban continuum codes (RUCC 1-3, metro = urban).

Every layer is reprojected to EPSG:4326 whatever its CRS.
"""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import geopandas as gpd
import numpy as np
import numpy.typing as npt
import pandas as pd
import shapely
from shapely.geometry.base import BaseGeometry

from geodbk.errors import DataError
from geodbk.geo.regions import WGS84, polygonal_part, read_vector

log = logging.getLogger("geodbk")

#: Urban-area code fields, which only Census urban-area layers have (GEOID and NAME fields
#: are in every Census layer: a state or tract file would pass as urban areas).
_UA_CODE_FIELDS = ("UACE20", "UACE10", "UACE")
_UA_NAME_FIELDS = ("NAME20", "NAME10", "NAME", "NAMELSAD20", "NAMELSAD10")
_TRACT_FIELDS = ("GEOID", "GEOID20", "GEOID10", "GEOID00", "CTIDFP00", "GEO_ID")
_COUNTY_FIELDS = ("GEOID", "GEOID20", "GEOID10", "CNTYIDFP", "FIPS")


@dataclass
class UrbanLayer:
    """Urban polygons (EPSG:4326) and how they were derived.

    Attributes
    ----------
    kind
        ``urban_areas``, ``tracts`` or ``counties``.
    polygons
        The urban polygons (one row per urban area / tract / county), with ``code``/``name``.
    sources
        Files read.
    info
        Counts (units read, urban units, ...) for the report.
    """

    kind: str
    polygons: gpd.GeoDataFrame
    sources: list[str]
    info: dict[str, Any] = field(default_factory=dict)

    def label(self, lon: npt.ArrayLike, lat: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """Urban (True) or rural (False) for each point (vectorised spatial-index join)."""
        lon_a = np.asarray(lon, dtype=float)
        lat_a = np.asarray(lat, dtype=float)
        out = np.zeros(lon_a.shape[0], dtype=bool)
        if len(self.polygons) == 0 or lon_a.size == 0:
            return out
        points = shapely.points(lon_a, lat_a)
        hits = self.polygons.sindex.query(points, predicate="intersects")
        out[hits[0]] = True
        return out

    def outlines(self, *, within: BaseGeometry | None = None) -> gpd.GeoDataFrame:
        """Urban polygons for display: urban areas as they are, tracts/counties dissolved;
        with ``within`` (the region), each cut to it, so that a tract reaching into coastal
        water is drawn along the region's coast. Labels of points in ``within`` are unchanged
        (a point lies in a cut polygon exactly when it lies in the polygon)."""
        if len(self.polygons) == 0:
            return self.polygons
        if self.kind == "urban_areas":
            outlines = self.polygons
        else:
            geom = shapely.union_all(self.polygons.geometry.to_numpy())
            outlines = gpd.GeoDataFrame(
                {"name": [f"urban {self.kind}"], "kind": [self.kind]}, geometry=[geom], crs=WGS84
            )
        if within is None:
            return outlines
        cut = [
            polygonal_part(g) for g in shapely.intersection(outlines.geometry.to_numpy(), within)
        ]
        keep = np.array([g is not None for g in cut], dtype=bool)
        kept = [g for g in cut if g is not None]
        return outlines.loc[keep].set_geometry(kept, crs=WGS84).reset_index(drop=True)

    def clip_to(self, bounds: tuple[float, float, float, float]) -> UrbanLayer:
        """Keep only polygons intersecting a bounding box (labels inside it are unchanged)."""
        idx = self.polygons.sindex.query(shapely.box(*bounds), predicate="intersects")
        polys = self.polygons.iloc[np.sort(idx)].reset_index(drop=True)
        return UrbanLayer(self.kind, polys, self.sources, dict(self.info))


def _null_geometries(gdf: gpd.GeoDataFrame) -> int:
    """How many null or empty geometries :func:`geodbk.geo.regions.read_vector` dropped."""
    return int(gdf.attrs.get("null_geometries", 0))


def _pick(gdf: pd.DataFrame, fields: Iterable[str]) -> str | None:
    return next((f for f in fields if f in gdf.columns), None)


def _columns(gdf: gpd.GeoDataFrame) -> str:
    """A layer's attribute columns for a message (the geometry left out), or ``none``."""
    names = [str(c) for c in gdf.columns if c != gdf.geometry.name]
    return ", ".join(names) or "none"


def _urban_layer(
    kind: str,
    gdf: gpd.GeoDataFrame,
    codes: np.ndarray,
    urban: np.ndarray,
    sources: Iterable[str | Path],
    *,
    names: np.ndarray | None = None,
    **info: Any,
) -> UrbanLayer:
    """The ``urban`` units of ``gdf`` (``code`` and ``name``, default the code) as an
    :class:`UrbanLayer`; its info counts the units read and the urban ones, then ``info``."""
    polys = gpd.GeoDataFrame(
        {"code": codes[urban], "name": (codes if names is None else names)[urban]},
        geometry=gdf.geometry.to_numpy()[urban],
        crs=WGS84,
    )
    counts = {"units": len(gdf), "urban_units": int(urban.sum())}
    return UrbanLayer(kind, polys, [str(s) for s in sources], {**counts, **info})


def read_urban_areas(
    path: str | Path, *, bbox: tuple[float, float, float, float] | None = None
) -> UrbanLayer:
    """Census urban areas (``tl_2020_us_uac20`` or the 2010 ``UACE10`` layer): inside = urban.

    A layer without an urban-area code field (``UACE20``, ``UACE10`` or ``UACE``), such as a
    state-boundary or tract file, is refused: any polygon is not an urban mask.
    """
    gdf = read_vector(path, bbox=bbox, what="urban-area")
    code_f = _pick(gdf, _UA_CODE_FIELDS)
    if code_f is None:
        raise DataError(
            f"{path}: not a Census urban-area layer (no UACE20, UACE10 or UACE field; "
            f"its columns: {_columns(gdf)}); pass the Census urban areas as --urban-areas "
            "(tl_2020_us_uac20.zip, or a 2010 layer with UACE10), or label tiles with "
            "--tracts/--rural-tracts or --counties/--rucc"
        )
    name_f = _pick(gdf, _UA_NAME_FIELDS)
    return _urban_layer(
        "urban_areas",
        gdf,
        gdf[code_f].astype(str).to_numpy(),
        np.ones(len(gdf), dtype=bool),
        [path],
        names=gdf[name_f or code_f].astype(str).to_numpy(),
        code_field=code_f,
        null_geometries=_null_geometries(gdf),
    )


#: Words that mark a header field of tract GEOIDs in a rural-tract list (normalised names that
#: contain one: ``FIPS``, ``GEOID_2010``, ``Tract FIPS Code``, ``Census Tract``), most telling
#: first.
_RURAL_LIST_WORDS = ("GEOID", "FIPS", "TRACT")


def _list_lines(p: Path) -> list[list[str]]:
    """The lines of a rural-tract list: a text file's, or those of each sheet of a workbook in
    turn (one list of lines per sheet)."""
    if p.suffix.lower() in (".xls", ".xlsx"):
        sheets = pd.read_excel(p, dtype=str, header=None, sheet_name=None)
        return [
            [
                ",".join("" if pd.isna(v) else str(v).replace(",", " ") for v in row)
                for row in frame.itertuples(index=False)
            ]
            for frame in sheets.values()
        ]
    return [p.read_text(encoding="utf-8-sig", errors="replace").splitlines()]


def _tract_ids(values: pd.Series) -> pd.Series:
    """The 10-11 digit codes among ``values``, zero-padded to 11 digits."""
    ids = _digits(values.dropna()).str.strip('"')
    return ids[ids.str.fullmatch(r"\d{10,11}").fillna(False)].str.zfill(11)


def _rural_ids(lines: list[str]) -> tuple[set[str], list[str]] | None:
    """The GEOIDs under the first header line that has a GEOID/FIPS/TRACT field and a column
    whose values are mostly 11-digit codes (of several, by :data:`_RURAL_LIST_WORDS` order);
    ``None`` when no line has such a field, an empty set and the last such line's fields when
    none has such a column (prose above the FCC list mentions census tracts)."""
    headers: list[str] | None = None
    for i, line in enumerate(lines):
        fields = [_norm(f) for f in re.split(r"[,;\t]", line.strip())]
        if not any(w in f for f in fields for w in _RURAL_LIST_WORDS):
            continue
        sep = next((s for s in (",", ";", "\t") if s in line), ",")
        try:
            df = pd.read_csv(io.StringIO("\n".join(lines[i:])), dtype=str, sep=sep)
        except pd.errors.ParserError:  # a line of prose: its fields run on below
            continue
        ranked = sorted(
            range(len(df.columns)),
            key=lambda k: next(
                (n for n, w in enumerate(_RURAL_LIST_WORDS) if w in _norm(df.columns[k])), 9
            ),
        )
        for k in ranked:
            values = df.iloc[:, k].dropna()
            ids = _tract_ids(values)
            if len(values) and len(ids) >= 0.5 * len(values):
                return set(ids), []
        headers = [str(c) for c in df.columns]
    return None if headers is None else (set(), headers)


def read_rural_tract_list(path: str | Path) -> set[str]:
    """Read a list of rural tract GEOIDs (11 digits).

    Accepts the FCC file (prose preamble, then a line ``FIPS``, then one GEOID per line) or any
    CSV or Excel table (any sheet) whose header names a column of tract GEOIDs (``FIPS``,
    ``GEOID``, ``GEOID10``, ``Tract FIPS Code``, ...; of several, the one holding 11-digit
    codes), in any position. GEOIDs that lost their leading zero are re-padded.
    """
    p = Path(path)
    try:
        books = _list_lines(p)
    except Exception as exc:
        raise DataError(
            f"{p}: cannot read the rural-tract list ({type(exc).__name__}: {exc})"
        ) from exc
    headers: list[str] = []
    for lines in books:
        found = _rural_ids(lines)
        if found is not None and found[0]:
            return found[0]
        if found is not None:
            headers = found[1]
    if headers:
        raise DataError(
            f"{p}: the rural-tract list has no column of 11-digit tract GEOIDs (columns: "
            f"{', '.join(headers)}); it needs one, e.g. FIPS or GEOID, of codes like 15001021010"
        )
    raise DataError(
        f"{p}: no FIPS/GEOID header line in the rural-tract list"
        + (" (in any sheet)" if len(books) > 1 else "")
        + "; expected the FCC file (a line 'FIPS' followed by one 11-digit tract GEOID per "
        "line) or a table with a FIPS, GEOID, GEOID10 or GEOID20 column of tract GEOIDs"
    )


#: A year of the 2010s or 2020s in a file name, not part of a longer number.
_YEAR = re.compile(r"(?<!\d)(20[12]\d)(?!\d)")


def census_vintage(name: str | Path) -> int | None:
    """The census (2010 or 2020) whose tracts a file holds, from the first year of the 2010s or
    2020s in its name (``tl_2019_15_tract`` holds 2010 tracts, ``tl_2023_15_tract`` 2020
    tracts), else ``None``."""
    m = _YEAR.search(Path(str(name)).name)
    return None if m is None else 2010 if int(m.group(1)) < 2020 else 2020


def _warn_on_mixed_vintages(
    tracts: str | Path, rural_tracts: str | Path, field: str
) -> dict[str, int | None]:
    """The vintages of the tract layer (its field ``GEOID10``/``GEOID20``, else its name) and
    of the rural list (its name), with a warning when they differ: tracts renumbered between
    the two censuses are missing from the list and would be labelled urban."""
    layer = {"GEOID10": 2010, "GEOID20": 2020}.get(field) or census_vintage(tracts)
    listed = census_vintage(rural_tracts)
    if layer is not None and listed is not None and layer != listed:
        log.warning(
            "%s holds %d census tracts but the rural-tract list %s names %d tracts: tracts "
            "renumbered between the two censuses are not on the list and are labelled urban; "
            "pass the %d tract layer (e.g. tl_%d_SS_tract%s.zip) or --urban-areas instead",
            tracts,
            layer,
            rural_tracts,
            listed,
            listed,
            listed,
            str(listed)[2:] if listed == 2010 else "",
        )
    return {"tract_vintage": layer, "rural_list_vintage": listed}


#: Listed rural tracts missing from a whole tract layer's counties above which the list and the
#: layer are taken to be of different censuses (a matching pair misses none).
_MISSING_LISTED_SHARE = 0.02


def _warn_on_listed_tracts_not_in_layer(
    layer: set[str], rural: set[str], tracts: str | Path, rural_tracts: str | Path
) -> None:
    """Warn when tracts the rural list names in the layer's counties are not in the layer (read
    whole): tracts renumbered between the 2010 and 2020 censuses, whatever the files' names."""
    counties = {g[:5] for g in layer}
    listed = [g for g in rural if g[:5] in counties]
    missing = sorted(g for g in listed if g not in layer)
    if len(missing) >= 3 and len(missing) > _MISSING_LISTED_SHARE * len(listed):
        log.warning(
            "%d of the %d rural tracts that %s lists in the counties of %s are not in that "
            "layer (e.g. %s): the list and the layer are probably of different censuses, and "
            "the layer's renumbered rural tracts are labelled urban; pass the tract layer of "
            "the list's census (the FCC list names 2010 tracts: tl_2010_SS_tract10.zip) or "
            "--urban-areas instead",
            len(missing),
            len(listed),
            rural_tracts,
            tracts,
            ", ".join(missing[:3]),
        )


def read_tract_urban(
    tracts: str | Path,
    rural_tracts: str | Path,
    *,
    bbox: tuple[float, float, float, float] | None = None,
) -> UrbanLayer:
    """Tract polygons + rural-tract list: a tract not on the list is urban."""
    rural = read_rural_tract_list(rural_tracts)
    gdf = read_vector(tracts, bbox=bbox, what="census-tract")
    f = _pick(gdf, _TRACT_FIELDS)
    if f is None:
        raise DataError(
            f"{tracts}: not a census-tract layer (no {', '.join(_TRACT_FIELDS[:-1])} or "
            f"{_TRACT_FIELDS[-1]} field; its columns: {_columns(gdf)}); pass the TIGER tract "
            "layer of the state as --tracts (e.g. tl_2010_15_tract10.zip: the FCC rural list "
            "names 2010 tracts), or use --urban-areas or --counties/--rucc"
        )
    vintages = _warn_on_mixed_vintages(tracts, rural_tracts, f)
    raw = _digits(gdf[f]).fillna("")  # a GEOID stored as a number: 15009030100.0
    raw = raw.str.replace(r"^\d{7}US", "", regex=True)  # cartographic GEO_ID 1400000US...
    if len(raw) and raw.str.len().max() <= 5:
        raise DataError(
            f"{tracts}: field {f} holds {int(raw.str.len().max())}-digit codes (states or "
            "counties?), not 11-digit census-tract GEOIDs; pass the tract layer "
            "(e.g. tl_2010_15_tract10.zip) as --tracts"
        )
    geoid = raw.str.zfill(11)
    if not gdf.attrs.get("clipped", False):
        _warn_on_listed_tracts_not_in_layer(set(geoid), rural, tracts, rural_tracts)
    is_urban = ~geoid.isin(rural).to_numpy()
    states = sorted(set(geoid.str[:2]))
    covers = not len(geoid) or any(g[:2] in states for g in rural)
    if not covers:
        log.warning(
            "%s: the rural-tract list has no tract of state(s) %s of %s, so every tract is "
            "labelled urban (only tiles outside all tracts stay rural); unless the state has "
            "no rural tract at all, pass the rural list that covers it (the FCC list covers "
            "all states)",
            rural_tracts,
            ", ".join(states),
            tracts,
        )
    return _urban_layer(
        "tracts",
        gdf,
        geoid.to_numpy(),
        is_urban,
        [tracts, rural_tracts],
        rural_units=int((~is_urban).sum()),
        rural_list_size=len(rural),
        code_field=f,
        null_geometries=_null_geometries(gdf),
        rural_list_covers_state=covers,
        tract_vintage=vintages["tract_vintage"],
        rural_list_vintage=vintages["rural_list_vintage"],
    )


def _norm(name: object) -> str:
    """A column or attribute name reduced to upper-case letters and digits (BOM dropped)."""
    return re.sub(r"[^A-Z0-9]", "", str(name).replace("\ufeff", "").upper())


#: Normalised names of a county FIPS column in the RUCC and ERS county-level files.
_FIPS_NAMES = ("FIPS", "FIPSCODE", "FIPSTXT", "GEOID", "COUNTYFIPS", "STCOFIPS", "FIPSSTCO")
_RUCC_NAME = re.compile(r"^(RUCC|RURALURBANCONTINUUMCODE)(\d{4})?$")


def _rucc_year(name: object) -> int | None:
    """The year of a RUCC column or attribute name (0 without one), else ``None``."""
    m = _RUCC_NAME.match(_norm(name))
    return None if m is None else int(m.group(2) or 0)


def _read_table(p: Path) -> pd.DataFrame:
    """A CSV (UTF-8 with or without BOM, else Latin-1) or Excel file as strings."""
    if p.suffix.lower() in (".xls", ".xlsx"):
        return pd.read_excel(p, dtype=str)
    try:
        return pd.read_csv(p, dtype=str, encoding="utf-8-sig")
    except UnicodeDecodeError:
        return pd.read_csv(p, dtype=str, encoding="latin-1")


def _fips_column(df: pd.DataFrame) -> str | None:
    """The county FIPS column: by name, else the first column whose values are 4-5 digit codes."""
    by_name = {_norm(c): c for c in df.columns}
    for name in _FIPS_NAMES:
        if name in by_name:
            return str(by_name[name])
    for c in df.columns:
        values = _digits(df[c]).dropna()
        if len(values) and values.str.fullmatch(r"\d{4,5}").mean() > 0.9:
            return str(c)
    return None


def _digits(values: pd.Series) -> pd.Series:
    """Codes as digit strings: thousands separators, spaces and a trailing ``.0`` removed."""
    text = values.astype("string").str.strip().str.replace(",", "", regex=False)
    return text.str.replace(r"\.0+$", "", regex=True)


def read_rucc(path: str | Path) -> dict[str, int]:
    """Read USDA rural-urban continuum codes: county FIPS (5 digits) -> RUCC (1-9).

    Columns are found by name pattern and content, so every ERS layout reads:

    - the RUCC files (2003, 2013, 2023), wide (``FIPS``, ``RUCC_2013``) or long (``FIPS``,
      ``Attribute`` = ``RUCC_2023``, ``Value``);
    - the ERS county-level data sets (population, unemployment, education), wide with e.g.
      ``FIPStxt``/``FIPS_Code`` and ``Rural-urban_Continuum Code_2013``, or long with
      ``Attribute`` = ``Rural_Urban_Continuum_Code_2013``.

    CSV (UTF-8 with or without BOM, or Latin-1) or Excel; thousands separators and ``.0``
    suffixes in codes are ignored. With several years, the latest is used.
    """
    p = Path(path)
    try:
        df = _read_table(p)
    except Exception as exc:
        raise DataError(f"{p}: cannot read the RUCC file ({type(exc).__name__}: {exc})") from exc
    df.columns = [str(c).replace("\ufeff", "").strip() for c in df.columns]
    fips_c = _fips_column(df)
    if fips_c is None:
        raise DataError(
            f"{p}: no county FIPS column in the RUCC file (looked for FIPS, FIPS_Code, FIPStxt, "
            f"GEOID or a column of 5-digit codes; columns: {', '.join(map(str, df.columns))})"
        )
    by_name = {_norm(c): c for c in df.columns}
    if "ATTRIBUTE" in by_name and "VALUE" in by_name:
        attr = df[by_name["ATTRIBUTE"]]
        years = attr.map(_rucc_year)
        if years.notna().sum() == 0:
            raise DataError(
                f"{p}: no RUCC attribute (RUCC_2023, Rural_Urban_Continuum_Code_2013, ...) in the "
                "long file's Attribute column"
            )
        sub = df[years == years.max()]
        codes, fips = sub[by_name["VALUE"]], sub[fips_c]
    else:
        ranked = sorted((y, str(c)) for c in df.columns if (y := _rucc_year(c)) is not None)
        if not ranked:
            raise DataError(
                f"{p}: no RUCC column (RUCC_2013, RUCC_2023, Rural-urban_Continuum Code_2013, "
                f"...) in the RUCC file; columns: {', '.join(map(str, df.columns))}"
            )
        rucc_c = ranked[-1][1]
        codes, fips = df[rucc_c], df[fips_c]
    num = pd.to_numeric(_digits(codes), errors="coerce")
    key = _digits(fips)
    ok = num.between(1, 9) & key.str.fullmatch(r"\d{1,5}").fillna(False)
    if not ok.any():
        raise DataError(f"{p}: no valid RUCC codes (1-9) with a county FIPS in the file")
    return dict(zip(key[ok].str.zfill(5), num[ok].astype(int), strict=True))


def read_county_urban(
    counties: str | Path,
    rucc: str | Path,
    *,
    bbox: tuple[float, float, float, float] | None = None,
    urban_codes: tuple[int, ...] = (1, 2, 3),
) -> UrbanLayer:
    """County polygons + USDA RUCC codes: codes 1-3 (metro) are urban."""
    codes = read_rucc(rucc)
    gdf = read_vector(counties, bbox=bbox, what="county")
    f = _pick(gdf, _COUNTY_FIELDS)
    if f is not None:
        fips = gdf[f].astype(str).str.strip().str.zfill(5)
    elif "STATEFP" in gdf.columns and "COUNTYFP" in gdf.columns:
        fips = gdf["STATEFP"].astype(str).str.zfill(2) + gdf["COUNTYFP"].astype(str).str.zfill(3)
    else:
        raise DataError(f"{counties}: not a county layer (no GEOID or STATEFP+COUNTYFP fields)")
    rucc_of = fips.map(codes)
    missing = int(rucc_of.isna().sum())
    if len(fips) and missing == len(fips):
        raise DataError(
            f"{rucc}: no county FIPS of {counties} is in the RUCC table (no join key in "
            "common), so no tile could be labelled; pass the RUCC file that covers these "
            "counties"
        )
    is_urban = rucc_of.isin(urban_codes).to_numpy()
    return _urban_layer(
        "counties",
        gdf,
        fips.to_numpy(),
        is_urban,
        [counties, rucc],
        counties_without_rucc=missing,
        urban_codes=list(urban_codes),
        null_geometries=_null_geometries(gdf),
    )


def resolve_urban(
    *,
    urban_areas: str | Path | None = None,
    tracts: str | Path | None = None,
    rural_tracts: str | Path | None = None,
    counties: str | Path | None = None,
    rucc: str | Path | None = None,
    bbox: tuple[float, float, float, float] | None = None,
) -> UrbanLayer | None:
    """Build the urban layer from exactly one source; ``None`` when none is given."""
    kinds = [
        k
        for k, v in (
            ("--urban-areas", urban_areas),
            ("--tracts/--rural-tracts", tracts or rural_tracts),
            ("--counties/--rucc", counties or rucc),
        )
        if v
    ]
    if len(kinds) > 1:
        raise DataError(f"give only one urban/rural source (got {', '.join(kinds)})")
    if urban_areas:
        return read_urban_areas(urban_areas, bbox=bbox)
    if tracts or rural_tracts:
        if not (tracts and rural_tracts):
            raise DataError("--tracts and --rural-tracts go together (tract polygons + rural list)")
        return read_tract_urban(tracts, rural_tracts, bbox=bbox)
    if counties or rucc:
        if not (counties and rucc):
            raise DataError("--counties and --rucc go together (county polygons + RUCC codes)")
        return read_county_urban(counties, rucc, bbox=bbox)
    return None
