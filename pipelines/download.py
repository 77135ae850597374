"""``geodbk download``: fetch Ookla open-data parquet and the Census files into a cache folder.

- Ookla tiles: ``BASE/parquet/performance/type=T/year=Y/quarter=Q/Y-MM-01_performance_T_tiles.parquet``
  (``BASE`` = https://ookla-open-data.s3.amazonaws.com/). When a region is given and the file has
  ``tile_x``/``tile_y`` (centroid lon/lat, Ookla files from 2023Q3 on), only its footer and the
  row groups whose ``tile_x``/``tile_y`` statistics intersect the region's bounding box are read,
  with HTTP Range requests, and the region's rows are written to the cache; otherwise the whole file
  is downloaded.
- Census: the 2020 urban areas (``tl_2020_us_uac20.zip``) and the state boundaries
  (``cb_2018_us_state_500k.zip``).

Downloads go to ``NAME.part`` first and are resumed with a Range request when interrupted
(with ``If-Range`` and the server's ETag or Last-Modified, so a file that changed on the server
restarts instead of being spliced); a finished file is checked (a ``.parquet`` must carry the
parquet magic at both ends and a readable footer, a ``.zip`` a readable zip directory) and only
then moved into place atomically. A cached file that fails the check is removed and fetched
again, so an HTML error page served in place of a file is never kept. Progress bars use tqdm. Only the standard library
(urllib) talks HTTP.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import logging
import os
import urllib.error
import urllib.request
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from geodbk.atomic import atomic_path, atomic_write_json
from geodbk.errors import DataError, GeodbkError
from geodbk.geo.frame import native_boxes
from geodbk.geo.ookla import TYPES
from geodbk.geo.regions import bbox_region, resolve_region
from geodbk.geo.timeaxis import parse_quarters
from pipelines.cli import add_bbox_option, add_progress_option, call_with_options, stage_parser

log = logging.getLogger("geodbk.download")

OOKLA_BASE_URL = "https://ookla-open-data.s3.amazonaws.com/"
CENSUS_BASE_URL = "https://www2.census.gov/geo/tiger/"
#: Census files, as paths under ``CENSUS_BASE_URL``.
CENSUS_FILES: dict[str, str] = {
    "urban_areas": "TIGER2020/UAC/tl_2020_us_uac20.zip",
    "states": "GENZ2018/shp/cb_2018_us_state_500k.zip",
}
CHUNK = 1 << 20
TIMEOUT = 60.0


class DownloadError(GeodbkError):
    """A download that failed (network, HTTP status, truncated transfer); CLI exit code 1."""


def ookla_key(type: str, quarter: str) -> str:
    """The S3 key of Ookla's parquet for a type (``mobile``/``fixed``) and quarter (``2023Q4``)."""
    if type not in TYPES:
        raise DataError(f"unknown type {type!r}: use mobile or fixed")
    (q,) = parse_quarters(quarter) or [quarter]
    year, n = int(q[:4]), int(q[5])
    month = 3 * (n - 1) + 1
    return (
        f"parquet/performance/type={type}/year={year}/quarter={n}/"
        f"{year}-{month:02d}-01_performance_{type}_tiles.parquet"
    )


def _join(base: str, key: str) -> str:
    return base.rstrip("/") + "/" + key.lstrip("/")


