"""Downloading one http(s) source into a file: size limit, sha256, clear errors.

Credentials are the caller's: an `Authorization` header value resolved by the operator
from the ModelDeployment's Secret (or, in local mode, from a file) and handed in with the
desired set. This module never looks them up, never logs them, and leaves them out of
every error message. httpx drops the header on a redirect to another origin. No error
message carries an exception's text that could quote the header.
"""

from __future__ import annotations

import hashlib
import logging
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelswap_sidecar.sources.errors import (
    CredentialsInvalid,
    SourceDigestMismatch,
    SourceNotFound,
    SourceTooLarge,
    SourceUnreachable,
)

log = logging.getLogger(__name__)

_CHUNK_BYTES = 1 << 20
#: A header value h11 sends: visible ASCII, inner spaces and tabs.
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e\t]*[\x21-\x7e])?")


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
    headers: Mapping[str, str] | None = None,
) -> Fetched:
    """Stream `uri` into `target` (created); raise a `SourceError` naming the field.
    `headers`: the credential's other headers (`credentials.headers`), sent as given."""
    # Userinfo travels as basic auth, so the URL that httpx logs carries no password; an
    # explicit `authorization` wins over it.
    shown, basic_auth = _split_userinfo(uri)
    if authorization is not None and _HEADER_VALUE.fullmatch(authorization) is None:
        # refused here, before httpx: its transport logs a refused header verbatim at debug
        raise CredentialsInvalid(
            "the Authorization value holds characters a header cannot carry (control "
            "characters or non-ASCII); fix the Secret"
        )
    for name, value in (headers or {}).items():
        if _HEADER_VALUE.fullmatch(value) is None:
            raise CredentialsInvalid(
                f"credentials.headers.{name}: the value holds characters a header cannot "
                "carry (control characters or non-ASCII); fix the Secret"
            )
    headers = {**(headers or {}), **({"Authorization": authorization} if authorization else {})}
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
    except httpx.NetworkError as e:  # the socket's or TLS's own words: no request in them
        raise SourceUnreachable(f"{shown}: unreachable: {e or type(e).__name__}") from e
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as e:
        # Any other error's text can quote the request's headers (h11: `Illegal header
        # value b'Bearer …'`; a non-ASCII value's UnicodeEncodeError), so only its type is
        # shown, and it is not chained (a logged traceback would print it).
        raise SourceUnreachable(f"{shown}: unreachable ({type(e).__name__})") from None
    actual = digest.hexdigest()
    if expected_sha256 is not None and actual != expected_sha256.lower():
        raise SourceDigestMismatch(
            f"{shown} has sha256 {actual}, not the expected {expected_sha256.lower()}"
        )
    log.info("fetched %s: %d bytes, sha256 %s", shown, size_bytes, actual)
    return Fetched(target, size_bytes, actual)
