"""Decoding of the Kubernetes protobuf envelope for the few built-in types kubectl's typed
`create` commands and helm's release storage send as protobuf (`kubectl create
namespace|configmap|secret|serviceaccount|token`, `kubectl auth can-i|whoami`, Secrets and
DeleteOptions). Answers stay JSON (client-go reads the response's content type).

Wire format: `k8s\\x00` + runtime.Unknown{1: TypeMeta{1: apiVersion, 2: kind}, 2: raw};
`raw` is the object's message (field numbers from k8s.io/api generated.proto).
"""

from __future__ import annotations

import base64
from typing import Any

from tests.support.kube_emulator.errors import ApiError

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
_MAGIC = b"k8s\x00"

# A schema maps field numbers to (name, kind, repeated); kinds: "string", "bytes" (base64 in
# JSON), "int", "bool", "time" (metav1.Time), a nested schema, or ("map", value kind).
Schema = dict[int, tuple[str, Any, bool]]

_TIME: Schema = {1: ("seconds", "int", False), 2: ("nanos", "int", False)}
_OWNER_REFERENCE: Schema = {
    1: ("kind", "string", False), 3: ("name", "string", False), 4: ("uid", "string", False),
    5: ("apiVersion", "string", False), 6: ("controller", "bool", False),
    7: ("blockOwnerDeletion", "bool", False),
}  # fmt: skip
_OBJECT_META: Schema = {
    1: ("name", "string", False), 2: ("generateName", "string", False),
    3: ("namespace", "string", False), 5: ("uid", "string", False),
    6: ("resourceVersion", "string", False), 7: ("generation", "int", False),
    11: ("labels", ("map", "string"), False), 12: ("annotations", ("map", "string"), False),
    13: ("ownerReferences", _OWNER_REFERENCE, True), 14: ("finalizers", "string", True),
}  # fmt: skip
_OBJECT_REFERENCE: Schema = {
    1: ("kind", "string", False), 2: ("namespace", "string", False), 3: ("name", "string", False),
    4: ("uid", "string", False), 5: ("apiVersion", "string", False),
}  # fmt: skip
_DELETE_OPTIONS: Schema = {
    1: ("gracePeriodSeconds", "int", False),
    2: ("preconditions", {1: ("uid", "string", False), 2: ("resourceVersion", "string", False)},
        False),
    3: ("orphanDependents", "bool", False), 4: ("propagationPolicy", "string", False),
    5: ("dryRun", "string", True),
}  # fmt: skip
_RESOURCE_ATTRIBUTES: Schema = {
    1: ("namespace", "string", False), 2: ("verb", "string", False),
    3: ("group", "string", False), 4: ("version", "string", False),
    5: ("resource", "string", False), 6: ("subresource", "string", False),
    7: ("name", "string", False),
}  # fmt: skip
_NON_RESOURCE_ATTRIBUTES: Schema = {1: ("path", "string", False), 2: ("verb", "string", False)}
_ACCESS_REVIEW_SPEC: Schema = {
    1: ("resourceAttributes", _RESOURCE_ATTRIBUTES, False),
    2: ("nonResourceAttributes", _NON_RESOURCE_ATTRIBUTES, False),
    3: ("user", "string", False), 4: ("groups", "string", True), 6: ("uid", "string", False),
}  # fmt: skip
_TOKEN_REQUEST_SPEC: Schema = {
    1: ("audiences", "string", True), 4: ("expirationSeconds", "int", False),
    3: ("boundObjectRef", {
        1: ("kind", "string", False), 2: ("apiVersion", "string", False),
        3: ("name", "string", False), 4: ("uid", "string", False),
    }, False),
}  # fmt: skip
SCHEMAS: dict[tuple[str, str], Schema] = {
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): {
        1: ("metadata", _OBJECT_META, False), 2: ("spec", _ACCESS_REVIEW_SPEC, False),
    },
    ("authorization.k8s.io/v1", "SubjectAccessReview"): {
        1: ("metadata", _OBJECT_META, False), 2: ("spec", _ACCESS_REVIEW_SPEC, False),
    },
    ("authentication.k8s.io/v1", "SelfSubjectReview"): {1: ("metadata", _OBJECT_META, False)},
    ("authentication.k8s.io/v1", "TokenRequest"): {
        1: ("metadata", _OBJECT_META, False), 2: ("spec", _TOKEN_REQUEST_SPEC, False),
    },
    ("v1", "DeleteOptions"): _DELETE_OPTIONS,
    ("meta.k8s.io/v1", "DeleteOptions"): _DELETE_OPTIONS,
    ("v1", "Namespace"): {
        1: ("metadata", _OBJECT_META, False),
        2: ("spec", {1: ("finalizers", "string", True)}, False),
    },
    ("v1", "ConfigMap"): {
        1: ("metadata", _OBJECT_META, False), 2: ("data", ("map", "string"), False),
        3: ("binaryData", ("map", "bytes"), False), 4: ("immutable", "bool", False),
    },
    ("v1", "Secret"): {
        1: ("metadata", _OBJECT_META, False), 2: ("data", ("map", "bytes"), False),
        3: ("type", "string", False), 4: ("stringData", ("map", "string"), False),
        5: ("immutable", "bool", False),
    },
    ("v1", "ServiceAccount"): {
        1: ("metadata", _OBJECT_META, False), 2: ("secrets", _OBJECT_REFERENCE, True),
        3: ("imagePullSecrets", {1: ("name", "string", False)}, True),
        4: ("automountServiceAccountToken", "bool", False),
    },
}  # fmt: skip


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int | bytes]]:
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((number, value))
        elif wire == 2:
            length, pos = _varint(data, pos)
            out.append((number, data[pos : pos + length]))
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            out.append((number, int.from_bytes(data[pos : pos + size], "little")))
            pos += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _scalar(kind: Any, value: int | bytes) -> Any:
    if kind == "string":
        return bytes(value).decode() if isinstance(value, bytes) else str(value)
    if kind == "bytes":
        return base64.b64encode(bytes(value) if isinstance(value, bytes) else b"").decode()
    if kind == "bool":
        return bool(value)
    if kind == "int":
        return int(value) if isinstance(value, int) else 0
    if isinstance(kind, dict):
        return _message(kind, value if isinstance(value, bytes) else b"")
    raise ValueError(f"unknown kind {kind!r}")


