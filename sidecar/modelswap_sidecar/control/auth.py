"""Bearer-token check of the control API.

The token comes from a file (a key of a Secret the operator creates, mounted optional) and
is re-read whenever the file changes: its inode, size or mtime (a Secret volume swaps a
symlink, which changes the inode). Comparison is constant-time (`hmac.compare_digest`).
No file, or an empty one, means no caller is admitted.
"""

from __future__ import annotations

import enum
import hmac
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

_SCHEME = "bearer"


class Verdict(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no Authorization header, or not a bearer one → 401
    WRONG = "wrong"  # a bearer token that does not match → 403
    UNAVAILABLE = "unavailable"  # this agent has no token to compare with → 503


class TokenFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int, int] | None = None
        self._token: bytes | None = None

    def current(self) -> bytes | None:
        """The token, re-read if the file changed since the last call; None if unusable."""
        try:
            st = os.stat(self.path)
        except OSError:
            if self._stamp is not None:
                logger.warning("token file %s is gone; refusing every call", self.path)
            self._stamp, self._token = None, None
            return None
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if stamp != self._stamp:
            try:
                token = self.path.read_bytes().strip()
            except OSError as e:
                logger.warning("cannot read token file %s: %s", self.path, e)
                return None
            self._stamp, self._token = stamp, token or None
            logger.info("read the control API token from %s", self.path)
        return self._token

    def check(self, authorization: str | None) -> Verdict:
        token = self.current()
        if token is None:
            return Verdict.UNAVAILABLE
        if authorization is None:
            return Verdict.MISSING
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != _SCHEME or not given.strip():
            return Verdict.MISSING
        if hmac.compare_digest(given.strip().encode(), token):
            return Verdict.OK
        return Verdict.WRONG
