"""`credentials.headers` other than `authorization` are sent with the source request (issue
12, finding 11: they were dropped): a header a request cannot carry is refused naming
`credentials.headers.<name>`, never its value, and the cache key covers every header."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web

from modelswap_api.control import SourceCredentials
from modelswap_api.models import Source
from modelswap_sidecar.agent.core.loading import authorization_of, source_headers_of
from modelswap_sidecar.sources.cache import CacheSettings, SourceCache
from modelswap_sidecar.sources.errors import CredentialsInvalid, SourceError, SourceUnreachable
from modelswap_sidecar.sources.resolver import SourceResolver
from tests.unit.test_sources import model_archive

MiB = 1 << 20
KEY = "k3y-s3cret"


@pytest_asyncio.fixture
async def origin() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    archive = model_archive()

    async def keyed(request: web.Request) -> web.StreamResponse:
        seen.append({k.lower(): v for k, v in request.headers.items()})
        if request.headers.get("X-Api-Key") != KEY:
            raise web.HTTPUnauthorized()
        return web.Response(body=archive)

    app = web.Application()
    app.router.add_get("/keyed/echo.tar.gz", keyed)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}/keyed/echo.tar.gz", seen
    finally:
        await runner.cleanup()


def new_cache(root: Path) -> SourceCache:
    return SourceCache(
        CacheSettings(
            root=root, capacity_bytes=64 * MiB, max_download_bytes=8 * MiB, trust_env=False
        )
    )


@pytest.mark.asyncio
async def test_other_headers_are_sent_and_key_the_cache(
    origin: tuple[str, list[dict[str, str]]], tmp_path: Path
) -> None:
    uri, seen = origin
    cache = new_cache(tmp_path / "cache")
    credentials = SourceCredentials(
        headers={"X-Api-Key": KEY + "\n", "X-Team": "ml", "Authorization": "Bearer t"}
    )
    resolver = SourceResolver(cache)
    resolved = await resolver.resolve(
        Source(uri=uri),
        authorization=authorization_of(credentials),
        headers=source_headers_of(credentials),
    )
    assert (resolved.model_dir / "config.pbtxt").is_file()
    assert seen[-1]["x-api-key"] == KEY and seen[-1]["x-team"] == "ml"
    assert seen[-1]["authorization"] == "Bearer t"
    with pytest.raises(SourceUnreachable, match="HTTP 401"):
        await cache.fetch(uri, headers={"X-Api-Key": "other"})  # not a hit: the origin says no
    with pytest.raises(SourceUnreachable, match="HTTP 401"):
        await cache.fetch(uri)
    again = await cache.fetch(uri, authorization="Bearer t", headers={"x-team": "ml",
                                                                     "X-API-KEY": KEY})  # fmt: skip
    assert again.key == resolved.cache_key and len(seen) == 3  # the same proof: a hit
    assert all(KEY not in path.name for path in (tmp_path / "cache").iterdir())
    await cache.close()


@pytest.mark.asyncio
async def test_a_value_a_header_cannot_carry_is_refused_by_name_and_never_echoed(
    origin: tuple[str, list[dict[str, str]]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uri, seen = origin
    caplog.set_level(logging.DEBUG)
    cache = new_cache(tmp_path / "cache")
    for value in ("leaked\x7fkey", "leaked-kéy"):
        with pytest.raises(SourceError, match=r"credentials\.headers\.X-Api-Key: ") as caught:
            await cache.fetch(uri, headers={"X-Api-Key": value})
        assert "leaked" not in str(caught.value)
    assert "leaked" not in caplog.text and seen == []
    await cache.close()


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"Host": "evil.example"}, "credentials.headers.Host: "),
        ({"Content-Length": "0"}, "credentials.headers.Content-Length: "),
        ({"X Bad": "v"}, "credentials.headers.X Bad: "),
        ({"X-Key": "leaked\r\nX-Other: 1"}, "credentials.headers.X-Key value"),
    ],
)
def test_a_header_a_request_cannot_carry_is_refused_naming_it(
    headers: dict[str, str], named: str
) -> None:
    with pytest.raises(CredentialsInvalid) as caught:
        source_headers_of(SourceCredentials(headers=headers))
    assert named in str(caught.value) and "leaked" not in str(caught.value)
    assert "evil" not in str(caught.value)


def test_authorization_stays_with_authorization_of() -> None:
    credentials = SourceCredentials(headers={"authorization": "X y", "X-Key": " v "})
    assert source_headers_of(credentials) == {"X-Key": "v"}
    assert authorization_of(credentials) == "X y"
    assert source_headers_of(None) == {}
