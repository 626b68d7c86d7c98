"""The API verbs with the real server's object semantics, independent of HTTP.

create/replace/patch apply what the generic registry and the custom-resource strategies
do: uid, creationTimestamp, resourceVersion, generation, generateName, status subresource
rules, optimistic concurrency, no new finalizers while deleting, dry-run, no-op writes not
written, and CRD registration. Deletion lives in `deletion`, server-side apply in `applying`.
"""

from __future__ import annotations

import json
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tests.support.kube_emulator import applying, clock, crds, defaults, deletion, patching
from tests.support.kube_emulator.admission import FieldValidation, admit, check_name
from tests.support.kube_emulator.copying import clone
from tests.support.kube_emulator.errors import (
    STALE,
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
    unsupported_media_type,
)
from tests.support.kube_emulator.registry import TypeRegistry
from tests.support.kube_emulator.resources import ResourceType
from tests.support.kube_emulator.selectors import Predicate
from tests.support.kube_emulator.store import Store

INITIAL_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_IMMUTABLE_META = (
    "uid", "creationTimestamp", "namespace", "name", "generation", "deletionTimestamp",
    "deletionGracePeriodSeconds", "resourceVersion", "managedFields",
)  # fmt: skip
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_CUSTOM_PATCH_TYPES = (patching.JSON_PATCH, patching.MERGE_PATCH, patching.APPLY_PATCH)
_CRD_KEY = ("apiextensions.k8s.io", "customresourcedefinitions")
_NS_KEY = ("", "namespaces")


@dataclass(frozen=True)
class WriteAttempt:
    """A create, update or delete about to be stored, as validating admission sees it."""

    rt: ResourceType
    operation: str  # CREATE | UPDATE | DELETE
    subresource: str | None
    object: dict[str, Any] | None  # None on DELETE
    old_object: dict[str, Any] | None  # None on CREATE
    dry_run: bool


# Validating admission after the server's own checks, before storage (also for dry-run and
# no-op writes, as the apiserver admits them): warnings, or ApiError to refuse the write.
ValidatingAdmission = Callable[[WriteAttempt], list[str]]


@dataclass
class Written:
    """What a write answers: the object, HTTP status and warnings for `Warning` headers."""

    object: dict[str, Any]
    code: int = 200
    warnings: list[str] = field(default_factory=list)


