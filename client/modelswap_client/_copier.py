"""The copier: a swap's data steps between the regions and host-store files — save (regions
to files), map (the agent's chunks at the regions' addresses) and restore (files back
in) — in pieces spread over the mapper's copy streams. It changes no client state: the
agent handler (`_handler`) does, from what these return."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from modelswap_api.wire import ErrorCode, Message, RegionKind
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import CopyEvent, Handle, HostBuffer, Mapper
from modelswap_client.regions import Region, Regions


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restore did: per region "restored" or "fresh", and the copy's figures."""

    regions: dict[str, str]
    copy: dict[str, Any]


class Copier:
    """Copies in pieces of at most `copy_piece_bytes`, round-robin over the copy streams.

    It keeps a read-only mapping of each region's weight copy between swap-ins (see
    `_weights_source`); `drop_weight_sources` lets them go.
    """

    def __init__(self, mapper: Mapper, regions: Regions, copy_piece_bytes: int) -> None:
        if copy_piece_bytes <= 0:
            raise ValueError("copy_piece_bytes must be positive")
        self._mapper = mapper
        self._regions = regions
        self._piece_bytes = copy_piece_bytes
        #: region tag → ((st_dev, st_ino, bytes) of its weight copy, read-only host mapping)
        self._weight_sources: dict[str, tuple[tuple[int, int, int], HostBuffer]] = {}

    def _pieces(self, start: int, size: int) -> Iterator[tuple[int, int]]:
        """(offset, bytes) pieces of [start, start + size), at most `copy_piece_bytes` each."""
        offset, end = start, start + size
        while offset < end:
            n = min(self._piece_bytes, end - offset)
            yield offset, n
            offset += n

    def save(self, message: Message) -> None:
        """Copy each named region whole into its host-store file (fds in `message`, closed
        here in every case)."""
        mapper = self._mapper
        buffers = []
        events: list[CopyEvent] = []
        try:
            for rd in message.body["regions"]:
                r = self._regions[rd["tag"]]
                fd = message.fds[int(rd["fd"])]
                host = mapper.map_host(fd, int(rd["bytes"]), writable=True)
                buffers.append(host)
                for n, (off, size) in enumerate(self._pieces(0, r.reserved_bytes)):
                    events.append(
                        mapper.copy_to_host(
                            host.address + off,
                            r.address + off,
                            size,
                            n % mapper.stream_count(),
                        )
                    )
            for ev in events:
                ev.wait()
        finally:
            mapper.synchronize()
            for b in buffers:
                mapper.unmap_host(b)
            message.close_fds()  # the writable fds of host-store files never stay here

    def map(self, message: Message) -> None:
        """Import the agent's chunks and map them (no access yet) at the regions'
        addresses. All or nothing: on a failure what was mapped is unmapped and released,
        and every fd is consumed or closed."""
        mapper = self._mapper
        done: list[tuple[Region, int, int, Handle]] = []
        fds = list(message.fds)
        message.fds = []
        consumed: set[int] = set()
        try:
            for rd in message.body["regions"]:
                r = self._regions[rd["tag"]]
                if r.handles:
                    raise ClientError(f"region {r.tag} is already mapped", ErrorCode.WRONG_STATE)
                for c in rd["chunks"]:
                    index = int(c["fd"])
                    consumed.add(index)
                    h = mapper.import_fd(fds[index], int(c["bytes"]))
                    try:
                        mapper.map(r.address + int(c["offset"]), int(c["bytes"]), h)
                    except BaseException:
                        mapper.release(h)
                        raise
                    done.append((r, int(c["offset"]), int(c["bytes"]), h))
        except BaseException:
            for r, offset, size, h in done:
                mapper.unmap(r.address + offset, size)
                mapper.release(h)
            raise
        finally:
            for i, fd in enumerate(fds):
                if i not in consumed:
                    os.close(fd)
        for r, offset, size, h in done:
            r.handles.append((offset, size, h))

    def restore(self, message: Message) -> Restored:
        """Grant access chunk by chunk and copy each host copy in right behind it.

        Chunk i's grant goes on copy stream i mod streams (`set_access_on_stream`). Where
        the grant is still queued (the sim mapper: granting populates the page tables),
        that chunk's pieces follow it on the same stream, so each stream grants and copies
        its own chunks and the grants run side by side. Where it was granted at once
        (CUDA), the pieces spread over every stream while this thread grants the next.
        """
        mapper = self._mapper
        buffers = []
        events: list[CopyEvent] = []
        result: dict[str, str] = {}
        streams = mapper.stream_count()
        chunks = 0
        queued = 0
        copied_bytes = 0
        started = time.perf_counter()
        try:
            for rd in message.body["regions"]:
                r = self._regions[rd["tag"]]
                host: HostBuffer | None = None
                if rd.get("fresh"):
                    r.restored = False
                    result[r.tag] = "fresh"
                elif r.kind is RegionKind.WEIGHTS:
                    host = self._weights_source(r, message.fds[int(rd["fd"])], int(rd["bytes"]))
                else:  # a KV copy is rewritten by every swap-out: map it for this copy only
                    fd = message.fds[int(rd["fd"])]
                    host = mapper.map_host(fd, int(rd["bytes"]), writable=False)
                    buffers.append(host)
                for offset, size, _ in sorted(r.handles, key=lambda h: h[0]):
                    stream = chunks % streams
                    chunks += 1
                    granted = mapper.set_access_on_stream(r.address + offset, size, stream)
                    events.append(granted)
                    if host is None:
                        continue
                    anywhere = granted.query()  # granted already: any stream may copy it
                    for off, n in self._pieces(offset, size):
                        events.append(
                            mapper.copy_to_device(
                                r.address + off,
                                host.address + off,
                                n,
                                queued % streams if anywhere else stream,
                            )
                        )
                        queued += 1
                        copied_bytes += n
                if host is not None:
                    r.restored = True
                    result[r.tag] = "restored"
            for ev in events:
                ev.wait()
            copy_seconds = time.perf_counter() - started
        finally:
            mapper.synchronize()
            for b in buffers:
                mapper.unmap_host(b)
            message.close_fds()
        paced = mapper.paced_bytes_per_second()
        # what this restore moved and how fast (granting access included); "scaled" when
        # the mapper paced it to an emulated link, so nobody reads it as a real link speed
        copy = {
            "bytes": copied_bytes,
            "seconds": copy_seconds,
            "scaled": paced > 0,
            "target_bytes_per_second": paced if paced > 0 else None,
        }
        return Restored(result, copy)

    def _weights_source(self, r: Region, fd: int, size_bytes: int) -> HostBuffer:
        """The read-only host mapping of `r`'s weight copy, kept between swap-ins.

        A weight copy is written once and never changes while its file exists, so the
        mapping made for the first restore serves every later one (a CUDA mapper pins
        host memory once this way); a different file (new inode) replaces it.
        """
        info = os.fstat(fd)
        key = (info.st_dev, info.st_ino, size_bytes)
        cached = self._weight_sources.get(r.tag)
        if cached is not None and cached[0] == key:
            return cached[1]
        if cached is not None:
            self._mapper.unmap_host(cached[1])
            del self._weight_sources[r.tag]
        host = self._mapper.map_host(fd, size_bytes, writable=False)
        self._weight_sources[r.tag] = (key, host)
        return host

    def drop_weight_sources(self) -> None:
        """Unmap the kept weight-copy mappings (their files are deleted, or we detach)."""
        for _, host in self._weight_sources.values():
            self._mapper.unmap_host(host)
        self._weight_sources.clear()
