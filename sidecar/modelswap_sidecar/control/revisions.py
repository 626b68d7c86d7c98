"""The highest desired-set revision seen, kept in a small JSON file written atomically.

An agent that restarts must still refuse a deposed leader's pushes, so the revision is
written (temporary file, fsync, rename, fsync of the folder) before a set is acted on.
A stored revision out of the API's bounds (`check_revision`; saved by an older agent
that took any number) is ignored at load, logged, rather than refusing every push.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from modelswap_api.control import Revision, check_revision
from modelswap_api.errors import ModelError
from modelswap_sidecar.control.errors import RevisionStoreError

logger = logging.getLogger(__name__)

_FORMAT_VERSION = 1


class RevisionStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Revision | None:
        """The stored revision; None when there is no file yet."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise RevisionStoreError(f"cannot read {self.path}: {e}") from e
        try:
            data = json.loads(text)
            if data.get("version") != _FORMAT_VERSION:
                raise ModelError("version", f"expected {_FORMAT_VERSION}")
            revision = Revision.from_dict(data["revision"])
        except (ValueError, KeyError, AttributeError, TypeError) as e:
            raise RevisionStoreError(f"{self.path} is not a revision state file: {e}") from e
        try:
            check_revision(revision)
        except ModelError as e:
            # Saved by an agent that took any number (a hostile push): no operator can
            # send a revision above it, so keeping it would refuse every push for good.
            # Forgotten, the node takes the next push's revision as the highest seen.
            logger.error(
                "ignoring revision %s in %s: %s; the next push sets it", revision, self.path, e
            )
            return None
        return revision

    def save(self, revision: Revision) -> None:
        payload = json.dumps({"version": _FORMAT_VERSION, "revision": revision.to_dict()})
        folder = self.path.parent
        temporary = folder / f".{self.path.name}.{os.getpid()}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(payload.encode())
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(folder_fd)
            finally:
                os.close(folder_fd)
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise RevisionStoreError(f"cannot write {self.path}: {e}") from e
        logger.debug("stored revision %s in %s", revision, self.path)
