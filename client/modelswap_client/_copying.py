"""Copies between regions and the host store: save (regions to host-store files), map (the
agent's chunks at the regions' addresses) and restore (host copies back in), in pieces
spread over the mapper's copy streams."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from modelswap_api.wire import ErrorCode, Message, RegionKind
from modelswap_client._state import AttachmentState, ClientState
from modelswap_client.errors import ClientError
from modelswap_client.mappers.base import CopyEvent, Handle, HostBuffer
from modelswap_client.regions import Region


class Copying(AttachmentState):
    """The copy steps of a swap, as the agent asks for them (see `_swapping`)."""

    def _pieces(self, start: int, size: int) -> Iterator[tuple[int, int]]:
        """(offset, bytes) pieces of [start, start + size), at most `copy_piece_bytes` each."""
        offset, end = start, start + size
        while offset < end:
            n = min(self.copy_piece_bytes, end - offset)
            yield offset, n
            offset += n

    def _save(self, message: Message) -> None:
        buffers = []
        events: list[CopyEvent] = []
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                fd = message.fds[int(rd["fd"])]
                host = self.mapper.map_host(fd, int(rd["bytes"]), writable=True)
                buffers.append(host)
                for n, (off, size) in enumerate(self._pieces(0, r.reserved_bytes)):
                    events.append(
                        self.mapper.copy_to_host(
                            host.address + off,
                            r.address + off,
                            size,
                            n % self.mapper.stream_count(),
                        )
                    )
            for ev in events:
                ev.wait()
        finally:
            self.mapper.synchronize()
            for b in buffers:
                self.mapper.unmap_host(b)
            message.close_fds()  # the writable fds of host-store files never stay here

    def _map(self, message: Message) -> None:
        done: list[tuple[Region, int, int, Handle]] = []
        fds = list(message.fds)
        message.fds = []
        consumed: set[int] = set()
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                if r.handles:
                    raise ClientError(f"region {r.tag} is already mapped", ErrorCode.WRONG_STATE)
                for c in rd["chunks"]:
                    index = int(c["fd"])
                    consumed.add(index)
                    h = self.mapper.import_fd(fds[index], int(c["bytes"]))
                    try:
                        self.mapper.map(r.address + int(c["offset"]), int(c["bytes"]), h)
                    except BaseException:
                        self.mapper.release(h)
                        raise
                    done.append((r, int(c["offset"]), int(c["bytes"]), h))
        except BaseException:
            for r, offset, size, h in done:
                self.mapper.unmap(r.address + offset, size)
                self.mapper.release(h)
            raise
        finally:
            for i, fd in enumerate(fds):
                if i not in consumed:
                    os.close(fd)
        for r, offset, size, h in done:
            r.handles.append((offset, size, h))

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
            self.mapper.unmap_host(cached[1])
            del self._weight_sources[r.tag]
        host = self.mapper.map_host(fd, size_bytes, writable=False)
        self._weight_sources[r.tag] = (key, host)
        return host

    def _drop_weight_sources(self) -> None:
        for _, host in self._weight_sources.values():
            self.mapper.unmap_host(host)
        self._weight_sources.clear()

    def _restore(self, message: Message) -> dict[str, Any]:
        """Grant access chunk by chunk and copy each host copy in right behind it.

        Access is set per mapping (chunk) and that chunk's copies are queued at once, so
        the copy streams move chunk i while this thread grants access to chunk i+1 (for
        the sim mapper, granting access populates the page tables: the two overlap).
        """
        buffers = []
        events: list[CopyEvent] = []
        result: dict[str, str] = {}
        streams = self.mapper.stream_count()
        queued = 0
        copied_bytes = 0
        started = time.perf_counter()
        try:
            for rd in message.body["regions"]:
                r = self.regions[rd["tag"]]
                host: HostBuffer | None = None
                if rd.get("fresh"):
                    r.restored = False
                    result[r.tag] = "fresh"
                elif r.kind is RegionKind.WEIGHTS:
                    host = self._weights_source(r, message.fds[int(rd["fd"])], int(rd["bytes"]))
                else:  # a KV copy is rewritten by every swap-out: map it for this copy only
                    fd = message.fds[int(rd["fd"])]
                    host = self.mapper.map_host(fd, int(rd["bytes"]), writable=False)
                    buffers.append(host)
                for offset, size, _ in sorted(r.handles, key=lambda h: h[0]):
                    self.mapper.set_access(r.address + offset, size, writable=True)
                    if host is None:
                        continue
                    for off, n in self._pieces(offset, size):
                        events.append(
                            self.mapper.copy_to_device(
                                r.address + off, host.address + off, n, queued % streams
                            )
                        )
                        queued += 1
                        copied_bytes += n
                if host is not None:
                    r.restored = True
                    result[r.tag] = "restored"
                elif r.kind is RegionKind.WEIGHTS:  # reloaded after a drop or failure
                    self.restored = self.committed = False
            for ev in events:
                ev.wait()
            copy_seconds = time.perf_counter() - started
        finally:
            self.mapper.synchronize()
            for b in buffers:
                self.mapper.unmap_host(b)
            message.close_fds()
        paced = self.mapper.paced_bytes_per_second()
        # what this restore moved and how fast (granting access included); "scaled" when
        # the mapper paced it to an emulated link, so nobody reads it as a real link speed
        copy = {
            "bytes": copied_bytes,
            "seconds": copy_seconds,
            "scaled": paced > 0,
            "target_bytes_per_second": paced if paced > 0 else None,
        }
        was_out = self.state is ClientState.MAPPED
        self.dropped = False
        self._set_state(ClientState.RESIDENT)
        if was_out:
            for h in self._on_swap_in:
                h(self)
        return {"regions": result, "copy": copy}