def _open(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    url_option: str = "--base-url",
) -> Any:
    """Open ``url``; a connection that fails names ``url_option``, the option that sets the
    URL's host (``--base-url`` for Ookla, ``--census-base-url`` for Census files)."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        return urllib.request.urlopen(req, timeout=TIMEOUT)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:
            return exc  # range not satisfiable: caller decides
        raise DownloadError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DownloadError(
            f"{url}: cannot connect ({exc}); check the network or {url_option}"
        ) from exc


#: Bytes at both ends of every parquet file.
PARQUET_MAGIC = b"PAR1"


def content_problem(path: Path, *, suffix: str | None = None) -> str | None:
    """What is wrong with a downloaded file's content for ``suffix`` (default its own), or
    ``None``: a ``.parquet`` needs ``PAR1`` at its start and end and a footer pyarrow can read;
    a ``.zip`` a zip directory that opens. Other suffixes are not checked."""
    suffix = (suffix or path.suffix).lower()
    if suffix not in (".parquet", ".zip"):
        return None
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(64)
        fh.seek(max(size - 4, 0))
        tail = fh.read(4)
    start = head[:40].decode("ascii", "replace").strip()
    seen = f"it starts with {start!r}" if head else "it is empty"
    if suffix == ".parquet":
        if head[:4] != PARQUET_MAGIC or tail != PARQUET_MAGIC:
            return f"not a parquet file ({size} bytes; {seen})"
        try:
            pq.read_metadata(path)
        except Exception as exc:  # pyarrow raises several types
            return f"a damaged parquet file ({exc})"
        return None
    try:
        with zipfile.ZipFile(path) as zf:
            zf.infolist()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"not a zip archive ({size} bytes; {seen}; {exc})"
    return None


def _validator_path(part: Path) -> Path:
    return part.with_name(part.name + ".validator")


def _validator(resp: Any) -> str | None:
    """The response's ETag (else Last-Modified): what ``If-Range`` sends on a resume."""
    headers = getattr(resp, "headers", None)
    if headers is None:
        return None
    value = headers.get("ETag") or headers.get("Last-Modified")
    return str(value) if value else None


def _discard(*paths: Path) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def remote_size(url: str, *, url_option: str = "--base-url") -> int:
    """Size in bytes of a remote file (HEAD request)."""
    with _open(url, method="HEAD", url_option=url_option) as resp:
        length = resp.headers.get("Content-Length")
    if length is None:
        raise DownloadError(f"{url}: the server did not report the file size")
    return int(length)


