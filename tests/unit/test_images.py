"""The images' install steps work, replayed outside a container.

No container engine runs here, so the Dockerfiles cannot be built. What can be checked is
checked: the builder stage's COPY list is enough to build the wheel; every RUN line of the
final stage that installs into /opt/modelswap runs, as written (`/bin/sh -c`, ARG defaults
in the environment), with /opt/modelswap and /tmp/dist moved into a temporary folder and
`python`/`python3` the Python the base image ships; the result has the commands a user
runs (`modelswap operator`, `modelswap node`), the node's venv has the `cuda` extra, and
the stubs' Python imports the client library through the .pth file the image writes and
talks the protocol with it. The image version equals pyproject.toml's.

Installs the full dependency set (the machine's configured pip index) in two fresh venvs,
side by side: about a minute.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.unit.test_client_python_versions import interpreter

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
SMOKE = ROOT / "tests" / "support" / "client_smoke.py"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, rest)


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def args(self) -> dict[str, str]:
        """ARG defaults visible in the final stage (a bare ARG re-imports a global one)."""
        found: dict[str, str] = {}
        for keyword, rest in self.final.instructions:
            if keyword == "ARG":
                name, _, default = rest.partition("=")
                value = default or self.global_args.get(name, "")
                found[name.strip()] = value.strip().strip('"')
        return found

    def values(self, keyword: str) -> list[str]:
        return [rest for k, rest in self.final.instructions if k == keyword]


def parse(path: Path) -> Dockerfile:
    """Enough of the Dockerfile syntax for our two files: comments, `\\` continuations."""
    logical: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or not line:
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif not stages:
            assert keyword == "ARG", f"{path.name}: {keyword} before the first FROM"
            name, _, default = rest.partition("=")
            global_args[name] = default.strip('"')
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(global_args, stages)


OPERATOR = parse(IMAGES / "operator.Dockerfile")
NODE = parse(IMAGES / "node.Dockerfile")


@pytest.mark.parametrize("image", [OPERATOR, NODE], ids=["operator", "node"])
def test_image_version_is_the_project_version(image: Dockerfile) -> None:
    assert image.args()["MODELSWAP_VERSION"] == VERSION
    labels = " ".join(image.values("LABEL"))
    assert 'org.opencontainers.image.version="${MODELSWAP_VERSION}"' in labels


def test_operator_image_runs_the_operator_as_a_non_root_user() -> None:
    assert OPERATOR.final.base == "python:3.11-slim"
    assert json.loads(OPERATOR.values("ENTRYPOINT")[-1]) == ["modelswap", "operator"]
    user = OPERATOR.values("USER")[-1].split(":")[0]
    assert user not in ("root", "0")
    assert "[cuda]" not in " ".join(OPERATOR.values("RUN"))


def test_node_image_starts_the_supervisor_as_root_on_the_documented_triton() -> None:
    release = NODE.args()["TRITON_RELEASE"]
    assert NODE.final.base == "nvcr.io/nvidia/tritonserver:${TRITON_RELEASE}-py3"
    assert json.loads(NODE.values("ENTRYPOINT")[-1]) == ["modelswap", "node"]
    assert NODE.values("USER")[-1] == "root"
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert f"nvcr.io/nvidia/tritonserver:{release}-py3" in operations
    for capability in ("SETUID", "SETGID", "KILL", "FOWNER"):
        assert capability in operations


def test_node_image_gives_the_stubs_the_cuda_extras_bindings() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [r for r in extra["optional-dependencies"]["cuda"] if r.startswith("cuda-bindings")]
    stub_runs = [r for r in NODE.values("RUN") if "/opt/modelswap/stub-lib" in r]
    assert any(f'"{spec}"' in r for r in stub_runs), spec


def test_the_docs_say_how_to_build_and_tag_the_images() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert "docker build -f images/node.Dockerfile" in operations
    assert "docker build -f images/operator.Dockerfile" in operations
    assert f"modelswap-node:{VERSION}" in operations


# -- the replay ------------------------------------------------------------------------


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert result.returncode == 0, f"{shlex.join(argv)} failed:\n{result.stdout}\n{result.stderr}"
    return result  # type: ignore[no-any-return]


def build_wheel(image: Dockerfile, tmp: Path) -> Path:
    """Copy what the wheel stage COPYs into a temporary /src and build the wheel there, as
    `pip wheel --no-deps -w /dist /src` does (the working tree stays untouched)."""
    (stage,) = [s for s in image.stages if s.name == "wheel"]
    src = tmp / "src"
    src.mkdir()
    for keyword, rest in stage.instructions:
        if keyword != "COPY":
            continue
        *sources, destination = rest.split()
        assert destination.startswith("/src")
        inside = src / destination.removeprefix("/src").strip("/")
        for source in sources:
            # `COPY a b /src/` copies into the folder; `COPY api /src/api` names the target
            target = inside / source if destination.endswith("/") else inside
            if (ROOT / source).is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
                shutil.copytree(ROOT / source, target, ignore=ignore)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target)
    dist = tmp / "dist-built"
    _run([str(ROOT / ".venv" / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps",
          "-w", str(dist), str(src)], cwd=tmp, timeout=300)  # fmt: skip
    return dist


@dataclass
class Replay:
    root: Path  # stands for the image's /
    system_python: Path  # the base image's `python3`, as a venv so its site-packages is ours


def replay(image: Dockerfile, tmp: Path, base_python: str, wheels: Path) -> Replay:
    """Run the final stage's RUN lines that install into /opt/modelswap, in order."""
    root = tmp / "image"
    shutil.copytree(wheels, root / "tmp" / "dist")
    system = tmp / "system-python"
    _run([base_python, "-m", "venv", "--without-pip", str(system)], timeout=120)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))},
        **image.args(),
        "PATH": f"{system / 'bin'}:{os.environ.get('PATH', '')}",
    }
    runs = [r for r in image.values("RUN") if "/opt/modelswap" in r]
    assert runs, "no RUN line installs into /opt/modelswap"
    for command in runs:
        moved = command.replace("/opt/modelswap", f"{root}/opt/modelswap").replace(
            "/tmp/dist", f"{root}/tmp/dist"
        )
        _run(["/bin/sh", "-c", moved], env=env, cwd=tmp, timeout=600)
    return Replay(root, system / "bin" / "python3")