class Cluster:
    def __init__(self, history_size: int = 10_000) -> None:
        self.store = Store(history_size)
        self.types = TypeRegistry()
        self.applied = applying.AppliedConfigs()
        self.validating_admission: ValidatingAdmission | None = None
        ns_type = self.types.get("", "v1", "namespaces")
        assert ns_type is not None
        for name in INITIAL_NAMESPACES:
            self.create(ns_type, None, {"metadata": {"name": name}})

    # -- reads -----------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        obj = self.store.get(rt.key, namespace or "", name)
        if obj is None:
            raise not_found(rt.group, rt.plural, name)
        return self.as_version(rt, obj)

    def select(
        self, rt: ResourceType, namespace: str | None, predicate: Predicate
    ) -> list[dict[str, Any]]:
        return [
            self.as_version(rt, obj)
            for obj in self.store.items(rt.key, namespace)
            if predicate(obj)
        ]

    def select_view(
        self, rt: ResourceType, namespace: str | None, predicate: Predicate
    ) -> list[dict[str, Any]]:
        """`select` without the deep copies, for a list answer serialised at once: each item
        is a shallow copy with its apiVersion and kind; what it holds is the store's own,
        to read, never to change."""
        return [
            {**obj, "apiVersion": rt.api_version, "kind": rt.kind}
            for obj in self.store.views(rt.key, namespace)
            if predicate(obj)
        ]

    @staticmethod
    def as_version(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """All versions of a resource share storage; each is served under its own apiVersion."""
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        return obj

    # -- create ----------------------------------------------------------------------------

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: FieldValidation = "Strict",
    ) -> Written:
        obj = self._check_body(rt, body)
        meta = obj.setdefault("metadata", {})
        self._place(rt, namespace, meta)
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(
                    rt.group, rt.kind, "",
                    [("metadata.name", "FieldValueRequired",
                      "Required value: name or generateName is required")],
                )  # fmt: skip
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(_NAME_CHARS) for _ in range(5)
            )
        check_name(rt, meta["name"])
        if meta.get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")
        if self.store.get(rt.key, meta.get("namespace", ""), meta["name"]) is not None:
            raise already_exists(rt.group, rt.plural, meta["name"])
        for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(transient, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = clock.now()
        if rt.has_generation:
            meta["generation"] = 1
        if "status" in rt.subresources and not rt.status_on_create:
            obj.pop("status", None)
        defaults.on_create(rt, obj)
        admitted = admit(rt, obj, field_validation=field_validation, old=None, is_patch=False)
        obj = admitted.object
        if self.validating_admission is not None:
            attempt = WriteAttempt(rt, "CREATE", None, obj, None, dry_run)
            admitted.warnings += self.validating_admission(attempt)
        new_types = crds.types_for(obj) if rt.key == _CRD_KEY else []
        if dry_run:
            return Written(obj, 201, admitted.warnings)
        stored = self.store.put(rt.key, obj)
        if rt.key == _CRD_KEY:
            self._register(new_types)
            status_obj = clone(stored)
            status_obj["status"] = crds.established_status(stored, clock.now())
            self.store.put(rt.key, status_obj)  # as the CRD controllers do, just after
        return Written(self.as_version(rt, stored), 201, admitted.warnings)

    def _check_body(self, rt: ResourceType, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        obj = clone(body)
        for field_name, expected in (("apiVersion", rt.api_version), ("kind", rt.kind)):
            given = obj.get(field_name)
            if given and given != expected:
                raise bad_request(
                    f"the {'API version' if field_name == 'apiVersion' else 'kind'} in the data "
                    f"({given}) does not match the expected "
                    f"{'API version' if field_name == 'apiVersion' else 'kind'} ({expected})"
                )
            obj[field_name] = expected
        if not isinstance(obj.get("metadata", {}), dict):
            raise bad_request("metadata must be an object")
        return obj

    def _place(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> None:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        assert namespace is not None
        if meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        meta["namespace"] = namespace
        ns = self.store.get(_NS_KEY, "", namespace)
        if ns is None:
            raise not_found("", "namespaces", namespace)
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(
                403,
                f"{rt.group_resource} is forbidden: unable to create new content in namespace "
                f"{namespace} because it is being terminated",
                reason="Forbidden",
            )

    def _register(self, types: list[ResourceType]) -> None:
        for rt in types:
            self.types.remove_key(rt.group, rt.plural)
        for rt in types:
            self.types.add(rt)

    # -- update ----------------------------------------------------------------------------

    def replace(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Strict",
    ) -> Written:
        new = self._check_body(rt, body)
        meta = new.setdefault("metadata", {})
        if meta.get("name") and meta["name"] != name:
            raise bad_request(
                f"the name of the object ({meta['name']}) does not match the name on the URL "
                f"({name})"
            )
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        current = self.get(rt, namespace, name)
        given_rv = meta.get("resourceVersion")
        if not given_rv and (rt.custom or rt.key == _CRD_KEY):
            raise invalid(
                rt.group, rt.kind, name,
                [("metadata.resourceVersion", "FieldValueInvalid",
                  "Invalid value: 0x0: must be specified for an update")],
            )  # fmt: skip
        if given_rv and given_rv != current["metadata"]["resourceVersion"]:
            raise conflict(rt.group, rt.plural, name, STALE)
        return self._update(
            rt, current, new, subresource=subresource, dry_run=dry_run,
            field_validation=field_validation, is_patch=False,
        )  # fmt: skip

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        raw: bytes,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_validation: FieldValidation = "Strict",
        field_manager: str | None = None,
    ) -> Written:
        if content_type == patching.APPLY_PATCH:
            return self._apply(
                rt, namespace, name, raw, subresource=subresource, dry_run=dry_run,
                field_validation=field_validation, field_manager=field_manager,
            )  # fmt: skip
        if rt.custom and content_type not in _CUSTOM_PATCH_TYPES:
            raise unsupported_media_type(content_type, _CUSTOM_PATCH_TYPES)
        try:
            body = _json(raw)
        except ValueError as e:
            raise bad_request(f"error decoding patch: {e}") from e
        current = self.get(rt, namespace, name)
        apply: Callable[[Any, Any], Any]
        if content_type == patching.MERGE_PATCH:
            apply = patching.merge_patch
        elif content_type == patching.JSON_PATCH:
            apply = patching.json_patch
        elif content_type == patching.STRATEGIC_MERGE_PATCH:

            def apply(target: Any, patch: Any) -> Any:
                return patching.strategic_merge_patch(target, patch, rt.merge_keys)
        else:
            raise unsupported_media_type(
                content_type, (*_CUSTOM_PATCH_TYPES, patching.STRATEGIC_MERGE_PATCH)
            )
        patched = apply(current, body)
        if not isinstance(patched, dict):
            raise bad_request("the patch did not result in an object")
        patched_rv = (patched.get("metadata") or {}).get("resourceVersion")
        if patched_rv and patched_rv != current["metadata"]["resourceVersion"]:
            raise conflict(rt.group, rt.plural, name, STALE)
        return self._update(
            rt, current, patched, subresource=subresource, dry_run=dry_run,
            field_validation=field_validation, is_patch=True,
        )  # fmt: skip

    def _apply(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        raw: bytes,
        *,
        subresource: str | None,
        dry_run: bool,
        field_validation: FieldValidation,
        field_manager: str | None,
    ) -> Written:
        if not field_manager:
            raise bad_request("PATCH requests with apply must specify a fieldManager")
        try:
            config = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise bad_request(f"error decoding YAML: {e}") from e
        if not isinstance(config, dict):
            raise bad_request("the applied configuration must be an object")
        if subresource is None and self.store.get(rt.key, namespace or "", name) is None:
            written = self.create(
                rt, namespace, config, dry_run=dry_run, field_validation=field_validation
            )
        else:
            current = self.get(rt, namespace, name)
            uid = current["metadata"]["uid"]
            applied = applying.apply(current, self.applied.previous(uid, field_manager), config)
            written = self._update(
                rt, current, applied, subresource=subresource, dry_run=dry_run,
                field_validation=field_validation, is_patch=True,
            )  # fmt: skip
        if not dry_run:
            self.applied.record(written.object["metadata"]["uid"], field_manager, config)
        return written

    def _update(
        self,
        rt: ResourceType,
        old: dict[str, Any],
        new: dict[str, Any],
        *,
        subresource: str | None,
        dry_run: bool,
        field_validation: FieldValidation,
        is_patch: bool,
    ) -> Written:
        new = clone(new)
        if subresource == "status":
            status = new.get("status")
            new = clone(old)
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        elif subresource is not None:
            raise not_found(rt.group, f"{rt.plural}/{subresource}", old["metadata"]["name"])
        elif "status" in rt.subresources:
            if "status" in old:
                new["status"] = clone(old["status"])
            else:
                new.pop("status", None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        for key in _IMMUTABLE_META:
            if key in old["metadata"]:
                meta[key] = clone(old["metadata"][key])
            else:
                meta.pop(key, None)
        if old["metadata"].get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old["metadata"].get("finalizers") or ())
            if added:
                raise invalid(
                    rt.group, rt.kind, meta["name"],
                    [("metadata.finalizers", "FieldValueForbidden",
                      "Forbidden: no new finalizers can be added if the object is being deleted, "
                      f"found new finalizers {sorted(added)}")],
                )  # fmt: skip
        defaults.on_update(rt, old, new)
        admitted = admit(rt, new, field_validation=field_validation, old=old, is_patch=is_patch)
        new = admitted.object
        if self.validating_admission is not None:
            attempt = WriteAttempt(rt, "UPDATE", subresource, new, old, dry_run)
            admitted.warnings += self.validating_admission(attempt)
        if rt.has_generation and self._spec_part(rt, new) != self._spec_part(rt, old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 0) + 1
        new_types = crds.types_for(new) if rt.key == _CRD_KEY else []
        if new == old:
            return Written(old, 200, admitted.warnings)  # a no-op writes nothing
        if dry_run:
            return Written(new, 200, admitted.warnings)
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            gone = self._remove(rt, new)
            return Written(gone, 200, admitted.warnings)
        stored = self.store.put(rt.key, new)
        if rt.key == _CRD_KEY:
            self._register(new_types)
        return Written(self.as_version(rt, stored), 200, admitted.warnings)

    @staticmethod
    def _spec_part(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        skip = {"metadata", "apiVersion", "kind"}
        if "status" in rt.subresources:
            skip.add("status")
        return {k: v for k, v in obj.items() if k not in skip}

    # -- delete ----------------------------------------------------------------------------

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: dict[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> Written:
        if self.validating_admission is not None:
            current = self.get(rt, namespace, name)
            self.validating_admission(WriteAttempt(rt, "DELETE", None, None, current, dry_run))
        return Written(deletion.delete(self, rt, namespace, name, options, dry_run=dry_run))

    def _remove(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        return deletion.remove(self, rt, obj)


def _json(raw: bytes) -> Any:
    return json.loads(raw or b"null")