def _message(schema: Schema, data: bytes) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for number, value in _fields(data):
        if number not in schema:
            continue
        name, kind, repeated = schema[number]
        if isinstance(kind, tuple):  # a map: entries {1: key, 2: value}
            entry = dict(_fields(value if isinstance(value, bytes) else b""))
            key = _scalar("string", entry.get(1, b""))
            obj.setdefault(name, {})[key] = _scalar(kind[1], entry.get(2, b""))
        elif repeated:
            obj.setdefault(name, []).append(_scalar(kind, value))
        else:
            decoded = _scalar(kind, value)
            if decoded not in ("", 0) or isinstance(decoded, bool):  # Go's omitempty
                obj[name] = decoded
    return obj


def decode(raw: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf-encoded object; 415 for kinds not covered here."""
    if not raw.startswith(_MAGIC):
        raise ApiError(400, "protobuf body without the k8s envelope")
    try:
        unknown = dict(_fields(raw[len(_MAGIC) :]))
        type_meta = dict(_fields(bytes(unknown.get(1, b""))))
        api_version = _scalar("string", type_meta.get(1, b""))
        kind = _scalar("string", type_meta.get(2, b""))
        schema = SCHEMAS.get((api_version, kind))
        if schema is None:
            raise ApiError(
                415,
                f"the emulator cannot decode protobuf {api_version} {kind}; send JSON",
                reason="UnsupportedMediaType",
            )
        obj = _message(schema, bytes(unknown.get(2, b"")))
    except (IndexError, ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"error decoding protobuf body: {e}") from e
    return {"apiVersion": api_version, "kind": kind, **obj}
