"""The authorizing emulator's pure parts: request attributes as the apiserver's RequestInfo
derives them, RBAC rule matching, and admission-policy resource rules (no server)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.kube_emulator.admission_policies import (
    AdmissionRequest,
    labels_match,
    rule_matches,
)
from tests.support.kube_emulator.authn import UserInfo
from tests.support.kube_emulator.rbac import rule_allows
from tests.support.kube_emulator.request_info import RequestAttributes, attributes
from tests.support.kube_emulator.resources import ResourceType


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/a/configmaps/x", {}, ("get", "", "configmaps", "", "a", "x")),
        ("GET", "/api/v1/namespaces/a/configmaps", {}, ("list", "", "configmaps", "", "a", "")),
        ("GET", "/api/v1/namespaces/a/configmaps", {"watch": "true"},
         ("watch", "", "configmaps", "", "a", "")),
        ("GET", "/api/v1/namespaces/a/configmaps", {"fieldSelector": "metadata.name=x"},
         ("list", "", "configmaps", "", "a", "x")),
        ("GET", "/api/v1/namespaces/a/configmaps", {"fieldSelector": "metadata.name!=x"},
         ("list", "", "configmaps", "", "a", "")),
        ("POST", "/api/v1/namespaces/a/configmaps", {}, ("create", "", "configmaps", "", "a", "")),
        ("DELETE", "/api/v1/namespaces/a/configmaps", {},
         ("deletecollection", "", "configmaps", "", "a", "")),
        ("PATCH", "/apis/modelswap.io/v1alpha1/swapnodes/n/status", {},
         ("patch", "modelswap.io", "swapnodes", "status", "", "n")),
        ("PUT", "/apis/coordination.k8s.io/v1/namespaces/l/leases/n", {},
         ("update", "coordination.k8s.io", "leases", "", "l", "n")),
        ("POST", "/api/v1/namespaces/a/serviceaccounts/s/token", {},
         ("create", "", "serviceaccounts", "token", "a", "s")),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "", "a", "a")),
    ],
)  # fmt: skip
def test_request_attributes(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    attrs = attributes(method, path, query)
    assert attrs.resource_request
    got = (attrs.verb, attrs.api_group, attrs.resource, attrs.subresource, attrs.namespace,
           attrs.name)  # fmt: skip
    assert got == expected


def test_non_resource_requests_use_the_lower_case_method() -> None:
    attrs = attributes("GET", "/apis", {})
    assert (attrs.resource_request, attrs.verb, attrs.path) == (False, "get", "/apis")


def _attrs(verb: str, resource: str, name: str = "", group: str = "") -> RequestAttributes:
    plural, _, sub = resource.partition("/")
    return RequestAttributes(verb=verb, path="", resource_request=True, api_group=group,
                             resource=plural, subresource=sub, namespace="a", name=name)  # fmt: skip


@pytest.mark.parametrize(
    ("rule", "request_", "allowed"),
    [
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}, _attrs("get", "pods"), True),
        ({"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
         _attrs("get", "pods/log"), False),
        ({"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
         _attrs("get", "pods/log"), True),
        ({"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["patch"]},
         _attrs("patch", "swapnodes/status", group="modelswap.io"), True),
        ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
         _attrs("patch", "swapnodes/status", group="modelswap.io"), True),
        ({"apiGroups": ["apps"], "resources": ["*"], "verbs": ["get"]},
         _attrs("get", "pods"), False),
        ({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
          "resourceNames": ["x"]}, _attrs("get", "configmaps", "x"), True),
        ({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
          "resourceNames": ["x"]}, _attrs("get", "configmaps", "y"), False),
        ({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"],
          "resourceNames": ["x"]}, _attrs("create", "configmaps"), False),
        ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]},
         RequestAttributes("get", "/apis/apps", False), True),
        ({"nonResourceURLs": ["/apis/*"], "verbs": ["get"]},
         RequestAttributes("get", "/apis", False), False),
        ({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
         RequestAttributes("get", "/healthz", False), False),
    ],
)  # fmt: skip
def test_rbac_rule_matching(
    rule: dict[str, Any], request_: RequestAttributes, allowed: bool
) -> None:
    assert rule_allows(rule, request_) is allowed


def _write(resource: str, operation: str = "UPDATE", name: str = "n") -> AdmissionRequest:
    plural, _, sub = resource.partition("/")
    rt = ResourceType(group="modelswap.io", version="v1alpha1", plural=plural,
                      singular=plural[:-1], kind="SwapNode", namespaced=False)  # fmt: skip
    obj = {"metadata": {"name": name}}
    return AdmissionRequest(rt=rt, operation=operation, subresource=sub, name=name,
                            namespace="", object=obj, old_object=obj, user=UserInfo("u"),
                            dry_run=False)  # fmt: skip


@pytest.mark.parametrize(
    ("resources", "request_", "matched"),
    [
        (["swapnodes"], _write("swapnodes"), True),
        (["swapnodes"], _write("swapnodes/status"), False),
        (["swapnodes/status"], _write("swapnodes/status"), True),
        (["*"], _write("swapnodes/status"), False),
        (["*/*"], _write("swapnodes/status"), True),
        (["swapnodes/*"], _write("swapnodes/status"), True),
        # `res/*` also matches `res` itself: the apiserver's matcher compares "*" with "".
        (["swapnodes/*"], _write("swapnodes"), True),
    ],
)
def test_policy_resource_rules_treat_subresources_as_the_apiserver_does(
    resources: list[str], request_: AdmissionRequest, matched: bool
) -> None:
    rule = {"apiGroups": ["modelswap.io"], "apiVersions": ["*"], "operations": ["UPDATE"],
            "resources": resources}  # fmt: skip
    assert rule_matches(rule, request_) is matched


def test_policy_rules_check_operation_scope_and_names() -> None:
    base = {"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["swapnodes"]}
    assert not rule_matches({**base, "operations": ["CREATE"]}, _write("swapnodes"))
    assert not rule_matches({**base, "operations": ["*"], "scope": "Namespaced"},
                             _write("swapnodes"))  # fmt: skip
    assert rule_matches({**base, "operations": ["*"], "scope": "Cluster"}, _write("swapnodes"))
    named = {**base, "operations": ["*"], "resourceNames": ["a"]}
    assert rule_matches(named, _write("swapnodes", name="a"))
    assert not rule_matches(named, _write("swapnodes", name="b"))


def test_label_selectors() -> None:
    labels = {"tier": "gpu", "zone": "a"}
    assert labels_match(None, labels) and labels_match({}, labels)
    assert labels_match({"matchLabels": {"tier": "gpu"}}, labels)
    assert not labels_match({"matchLabels": {"tier": "cpu"}}, labels)
    expressions = [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "rack", "operator": "NotIn", "values": ["a"]}, True),
        ({"key": "rack", "operator": "Exists"}, False),
        ({"key": "rack", "operator": "DoesNotExist"}, True),
    ]
    for expression, expected in expressions:
        assert labels_match({"matchExpressions": [expression]}, labels) is expected, expression
