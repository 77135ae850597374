"""``geodbk download`` against a local HTTP server on 127.0.0.1 (Range requests supported)."""

from __future__ import annotations

import hashlib
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import shapely

from geodbk.geo import quadkey as qk
from geodbk.geo.frame import tile_polygons
from pipelines import cli
from pipelines import download as dl


class _Server:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, str, str | None]] = []
        self.bytes_sent = 0
        self.honour_ranges = True
        self.truncate_at: int | None = None
        self.etags = False  # send an ETag and honour If-Range
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _file(self) -> Path | None:
                path = server.root / self.path.lstrip("/")
                return path if path.is_file() else None

            def do_HEAD(self) -> None:
                server.requests.append(("HEAD", self.path, None))
                f = self._file()
                if f is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(f.stat().st_size))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                server.requests.append(("GET", self.path, rng))
                f = self._file()
                if f is None:
                    self.send_error(404)
                    return
                data = f.read_bytes()
                etag = f'"{hashlib.sha256(data).hexdigest()[:16]}"'
                if server.etags and self.headers.get("If-Range") not in (None, etag):
                    rng = None  # the file changed since the part was fetched: send it whole
                if rng and server.honour_ranges:
                    a, b = rng.removeprefix("bytes=").split("-")
                    start = int(a)
                    end = int(b) if b else len(data) - 1
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.end_headers()
                        return
                    body = data[start : end + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
                else:
                    body = data
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                if server.etags:
                    self.send_header("ETag", etag)
                self.end_headers()
                if server.truncate_at is not None:
                    body = body[: server.truncate_at]  # then the connection closes early
                    server.truncate_at = None
                    self.close_connection = True
                self.wfile.write(body)
                server.bytes_sent += len(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    root = tmp_path / "www"
    root.mkdir()
    s = _Server(root)
    yield s
    s.close()


def _ookla_table(lon0: float, lat0: float, n: int, *, seed: int, with_xy: bool) -> pa.Table:
    rng = np.random.default_rng(seed)
    x0, y0 = qk.lonlat_to_tile([lon0], [lat0], 16)
    cells = rng.choice(10_000, n, replace=False)
    x, y = x0[0] + cells % 100, y0[0] + cells // 100
    keys = qk.tile_to_quadkey(x, y, np.full(n, 16))
    w, s, e, nn = qk.tile_bounds(x, y, 16)
    cols = {"quadkey": keys.astype(str), "tile": shapely.to_wkt(tile_polygons(w, s, e, nn))}
    if with_xy:
        cols["tile_x"] = (w + e) / 2
        cols["tile_y"] = (s + nn) / 2
    cols.update(
        avg_d_kbps=rng.integers(1000, 90000, n),
        avg_u_kbps=rng.integers(100, 9000, n),
        avg_lat_ms=rng.integers(5, 90, n),
        tests=rng.integers(1, 9, n),
        devices=np.ones(n, dtype=np.int64),
    )
    return pa.Table.from_pandas(pd.DataFrame(cols), preserve_index=False)


def _write(root: Path, key: str, table: pa.Table, *, row_group_size: int) -> Path:
    path = root / key
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def _shapefile_zip(gdf: gpd.GeoDataFrame, path: Path) -> None:
    tmp = path.with_suffix("")
    tmp.mkdir(parents=True)
    gdf.to_file(tmp / (path.stem + ".shp"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for f in sorted(tmp.iterdir()):
            zf.write(f, f.name)


def test_ookla_key() -> None:
    assert dl.ookla_key("mobile", "2023Q4") == (
        "parquet/performance/type=mobile/year=2023/quarter=4/2023-10-01_performance_mobile_tiles.parquet"
    )
    assert dl.ookla_key("fixed", "2020Q2").endswith(
        "quarter=2/2020-04-01_performance_fixed_tiles.parquet"
    )


def test_resume_partial_download(server: _Server, tmp_path: Path) -> None:
    payload = np.random.default_rng(0).bytes(300_000)
    (server.root / "big.bin").write_bytes(payload)
    dest = tmp_path / "cache" / "big.bin"
    dest.parent.mkdir()
    (dest.parent / "big.bin.part").write_bytes(payload[:120_000])
    dl.fetch(server.url + "big.bin", dest, progress=False)
    assert dest.read_bytes() == payload
    assert not (dest.parent / "big.bin.part").exists()
    assert server.requests[-1] == ("GET", "/big.bin", "bytes=120000-")
    assert server.bytes_sent == 180_000
    # cached: no new request
    n = len(server.requests)
    dl.fetch(server.url + "big.bin", dest, progress=False)
    assert len(server.requests) == n


def test_interrupted_transfer_then_resume(server: _Server, tmp_path: Path) -> None:
    payload = np.random.default_rng(1).bytes(200_000)
    (server.root / "cut.bin").write_bytes(payload)
    server.truncate_at = 50_000
    dest = tmp_path / "cut.bin"
    with pytest.raises(dl.DownloadError, match="run the command again to resume"):
        dl.fetch(server.url + "cut.bin", dest, progress=False)
    assert not dest.exists()
    assert (tmp_path / "cut.bin.part").stat().st_size == 50_000
    dl.fetch(server.url + "cut.bin", dest, progress=False)
    assert dest.read_bytes() == payload
    assert server.requests[-1][2] == "bytes=50000-"


def test_resume_when_server_ignores_ranges(server: _Server, tmp_path: Path) -> None:
    payload = b"abcdefghij" * 1000
    (server.root / "f.bin").write_bytes(payload)
    server.honour_ranges = False
    dest = tmp_path / "f.bin"
    (tmp_path / "f.bin.part").write_bytes(b"XXXX")
    dl.fetch(server.url + "f.bin", dest, progress=False)
    assert dest.read_bytes() == payload


def test_missing_remote_file_is_clear(server: _Server, tmp_path: Path) -> None:
    with pytest.raises(dl.DownloadError, match="HTTP 404"):
        dl.fetch(server.url + "nope.zip", tmp_path / "nope.zip", progress=False)
    assert not (tmp_path / "nope.zip").exists()


def test_an_html_page_served_as_parquet_is_refused_and_not_kept(
    server: _Server, tmp_path: Path
) -> None:
    key = dl.ookla_key("mobile", "2023Q4")
    (server.root / key).parent.mkdir(parents=True)
    (server.root / key).write_text("<!DOCTYPE html><html><body>Sign in</body></html>")
    dest = tmp_path / "got" / "x.parquet"
    with pytest.raises(dl.DownloadError, match=r"not a parquet file .*<!DOCTYPE html"):
        dl.fetch(server.url + key, dest, progress=False)
    assert list(dest.parent.iterdir()) == []  # neither the file nor its .part is kept
    assert (
        cli.main(
            [
                "download",
                "--cache",
                str(tmp_path / "c"),
                "--type",
                "mobile",
                "--quarters",
                "2023Q4",
                "--base-url",
                server.url,
                "--no-census",
            ]
        )
        == 1
    )


def test_a_bad_cached_file_is_fetched_again(server: _Server, tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"a": [1, 2, 3]}), good)
    (server.root / "f.parquet").write_bytes(good.read_bytes())
    dest = tmp_path / "cache" / "f.parquet"
    dest.parent.mkdir()
    dest.write_text("<html>cached error page</html>")
    dl.fetch(server.url + "f.parquet", dest, progress=False)
    assert pq.read_table(dest).column("a").to_pylist() == [1, 2, 3]


def test_resume_restarts_when_the_file_changed_on_the_server(
    server: _Server, tmp_path: Path
) -> None:
    server.etags = True
    old = np.random.default_rng(3).bytes(100_000)
    new = np.random.default_rng(4).bytes(100_000)
    (server.root / "v.bin").write_bytes(old)
    server.truncate_at = 40_000
    dest = tmp_path / "v.bin"
    with pytest.raises(dl.DownloadError, match="resume"):
        dl.fetch(server.url + "v.bin", dest, progress=False)
    (server.root / "v.bin").write_bytes(new)  # a new version between the two runs
    dl.fetch(server.url + "v.bin", dest, progress=False)
    assert dest.read_bytes() == new  # not old[:40000] + new[40000:]
    assert server.requests[-1][2] == "bytes=40000-"  # it did ask to resume


def test_row_group_selection_with_tile_xy(server: _Server, tmp_path: Path) -> None:
    key = dl.ookla_key("mobile", "2023Q4")
    # two clusters far apart, sorted so that row groups separate them
    t = pa.concat_tables(
        [
            _ookla_table(-157.9, 21.4, 2000, seed=1, with_xy=True),
            _ookla_table(-80.0, 35.0, 6000, seed=2, with_xy=True),
        ]
    )
    src = _write(server.root, key, t, row_group_size=1000)
    bbox = (-158.5, 20.5, -157.0, 22.5)
    info = dl.fetch_ookla(
        type="mobile",
        quarter="2023Q4",
        cache=tmp_path,
        bbox=bbox,
        base_url=server.url,
        progress=False,
    )
    assert info["mode"] == "row-groups"
    assert info["row_groups_read"] == 2 and info["row_groups_total"] == 8
    assert info["rows"] == 2000
    assert info["bytes_fetched"] < 0.5 * src.stat().st_size
    assert all(r[2] is not None for r in server.requests if r[0] == "GET")  # only ranges
    got = pq.read_table(tmp_path / "ookla" / key)
    assert got.num_rows == 2000 and got.schema.names == t.schema.names
    # cached for the same bbox
    again = dl.fetch_ookla(
        type="mobile",
        quarter="2023Q4",
        cache=tmp_path,
        bbox=bbox,
        base_url=server.url,
        progress=False,
    )
    assert again["cached"] is True


def test_full_download_without_tile_xy(server: _Server, tmp_path: Path) -> None:
    key = dl.ookla_key("fixed", "2021Q1")
    src = _write(
        server.root, key, _ookla_table(-157.9, 21.4, 500, seed=3, with_xy=False), row_group_size=100
    )
    info = dl.fetch_ookla(
        type="fixed",
        quarter="2021Q1",
        cache=tmp_path,
        bbox=(-158.5, 20.5, -157.0, 22.5),
        base_url=server.url,
        progress=False,
    )
    assert info["mode"] == "full"
    assert (tmp_path / "ookla" / key).read_bytes() == src.read_bytes()


def test_cli_download_state_then_ingest(server: _Server, tmp_path: Path) -> None:
    census = server.root / "census"
    states = gpd.GeoDataFrame(
        {"STUSPS": ["HI", "NC"], "NAME": ["Hawaii", "North Carolina"], "GEOID": ["15", "37"]},
        geometry=[shapely.box(-160.5, 18.5, -154.5, 22.5), shapely.box(-84, 33.5, -75, 37)],
        crs="EPSG:4269",
    )
    _shapefile_zip(states, census / "GENZ2018/shp/cb_2018_us_state_500k.zip")
    uac = gpd.GeoDataFrame(
        {"UACE20": ["89770"], "NAME20": ["Urban Honolulu, HI"]},
        geometry=[shapely.box(-158.0, 21.25, -157.6, 21.5)],
        crs="EPSG:4269",
    )
    _shapefile_zip(uac, census / "TIGER2020/UAC/tl_2020_us_uac20.zip")
    for q in (3, 4):
        t = pa.concat_tables(
            [
                _ookla_table(-157.9, 21.4, 800, seed=q, with_xy=True),
                _ookla_table(-80.0, 35.0, 800, seed=10 + q, with_xy=True),
            ]
        )
        _write(server.root / "ookla", dl.ookla_key("mobile", f"2023Q{q}"), t, row_group_size=400)
    cache = tmp_path / "cache"
    argv = ["download", "--type", "mobile", "--quarters", "2023Q3:2023Q4", "--state", "HI", "--cache", str(cache),
            "--base-url", server.url + "ookla/", "--census-base-url", server.url + "census/", "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    assert (cache / "census/cb_2018_us_state_500k.zip").is_file()
    assert (cache / "census/tl_2020_us_uac20.zip").is_file()
    run = tmp_path / "run"
    argv = ["ingest", "--tiles", str(cache / "ookla/parquet/performance"), "--type", "mobile", "--run", str(run),
            "--state", "HI", "--states-file", str(cache / "census/cb_2018_us_state_500k.zip"),
            "--urban-areas", str(cache / "census/tl_2020_us_uac20.zip")]  # fmt: skip
    assert cli.main(argv) == 0
    from geodbk.geo.table import read_tile_table

    t, meta = read_tile_table(run)
    assert meta["counts"]["kept"] == 1600 and meta["quarters"] == ["2023Q3", "2023Q4"]
    assert 0 < meta["counts"]["urban"] < 1600


def test_row_groups_either_side_of_the_180_meridian(server: _Server, tmp_path: Path) -> None:
    key = dl.ookla_key("mobile", "2023Q4")
    t = pa.concat_tables(
        [
            _ookla_table(179.0, 51.5, 1000, seed=1, with_xy=True),  # 179.0..179.55 E
            _ookla_table(10.0, 51.5, 3000, seed=2, with_xy=True),  # Europe, same latitudes
            _ookla_table(-179.9, 51.5, 1000, seed=3, with_xy=True),  # 179.9..179.35 W
        ]
    )
    _write(server.root, key, t, row_group_size=1000)
    frame = (178.9, 51.0, 180.7, 53.0)  # a region's frame: east of 180 is 179.3 W
    info = dl.fetch_ookla(
        type="mobile", quarter="2023Q4", cache=tmp_path, bbox=frame, base_url=server.url,
        progress=False,
    )  # fmt: skip
    assert info["row_groups_read"] == 2 and info["rows"] == 2000
    lon = pq.read_table(tmp_path / "ookla" / key)["tile_x"].to_numpy()
    assert ((lon > 178.9) | (lon < -179.3)).all() and (lon > 0).sum() == 1000


def _hawaii_states_zip(root: Path) -> None:
    states = gpd.GeoDataFrame(
        {"STUSPS": ["HI"], "NAME": ["Hawaii"], "GEOID": ["15"]},
        geometry=[shapely.box(-160.5, 18.5, -154.5, 22.5)],
        crs="EPSG:4269",
    )
    _shapefile_zip(states, root / "census" / dl.CENSUS_FILES["states"])


def test_no_census_with_state_fetches_only_the_state_file(server: _Server, tmp_path: Path) -> None:
    _hawaii_states_zip(server.root)
    t = _ookla_table(-157.9, 21.4, 200, seed=1, with_xy=True)
    _write(server.root / "ookla", dl.ookla_key("mobile", "2023Q4"), t, row_group_size=100)
    cache = tmp_path / "cache"
    argv = ["download", "--type", "mobile", "--quarters", "2023Q4", "--state", "HI", "--cache", str(cache),
            "--no-census", "--base-url", server.url + "ookla/", "--census-base-url", server.url + "census/",
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 0
    fetched = {path for _, path, _ in server.requests if path.startswith("/census/")}
    assert fetched == {"/census/" + dl.CENSUS_FILES["states"]}  # no urban areas
    assert sorted(p.name for p in (cache / "census").iterdir()) == ["cb_2018_us_state_500k.zip"]


def _closed_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    return f"http://127.0.0.1:{port}/"  # nothing listens there now


def test_an_unreachable_census_url_names_census_base_url(
    server: _Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["download", "--type", "mobile", "--quarters", "2023Q4", "--state", "HI", "--cache",
            str(tmp_path / "cache"), "--base-url", server.url, "--census-base-url", _closed_port_url(),
            "--no-progress"]  # fmt: skip
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert "cannot connect" in err and "--census-base-url" in err
    assert "or --base-url" not in err
    # an unreachable Ookla bucket still names --base-url
    with pytest.raises(dl.DownloadError, match=r"check the network or --base-url$"):
        dl.fetch(_closed_port_url() + "x.parquet", tmp_path / "x.parquet", progress=False)
