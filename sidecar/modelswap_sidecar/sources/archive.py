"""Unpacking a `.tar.gz` of a model directory, safely.

Only regular files and directories are extracted, by our own code (not
`TarFile.extractall`): a member with an absolute path or a `..` component, a link, a device
or a FIFO is refused, and so is an archive whose files add up to more than the limit or
that has too many members. Files get mode 0644 (0755 if executable in the archive), so
nothing setuid or world-writable comes out of an archive.

The model directory is the archive's top when `config.pbtxt` is there, or its single
top-level folder when that holds `config.pbtxt` (as `tar -czf llama.tar.gz llama/` makes).
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path, PurePosixPath

from modelswap_sidecar.sources.errors import SourceInvalid, SourceTooLarge

GZIP_MAGIC = b"\x1f\x8b"
CONFIG_FILE_NAME = "config.pbtxt"
DEFAULT_MAX_MEMBERS = 100_000
_COPY_CHUNK_BYTES = 1 << 20


def is_gzip(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(2) == GZIP_MAGIC


def _safe_relative(name: str, origin: str) -> PurePosixPath | None:
    """The member's path relative to the destination; None for the archive's top ('.')."""
    path = PurePosixPath(name)
    if path.is_absolute() or ".." in path.parts:
        raise SourceInvalid(f"{origin}: archive member {name!r} points outside the model directory")
    parts = [p for p in path.parts if p not in (".", "")]
    return PurePosixPath(*parts) if parts else None


def unpack_tar_gz(
    archive: Path,
    destination: Path,
    *,
    origin: str,
    max_unpacked_bytes: int,
    max_members: int = DEFAULT_MAX_MEMBERS,
) -> int:
    """Unpack `archive` into `destination` (created; must not exist); returns bytes written.

    `origin` names the source in errors (the URI as the user wrote it).
    """
    destination.mkdir(parents=True)
    total_bytes = 0
    try:
        tar = tarfile.open(archive, "r:gz")  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError, EOFError) as e:
        raise SourceInvalid(f"{origin}: not a readable .tar.gz: {e}") from e
    with tar:
        try:
            for count, member in enumerate(tar, start=1):
                if count > max_members:
                    raise SourceInvalid(f"{origin}: archive has more than {max_members} members")
                relative = _safe_relative(member.name, origin)
                if member.isdir():
                    if relative is not None:
                        (destination / relative).mkdir(parents=True, exist_ok=True)
                    continue
                if not member.isfile():
                    kind = "link" if member.issym() or member.islnk() else "special file"
                    raise SourceInvalid(
                        f"{origin}: archive member {member.name!r} is a {kind}; only files and"
                        " folders are unpacked (tar --dereference resolves links)"
                    )
                if relative is None:
                    raise SourceInvalid(f"{origin}: archive member {member.name!r} has no name")
                total_bytes += member.size
                if total_bytes > max_unpacked_bytes:
                    raise SourceTooLarge(
                        f"{origin}: unpacks to more than {max_unpacked_bytes} bytes"
                    )
                target = destination / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                if source is None:
                    raise SourceInvalid(f"{origin}: archive member {member.name!r} is unreadable")
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, _COPY_CHUNK_BYTES)
                target.chmod(0o755 if member.mode & 0o111 else 0o644)
        except (tarfile.TarError, EOFError, OSError) as e:
            raise SourceInvalid(f"{origin}: broken .tar.gz: {e}") from e
    return total_bytes


def model_directory(unpacked: Path, *, origin: str) -> Path:
    """Where config.pbtxt is: the top, or the single top-level folder."""
    if (unpacked / CONFIG_FILE_NAME).is_file():
        return unpacked
    entries = list(unpacked.iterdir())
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / CONFIG_FILE_NAME).is_file():
        return entries[0]
    raise SourceInvalid(
        f"{origin}: the archive holds no {CONFIG_FILE_NAME} at its top or in its single"
        " top-level folder"
    )
