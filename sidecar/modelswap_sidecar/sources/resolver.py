"""Where a model's directory is, from its `spec.model.source`.

- An absolute path to a directory the node pod mounts is used in place; it must hold
  `config.pbtxt`. A `sha256` is refused there (it is the digest of a file).
- An absolute path to a mounted `.tar.gz` is unpacked into the source cache (its `sha256`,
  if given, checked first).
- An http(s) URL of a `.tar.gz` is fetched into the source cache (size limit, `sha256`,
  atomic rename), with the `Authorization` header value the caller passes (the operator
  resolves the Secret; this code reads no Secrets).

A model holds its cache entry while loaded: `release` it when the model is unloaded, so the
entry may be evicted. Every failure is a `SourceError` whose message names the field.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from modelswap_api.models import Source
from modelswap_sidecar.sources.archive import CONFIG_FILE_NAME
from modelswap_sidecar.sources.cache import SourceCache
from modelswap_sidecar.sources.errors import SHA256_FIELD, SourceInvalid, SourceNotFound

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResolvedSource:
    model_dir: Path
    #: The cache entry the model holds; None for a mounted directory used in place.
    cache_key: str | None
    #: sha256 of the archive the model came from; None for a mounted directory.
    sha256: str | None = None


def _check_mounted_directory(source: Source, path: Path) -> bool:
    """True for a usable mounted model directory, False for a file; raise otherwise."""
    if path.is_dir():
        if source.sha256 is not None:
            raise SourceInvalid(
                f"{source.uri} is a directory; sha256 applies to a .tar.gz (fetched or"
                " mounted), not to a directory",
                field=SHA256_FIELD,
            )
        if not (path / CONFIG_FILE_NAME).is_file():
            raise SourceInvalid(f"{source.uri}: no {CONFIG_FILE_NAME} in this directory")
        return True
    if path.is_file():
        return False
    raise SourceNotFound(f"{source.uri}: no such file or directory on this node (is it mounted?)")


class SourceResolver:
    def __init__(self, cache: SourceCache) -> None:
        self.cache = cache

    async def resolve(
        self,
        source: Source,
        *,
        authorization: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ResolvedSource:
        """The source's model folder; an http(s) source is fetched with the credential's
        `authorization` and other `headers` (a mounted one needs none)."""
        if source.is_url:
            entry = await self.cache.fetch(
                source.uri, sha256=source.sha256, authorization=authorization, headers=headers
            )
            return ResolvedSource(entry.model_dir, entry.key, entry.sha256)
        path = Path(source.uri)
        if not path.is_absolute():
            raise SourceInvalid(f"{source.uri}: neither an absolute path nor an http(s) URL")
        # A mounted volume may be slow (NFS): look at it off the event loop.
        if await asyncio.to_thread(_check_mounted_directory, source, path):
            return ResolvedSource(path, None)
        entry = await self.cache.unpack_file(path, sha256=source.sha256)
        return ResolvedSource(entry.model_dir, entry.key, entry.sha256)

    def release(self, resolved: ResolvedSource) -> None:
        if resolved.cache_key is not None:
            self.cache.release(resolved.cache_key)
