"""How the gateway logs requests it cannot parse: briefly, and not once per request.

aiohttp answers a request its parser refuses (a garbled request line, a header past its
limits, HTTP/2's preface from a gRPC client on the HTTP port) with a 400 and logs it with
`logger.exception`: an ERROR and a traceback per request, so anyone who can connect can
fill the agent's log. Those are the client's errors, not the node's. `ParseErrorLog`
stands in for aiohttp's server logger: a parse error is one WARNING line naming the client
and the parser's reason, then at most one line per `summary_seconds` counting the ones
since; anything else aiohttp logs goes through unchanged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, MutableMapping
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

#: What the first line adds when the refused bytes look like HTTP/2 (a gRPC client).
HTTP2_HINT = "an HTTP/2 or gRPC client on the HTTP port? (the gRPC front has its own port)"


class ParseErrorLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    def __init__(
        self,
        logger: logging.Logger,
        *,
        summary_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(logger, {})
        self.summary_seconds = summary_seconds
        self.clock = clock
        self.refused = 0  # parse errors seen, in all
        self._unlogged = 0  # since the last line
        self._logged_at: float | None = None

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return msg, kwargs

    def debug(self, msg: object, *args: object, exc_info: Any = None, **kwargs: Any) -> None:
        """aiohttp logs a bad method on a connection's first request (TLS or other
        non-HTTP bytes) at DEBUG: kept there, as one line."""
        if isinstance(exc_info, HttpProcessingError):
            self.refused += 1
            self.logger.debug(f"{msg}: %s", *args, _reason(exc_info), **kwargs)
            return
        self.logger.debug(msg, *args, exc_info=exc_info, **kwargs)

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if not isinstance(exc_info, HttpProcessingError):
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)
            return
        self.refused += 1
        self._unlogged += 1
        now = self.clock()
        if self._logged_at is not None and now - self._logged_at < self.summary_seconds:
            return
        client = args[0] if args else "?"
        reason = _reason(exc_info)
        hint = f"; {HTTP2_HINT}" if "HTTP/2" in reason or "PRI" in reason else ""
        if self._logged_at is None:
            self.logger.warning("refused a request it could not parse from %s: %s%s",
                                client, reason, hint)  # fmt: skip
        else:
            self.logger.warning(
                "refused %d requests it could not parse in the last %.0f s; the last from %s: %s%s",
                self._unlogged,
                now - self._logged_at,
                client,
                reason,
                hint,
            )
        self._logged_at = now
        self._unlogged = 0


def _reason(e: HttpProcessingError) -> str:
    """The parser's message on one line, shortened (it may quote the client's bytes)."""
    text = " ".join(str(e.message or type(e).__name__).split())
    return text if len(text) <= 160 else text[:157] + "..."
