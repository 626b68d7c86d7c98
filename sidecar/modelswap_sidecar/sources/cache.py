"""The node-local cache of fetched (or mounted) `.tar.gz` model sources.

Layout under `root` (the agent's, 0700):

    <key>/meta.json        what the entry is; its mtime is the entry's last use
    <key>/unpacked/...     the unpacked archive (the model directory is in there)
    .tmp-<key>-<random>/   a fetch in progress; removed on failure and at start

An entry appears by one atomic rename of a finished temporary folder, so a crash never
leaves a half entry under a real key. Entries are keyed by what was asked (the URI and the
expected sha256; for a mounted archive its path, size and mtime), so a request with a
different `sha256` never reuses a wrong entry. Without a `sha256`, a cached URI is reused
until it is evicted. A fetched entry is keyed by the credentials that fetched it too (a
digest of the Authorization value, never the value): bytes one namespace's Secret unlocked
are never handed to a model that presents other credentials, or none — that model fetches
for itself and the origin decides.

Size: every entry's unpacked bytes count against `capacity_bytes`; making room evicts
unused entries, least recently used first. An entry is in use from `fetch`/`unpack_file`
until `release` (a loaded model holds its entry). One download is limited to
`max_download_bytes`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from modelswap_sidecar.sources.archive import is_gzip, model_directory, unpack_tar_gz
from modelswap_sidecar.sources.errors import (
    SourceDigestMismatch,
    SourceInvalid,
    SourceNotFound,
    SourceTooLarge,
)
from modelswap_sidecar.sources.fetch import display_uri, fetch_to_file

log = logging.getLogger(__name__)

META_NAME = "meta.json"
UNPACKED_NAME = "unpacked"
TMP_PREFIX = ".tmp-"
_HASH_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class CacheSettings:
    root: Path
    capacity_bytes: int
    max_download_bytes: int
    connect_timeout_seconds: float = 10.0
    read_timeout_seconds: float = 60.0
    #: Let httpx take proxies and CA bundles from the environment (read when the cache starts).
    trust_env: bool = True


@dataclass(frozen=True)
class CacheEntry:
    key: str
    model_dir: Path
    size_bytes: int
    #: sha256 of the fetched (or mounted) archive.
    sha256: str
    #: The source as shown in messages (credentials stripped).
    origin: str
    last_used_seconds: float
    in_use: int


@dataclass
class _Entry:
    key: str
    model_dir: Path
    size_bytes: int
    sha256: str
    origin: str
    last_used_seconds: float
    in_use: int = 0

    def frozen(self) -> CacheEntry:
        return CacheEntry(self.key, self.model_dir, self.size_bytes, self.sha256, self.origin,
                          self.last_used_seconds, self.in_use)  # fmt: skip


def _key(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _access_of(authorization: str | None, headers: Mapping[str, str] | None = None) -> str:
    """What proved access to a fetched source, as part of its cache key: a digest of the
    Authorization value and of every other credential header (empty without any). A
    digest, so the key and the folder name under the cache root carry no usable secret."""
    sent = sorted((name.lower(), value) for name, value in (headers or {}).items())
    if not authorization and not sent:
        return ""
    proof = [(authorization or "").strip(), *(f"{name}: {value}" for name, value in sent)]
    return "auth:" + hashlib.sha256("\n".join(proof).encode()).hexdigest()


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


class SourceCache:
    """Create inside a running event loop (it owns an `httpx.AsyncClient` unless given one)."""

    def __init__(
        self,
        settings: CacheSettings,
        *,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._clock = clock
        self._own_client = client is None
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(settings.read_timeout_seconds,
                                  connect=settings.connect_timeout_seconds),
            trust_env=settings.trust_env,
        )  # fmt: skip
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # Readable, not writable, by Triton's uid: it loads the models from here.
        settings.root.mkdir(parents=True, exist_ok=True, mode=0o755)
        self._scan()

    async def close(self) -> None:
        if self._own_client:
            await self._client.aclose()

    def _scan(self) -> None:
        """Adopt the entries a previous agent left; drop temporaries and broken entries."""
        for path in self.settings.root.iterdir():
            if path.name.startswith(TMP_PREFIX):
                shutil.rmtree(path, ignore_errors=True)
                continue
            meta_path = path / META_NAME
            try:
                meta = json.loads(meta_path.read_text())
                entry = _Entry(
                    key=path.name,
                    model_dir=path / UNPACKED_NAME / meta["model_dir"],
                    size_bytes=int(meta["size_bytes"]),
                    sha256=str(meta["sha256"]),
                    origin=str(meta["origin"]),
                    last_used_seconds=meta_path.stat().st_mtime,
                )
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("source cache: removing unreadable entry %s (%s)", path.name, e)
                shutil.rmtree(path, ignore_errors=True)
                continue
            self._entries[entry.key] = entry
        if self._entries:
            log.info("source cache: adopted %d entries, %d bytes", len(self._entries),
                     self.used_bytes())  # fmt: skip

    def entries(self) -> list[CacheEntry]:
        return sorted((e.frozen() for e in self._entries.values()), key=lambda e: e.key)

    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self._entries.values())

    def release(self, key: str) -> None:
        """The caller no longer uses the entry (its model was unloaded): it may be evicted."""
        entry = self._entries.get(key)
        if entry is not None and entry.in_use > 0:
            entry.in_use -= 1

    def _touch(self, entry: _Entry) -> None:
        now = self._clock()
        entry.last_used_seconds = now
        with contextlib.suppress(OSError):
            os.utime(self.settings.root / entry.key / META_NAME, (now, now))

    def _hit(self, key: str) -> CacheEntry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if not entry.model_dir.is_dir():
            log.warning("source cache: entry %s lost its files; fetching again", key)
            self._drop(entry)
            return None
        entry.in_use += 1
        self._touch(entry)
        log.debug("source cache hit %s (%s)", key, entry.origin)
        return entry.frozen()

    def _drop(self, entry: _Entry) -> None:
        self._entries.pop(entry.key, None)
        shutil.rmtree(self.settings.root / entry.key, ignore_errors=True)

    def _make_room(self, needed_bytes: int, origin: str) -> None:
        """Evict unused entries, least recently used first, until `needed_bytes` fit."""
        capacity = self.settings.capacity_bytes
        victims = sorted((e for e in self._entries.values() if e.in_use == 0),
                         key=lambda e: e.last_used_seconds)  # fmt: skip
        free = capacity - self.used_bytes()
        if free + sum(v.size_bytes for v in victims) < needed_bytes:
            raise SourceTooLarge(
                f"{origin}: needs {needed_bytes} bytes in the source cache, which holds"
                f" {capacity} bytes of which {capacity - free} are used, some by loaded models"
            )
        for victim in victims:
            if free >= needed_bytes:
                break
            log.info("source cache: evicting %s (%s, %d bytes)", victim.key, victim.origin,
                     victim.size_bytes)  # fmt: skip
            self._drop(victim)
            free += victim.size_bytes

    async def fetch(
        self,
        uri: str,
        *,
        sha256: str | None = None,
        authorization: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> CacheEntry:
        """The cache entry of an http(s) `.tar.gz`, fetched unless cached; marks it in use.
        Keyed by every credential sent (`authorization`, `headers`)."""
        key = _key("url", uri, (sha256 or "").lower(), _access_of(authorization, headers))
        origin = display_uri(uri)
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (hit := self._hit(key)) is not None:
                return hit
            tmp = self._tmp_dir(key)
            try:
                fetched = await fetch_to_file(
                    self._client, uri, tmp / "archive", max_bytes=self.settings.max_download_bytes,
                    expected_sha256=sha256, authorization=authorization, headers=headers,
                )  # fmt: skip
                return await self._install(key, tmp, fetched.path, fetched.sha256, origin)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    async def unpack_file(self, path: Path, *, sha256: str | None = None) -> CacheEntry:
        """The cache entry of a mounted `.tar.gz` (unpacked once per path, size and mtime)."""
        origin = str(path)
        try:
            stat = await asyncio.to_thread(path.stat)
        except FileNotFoundError as e:
            raise SourceNotFound(f"{origin}: no such file on this node (is it mounted?)") from e
        if stat.st_size > self.settings.max_download_bytes:
            raise SourceTooLarge(
                f"{origin}: {stat.st_size} bytes, over the limit of"
                f" {self.settings.max_download_bytes} bytes"
            )
        key = _key("file", origin, str(stat.st_size), str(stat.st_mtime_ns), (sha256 or "").lower())
        async with self._locks.setdefault(key, asyncio.Lock()):
            if (hit := self._hit(key)) is not None:
                return hit
            actual = await asyncio.to_thread(_sha256_of, path)
            if sha256 is not None and actual != sha256.lower():
                raise SourceDigestMismatch(
                    f"{origin} has sha256 {actual}, not the expected {sha256.lower()}"
                )
            tmp = self._tmp_dir(key)
            try:
                return await self._install(key, tmp, path, actual, origin)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    def _tmp_dir(self, key: str) -> Path:
        tmp = self.settings.root / f"{TMP_PREFIX}{key}-{secrets.token_hex(4)}"
        tmp.mkdir(mode=0o755)  # renamed into place: Triton's uid reads the entry
        return tmp

    async def _install(
        self, key: str, tmp: Path, archive: Path, sha256: str, origin: str
    ) -> CacheEntry:
        """Unpack `archive` into `tmp`, make room, and rename `tmp` into place as `key`."""
        if not await asyncio.to_thread(is_gzip, archive):
            raise SourceInvalid(f"{origin}: not a .tar.gz (no gzip header)")
        unpacked = tmp / UNPACKED_NAME
        size_bytes = await asyncio.to_thread(
            unpack_tar_gz, archive, unpacked, origin=origin,
            max_unpacked_bytes=self.settings.capacity_bytes,
        )  # fmt: skip
        model_dir = model_directory(unpacked, origin=origin)
        return self._commit(key, tmp, archive=archive, model_rel=model_dir.relative_to(unpacked),
                            size_bytes=size_bytes, sha256=sha256, origin=origin)  # fmt: skip

    def _commit(
        self, key: str, tmp: Path, *, archive: Path, model_rel: Path, size_bytes: int,
        sha256: str, origin: str,
    ) -> CacheEntry:  # fmt: skip
        """Make room and rename `tmp` into place; synchronous, so no other install interleaves."""
        if archive.parent == tmp:
            archive.unlink()
        self._make_room(size_bytes, origin)
        meta = {"origin": origin, "sha256": sha256, "size_bytes": size_bytes,
                "model_dir": str(model_rel)}  # fmt: skip
        (tmp / META_NAME).write_text(json.dumps(meta) + "\n")
        final = self.settings.root / key
        tmp.rename(final)
        entry = _Entry(key, final / UNPACKED_NAME / model_rel, size_bytes, sha256, origin,
                       self._clock(), in_use=1)  # fmt: skip
        self._entries[key] = entry
        self._touch(entry)
        log.info("source cache: added %s (%s, %d bytes unpacked)", key, origin, size_bytes)
        return entry.frozen()
