"""Every exception of model sources. Each message starts with the field it is about
(`spec.model.source` or `spec.model.source.sha256`), so the control API and the
ModelDeployment's conditions can show it as is.

    SourceError                 (code BadSource)
    ├── SourceNotFound          404, or a mounted path that does not exist
    ├── SourceUnreachable       connection refused, timeout, TLS failure, 5xx, 401/403
    ├── SourceTooLarge          over the download limit, or does not fit the cache
    ├── SourceDigestMismatch    the fetched file's sha256 is not the expected one
    ├── SourceInvalid           not a model directory, not a .tar.gz, unsafe archive members
    └── CredentialsInvalid      a credential holds CR, LF or NUL (the message never shows it)
"""

from __future__ import annotations

from modelswap_api.wire import ErrorCode

FIELD = "spec.model.source"
CREDENTIALS_FIELD = "spec.model.source.credentialsSecretRef"
SHA256_FIELD = "spec.model.source.sha256"


class SourceError(Exception):
    code: ErrorCode = ErrorCode.BAD_SOURCE

    def __init__(self, message: str, *, field: str = FIELD) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class SourceNotFound(SourceError):  # noqa: N818 - named after the condition it reports
    pass


class SourceUnreachable(SourceError):  # noqa: N818
    pass


class SourceTooLarge(SourceError):  # noqa: N818
    pass


class SourceDigestMismatch(SourceError):  # noqa: N818
    def __init__(self, message: str) -> None:
        super().__init__(message, field=SHA256_FIELD)


class SourceInvalid(SourceError):  # noqa: N818
    pass


class CredentialsInvalid(SourceError):  # noqa: N818
    """A resolved credential cannot be sent as a header; names which one, never its value."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field=CREDENTIALS_FIELD)
