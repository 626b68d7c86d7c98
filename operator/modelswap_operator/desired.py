"""Each node's desired set, built from the plan (pure).

An entry carries the model's identity, generation, model generation (`model_generations`:
with the uid it names the instance the node holds), spec, the GPU the planner chose, the
effective policy computed once here (the agent keeps no defaults of its own for it) and
the source credentials resolved from the model's Secret. One invalid entry makes the agent
refuse the whole PUT, so an entry that cannot be sent is left out and reported on its own
object (`check_entry`, and `refused_entry` for what only the agent finds).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modelswap_api.control import DesiredEntry, Revision, SourceCredentials, check_uid
from modelswap_api.errors import ModelError
from modelswap_api.models import ModelDeployment
from modelswap_api.policy import EffectivePolicy

#: The key of a source's credentials Secret: the Authorization header value.
AUTHORIZATION_KEY = "authorization"
_ENTRY_FIELD = re.compile(r"^entries\[(\d+)\]\.?")


def credentials_refusal(namespace: str, opted_in: tuple[str, ...] | None) -> str | None:
    """Why a credentialsSecretRef Secret in `namespace` is not to be read, or None when it
    may be (`opted_in` None: every served namespace may be read). The message names the
    namespace and how to opt it in; the read is not even attempted, so a namespace that
    did not opt in sees no request for its Secrets."""
    if opted_in is None or namespace in opted_in:
        return None
    listed = ", ".join(opted_in) or "none"
    return (
        f"namespace {namespace!r} has not opted in to source credentials: the operator "
        f"reads credentialsSecretRef Secrets only in the namespaces listed in the chart's "
        f"operator.credentials.namespaces (now: {listed}); add {namespace!r} there and "
        f'run helm upgrade (docs/operations.md, "Source credentials")'
    )


def forbidden_message(namespace: str, secret_name: str) -> str:
    """What a 403 on the Secret's read says: the operator's rights do not cover it."""
    return (
        f"the API server refused the operator reading Secret {secret_name!r} in namespace "
        f"{namespace!r} (403): its ServiceAccount has no get on Secrets there; opt the "
        f"namespace in (the chart's operator.credentials.namespaces) and run helm upgrade"
    )


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
    model_generation: int | None = None,
) -> DesiredEntry:
    """The entry; `model_generation` (`model_generations`) names the instance to hold."""
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
        model_generation=model_generation,
    )


def check_entry(entry: DesiredEntry) -> EntryProblem | None:
    """What the agent checks that the API server did not: the UID's shape. The spec passed
    the same CRD schema and rules at the API server, and the policy was checked when it was
    merged, so checking them again here would cost every turn the CEL evaluations of every
    model for nothing; should an agent still refuse an entry (a CRD skew), the reconciler
    leaves that entry out and pushes again (`refused_entry`)."""
    try:
        check_uid(entry.uid)
    except ModelError as e:
        return EntryProblem(entry.uid, "InvalidEntry", "metadata.uid", str(e))
    return None


def refused_entry(field_path: str | None, entries: Sequence[DesiredEntry]) -> DesiredEntry | None:
    """The entry an agent's 400 names (`entries[3].spec.model.weightsBytes`), if any."""
    match = _ENTRY_FIELD.match(field_path or "")
    if match is None or int(match.group(1)) >= len(entries):
        return None
    return entries[int(match.group(1))]


def relative_field(field_path: str) -> str:
    """`entries[3].spec.model.weightsBytes` -> `spec.model.weightsBytes`."""
    return _ENTRY_FIELD.sub("", field_path, count=1) or "spec"


def revision(term: int, counter: int) -> Revision:
    return Revision(term=term, counter=counter)


def same_entries(a: Iterable[DesiredEntry], b: Iterable[DesiredEntry]) -> bool:
    """Whether two sets say the same (the revision aside): a changed set is pushed at once,
    an unchanged one only as the heartbeat."""
    return sorted(a, key=lambda e: e.uid) == sorted(b, key=lambda e: e.uid)
