"""Each node's desired set, built from the plan (pure).

An entry carries the model's identity, generation, spec, the GPU the planner chose, the
effective policy computed once here (the agent keeps no defaults of its own for it) and
the source credentials resolved from the model's Secret. Every entry is checked exactly
as the agent checks it (`parse_desired_set`): one invalid entry makes the agent refuse the
whole PUT, so an entry that fails is left out and reported on its own object.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import DesiredEntry, Revision, SourceCredentials, parse_desired_set
from modelswap_api.errors import ModelError, ResourceError
from modelswap_api.models import ModelDeployment
from modelswap_api.policy import EffectivePolicy

#: The key of a source's credentials Secret: the Authorization header value.
AUTHORIZATION_KEY = "authorization"


@dataclass(frozen=True)
class EntryProblem:
    """Why a model's entry cannot be sent; `field` names the spec or Secret field."""

    uid: str
    reason: str
    field: str
    message: str


def credentials_from_secret(
    secret: Mapping[str, Any] | None, secret_name: str
) -> SourceCredentials:
    """The entry's credentials from a Secret's `authorization` key.

    ValueError with a message naming the Secret and key (never the value). Surrounding
    whitespace is dropped: a Secret made from a file often ends in a newline, which would
    make an illegal header (and, echoed in an error, leak the token).
    """
    if secret is None:
        raise ValueError(f"Secret {secret_name!r} does not exist")
    encoded = (secret.get("data") or {}).get(AUTHORIZATION_KEY)
    if not encoded:
        raise ValueError(f"Secret {secret_name!r} has no {AUTHORIZATION_KEY!r} key")
    try:
        value = base64.b64decode(encoded, validate=True).decode("utf-8").strip()
    except (binascii.Error, UnicodeDecodeError) as e:
        raise ValueError(
            f"Secret {secret_name!r} key {AUTHORIZATION_KEY!r} is not base64 UTF-8 text"
        ) from e
    if not value or any(c in value for c in "\r\n\0"):
        raise ValueError(
            f"Secret {secret_name!r} key {AUTHORIZATION_KEY!r} is empty or spans several lines"
        )
    scheme, _, rest = value.partition(" ")
    if scheme.lower() == "bearer" and rest.strip():
        return SourceCredentials(bearer_token=rest.strip())
    return SourceCredentials(headers={"Authorization": value})


def entry_for(
    deployment: ModelDeployment,
    *,
    gpu: str,
    policy: EffectivePolicy,
    credentials: SourceCredentials | None,
) -> DesiredEntry:
    metadata = deployment.metadata
    return DesiredEntry(
        uid=str(metadata["uid"]),
        namespace=deployment.namespace,
        name=deployment.name,
        generation=int(metadata.get("generation") or 1),
        spec=deployment.spec,
        credentials=credentials,
        gpu=gpu,
        policy=policy.to_status(),
    )


def check_entry(entry: DesiredEntry) -> EntryProblem | None:
    """The entry as the agent will check it; the problem's field is relative to the object
    (`spec.model.weightsBytes`), not to the set."""
    body = {"revision": {"term": 0, "counter": 0}, "entries": [entry.to_dict()]}
    try:
        parse_desired_set(body)
    except ResourceError as e:
        first = e.errors[0]
        return EntryProblem(entry.uid, "InvalidEntry", _relative(first.path), str(e))
    except ModelError as e:
        return EntryProblem(entry.uid, "InvalidEntry", _relative(e.path), str(e))
    return None


def _relative(path: str) -> str:
    prefix = "entries[0]."
    return path[len(prefix) :] if path.startswith(prefix) else path


def revision(term: int, counter: int) -> Revision:
    return Revision(term=term, counter=counter)


def same_entries(a: Iterable[DesiredEntry], b: Iterable[DesiredEntry]) -> bool:
    """Whether two sets say the same (the revision aside): a changed set is pushed at once,
    an unchanged one only as the heartbeat."""
    return sorted(a, key=lambda e: e.uid) == sorted(b, key=lambda e: e.uid)
