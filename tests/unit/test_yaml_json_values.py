"""Values PyYAML reads into types JSON cannot hold (a date, bytes, a set, ...) are refused
with their field path, by `modelswap validate` and by local mode's folder reader, one
document at a time: the file's and the folder's other documents are still checked and
served. Before, they reached the validator and ended in a TypeError traceback (validate)
or an exception that stopped local mode reading its folder."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.validate_command import validate_paths
from modelswap_api.yaml_input import (
    RefusedDocument,
    YamlInputError,
    json_problem,
    load_text,
    read_text,
)
from modelswap_sidecar.local.manifests import read_folder

GOOD = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}
  namespace: default
{labels}spec:
  model:
    source: {{uri: /models/mlp}}
    weightsBytes: 32Mi
"""

#: (the YAML under metadata.labels, the field path named, a piece of the message)
NOT_JSON = [
    ("  labels: {since: 2024-01-01}\n", "metadata.labels.since", "is read as a date"),
    (
        "  labels: {at: 2001-12-14t21:59:43.10-05:00}\n",
        "metadata.labels.at",
        "is read as a timestamp",
    ),
    ("  labels: {at: 2024-01-01 10:00:00}\n", "metadata.labels.at", "is read as a timestamp"),
    ("  labels: {blob: !!binary aGVsbG8=}\n", "metadata.labels.blob", "!!binary bytes"),
    ("  labels: {tags: !!set {a, b}}\n", "metadata.labels.tags", "a !!set"),
    ("  labels: {m: !!omap [{a: 1}]}\n", "metadata.labels.m[0]", "!!omap or !!pairs"),
    ("  labels: {m: !!pairs [{a: 1}]}\n", "metadata.labels.m[0]", "!!omap or !!pairs"),
    ("  labels: {x: .nan}\n", "metadata.labels.x", "not a number JSON can hold"),
    ("  labels: {x: [1, -.inf]}\n", "metadata.labels.x[1]", "not a number JSON can hold"),
    ("  labels: {1: a}\n", "metadata.labels", "the key 1 is read as an integer"),
    ("  labels: {yes: a}\n", "metadata.labels", "the key True is read as a boolean"),
    ("  labels: {2024-01-01: a}\n", "metadata.labels", "the key 2024-01-01 is read as a date"),
    ("  labels: {~: a}\n", "metadata.labels", "the key None is read as null"),
]


def _file(tmp_path: Path, labels: str) -> Path:
    """One bad document between two good ones."""
    bad = GOOD.format(name="bad", labels=labels)
    text = "---\n".join(
        [GOOD.format(name="first", labels=""), bad, GOOD.format(name="last", labels="")]
    )
    path = tmp_path / "models.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("labels", "field", "what"), NOT_JSON)
def test_validate_names_the_field_of_a_non_json_value_and_checks_the_other_documents(
    tmp_path: Path, labels: str, field: str, what: str
) -> None:
    path = _file(tmp_path, labels)
    out = io.StringIO()
    assert validate_paths([path], out) == 1
    lines = out.getvalue().splitlines()
    assert lines == [
        f"{path}: ModelDeployment default/bad: {field}: " + lines[0].split(f"{field}: ", 1)[1],
        "3 document(s) checked: 1 problem(s)",
    ]
    assert what in lines[0]


@pytest.mark.parametrize(("labels", "field", "what"), NOT_JSON)
def test_local_mode_refuses_the_document_by_field_and_serves_the_rest(
    tmp_path: Path, labels: str, field: str, what: str
) -> None:
    path = _file(tmp_path, labels)
    (tmp_path / "other.yaml").write_text(GOOD.format(name="other", labels=""))
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert sorted(m.name for m in models) == ["first", "last", "other"]
    [problem] = problems
    assert problem.file == path
    assert problem.label == "ModelDeployment default/bad"
    assert problem.message.startswith(f"{field}: ") and what in problem.message


def test_an_unquoted_date_as_the_name_is_refused_without_a_traceback(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD.format(name="2024-01-01", labels=""))
    out = io.StringIO()
    assert validate_paths([path], out) == 1
    assert "metadata.name: 2024-01-01 is read as a date, which JSON cannot hold; quote it" in (
        out.getvalue()
    )
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert models == []
    assert [p.label for p in problems] == ["document 1"]  # the name is no string
    assert problems[0].message.startswith("metadata.name: ")
    # quoted, it is a name like any other
    path.write_text(GOOD.format(name="'2024-01-01'", labels=""))
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert (problems, [m.name for m in models]) == ([], ["2024-01-01"])


def test_an_integer_too_long_for_python_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD.format(name="m", labels="").replace("32Mi", "1" * 5000))
    out = io.StringIO()
    assert validate_paths([path], out) == 1
    assert f"{path}: file: line 9: an integer longer than" in out.getvalue()
    (tmp_path / "ok.yaml").write_text(GOOD.format(name="ok", labels=""))
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert [m.name for m in models] == ["ok"]
    assert [(p.file.name, p.label) for p in problems] == [("m.yaml", "file")]


def test_load_text_refuses_the_file_naming_the_document_and_read_text_only_the_document() -> None:
    text = "a: 1\n---\nb: {c: !!set {x}}\n---\nd: 2\n"
    with pytest.raises(YamlInputError, match=r"^document 2: b\.c: a !!set"):
        load_text(text)
    first, refused, last = read_text(text)
    assert (first, last) == ({"a": 1}, {"d": 2})
    assert isinstance(refused, RefusedDocument)
    assert refused.message.startswith("b.c: ")


def test_json_values_pass_and_shared_collections_are_walked_once() -> None:
    shared = {"k": [1, 2.5, True, None, "s"]}
    document = {"a": shared, "b": shared, "c": [shared] * 1000}
    assert json_problem(document) is None
    assert json_problem(b"x") == "(document): !!binary bytes, which JSON cannot hold; give " + (
        "the base64 text as a string"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("!!timestamp 2024-13-45", "line 9: '2024-13-45' cannot be read as !!timestamp"),
        ("!!timestamp 99999-01-01", "line 9: '99999-01-01' cannot be read as !!timestamp"),
        ("!!float x", "line 9: 'x' cannot be read as !!float"),
        ("!!bool x", "line 9: 'x' cannot be read as !!bool"),
        ("!!int 1.5", "line 9: '1.5' cannot be read as !!int"),
    ],
)
def test_a_scalar_its_tag_cannot_read_refuses_the_file_naming_its_line(
    tmp_path: Path, value: str, message: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD.format(name="m", labels="").replace("32Mi", value))
    out = io.StringIO()
    assert validate_paths([path], out) == 1
    assert out.getvalue().splitlines()[0] == f"{path}: file: {message}"
    (tmp_path / "ok.yaml").write_text(GOOD.format(name="ok", labels=""))
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert [m.name for m in models] == ["ok"]
    assert [str(p) for p in problems] == [f"{path}: file: {message}"]


def test_a_hex_integer_past_what_python_can_write_is_refused_by_field(tmp_path: Path) -> None:
    """int(x, 16) has no digit limit, but str() of the result raises: no message could
    show it, and JSON has no use for it."""
    path = _file(tmp_path, "  labels: {x: [0x" + "f" * 5000 + "]}\n")
    out = io.StringIO()
    assert validate_paths([path], out) == 1
    assert "metadata.labels.x[0]: an integer of more than 4300 digits" in out.getvalue()
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert sorted(m.name for m in models) == ["first", "last"]
    assert [p.message for p in problems] == [
        "metadata.labels.x[0]: an integer of more than 4300 digits"
    ]