@pytest.fixture(scope="module")
def replays(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Replay]]:
    tmp = tmp_path_factory.mktemp("images")
    wheels = build_wheel(OPERATOR, tmp)
    assert [p.name for p in wheels.iterdir()] == [f"modelswap-{VERSION}-py3-none-any.whl"]
    # python:3.11-slim ships 3.11; Triton 25.02 (Ubuntu 24.04) ships 3.12.
    operator_python = interpreter("3.11")
    node_python = interpreter("3.12") or operator_python
    assert operator_python is not None, "no python3.11 to stand in for python:3.11-slim"
    assert node_python is not None
    (tmp / "operator").mkdir()
    (tmp / "node").mkdir()
    try:
        # the two images are independent: install side by side
        with ThreadPoolExecutor(max_workers=2) as pool:
            operator = pool.submit(replay, OPERATOR, tmp / "operator", operator_python, wheels)
            node = pool.submit(replay, NODE, tmp / "node", node_python, wheels)
            done = {"operator": operator.result(), "node": node.result()}
        yield done
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _commands(venv: Path) -> str:
    return _run([str(venv / "bin" / "modelswap"), "--help"], timeout=120).stdout


def _path_has_venv(image: Dockerfile) -> bool:
    return any("/opt/modelswap/venv/bin" in env for env in image.values("ENV"))


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first one pays for both installs (pip, full dependency sets)
def test_operator_image_install_gives_the_operator_command(replays: dict[str, Replay]) -> None:
    venv = replays["operator"].root / "opt" / "modelswap" / "venv"
    assert re.search(r"^\s+operator\s", _commands(venv), re.MULTILINE)
    assert _path_has_venv(OPERATOR)  # so ENTRYPOINT's `modelswap` is this one
    help_text = _run([str(venv / "bin" / "modelswap"), "operator", "--help"], timeout=120).stdout
    assert "usage: modelswap operator" in help_text
    # no CUDA in the operator image
    probe = _run([str(venv / "bin" / "python"), "-c", "import importlib.util as u; "
                  "print(u.find_spec('cuda') is None)"], timeout=60)  # fmt: skip
    assert probe.stdout.strip() == "True"


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first one pays for both installs (pip, full dependency sets)
def test_node_image_install_gives_the_node_and_agent_commands_with_cuda(
    replays: dict[str, Replay],
) -> None:
    venv = replays["node"].root / "opt" / "modelswap" / "venv"
    commands = _commands(venv)
    for command in ("node", "sidecar"):  # the supervisor and its default agent command
        assert re.search(rf"^\s+{command}\s", commands, re.MULTILINE), commands
    assert _path_has_venv(NODE)
    probe = "import cuda.bindings, pynvml, modelswap_sidecar.supervisor.command; print('ok')"
    assert _run([str(venv / "bin" / "python"), "-c", probe], timeout=120).stdout.strip() == "ok"


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first one pays for both installs (pip, full dependency sets)
def test_node_image_stubs_python_imports_the_client_and_nothing_else(
    replays: dict[str, Replay],
) -> None:
    node = replays["node"]
    stub_lib = node.root / "opt" / "modelswap" / "stub-lib"
    # ours and cuda-bindings (with what it needs): none of the agent's dependencies
    dists = _run([str(node.system_python), "-I", "-c",
                  "import importlib.metadata as m, json, sys; print(json.dumps(sorted("
                  "{d.metadata['Name'].lower() for d in m.distributions(path=sys.argv[1:])})))",
                  str(stub_lib)], timeout=60)  # fmt: skip
    names = set(json.loads(dists.stdout))
    assert {"modelswap", "cuda-bindings"} <= names
    assert not names & {"kopf", "kubernetes", "tritonclient", "numpy", "aiohttp", "nvidia-ml-py"}
    assert not (stub_lib / "modelswap").exists()  # no script beside the packages
    assert not shutil.which("modelswap", path=str(node.system_python.parent))
    # The system Python finds it through the .pth file alone (isolated mode: no
    # PYTHONPATH), and the installed copy talks the protocol.
    where = _run([str(node.system_python), "-I", "-c",
                  "import modelswap_client.client as c, cuda.bindings as b; "
                  "print(c.__file__); print(b.__file__)"], timeout=60)  # fmt: skip
    assert all(line.startswith(str(stub_lib)) for line in where.stdout.split())
    smoke = _run([str(node.system_python), "-I", "-B", str(SMOKE), str(stub_lib), str(stub_lib)],
                 timeout=60)  # fmt: skip
    seen = json.loads(smoke.stdout.strip().splitlines()[-1])
    assert seen["reply"] == {"epoch": 3, "saw_bytes": 4096}
    assert seen["error"] == "Stale|Stale: epoch 2 is gone"
