"""Local mode's reload on change, without Triton: what a model folder's look sees, when a
change is due (debounced on an injected clock), which host copy a reload keeps, and the
watcher's requests to a fake control API (reload, retried when the agent cannot be reached;
the dev-models file written before each push; a dev model's folder never looked at)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_sidecar.local.manifests import local_uid, read_folder
from modelswap_sidecar.local.sources import (
    SourceWatch,
    changed_paths,
    folder_tree,
    keeps_host_copy,
)
from modelswap_sidecar.local.status import dev_lines, reload_lines
from modelswap_sidecar.local.watcher import FolderWatcher, source_folder
from modelswap_sidecar.triton.naming import triton_model_name

MODEL = """\
apiVersion: modelswap.io/v1alpha1
kind: ModelDeployment
metadata:
  name: {name}{annotations}
spec:
  model:
    source: {{uri: {uri}}}
    weightsBytes: 2Mi
"""
DEV_ANNOTATION = '\n  annotations: {modelswap.io/dev: "true"}'


def model_yaml(name: str, uri: str = "/models/toy", *, dev: bool = False) -> str:
    return MODEL.format(name=name, uri=uri, annotations=DEV_ANNOTATION if dev else "")


def write(path: Path, text: str, *, mtime_ns: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


# -- a folder's look ------------------------------------------------------------------------


def test_the_look_sees_model_files_and_leaves_out_caches_hidden_files_and_editor_temporaries(
    tmp_path: Path,
) -> None:
    write(tmp_path / "config.pbtxt", "backend: python")
    write(tmp_path / "1" / "model.py", "VERSION = 1")
    write(tmp_path / "1" / "weights.bin", "w" * 10)
    for junk in ("1/__pycache__/model.cpython-311.pyc", "1/.model.py.swp", "1/model.py~",
                 ".git/HEAD", "1/weights.bin.part", "1/x.tmp", "1/model.pyc"):  # fmt: skip
        write(tmp_path / junk, "junk")
    tree, truncated = folder_tree(tmp_path)
    assert sorted(tree) == ["1/model.py", "1/weights.bin", "config.pbtxt"]
    assert tree["1/weights.bin"][0] == 10 and not truncated
    assert folder_tree(tmp_path / "missing") == ({}, False)


def test_the_look_is_bounded_in_files_and_depth(tmp_path: Path) -> None:
    for i in range(5):
        write(tmp_path / f"f{i}.py", "x")
    write(tmp_path / "a" / "b" / "c" / "deep.py", "x")
    tree, truncated = folder_tree(tmp_path, max_files=3)
    assert len(tree) == 3 and truncated
    tree, truncated = folder_tree(tmp_path, max_depth=2)
    assert "a/b/c/deep.py" not in tree and truncated
    assert "a/b/c/deep.py" in folder_tree(tmp_path)[0]


def test_code_changes_keep_the_host_copy_and_any_other_file_drops_it() -> None:
    assert keeps_host_copy(["1/model.py", "config.pbtxt", "tokenizer.json"])
    assert not keeps_host_copy(["1/model.py", "1/weights.f32"])
    assert not keeps_host_copy(["model.safetensors"])
    assert not keeps_host_copy(["1/weights.bin"])
    old = {"a.py": (1, 1), "b.bin": (2, 2), "gone.txt": (1, 1)}
    new = {"a.py": (1, 1), "b.bin": (2, 3), "new.py": (1, 1)}
    assert changed_paths(old, new) == ("b.bin", "gone.txt", "new.py")


# -- when a change is due -------------------------------------------------------------------


def test_a_change_is_due_once_the_folder_is_quiet_and_an_unchanged_folder_never_is() -> None:
    watch = SourceWatch(settle_seconds=1.0, max_delay_seconds=10.0, min_interval_seconds=2.0)
    folder = Path("/m/toy")
    v1 = {"1/model.py": (10, 1)}
    assert watch.observe("u", folder, v1, 0.0) is None  # the first look: the baseline
    for t in range(1, 30):
        assert watch.observe("u", folder, v1, float(t)) is None  # unchanged: never due
    half = {"1/model.py": (3, 2)}  # an editor's first step
    assert watch.observe("u", folder, half, 30.0) is None
    v2 = {"1/model.py": (12, 3)}  # its second, 0.5 s later: the quiet period starts again
    assert watch.observe("u", folder, v2, 30.5) is None
    assert watch.observe("u", folder, v2, 31.0) is None
    change = watch.observe("u", folder, v2, 31.5)
    assert change is not None
    assert (change.paths, change.keep_host_copy) == (("1/model.py",), True)
    assert change.summary() == "1/model.py changed"
    assert watch.observe("u", folder, v2, 32.0) is not None  # due until taken
    watch.taken(change, 32.0)
    assert watch.observe("u", folder, v2, 33.0) is None  # the new baseline


def test_a_folder_that_never_goes_quiet_is_reloaded_after_the_longest_delay_at_most_so_often() -> (
    None
):
    watch = SourceWatch(settle_seconds=1.0, max_delay_seconds=5.0, min_interval_seconds=20.0)
    folder = Path("/m/toy")
    watch.observe("u", folder, {"w.bin": (1, 0)}, 0.0)
    due = [t for t in range(1, 12) if watch.observe("u", folder, {"w.bin": (1, t)}, float(t))]
    assert due[0] == 6  # 5 s after the first change, though it changes every second
    change = watch.observe("u", folder, {"w.bin": (1, 12)}, 12.0)
    assert change is not None and not change.keep_host_copy
    watch.taken(change, 12.0)
    later = [t for t in range(13, 40) if watch.observe("u", folder, {"w.bin": (1, t)}, float(t))]
    assert later[0] == 32  # not before min_interval_seconds since the last reload


def test_files_removed_alone_reload_nothing_and_the_next_file_written_does() -> None:
    watch = SourceWatch(settle_seconds=1.0, min_interval_seconds=0.0)
    folder = Path("/m/embed")
    full = {"config.json": (1, 1), "model.safetensors": (90, 1), "model.py": (5, 1)}
    watch.observe("u", folder, full, 0.0)
    moved_away = {"config.json": (1, 1), "model.py": (5, 1)}  # weights moved out of it
    for t in range(1, 20):
        assert watch.observe("u", folder, moved_away, float(t)) is None
    back = {**moved_away, "model.safetensors": (91, 30)}  # a new weight file written
    assert watch.observe("u", folder, back, 30.0) is None
    change = watch.observe("u", folder, back, 31.0)
    assert change is not None
    assert (change.paths, change.keep_host_copy) == (("model.safetensors",), False)


def test_a_change_undone_before_it_settles_is_no_change_and_a_new_folder_is_a_new_baseline() -> (
    None
):
    watch = SourceWatch(settle_seconds=1.0)
    v1 = {"m.py": (1, 1)}
    watch.observe("u", Path("/a"), v1, 0.0)
    assert watch.observe("u", Path("/a"), {"m.py": (1, 2)}, 1.0) is None
    assert watch.observe("u", Path("/a"), v1, 1.5) is None
    assert watch.observe("u", Path("/a"), v1, 9.0) is None
    assert watch.observe("u", Path("/b"), {"other.py": (1, 1)}, 10.0) is None  # re-pointed
    assert watch.observe("u", Path("/b"), {"other.py": (1, 1)}, 20.0) is None


# -- the watcher against a fake control API ---------------------------------------------------


class FakeControl:
    def __init__(self, dev_file: Path | None = None) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.dev_file = dev_file
        self.dev_at_push: list[list[str]] = []
        self.down = False

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("agent restarting", request=request)
        self.calls.append((request.method, request.url.path, request.url.query.decode()))
        if request.method == "PUT":
            if self.dev_file is not None:
                self.dev_at_push.append(json.loads(self.dev_file.read_text())["models"])
            entries = json.loads(request.content)["entries"]
            results = [
                {"uid": e["uid"], "outcome": "applied", "reason": "Loading"} for e in entries
            ]
            return httpx.Response(200, json={"results": results})
        uid = request.url.path.split("/")[3]
        return httpx.Response(200, json={"uid": uid, "outcome": "completed", "reason": "Reloading"})

    def reloads(self) -> list[tuple[str, str]]:
        return [
            (path.split("/")[3], query)
            for method, path, query in self.calls
            if path.endswith("/reload")
        ]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_watcher_reloads_a_changed_model_keeps_or_drops_its_host_copy_and_retries_a_failed_ask(
    tmp_path: Path,
) -> None:
    folder, root = tmp_path / "deployments", tmp_path / "models"
    write(folder / "toy.yaml", model_yaml("toy"))
    write(folder / "steady.yaml", model_yaml("steady", "/models/steady"))
    write(folder / "remote.yaml", model_yaml("remote", "https://example.com/m"))
    for name in ("toy", "steady"):
        write(root / name / "1" / "model.py", "VERSION = 1", mtime_ns=1)
        write(root / name / "1" / "weights.bin", "w", mtime_ns=1)
    clock = Clock()
    control = FakeControl()
    watcher = FolderWatcher(
        folder,
        BUILTIN_DEFAULTS,
        control_url="http://agent",
        token="t",
        node_name="local",
        model_root=root,
        source_watch=SourceWatch(settle_seconds=1.0, min_interval_seconds=0.0),
        clock=clock,
        wall_clock=lambda: 5000.0,
    )
    toy = local_uid("default", "toy")
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:

        def look(seconds: float = 1.0) -> None:
            clock.now += seconds
            watcher.poll(client)

        look()  # pushed; the first look is every folder's baseline
        for _ in range(3):
            look()
        assert control.reloads() == []  # nothing changed: nothing reloaded

        write(root / "toy" / "1" / "model.py", "VERSION = 2", mtime_ns=2)
        look()
        assert control.reloads() == []  # not settled yet
        look()
        assert control.reloads() == [(toy, "hostCopy=keep")]
        note = watcher.applied.reloads[toy]
        assert (note.count, note.what, note.host_copy, note.outcome) == (
            1, "1/model.py changed", "kept", "completed Reloading"
        )  # fmt: skip
        look()
        assert len(control.reloads()) == 1  # taken: not again

        write(root / "toy" / "1" / "weights.bin", "W", mtime_ns=3)
        look()
        control.down = True
        look()  # due, but the agent cannot be reached: asked again at the next look
        control.down = False
        look()
        assert control.reloads()[1:] == [(toy, "hostCopy=drop")]
        assert watcher.applied.reloads[toy].count == 2
        assert watcher.applied.reloads[toy].host_copy == "dropped"
        for _ in range(3):
            look()
        assert len(control.reloads()) == 2
        assert local_uid("default", "steady") not in watcher.applied.reloads

        lines = reload_lines(
            [
                {"name": "toy", "reloads": watcher.applied.reloads[toy].to_dict()},
                {"name": "steady"},
            ],
            now_seconds=5004.0,
        )
        assert lines == [
            "reloaded: toy 4s ago (1/weights.bin changed; host copy dropped, 2 times in all): "
            "completed Reloading"
        ]


def test_the_agents_answers_to_a_reload_are_recorded_and_only_an_unreachable_agent_is_asked_again(
    tmp_path: Path,
) -> None:
    folder, root = tmp_path / "deployments", tmp_path / "models"
    write(folder / "toy.yaml", model_yaml("toy"))
    write(root / "toy" / "model.py", "x", mtime_ns=1)
    answers: list[httpx.Response] = []
    asked: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "PUT":
            entries = json.loads(request.content)["entries"]
            return httpx.Response(
                200, json={"results": [{"uid": e["uid"], "outcome": "applied"} for e in entries]}
            )
        asked.append(request.url.query.decode())
        return answers.pop(0)

    clock = Clock()
    watcher = FolderWatcher(
        folder,
        BUILTIN_DEFAULTS,
        control_url="http://agent",
        token="t",
        node_name="local",
        model_root=root,
        source_watch=SourceWatch(settle_seconds=0.0, min_interval_seconds=0.0),
        clock=clock,
    )
    toy = local_uid("default", "toy")
    refused = {"uid": toy, "outcome": "refused", "reason": "UnloadFailed", "message": "busy"}
    with httpx.Client(transport=httpx.MockTransport(handle)) as client:
        watcher.poll(client)  # the baseline
        for n, (answer, outcome) in enumerate(
            [
                (httpx.Response(503, json={"reason": "TokenUnavailable"}), None),  # again
                (httpx.Response(409, json=refused), "refused UnloadFailed: busy"),
                (httpx.Response(404, json={"reason": "NotFound"}), "unchanged NotHeld"),
                (httpx.Response(400, text="not json"), "refused 400"),
            ]
        ):
            write(root / "toy" / "model.py", "x", mtime_ns=10 + n)
            answers.append(answer)
            clock.now += 1
            watcher.poll(client)
            note = watcher.applied.reloads.get(toy)
            if outcome is None:
                assert note is None  # not recorded: asked again at the next look
                answers.append(httpx.Response(200, json={"outcome": "completed"}))
                clock.now += 1
                watcher.poll(client)
                assert watcher.applied.reloads[toy].outcome == "completed"
            else:
                assert watcher.applied.reloads[toy].outcome == outcome
        assert len(asked) == 5 and answers == []
        clock.now += 1
        watcher.poll(client)  # every answer but the 503 was taken: nothing asked again
        assert len(asked) == 5


def test_without_the_dev_loop_a_dev_model_is_a_problem_naming_the_annotation(
    tmp_path: Path,
) -> None:
    write(tmp_path / "dev.yaml", model_yaml("mine", dev=True))
    write(
        tmp_path / "odd.yaml",
        model_yaml("odd").replace(
            "name: odd", 'name: odd\n  annotations: {modelswap.io/dev: "yes"}'
        ),
    )
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS)
    assert models == []
    text = "\n".join(str(p) for p in problems)
    assert (
        "metadata.annotations[modelswap.io/dev]: a dev model is served by your own process" in text
    )
    assert "modelswap up --dev" in text
    assert "metadata.annotations[modelswap.io/dev]: Unsupported value: 'yes'" in text
    models, problems = read_folder(tmp_path, BUILTIN_DEFAULTS, dev_loop=True)
    assert [(m.name, m.dev) for m in models] == [("mine", True)]


def test_with_the_dev_loop_the_dev_models_file_is_written_before_each_push_and_a_flip_reloads_afresh(
    tmp_path: Path,
) -> None:
    folder, root, dev_file = tmp_path / "deployments", tmp_path / "models", tmp_path / "dev.json"
    write(folder / "mine.yaml", model_yaml("mine", "/models/mine", dev=True))
    write(folder / "toy.yaml", model_yaml("toy"))
    write(root / "mine" / "model.py", "x", mtime_ns=1)
    write(root / "toy" / "model.py", "x", mtime_ns=1)
    control = FakeControl(dev_file)
    clock = Clock()
    watcher = FolderWatcher(
        folder,
        BUILTIN_DEFAULTS,
        control_url="http://agent",
        token="t",
        node_name="local",
        model_root=root,
        source_watch=SourceWatch(settle_seconds=0.0, min_interval_seconds=0.0),
        dev_models_file=dev_file,
        clock=clock,
    )
    mine, toy = local_uid("default", "mine"), local_uid("default", "toy")
    with httpx.Client(transport=httpx.MockTransport(control.handle)) as client:
        watcher.poll(client)
        assert control.dev_at_push == [[triton_model_name(mine)]]
        write(root / "mine" / "model.py", "y", mtime_ns=2)  # a dev model's files: not watched
        clock.now += 5
        watcher.poll(client)
        clock.now += 5
        watcher.poll(client)
        assert control.reloads() == []

        write(folder / "mine.yaml", model_yaml("mine", "/models/mine"))  # no longer dev
        write(folder / "toy.yaml", model_yaml("toy", dev=True))  # now dev
        clock.now += 5
        watcher.poll(client)
        assert control.dev_at_push[-1] == [triton_model_name(toy)]
        assert sorted(control.reloads()) == sorted(
            [(mine, "hostCopy=drop"), (toy, "hostCopy=drop")]
        )
        # the PUT came first, the reloads after it
        methods = [m for m, path, _ in control.calls]
        assert methods[-3:] == ["PUT", "POST", "POST"]

    lines = dev_lines(
        [
            {
                "name": "toy",
                "dev": True,
                "engineName": triton_model_name(toy),
                "weightsBytes": "2Mi",
            },
            {"name": "mine"},
        ],
        socket_path="/run/sock/agent.sock",
    )
    assert lines == [
        "dev loop: export MODELSWAP_SOCKET=/run/sock/agent.sock",
        f"dev: toy: attach('{triton_model_name(toy)}', [RegionSpec(\"weights\", 2097152)])"
        "  # weightsBytes: 2Mi",
    ]


def test_source_folders_map_like_the_agent_and_fetched_sources_are_not_watched(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    assert (
        source_folder({"model": {"source": {"uri": "/models/toy"}}}, root, "/models")
        == root / "toy"
    )
    assert source_folder({"model": {"source": {"uri": "/models"}}}, root, "/models") == root
    assert source_folder({"model": {"source": {"uri": "/srv/x"}}}, root, "/models") == Path(
        "/srv/x"
    )
    assert source_folder({"model": {"source": {"uri": "/modelsx/y"}}}, root, "/models") == Path(
        "/modelsx/y"
    )
    assert source_folder({"model": {"source": {"uri": "https://h/m"}}}, root, "/models") is None
