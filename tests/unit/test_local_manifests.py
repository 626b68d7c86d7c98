"""Local mode's pure parts: reading a folder, UIDs, generations, the status table."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.local import manifests
from modelswap_sidecar.local.desired import Generations, desired_set
from modelswap_sidecar.local.manifests import (
    MAX_LOCAL_MODELS,
    LocalModel,
    cap_models,
    local_uid,
    read_folder,
)
from modelswap_sidecar.local.status import COLUMNS, rows, short_age, table

ROOT = Path(__file__).resolve().parents[2]


TOY = ROOT / "examples" / "toy"


def test_the_examples_read_without_problems_and_uids_are_stable() -> None:
    models, problems = read_folder(TOY, BUILTIN_DEFAULTS)
    assert problems == []
    assert sorted(m.name for m in models) == ["chat-pinned", "classify", "summarize"]
    chat = next(m for m in models if m.name == "chat-pinned")
    assert chat.uid == local_uid("default", "chat-pinned")
    assert chat.policy.pinned
    again, _ = read_folder(TOY, BUILTIN_DEFAULTS)
    assert {m.uid for m in again} == {m.uid for m in models}


def test_the_real_model_examples_read_without_problems() -> None:
    models, problems = read_folder(ROOT / "examples", BUILTIN_DEFAULTS)
    assert problems == []
    assert "embed" in {m.name for m in models}


def test_a_bad_file_names_its_field_and_the_rest_are_kept(tmp_path: Path) -> None:
    good = (TOY / "classify-drop-on-idle.yaml").read_text()
    (tmp_path / "good.yaml").write_text(good)
    (tmp_path / "late.yaml").write_text(good.replace("idleAfter: 30s", "idleAfter: 5s"))
    (tmp_path / "bad.yml").write_text(
        good.replace("name: classify\n  namespace", "name: x\n  namespace").replace(
            "weightsBytes: 32Mi", "weightsBytes: -3"
        )
    )
    (tmp_path / "notes.txt").write_text("not yaml")
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert [m.file.name for m in models] == ["good.yaml"]
    text = "\n".join(str(p) for p in problems)
    assert "bad.yml" in text and "spec.model.weightsBytes" in text
    # after the merge: minResident 10s > idleAfter 5s, and a second classify
    assert "late.yaml" in text and "spec.swapPolicy" in text


def test_generations_grow_only_when_the_spec_changes() -> None:
    models, _ = read_folder(TOY, BUILTIN_DEFAULTS)
    generations = Generations()
    first = desired_set(models, generations, counter=1, node_name="local")
    second = desired_set(models, generations, counter=2, node_name="local")
    assert first.revision.term == second.revision.term == 1
    assert [e.generation for e in second.entries] == [1, 1, 1]
    assert second.revision > first.revision


def test_status_rows_and_ages() -> None:
    assert [short_age(s) for s in (5, 130, 3700, 90000)] == ["5s", "2m10s", "1h1m", "1d1h"]
    models = [
        {
            "uid": "u1",
            "namespace": "default",
            "name": "chat-pinned",
            "phase": "Resident",
            "residentBytes": 96 << 20,
            "lastRequestTime": "2026-01-01T00:00:00.000Z",
        }
    ]
    local = [{"uid": "u1", "model": "chat", "appliedAt": 1767225540.0}]
    body = rows(models, local, node_name="local", now_seconds=1767225610.0)
    assert body == [("chat-pinned", "chat", "local", "Resident", "96Mi", "10s", "70s")]
    assert table(body).splitlines()[0].split() == list(COLUMNS)


def _fake_models(file: Path, count: int) -> list[LocalModel]:
    models, _ = read_folder(TOY, BUILTIN_DEFAULTS)
    model = models[0]
    return [
        replace(model, file=file, name=f"{file.stem}{i}", uid=local_uid("default", f"{file}{i}"))
        for i in range(count)
    ]


def test_the_cap_serves_whole_files_in_name_order_and_refuses_the_rest_by_name() -> None:
    # given out of order: the cap goes by the files' names
    files = [Path(f"/f/{letter}.yaml") for letter in "ecabd"]
    models = [m for file in files for m in _fake_models(file, 900)]
    served, problems = cap_models(models)
    assert MAX_LOCAL_MODELS == 4096
    assert sorted({m.file.name for m in served}) == ["a.yaml", "b.yaml", "c.yaml", "d.yaml"]
    assert len(served) == 3600
    assert [(p.file.name, p.label) for p in problems] == [("e.yaml", "file")]
    # every file after the first that does not fit is refused too, however small
    small = _fake_models(Path("/f/f.yaml"), 1)
    served, problems = cap_models([*models, *small])
    assert [p.file.name for p in problems] == ["e.yaml", "f.yaml"]
    # exactly at the cap: all served
    served, problems = cap_models(_fake_models(Path("/f/a.yaml"), 4096))
    assert (len(served), problems) == (4096, [])


def test_a_document_whose_check_raises_is_one_problem_and_the_rest_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    good = (TOY / "classify-drop-on-idle.yaml").read_text()
    (tmp_path / "a.yaml").write_text(good)
    (tmp_path / "b.yaml").write_text(good.replace("name: classify", "name: boom"))
    real = manifests.validate_resource

    def validate(document: Any) -> Any:
        if document["metadata"]["name"] == "boom":
            raise RuntimeError("a bug in the validator")
        return real(document)

    monkeypatch.setattr(manifests, "validate_resource", validate)
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert [m.name for m in models] == ["classify"]
    assert [str(p) for p in problems] == [
        f"{tmp_path / 'b.yaml'}: document 1: cannot be checked (an internal error)"
    ]
    assert "a bug in the validator" in caplog.text  # its traceback is logged
