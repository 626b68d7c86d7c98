"""Model sources: mounted paths, http(s) `.tar.gz` fetched into the node-local cache from a
server on 127.0.0.1 (size limit, sha256, credentials, atomic entries, LRU eviction, safe
unpacking). Every failure names `spec.model.source`."""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import socket
import tarfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from modelswap_api.models import Source
from modelswap_sidecar.sources.archive import unpack_tar_gz
from modelswap_sidecar.sources.cache import CacheSettings, SourceCache
from modelswap_sidecar.sources.errors import (
    SourceDigestMismatch,
    SourceError,
    SourceInvalid,
    SourceNotFound,
    SourceTooLarge,
    SourceUnreachable,
)
from modelswap_sidecar.sources.resolver import SourceResolver

MODEL = Path(__file__).resolve().parents[1] / "data" / "triton_models" / "echo"
TOKEN = "Bearer s3cret-token-value"
MiB = 1 << 20


def tar_gz(files: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buffer.getvalue()


def model_archive(top: str = "echo", padding_bytes: int = 0) -> bytes:
    files = {
        f"{top}/{p.relative_to(MODEL)}": p.read_bytes() for p in MODEL.rglob("*") if p.is_file()
    }
    if padding_bytes:
        files[f"{top}/1/padding.bin"] = b"\0" * padding_bytes
    return tar_gz(files)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Server:
    base: str
    archives: dict[str, bytes]
    hits: dict[str, int] = field(default_factory=dict)
    authorizations: list[str | None] = field(default_factory=list)

    def url(self, path: str) -> str:
        return f"{self.base}{path}"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[Server]:
    state = Server("", {})

    async def archive(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        state.hits[name] = state.hits.get(name, 0) + 1
        if name not in state.archives:
            raise web.HTTPNotFound()
        return web.Response(body=state.archives[name], content_type="application/gzip")

    async def private(request: web.Request) -> web.StreamResponse:
        state.authorizations.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != TOKEN:
            raise web.HTTPUnauthorized()
        return web.Response(body=state.archives["echo.tar.gz"])

    async def basic(request: web.Request) -> web.StreamResponse:
        state.authorizations.append(request.headers.get("Authorization"))
        return web.Response(body=state.archives["echo.tar.gz"])

    async def endless(request: web.Request) -> web.StreamResponse:
        # No Content-Length: the limit must hold while streaming.
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(64):
            await response.write(b"\x1f\x8b" + b"\0" * (MiB - 2))
        await response.write_eof()
        return response

    async def redirect(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/models/echo.tar.gz")

    app = web.Application()
    app.router.add_get("/models/{name}", archive)
    app.router.add_get("/private/echo.tar.gz", private)
    app.router.add_get("/basic/echo.tar.gz", basic)
    app.router.add_get("/endless.tar.gz", endless)
    app.router.add_get("/moved.tar.gz", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    state.base = f"http://{host}:{port}"
    state.archives["echo.tar.gz"] = model_archive()
    try:
        yield state
    finally:
        await runner.cleanup()


def new_cache(
    root: Path, *, capacity_bytes: int = 64 * MiB, max_download_bytes: int = 8 * MiB
) -> SourceCache:
    settings = CacheSettings(root=root, capacity_bytes=capacity_bytes,
                             max_download_bytes=max_download_bytes, trust_env=False)  # fmt: skip
    return SourceCache(settings)


def leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith(".tmp-"))


@pytest.mark.asyncio
async def test_a_fetched_archive_is_verified_unpacked_cached_and_adopted_after_a_restart(
    server: Server, tmp_path: Path
) -> None:
    digest = sha256(server.archives["echo.tar.gz"])
    source = Source(uri=server.url("/models/echo.tar.gz"), sha256=digest)
    cache = new_cache(tmp_path / "cache")
    resolver = SourceResolver(cache)
    resolved = await resolver.resolve(source)
    assert (resolved.model_dir / "config.pbtxt").read_bytes() == (
        MODEL / "config.pbtxt"
    ).read_bytes()
    assert (resolved.model_dir / "1" / "model.py").is_file()
    assert resolved.sha256 == digest
    again = await resolver.resolve(source)
    assert again == resolved
    assert server.hits["echo.tar.gz"] == 1, "the second resolve is a cache hit"
    assert cache.entries()[0].in_use == 2
    await cache.close()

    # A new agent over the same folder adopts the entry without fetching.
    restarted = new_cache(tmp_path / "cache")
    assert [e.model_dir for e in restarted.entries()] == [resolved.model_dir]
    assert (await SourceResolver(restarted).resolve(source)).model_dir == resolved.model_dir
    assert server.hits["echo.tar.gz"] == 1
    await restarted.close()


@pytest.mark.asyncio
async def test_an_entry_is_readable_by_another_uid(server: Server, tmp_path: Path) -> None:
    """Triton runs under its own uid and loads the model from the cache entry: every folder
    on the way is enterable and every file readable by others, none writable by them."""
    source = Source(uri=server.url("/models/echo.tar.gz"))
    cache = new_cache(tmp_path / "cache")
    resolved = await SourceResolver(cache).resolve(source)
    await cache.close()
    paths = [*resolved.model_dir.relative_to(tmp_path).parents][:-1]
    for path in [*(tmp_path / p for p in paths), *resolved.model_dir.rglob("*")]:
        mode = path.stat().st_mode
        assert mode & (0o005 if path.is_dir() else 0o004), f"{path}: {oct(mode)}"
        assert not mode & 0o002, f"{path}: {oct(mode)}"


@pytest.mark.asyncio
async def test_a_redirect_is_followed(server: Server, tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "cache")
    entry = await cache.fetch(server.url("/moved.tar.gz"))
    assert (entry.model_dir / "config.pbtxt").is_file()
    await cache.close()


@pytest.mark.asyncio
async def test_a_wrong_sha256_is_refused_naming_the_field_and_nothing_is_kept(
    server: Server, tmp_path: Path
) -> None:
    cache = new_cache(tmp_path / "cache")
    source = Source(uri=server.url("/models/echo.tar.gz"), sha256="0" * 64)
    with pytest.raises(SourceDigestMismatch) as caught:
        await SourceResolver(cache).resolve(source)
    message = str(caught.value)
    assert message.startswith("spec.model.source.sha256: ")
    assert sha256(server.archives["echo.tar.gz"]) in message and "0" * 64 in message
    assert cache.entries() == [] and leftovers(tmp_path / "cache") == []
    await cache.close()


@pytest.mark.asyncio
async def test_a_missing_url_is_a_404_naming_the_field(server: Server, tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "cache")
    with pytest.raises(
        SourceNotFound,
        match=r"^spec\.model\.source: http://127\.0\.0\.1:\d+/models/nope\.tar\.gz: HTTP 404",
    ):
        await cache.fetch(server.url("/models/nope.tar.gz"))
    assert leftovers(tmp_path / "cache") == []
    await cache.close()


@pytest.mark.asyncio
async def test_too_big_is_refused_by_content_length_and_while_streaming(
    server: Server, tmp_path: Path
) -> None:
    server.archives["big.tar.gz"] = model_archive(padding_bytes=0) + b"\0" * (2 * MiB)
    cache = new_cache(tmp_path / "cache", max_download_bytes=1 * MiB)
    with pytest.raises(
        SourceTooLarge, match=r"^spec\.model\.source: .*over the limit of 1048576 bytes"
    ):
        await cache.fetch(server.url("/models/big.tar.gz"))
    with pytest.raises(
        SourceTooLarge, match=r"^spec\.model\.source: .*more than the limit of 1048576 bytes"
    ):
        await cache.fetch(server.url("/endless.tar.gz"))
    assert cache.entries() == [] and leftovers(tmp_path / "cache") == []
    await cache.close()


@pytest.mark.asyncio
async def test_an_unreachable_server_names_the_field(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = new_cache(tmp_path / "cache")
    with pytest.raises(
        SourceUnreachable,
        match=r"^spec\.model\.source: http://127\.0\.0\.1:\d+/m\.tar\.gz: unreachable",
    ):
        await cache.fetch(f"http://127.0.0.1:{port}/m.tar.gz")
    await cache.close()


@pytest.mark.asyncio
async def test_credentials_are_sent_as_given_and_never_shown(
    server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    cache = new_cache(tmp_path / "cache")
    resolver = SourceResolver(cache)
    source = Source(uri=server.url("/private/echo.tar.gz"))
    with pytest.raises(SourceUnreachable, match="HTTP 401") as caught:
        await resolver.resolve(source, authorization="Bearer wrong")
    assert "wrong" not in str(caught.value)
    resolved = await resolver.resolve(source, authorization=TOKEN)
    assert (resolved.model_dir / "config.pbtxt").is_file()
    assert server.authorizations == ["Bearer wrong", TOKEN]
    assert "s3cret" not in caplog.text
    # user:password in the URL stays out of messages too.
    userinfo = server.url("/models/nope.tar.gz").replace("http://", "http://user:hunter2@")
    with pytest.raises(SourceNotFound) as missing:
        await cache.fetch(userinfo)
    assert "hunter2" not in str(missing.value) and "hunter2" not in caplog.text
    # ... and is sent as basic auth.
    await cache.fetch(server.url("/basic/echo.tar.gz").replace("http://", "http://user:hunter2@"))
    assert server.authorizations[-1] == "Basic " + base64.b64encode(b"user:hunter2").decode()
    assert "hunter2" not in caplog.text
    await cache.close()


@pytest.mark.asyncio
async def test_unused_entries_are_evicted_least_recently_used_first(
    server: Server, tmp_path: Path
) -> None:
    for name in ("a", "b", "c", "d"):
        server.archives[f"{name}.tar.gz"] = model_archive(top=name, padding_bytes=3 * MiB)
    cache = new_cache(tmp_path / "cache", capacity_bytes=7 * MiB)  # two entries fit
    clock = iter(range(1000, 2000))
    cache._clock = lambda: float(next(clock))  # deterministic last-use order

    a = await cache.fetch(server.url("/models/a.tar.gz"))
    b = await cache.fetch(server.url("/models/b.tar.gz"))
    cache.release(b.key)
    cache.release(a.key)
    await cache.fetch(server.url("/models/a.tar.gz"))  # a used again, after b
    cache.release(a.key)
    c = await cache.fetch(server.url("/models/c.tar.gz"))  # evicts b, the least recently used
    assert {e.key for e in cache.entries()} == {a.key, c.key}
    assert not b.model_dir.exists()
    assert cache.used_bytes() <= 7 * MiB

    # c is in use and a is not: d evicts a; nothing in use is ever evicted.
    d = await cache.fetch(server.url("/models/d.tar.gz"))
    assert {e.key for e in cache.entries()} == {c.key, d.key}
    with pytest.raises(SourceTooLarge, match=r"^spec\.model\.source: .* source cache"):
        await cache.fetch(server.url("/models/a.tar.gz"))  # c and d are both in use
    assert {e.key for e in cache.entries()} == {c.key, d.key}
    assert (c.model_dir / "config.pbtxt").is_file() and (d.model_dir / "config.pbtxt").is_file()
    await cache.close()


@pytest.mark.asyncio
async def test_a_different_sha256_never_reuses_an_entry(server: Server, tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "cache")
    await cache.fetch(server.url("/models/echo.tar.gz"))
    with pytest.raises(SourceDigestMismatch):
        await cache.fetch(server.url("/models/echo.tar.gz"), sha256="1" * 64)
    await cache.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("archive", "expected"),
    [
        (tar_gz({"../evil.txt": b"x"}), "points outside the model directory"),
        (tar_gz({"/etc/evil.txt": b"x"}), "points outside the model directory"),
        (tar_gz({"echo/config.pbtxt": b""}, links={"echo/1/model.py": "/etc/passwd"}), "is a link"),
        (tar_gz({"echo/README": b"no config"}), "holds no config.pbtxt"),
        (b"PK\x03\x04 a zip file", "not a .tar.gz"),
        (b"\x1f\x8b\x08\x00 truncated", "tar.gz"),
    ],
    ids=["dotdot", "absolute", "symlink", "no-config", "not-gzip", "truncated"],
)
async def test_unsafe_or_wrong_archives_are_refused(
    server: Server, tmp_path: Path, archive: bytes, expected: str
) -> None:
    server.archives["bad.tar.gz"] = archive
    cache = new_cache(tmp_path / "cache")
    with pytest.raises(SourceInvalid, match=r"^spec\.model\.source: ") as caught:
        await cache.fetch(server.url("/models/bad.tar.gz"))
    assert expected in str(caught.value)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "cache" / "evil.txt").exists()
    assert cache.entries() == [] and leftovers(tmp_path / "cache") == []
    await cache.close()


def test_unpacking_stops_at_the_size_limit(tmp_path: Path) -> None:
    archive = tmp_path / "m.tar.gz"
    archive.write_bytes(tar_gz({"config.pbtxt": b"", "1/w.bin": b"\0" * (2 * MiB)}))
    with pytest.raises(SourceTooLarge, match="unpacks to more than"):
        unpack_tar_gz(archive, tmp_path / "out", origin="/m.tar.gz", max_unpacked_bytes=MiB)


@pytest.mark.asyncio
async def test_mounted_paths(tmp_path: Path) -> None:
    cache = new_cache(tmp_path / "cache")
    resolver = SourceResolver(cache)
    in_place = await resolver.resolve(Source(uri=str(MODEL)))
    assert in_place.model_dir == MODEL and in_place.cache_key is None
    resolver.release(in_place)  # nothing to release: fine

    with pytest.raises(SourceNotFound, match=r"^spec\.model\.source: /nowhere/llama: no such file"):
        await resolver.resolve(Source(uri="/nowhere/llama"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceInvalid, match=r"^spec\.model\.source: .*no config\.pbtxt"):
        await resolver.resolve(Source(uri=str(tmp_path / "empty")))
    with pytest.raises(SourceInvalid, match=r"^spec\.model\.source\.sha256: .* is a directory"):
        await resolver.resolve(Source(uri=str(MODEL), sha256="0" * 64))

    # A mounted .tar.gz is unpacked into the cache, its sha256 checked.
    archive = tmp_path / "echo.tar.gz"
    archive.write_bytes(model_archive())
    unpacked = await resolver.resolve(Source(uri=str(archive), sha256=sha256(archive.read_bytes())))
    assert (unpacked.model_dir / "config.pbtxt").is_file() and unpacked.cache_key is not None
    with pytest.raises(SourceDigestMismatch):
        await resolver.resolve(Source(uri=str(archive), sha256="2" * 64))
    await cache.close()


def test_every_source_error_names_the_field() -> None:
    for error in SourceError.__subclasses__():
        assert str(error("x")).startswith("spec.model.source")


@pytest.mark.asyncio
async def test_a_header_value_httpx_refuses_is_never_echoed(
    server: Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12, finding 4: h11's `Illegal header value b'Bearer …'` reached status and log
    (httpcore also logs it at debug): such a value is refused before httpx sees it."""
    caplog.set_level(logging.DEBUG)
    cache = new_cache(tmp_path / "cache")
    for value in ("Bearer leaked-token\n", "Bearer leaked-token\x7f", "Bearer leaked-tökén"):
        with pytest.raises(SourceError, match=r"credentialsSecretRef: .*fix the Secret") as caught:
            await cache.fetch(server.url("/private/echo.tar.gz"), authorization=value)
        assert "leaked" not in str(caught.value)
    assert "leaked" not in caplog.text and server.authorizations == []
    await cache.close()


@pytest.mark.asyncio
async def test_a_source_fetched_with_credentials_is_never_served_to_other_credentials(
    server: Server, tmp_path: Path
) -> None:
    """Issue 12, finding 5: the cache was keyed by URL only, so a model without credentials
    (another namespace) got the bytes another namespace's Secret had unlocked."""
    cache = new_cache(tmp_path / "cache")
    uri = server.url("/private/echo.tar.gz")
    first = await cache.fetch(uri, authorization=TOKEN)
    with pytest.raises(SourceUnreachable, match="HTTP 401"):
        await cache.fetch(uri)  # no credentials: the origin is asked, and refuses
    with pytest.raises(SourceUnreachable, match="HTTP 401"):
        await cache.fetch(uri, authorization="Bearer other")
    again = await cache.fetch(uri, authorization=TOKEN)  # the same credentials: a hit
    assert again.key == first.key
    assert server.authorizations == [TOKEN, None, "Bearer other"]
    assert all("s3cret" not in path.name for path in (tmp_path / "cache").iterdir())
    await cache.close()