def fetch(
    url: str, dest: str | Path, *, progress: bool = True, url_option: str = "--base-url"
) -> Path:
    """Download ``url`` to ``dest`` resumably; an existing ``dest`` that passes
    :func:`content_problem` is kept (the cache), one that fails is removed and fetched again.

    Bytes go to ``dest.part``; if it exists (an interrupted download), the transfer continues from
    its end with a ``Range`` request and ``If-Range`` (the ETag or Last-Modified of the first
    response), restarting when the server ignores the range or the file changed. On completion
    the part file is checked and moved onto ``dest``; a file whose content does not match its
    name (an HTML page as ``.parquet``) is removed and a :class:`DownloadError` raised.
    ``url_option`` is the option a failed connection's message names.
    """
    dest = Path(dest)
    if dest.is_file():
        problem = content_problem(dest)
        if problem is None:
            log.info("cached: %s", dest)
            return dest
        log.warning("cached %s is %s: removing it and fetching it again", dest, problem)
        dest.unlink()
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    validator = _validator_path(part)
    have = part.stat().st_size if part.is_file() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    if have and validator.is_file():
        headers["If-Range"] = validator.read_text().strip()
    resp = _open(url, headers=headers, url_option=url_option)
    if isinstance(resp, urllib.error.HTTPError):  # 416: the part file is already complete
        resp.close()
        if have and have == remote_size(url, url_option=url_option):
            return _finish(part, dest, url=url)
        _discard(part, validator)
        return fetch(url, dest, progress=progress, url_option=url_option)
    with resp:
        status = getattr(resp, "status", 200)
        if have and status != 206:
            have = 0  # server ignored the range, or the file changed: start over
        if not have:
            tag = _validator(resp)
            if tag:
                validator.write_text(tag)
            else:
                validator.unlink(missing_ok=True)
        length = resp.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        mode = "ab" if have else "wb"
        with (
            open(part, mode) as out,
            tqdm(
                total=total,
                initial=have,
                unit="B",
                unit_scale=True,
                desc=dest.name,
                disable=not progress,
                leave=False,
            ) as bar,
        ):
            try:
                while True:
                    chunk = resp.read(CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    bar.update(len(chunk))
            except (OSError, http.client.HTTPException) as exc:
                out.flush()
                raise DownloadError(
                    f"{url}: transfer interrupted after {out.tell()} bytes ({exc!r}); run the "
                    "command again to resume from the .part file"
                ) from exc
            out.flush()
            os.fsync(out.fileno())
    got = part.stat().st_size
    if total is not None and got != total:
        raise DownloadError(
            f"{url}: transfer ended at {got} of {total} bytes; run the command again to resume"
        )
    return _finish(part, dest, url=url)


def _finish(part: Path, dest: Path, *, url: str) -> Path:
    """Check a complete ``part`` file's content and move it onto ``dest``; a file that fails
    :func:`content_problem` is removed with a :class:`DownloadError`."""
    validator = _validator_path(part)
    problem = content_problem(part, suffix=dest.suffix)
    if problem is not None:
        _discard(part, validator)
        raise DownloadError(
            f"{url}: the server sent {problem}, not the {dest.suffix} file asked for (an error "
            "or sign-in page?); nothing was kept. Check the address (--base-url) and try again"
        )
    os.replace(part, dest)
    validator.unlink(missing_ok=True)
    return dest


class HTTPRangeFile(io.RawIOBase):
    """A read-only, seekable file over HTTP Range requests (for ``pyarrow.parquet``).

    Attributes
    ----------
    requests, bytes_read
        Number of range requests made and bytes fetched (for reporting and tests).
    """

    def __init__(self, url: str, *, size: int | None = None) -> None:
        super().__init__()
        self.url = url
        self.size = remote_size(url) if size is None else size
        self.pos = 0
        self.requests = 0
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            size = self.size - self.pos
        end = min(self.pos + size, self.size)
        if end <= self.pos:
            return b""
        with _open(self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"}) as resp:
            data = resp.read()
            if getattr(resp, "status", 200) != 206:
                data = data[self.pos : end]  # server ignored the range
        self.requests += 1
        self.bytes_read += len(data)
        self.pos += len(data)
        return bytes(data)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def _row_groups_in_bbox(
    meta: pq.FileMetaData, bbox: tuple[float, float, float, float]
) -> list[int] | None:
    """Row groups whose tile_x/tile_y statistics intersect ``bbox`` (either half of one across
    the 180° meridian); None without such columns."""
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    if "tile_x" not in names or "tile_y" not in names:
        return None
    ix, iy = names.index("tile_x"), names.index("tile_y")
    keep = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        sx, sy = rg.column(ix).statistics, rg.column(iy).statistics
        if sx is None or sy is None or not (sx.has_min_max and sy.has_min_max):
            keep.append(g)  # no statistics: must read it
            continue
        if any(
            sx.max >= w and sx.min <= e and sy.max >= s and sy.min <= n
            for w, s, e, n in native_boxes(*bbox)
        ):
            keep.append(g)
    return keep


def _rows_in_bbox(table: pa.Table, bbox: tuple[float, float, float, float]) -> Any:
    """The rows of ``table`` whose ``tile_x``/``tile_y`` lie in ``bbox`` (either half)."""
    x, y = table["tile_x"], table["tile_y"]
    inside = None
    for w, s, e, n in native_boxes(*bbox):
        box = pc.and_(
            pc.and_(pc.greater_equal(x, w), pc.less_equal(x, e)),
            pc.and_(pc.greater_equal(y, s), pc.less_equal(y, n)),
        )
        inside = box if inside is None else pc.or_(inside, box)
    return inside


def fetch_ookla(
    *,
    type: str,
    quarter: str,
    cache: str | Path,
    bbox: tuple[float, float, float, float] | None = None,
    base_url: str = OOKLA_BASE_URL,
    progress: bool = True,
) -> dict[str, Any]:
    """Fetch one Ookla quarter into ``cache/ookla/<key>``; returns what was done.

    With ``bbox`` (east beyond 180: a box across the 180° meridian) and a file carrying
    ``tile_x``/``tile_y``, only the intersecting row groups are
    read and only the rows whose centroid lies in ``bbox`` are written (a sidecar
    ``<file>.json`` records the bbox); otherwise the whole file is downloaded.
    """
    key = ookla_key(type, quarter)
    url = _join(base_url, key)
    dest = Path(cache) / "ookla" / key
    sidecar = dest.with_name(dest.name + ".json")
    if dest.is_file() and sidecar.is_file() and content_problem(dest) is None:
        info: dict[str, Any] = json.loads(sidecar.read_text())
        if info.get("bbox") in (None, list(bbox) if bbox else None):
            log.info("cached: %s", dest)
            return {**info, "cached": True}
    if bbox is not None:
        remote = HTTPRangeFile(url)
        try:
            pf = pq.ParquetFile(remote)
            groups = _row_groups_in_bbox(pf.metadata, bbox)
        except DownloadError:
            raise
        except Exception as exc:
            raise DownloadError(f"{url}: not a readable parquet file ({exc})") from exc
        if groups is not None:
            tables = []
            for g in tqdm(
                groups, desc=dest.name, unit="row group", disable=not progress, leave=False
            ):
                t = pf.read_row_group(g)
                tables.append(t.filter(_rows_in_bbox(t, bbox)))
            table = pa.concat_tables(tables) if tables else pf.schema_arrow.empty_table()
            with atomic_path(dest) as tmp:
                pq.write_table(table, tmp, compression="zstd")
            info = {
                "url": url,
                "path": str(dest),
                "bbox": list(bbox),
                "mode": "row-groups",
                "row_groups_read": len(groups),
                "row_groups_total": pf.metadata.num_row_groups,
                "rows": table.num_rows,
                "bytes_fetched": remote.bytes_read,
                "file_size": remote.size,
            }
            atomic_write_json(sidecar, info)
            log.info(
                "%s: %d of %d row groups, %d rows, %.1f of %.1f MB fetched",
                key,
                len(groups),
                pf.metadata.num_row_groups,
                table.num_rows,
                remote.bytes_read / 1e6,
                remote.size / 1e6,
            )
            return {**info, "cached": False}
        log.info("%s has no tile_x/tile_y: downloading the whole file", key)
    if dest.is_file():
        dest.unlink()  # a subset for another bbox
    fetch(url, dest, progress=progress)
    info = {
        "url": url,
        "path": str(dest),
        "bbox": None,
        "mode": "full",
        "file_size": dest.stat().st_size,
    }
    atomic_write_json(sidecar, info)
    return {**info, "cached": False}


def fetch_census(
    *,
    cache: str | Path,
    base_url: str = CENSUS_BASE_URL,
    progress: bool = True,
    names: Sequence[str] = tuple(CENSUS_FILES),
) -> dict[str, Path]:
    """Fetch the Census zips ``names`` (default: the urban areas and the state boundaries) into
    ``cache/census/``."""
    out = {}
    for name in names:
        key = CENSUS_FILES[name]
        out[name] = fetch(
            _join(base_url, key),
            Path(cache) / "census" / Path(key).name,
            progress=progress,
            url_option="--census-base-url",
        )
    return out


def run_download(
    *,
    cache: str | Path,
    type: str = "mobile",
    quarters: str | Sequence[str],
    state: str | None = None,
    region: str | Path | None = None,
    bbox: Sequence[float] | None = None,
    census: bool = True,
    base_url: str = OOKLA_BASE_URL,
    census_base_url: str = CENSUS_BASE_URL,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the download stage; returns a summary (also written to ``cache/download.json``).

    Parameters
    ----------
    cache
        Cache folder.
    type, quarters
        Ookla network type and quarters (``2023Q1:2023Q4``).
    state, region, bbox
        Region to keep (a state needs the state-boundary file, fetched first, even with
        ``census=False``: its polygon is the region); none = whole files.
    census
        Also fetch the Census urban areas and state boundaries.
    base_url, census_base_url
        Where to fetch from (mirrors, tests).
    progress
        Show tqdm progress bars.
    """
    qs = parse_quarters(quarters)
    if not qs:
        raise DataError("--quarters is empty: give e.g. 2023Q4 or 2023Q1:2023Q4")
    ookla_key(type, qs[0])  # a bad --type or --bbox is refused before anything is fetched
    if bbox is not None:
        bbox_region(*bbox)
    cache_dir = Path(cache)
    census_files: dict[str, Path] = {}
    if census:
        census_files = fetch_census(cache=cache_dir, base_url=census_base_url, progress=progress)
    elif state is not None:  # the state's polygon is the region: only that file is needed
        log.info("--no-census: fetching only the Census state-boundary file, for --state")
        census_files = fetch_census(
            cache=cache_dir, base_url=census_base_url, progress=progress, names=("states",)
        )
    the_region = resolve_region(
        state=state,
        states_file=census_files.get("states"),
        region=region,
        bbox=tuple(bbox) if bbox is not None else None,  # type: ignore[arg-type]
    )
    box = the_region.extent if the_region is not None else None  # its frame: east may pass 180
    if box is None:
        log.warning("no region given: downloading whole quarterly files (hundreds of MB each)")
    files = [
        fetch_ookla(
            type=type, quarter=q, cache=cache_dir, bbox=box, base_url=base_url, progress=progress
        )
        for q in qs
    ]
    summary = {
        "type": type,
        "quarters": qs,
        "bbox": list(box) if box else None,
        "ookla": files,
        "census": {k: str(v) for k, v in census_files.items()},
        "tiles_dir": str(cache_dir / "ookla" / "parquet" / "performance"),
    }
    atomic_write_json(cache_dir / "download.json", summary)
    return summary


def _main(args: argparse.Namespace) -> int:
    summary = call_with_options(run_download, args)
    census = summary["census"]
    hint = [f"geodbk ingest --tiles {summary['tiles_dir']} --type {args.type} --run runs/NAME"]
    if args.state and "states" in census:
        hint.append(f"--state {args.state} --states-file {census['states']}")
    if "urban_areas" in census:
        hint.append(f"--urban-areas {census['urban_areas']}")
    q = summary["quarters"]
    hint.append(f"--quarters {q[0]}:{q[-1]}")
    print("next: " + " ".join(hint))
    return 0


_EPILOG = """\
examples:
  # four quarters of mobile tiles for Hawaii (+ Census urban areas and state boundaries)
  geodbk download --type mobile --quarters 2023Q1:2023Q4 --state HI --cache cache/

  # a bounding box, fixed tiles, no Census files
  geodbk download --type fixed --quarters 2023Q4 --bbox -158.3 21.2 -157.6 21.8 \\
      --cache cache/ --no-census

Files with tile_x/tile_y (Ookla 2023Q3 on) are read selectively with HTTP Range requests (only the
region's row groups); older files are downloaded whole. Interrupted downloads resume from their
.part files when the command is run again.
exit codes: 0 ok, 1 download failed (network, HTTP status, a page served instead of the file;
the message names the URL), 2 usage (a --type other than mobile or fixed), 3 bad option
(--quarters, --bbox), 6 the disk refused a write.
"""


def register(subparsers: Any) -> None:
    """Add the ``download`` sub-command to the CLI."""
    p = stage_parser(
        subparsers,
        "download",
        _main,
        description=(
            "Fetch Ookla's public parquet tiles for a type and quarters (only the region's rows "
            "where the file allows it) and the Census urban-area and state-boundary files, "
            "resumably and with progress."
        ),
        epilog=_EPILOG,
    )
    p.add_argument("--type", choices=TYPES, default="mobile", help="network type (default mobile)")
    p.add_argument(
        "--quarters", required=True, metavar="Q1:Q2", help="e.g. 2023Q4 or 2023Q1:2023Q4"
    )
    p.add_argument("--cache", default="cache", metavar="DIR", help="cache folder (default: cache)")
    g = p.add_argument_group("region (optional, one of)")
    g.add_argument(
        "--state",
        help="state postal code, name or FIPS; its boundary comes from the Census state file, "
        "which is fetched even with --no-census",
    )
    g.add_argument("--region", metavar="FILE", help="any polygon file")
    add_bbox_option(g)
    p.add_argument(
        "--no-census",
        dest="census",
        action="store_false",
        help="do not fetch the Census files (with --state, its state-boundary file is still "
        "fetched: it gives the state's boundary)",
    )
    p.add_argument(
        "--base-url", default=OOKLA_BASE_URL, help=f"Ookla bucket URL (default {OOKLA_BASE_URL})"
    )
    p.add_argument(
        "--census-base-url",
        default=CENSUS_BASE_URL,
        help=f"Census TIGER URL, for the urban-area and state files (default {CENSUS_BASE_URL})",
    )
    add_progress_option(p)
