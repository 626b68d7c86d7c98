"""The validator: Kubernetes semantics on a small schema, then our CRDs' examples and refusals."""

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from modelswap_api.errors import CrdError
from modelswap_api.resources import validate_resource
from modelswap_api.validation import SchemaValidator

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml")) + sorted(
    (ROOT / "examples" / "toy").glob("*.yaml")
)
INVALID = sorted((ROOT / "tests" / "data" / "invalid").glob("*.yaml"))

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {
                    "x-kubernetes-int-or-string": True,
                    "minimum": 1,
                    "pattern": "^[1-9][0-9]*Mi$",
                },
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                "note": {"type": "string", "nullable": True, "maxLength": 4},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "items": {
                    "type": "array",
                    "maxItems": 2,
                    "items": {
                        "type": "object",
                        "properties": {"low": {"type": "integer"}, "high": {"type": "integer"}},
                        "x-kubernetes-validations": [
                            {
                                "rule": "self.low <= self.high",
                                "message": "low above high",
                                "fieldPath": ".low",
                            }
                        ],
                    },
                },
                "frozen": {
                    "type": "string",
                    "maxLength": 8,
                    "x-kubernetes-validations": [
                        {"rule": "self == oldSelf", "message": "frozen is immutable"}
                    ],
                },
            },
        }
    },
}


def validate(spec: dict[str, Any], **kwargs: Any) -> Any:
    return SchemaValidator(SCHEMA).validate(
        {"apiVersion": "x/v1", "kind": "X", "metadata": {"name": "n"}, "spec": spec}, **kwargs
    )


def test_int_or_string_accepts_both_and_checks_each_by_its_own_keywords() -> None:
    assert validate({"size": 5}).ok
    assert validate({"size": "5Mi"}).ok
    assert [e.path for e in validate({"size": 0}).errors] == ["spec.size"]
    assert [e.path for e in validate({"size": "5Gi"}).errors] == ["spec.size"]
    assert validate({"size": 1.5}).errors[0].reason == "FieldValueTypeInvalid"


def test_unknown_fields_are_pruned_and_reported_but_preserved_where_the_schema_says() -> None:
    result = validate({"size": 5, "extra": 1, "free": {"anything": [1]}, "labels": {"a": "b"}})
    assert result.ok
    assert result.unknown_fields == ("spec.extra",)
    assert "extra" not in result.object["spec"]
    assert result.object["spec"]["free"] == {"anything": [1]}
    assert result.object["metadata"] == {"name": "n"}


def test_defaults_are_applied_and_nullable_admits_null() -> None:
    result = validate({"size": 5, "note": None})
    assert result.ok, result.errors
    assert result.object["spec"]["mode"] == "a"


def test_errors_name_each_field_with_the_api_servers_wording() -> None:
    result = validate({"mode": "c", "note": "too long", "labels": {"a": 1}})
    messages = {e.path: (e.reason, e.message) for e in result.errors}
    assert messages["spec.size"] == ("FieldValueRequired", "Required value")
    assert messages["spec.mode"][0] == "FieldValueNotSupported"
    assert 'supported values: "a", "b"' in messages["spec.mode"][1]
    assert messages["spec.note"][0] == "FieldValueTooLong"
    assert messages["spec.labels.a"][0] == "FieldValueTypeInvalid"


def test_cel_rules_report_their_field_path_and_run_per_list_item() -> None:
    result = validate({"size": 5, "items": [{"low": 1, "high": 2}, {"low": 3, "high": 2}]})
    assert [str(e) for e in result.errors] == [
        'spec.items[1].low: Invalid value: "object": low above high'
    ]


def test_cel_rules_do_not_run_on_a_subtree_that_failed_its_schema() -> None:
    result = validate({"size": 5, "items": [{"low": "x", "high": 2}]})
    assert [e.reason for e in result.errors] == ["FieldValueTypeInvalid"]


def test_transition_rules_run_only_against_an_old_object() -> None:
    assert validate({"size": 5, "frozen": "a"}).ok
    old = {"spec": {"size": 5, "frozen": "a"}}
    assert validate({"size": 5, "frozen": "a"}, old=old).ok
    changed = validate({"size": 5, "frozen": "b"}, old=old)
    assert [e.path for e in changed.errors] == ["spec.frozen"]


def test_a_rule_that_does_not_compile_is_refused_when_the_validator_is_built() -> None:
    schema = {"type": "object", "x-kubernetes-validations": [{"rule": "self.a ++"}]}
    with pytest.raises(CrdError, match="does not compile"):
        SchemaValidator(schema)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        result = validate_resource(document)
        assert result.ok, [str(e) for e in result.errors]
        assert result.unknown_fields == ()


def expected_path(path: Path) -> str:
    match = re.search(r"^# expect: (\S+)$", path.read_text(), re.MULTILINE)
    assert match, f"{path} lacks an '# expect: <field path>' line"
    return match.group(1)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_every_invalid_file_is_refused_naming_its_field(path: Path) -> None:
    result = validate_resource(yaml.safe_load(path.read_text()))
    assert not result.ok
    assert expected_path(path) in [e.path for e in result.errors], [str(e) for e in result.errors]


def test_the_invalid_set_covers_the_quantities_the_issue_names() -> None:
    values = {
        str(yaml.safe_load(p.read_text())["spec"]["model"].get("weightsBytes")) for p in INVALID
    }
    assert {"0", "-1", "500m", "0Gi"} <= values
    assert any("unknown field" in p.read_text() or "idleAftr" in p.read_text() for p in INVALID)


def test_wrong_api_version_kind_and_name_are_refused() -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    assert [e.path for e in validate_resource({**doc, "apiVersion": "modelswap.io/v1"}).errors] == [
        "apiVersion"
    ]
    assert [e.path for e in validate_resource({**doc, "kind": "Model"}).errors] == ["kind"]
    bad_name = {**doc, "metadata": {"name": "Not_A_Name"}}
    assert [e.path for e in validate_resource(bad_name).errors] == ["metadata.name"]


def test_warn_and_ignore_prune_unknown_fields_without_refusing() -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    doc["spec"]["surprise"] = True
    for mode in ("Warn", "Ignore"):
        result = validate_resource(doc, field_validation=mode)  # type: ignore[arg-type]
        assert result.ok
        assert result.unknown_fields == ("spec.surprise",)
        assert "surprise" not in result.object["spec"]
