"""Local mode's folder watcher against a fake control API: a model whose file is removed is
left out of the next push and then forgotten (DELETE), so `GET /v1/models` stops listing it;
a DELETE that fails is sent again after the next push. Deletions wait out a grace on an
injected clock; the folder is capped at whole files; a non-JSON value refuses its document
only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.local.manifests import MAX_LOCAL_MODELS
from modelswap_sidecar.local.watcher import DELETION_GRACE_SECONDS, FolderWatcher

MODEL = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}
spec:
  model:
    source: {{uri: /models/mlp}}
    weightsBytes: 32Mi
"""


class Clock:
    """An injected monotonic clock: a test moves it on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeControl:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.pushed: list[list[str]] = []
        self.refuse_deletes = False
        #: the names and generations of each push taken
        self.generations: list[dict[str, int]] = []
        #: a push of more entries is refused (400), as the agent refuses over MAX_ENTRIES
        self.max_entries = 4096

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.method == "PUT":
            entries = json.loads(request.content)["entries"]
            if len(entries) > self.max_entries:
                return httpx.Response(400, json={"error": "entries: too many"})
            self.generations.append({e["name"]: e["generation"] for e in entries})
            self.pushed.append(sorted(e["name"] for e in entries))
            results = [
                {"uid": e["uid"], "outcome": "applied", "reason": "Loading"} for e in entries
            ]
            return httpx.Response(200, json={"results": results})
        if self.refuse_deletes:
            return httpx.Response(503, json={"error": "busy"})
        return httpx.Response(200, json={"outcome": "completed", "reason": "Forgotten"})


def test_a_removed_file_is_pushed_out_then_forgotten_and_a_failed_delete_is_retried(
    tmp_path: Path,
) -> None:
    for name in ("classify", "embed"):
        (tmp_path / f"{name}.yaml").write_text(MODEL.format(name=name))
    control = FakeControl()
    clock = Clock()
    watcher = FolderWatcher(
        tmp_path,
        BUILTIN_DEFAULTS,
        control_url="http://agent",
        token="t",
        node_name="local",
        clock=clock,
    )
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert control.pushed == [["classify", "embed"]]
        uid = next(m.uid for m in watcher.applied.models if m.name == "embed")
        assert not [c for c in control.calls if c[0] == "DELETE"]

        (tmp_path / "embed.yaml").unlink()
        control.refuse_deletes = True
        watcher.poll(client)  # within the deletion grace: kept
        assert control.pushed[-1] == ["classify", "embed"]
        clock.now += DELETION_GRACE_SECONDS
        watcher.poll(client)
        assert control.pushed[-1] == ["classify"]
        assert control.calls[-1] == ("DELETE", f"/v1/models/{uid}")

        control.refuse_deletes = False
        watcher.resync_seconds = 0.0  # the next push is due at once
        watcher.poll(client)
        assert control.calls[-2:] == [("PUT", "/v1/desired"), ("DELETE", f"/v1/models/{uid}")]
        calls = len(control.calls)
        watcher.poll(client)
        assert [c[0] for c in control.calls[calls:]] == ["PUT"]  # forgotten once, not again


def _watcher(folder: Path, clock: Clock, **kwargs: Any) -> FolderWatcher:
    return FolderWatcher(
        folder,
        BUILTIN_DEFAULTS,
        control_url="http://agent",
        token="t",
        node_name="local",
        clock=clock,
        **kwargs,
    )


def _deletes(control: FakeControl) -> list[tuple[str, str]]:
    return [c for c in control.calls if c[0] == "DELETE"]


def test_a_file_emptied_and_written_again_within_the_grace_changes_nothing(
    tmp_path: Path,
) -> None:
    for name in ("classify", "embed"):
        (tmp_path / f"{name}.yaml").write_text(MODEL.format(name=name))
    control, clock = FakeControl(), Clock()
    watcher = _watcher(tmp_path, clock)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        before = watcher.applied.models
        assert control.generations == [{"classify": 1, "embed": 1}]

        (tmp_path / "embed.yaml").write_text("")  # an editor's save truncates it first
        watcher.poll(client)
        clock.now += DELETION_GRACE_SECONDS - 0.5
        watcher.poll(client)
        (tmp_path / "embed.yaml").write_text(MODEL.format(name="embed") + "# saved\n")
        watcher.poll(client)
        clock.now += DELETION_GRACE_SECONDS  # past the first grace: nothing is due any more
        watcher.poll(client)

        assert _deletes(control) == []
        assert all(g == {"classify": 1, "embed": 1} for g in control.generations)
        assert {m.uid for m in watcher.applied.models} == {m.uid for m in before}

        # removed and written again within the grace (a save by rename): the same
        (tmp_path / "embed.yaml").unlink()
        watcher.poll(client)
        clock.now += 1.0
        (tmp_path / "embed.yaml").write_text(MODEL.format(name="embed"))
        watcher.poll(client)
        clock.now += DELETION_GRACE_SECONDS
        watcher.poll(client)
        assert _deletes(control) == []
        assert control.generations[-1] == {"classify": 1, "embed": 1}


def test_a_file_left_empty_past_the_grace_removes_its_model(tmp_path: Path) -> None:
    for name in ("classify", "embed"):
        (tmp_path / f"{name}.yaml").write_text(MODEL.format(name=name))
    control, clock = FakeControl(), Clock()
    watcher = _watcher(tmp_path, clock)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        uid = next(m.uid for m in watcher.applied.models if m.name == "embed")
        (tmp_path / "embed.yaml").write_text("# nothing here any more\n")
        watcher.poll(client)
        clock.now += DELETION_GRACE_SECONDS - 0.5
        watcher.poll(client)  # no change in the folder, grace not over: nothing read
        assert control.pushed[-1] == ["classify", "embed"]
        assert _deletes(control) == []

        clock.now += 0.5  # the grace is over: read again although the folder is unchanged
        watcher.poll(client)
        assert control.pushed[-1] == ["classify"]
        assert _deletes(control) == [("DELETE", f"/v1/models/{uid}")]
        assert [m.name for m in watcher.applied.models] == ["classify"]


def test_a_model_taken_out_of_a_file_that_still_holds_documents_goes_at_once(
    tmp_path: Path,
) -> None:
    both = MODEL.format(name="classify") + "---\n" + MODEL.format(name="embed")
    (tmp_path / "models.yaml").write_text(both)
    control, clock = FakeControl(), Clock()
    watcher = _watcher(tmp_path, clock)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert control.pushed == [["classify", "embed"]]
        (tmp_path / "models.yaml").write_text(MODEL.format(name="classify"))
        watcher.poll(client)
        assert control.pushed[-1] == ["classify"]
        assert len(_deletes(control)) == 1


def _many(names: list[str]) -> str:
    return "---\n".join(MODEL.format(name=name) for name in names)


def test_past_the_cap_the_later_files_are_refused_by_name_and_the_rest_served(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.yaml").write_text(_many(["a1", "a2"]))
    (tmp_path / "b.yaml").write_text(_many(["b1"]))
    (tmp_path / "c.yaml").write_text(_many(["c1", "c2"]))  # would make 5 > 4
    (tmp_path / "d.yaml").write_text(_many(["d1"]))  # would fit, but comes after c
    control, clock = FakeControl(), Clock()
    control.max_entries = 4
    watcher = _watcher(tmp_path, clock, max_models=4)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert control.pushed == [["a1", "a2", "b1"]]  # taken: the push is not refused
        refused = {p.file.name: p.message for p in watcher.applied.problems}
        assert set(refused) == {"c.yaml", "d.yaml"}
        assert "at most 4 models" in refused["c.yaml"]

        # the edits of the served files are applied, not frozen
        (tmp_path / "b.yaml").write_text(_many(["b1"]).replace("32Mi", "64Mi"))
        watcher.poll(client)
        assert control.generations[-1] == {"a1": 1, "a2": 1, "b1": 2}

        # room made: the files past the cap are served
        (tmp_path / "a.yaml").write_text(_many(["a1"]))
        watcher.poll(client)
        assert control.pushed[-1] == ["a1", "b1", "c1", "c2"]
        assert {p.file.name for p in watcher.applied.problems} == {"d.yaml"}


def test_models_kept_while_their_file_is_unreadable_count_towards_the_cap(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.yaml").write_text(_many(["a1", "a2"]))
    (tmp_path / "b.yaml").write_text(_many(["b1"]))
    control, clock = FakeControl(), Clock()
    control.max_entries = 3
    watcher = _watcher(tmp_path, clock, max_models=3)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        (tmp_path / "a.yaml").write_text("a: [unclosed\n")  # a1, a2 keep their last spec
        (tmp_path / "c.yaml").write_text(_many(["c1"]))
        watcher.poll(client)
        assert control.pushed[-1] == ["a1", "a2", "b1"]
        assert "c.yaml" in {p.file.name for p in watcher.applied.problems}


def test_a_push_refused_as_a_bad_request_is_not_sent_again_until_a_change(
    tmp_path: Path,
) -> None:
    (tmp_path / "a.yaml").write_text(_many(["a1", "a2"]))
    control, clock = FakeControl(), Clock()
    control.max_entries = 1  # the agent refuses this set (400)
    watcher = _watcher(tmp_path, clock)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        for _ in range(3):
            watcher.poll(client)
        assert [c for c in control.calls if c[0] == "PUT"] == [("PUT", "/v1/desired")]
        (tmp_path / "a.yaml").write_text(_many(["a1"]))
        watcher.poll(client)
        assert control.pushed == [["a1"]]


def test_a_non_json_value_refuses_its_document_and_the_folder_goes_on(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(MODEL.format(name="classify"))
    (tmp_path / "b.yaml").write_text(MODEL.format(name="embed"))
    control, clock = FakeControl(), Clock()
    states: list[int] = []
    watcher = _watcher(
        tmp_path, clock, on_change=lambda applied: states.append(len(applied.problems))
    )
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        # embed's file gains a date: embed keeps its last valid spec, the problem is named
        (tmp_path / "b.yaml").write_text(
            MODEL.format(name="embed").replace(
                "metadata:\n", "metadata:\n  labels: {since: 2024-01-01}\n"
            )
        )
        watcher.poll(client)
        [problem] = watcher.applied.problems
        assert problem.file.name == "b.yaml"
        assert "metadata.labels.since: 2024-01-01 is read as a date" in problem.message
        assert states[-1] == 1  # the state file (modelswap status) hears of it
        assert control.pushed[-1] == ["classify", "embed"]
        # another file's edit is still applied
        (tmp_path / "a.yaml").write_text(MODEL.format(name="classify").replace("32Mi", "64Mi"))
        watcher.poll(client)
        assert control.generations[-1] == {"classify": 2, "embed": 1}


@pytest.mark.slow
def test_five_files_of_900_models_serve_the_first_four_and_refuse_the_fifth_by_name(
    tmp_path: Path,
) -> None:
    """The report's folder: 4,500 models, over the agent's 4,096 entries."""
    for letter in "abcde":
        (tmp_path / f"{letter}.yaml").write_text(_many([f"{letter}{i}" for i in range(900)]))
    control, clock = FakeControl(), Clock()
    assert control.max_entries == MAX_LOCAL_MODELS == 4096
    watcher = _watcher(tmp_path, clock)
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert len(control.pushed) == 1 and len(control.pushed[0]) == 3600
        assert {name[0] for name in control.pushed[0]} == set("abcd")
        [problem] = watcher.applied.problems
        assert (problem.file.name, problem.label) == ("e.yaml", "file")
        assert "900 model(s) not served" in problem.message
