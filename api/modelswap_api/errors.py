"""Every exception the contract package raises.

ContractError
├── CrdError          a CRD file is missing or malformed, or a CEL rule does not compile
├── QuantityError     a quantity or duration string cannot be parsed
├── ModelError        a dict does not fit the typed model (names the field path)
├── ResourceError     an object failed validation; carries every FieldError
└── PolicyError       the effective policy (spec over defaults) breaks a rule

KubeError             a Kubernetes API call failed (`modelswap_api.kube`)
├── NotFound          404
├── Conflict          409
└── KubeConfigError   the kubeconfig, or the in-cluster config, cannot be used
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modelswap_api.field_errors import FieldError


class ContractError(Exception):
    """Base of the contract package's errors."""


class CrdError(ContractError):
    """A CRD is missing or malformed."""


class QuantityError(ContractError, ValueError):
    """A quantity or duration string is not valid."""


class ModelError(ContractError, ValueError):
    """A value does not fit the typed model; the message names the field path."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class InvalidFieldsError(ContractError):
    """Problems with named fields."""

    def __init__(self, errors: Sequence[FieldError], context: str = "") -> None:
        self.errors = tuple(errors)
        lines = "; ".join(str(e) for e in self.errors)
        super().__init__(f"{context}: {lines}" if context else lines)


class ResourceError(InvalidFieldsError):
    """An object failed validation."""


class PolicyError(InvalidFieldsError):
    """The effective policy breaks a rule (after merging spec over defaults)."""


class KubeError(Exception):
    """A Kubernetes API call failed (`modelswap_api.kube`); no ContractError: the cluster
    answered, or did not, whatever the contract says.

    KubeError       `status` is the HTTP status, None when the server was unreachable
    ├── NotFound    404
    └── Conflict    409: the object exists already, or a write carried a stale resourceVersion
    """

    def __init__(self, message: str, *, status: int | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class NotFound(KubeError):  # noqa: N818 - named after the API's reason
    pass


class Conflict(KubeError):  # noqa: N818
    pass


class KubeConfigError(KubeError):
    """`kube.api_client` cannot use the kubeconfig or the in-cluster config (the client's
    own error, whose text this carries, is the cause)."""
