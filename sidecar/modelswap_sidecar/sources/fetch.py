"""Downloading one http(s) source into a file: size limit, sha256, clear errors.

Credentials are the caller's: an `Authorization` header value resolved by the operator
from the ModelDeployment's Secret (or, in local mode, from a file) and handed in with the
desired set. This module never looks them up, never logs them, and leaves them out of
every error message. httpx drops the header on a redirect to another origin.
"""

from __future__ import annotations

import hashlib
import logging
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelswap_sidecar.sources.errors import (
    SourceDigestMismatch,
    SourceNotFound,
    SourceTooLarge,
    SourceUnreachable,
)

log = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Fetched:
    path: Path
    size_bytes: int
    sha256: str


def _split_userinfo(uri: str) -> tuple[str, httpx.BasicAuth | None]:
    """The URI without `user:password@`, and those as basic auth (None when absent)."""
    parts = urllib.parse.urlsplit(uri)
    if parts.username is None and parts.password is None:
        return uri, None
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port else host
    auth = httpx.BasicAuth(
        urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or "")
    )
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), auth


def display_uri(uri: str) -> str:
    """The URI for messages and logs: user:password@ removed (query strings are the user's)."""
    return _split_userinfo(uri)[0]


async def fetch_to_file(
    client: httpx.AsyncClient,
    uri: str,
    target: Path,
    *,
    max_bytes: int,
    expected_sha256: str | None = None,
    authorization: str | None = None,
) -> Fetched:
    """Stream `uri` into `target` (created); raise a `SourceError` naming the field."""
    # Userinfo travels as basic auth, so the URL that httpx logs carries no password; an
    # explicit `authorization` wins over it.
    shown, basic_auth = _split_userinfo(uri)
    headers = {"Authorization": authorization} if authorization else {}
    auth = basic_auth if basic_auth is not None and not authorization else None
    digest = hashlib.sha256()
    size_bytes = 0
    try:
        async with client.stream(
            "GET", shown, headers=headers, auth=auth, follow_redirects=True
        ) as response:
            if response.status_code == 404:
                raise SourceNotFound(f"{shown}: HTTP 404 Not Found")
            if response.status_code != 200:
                raise SourceUnreachable(
                    f"{shown}: HTTP {response.status_code} {response.reason_phrase}"
                )
            declared = response.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                raise SourceTooLarge(
                    f"{shown}: {int(declared)} bytes, over the limit of {max_bytes} bytes"
                )
            with target.open("wb") as out:
                async for chunk in response.aiter_bytes(_CHUNK_BYTES):
                    size_bytes += len(chunk)
                    if size_bytes > max_bytes:
                        raise SourceTooLarge(f"{shown}: more than the limit of {max_bytes} bytes")
                    digest.update(chunk)
                    out.write(chunk)
    except httpx.TimeoutException as e:
        raise SourceUnreachable(f"{shown}: timed out ({type(e).__name__})") from e
    except httpx.TransportError as e:
        raise SourceUnreachable(f"{shown}: unreachable: {e or type(e).__name__}") from e
    except httpx.HTTPError as e:
        raise SourceUnreachable(f"{shown}: {e or type(e).__name__}") from e
    actual = digest.hexdigest()
    if expected_sha256 is not None and actual != expected_sha256.lower():
        raise SourceDigestMismatch(
            f"{shown} has sha256 {actual}, not the expected {expected_sha256.lower()}"
        )
    log.info("fetched %s: %d bytes, sha256 %s", shown, size_bytes, actual)
    return Fetched(target, size_bytes, actual)
