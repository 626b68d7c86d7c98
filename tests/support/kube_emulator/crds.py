"""CustomResourceDefinitions: checking one, turning it into served types, its status."""

from __future__ import annotations

from typing import Any

from tests.support.kube_emulator.errors import invalid
from tests.support.kube_emulator.resources import ResourceType, from_crd

CRD_GROUP = "apiextensions.k8s.io"


def _crd_invalid(name: str, field: str, message: str) -> Exception:
    return invalid(
        CRD_GROUP, "CustomResourceDefinition", name, [(field, "FieldValueInvalid", message)]
    )


def types_for(crd: dict[str, Any]) -> list[ResourceType]:
    """Check a CRD as the server does where it matters here; its served types with validators."""
    name = crd["metadata"].get("name", "")
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    for required in ("group", "names", "versions"):
        if not spec.get(required):
            raise invalid(
                CRD_GROUP, "CustomResourceDefinition", name,
                [(f"spec.{required}", "FieldValueRequired", "Required value")],
            )  # fmt: skip
    for required in ("plural", "kind"):
        if not names.get(required):
            raise invalid(
                CRD_GROUP, "CustomResourceDefinition", name,
                [(f"spec.names.{required}", "FieldValueRequired", "Required value")],
            )  # fmt: skip
    if name != f"{names['plural']}.{spec['group']}":
        raise _crd_invalid(
            name,
            "metadata.name",
            f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group',
        )
    storage = [v["name"] for v in spec["versions"] if v.get("storage")]
    if len(storage) != 1:
        raise _crd_invalid(
            name,
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        )
    types = from_crd(crd)
    from modelswap_api.validation import SchemaValidator  # heavy (jsonschema, CEL): lazily

    for rt in types:
        if rt.schema is None:
            raise invalid(
                CRD_GROUP, "CustomResourceDefinition", name,
                [(f"spec.versions[{rt.version}].schema.openAPIV3Schema", "FieldValueRequired",
                  "Required value: schemas are required")],
            )  # fmt: skip
        try:
            rt.validator = SchemaValidator.from_crd(crd, version=rt.version)
        except Exception as e:  # a schema or CEL rule that does not compile
            raise _crd_invalid(
                name, f"spec.versions[{rt.version}].schema.openAPIV3Schema", f"Invalid value: {e}"
            ) from e
    return types


def established_status(crd: dict[str, Any], now: str) -> dict[str, Any]:
    spec = crd["spec"]

    def condition(kind: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True",
            "lastTransitionTime": now,
            "reason": reason,
            "message": message,
        }

    return {
        "acceptedNames": spec["names"],
        "conditions": [
            condition("NamesAccepted", "NoConflicts", "no conflicts found"),
            condition(
                "Established", "InitialNamesAccepted", "the initial names have been accepted"
            ),
        ],
        "storedVersions": [v["name"] for v in spec["versions"] if v.get("storage")],
    }
