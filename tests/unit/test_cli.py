import subprocess
import sys
from pathlib import Path

import pytest

from modelswap_api import cli

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "modelswap"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, check=False, timeout=60
    )


def test_validate_accepts_the_examples_directory() -> None:
    result = run_cli("validate", str(ROOT / "examples"))
    assert result.returncode == 0, result.stdout + result.stderr
    # the real models' files and the numpy models' (examples/toy), one document each
    files = [*(ROOT / "examples").glob("*.yaml"), *(ROOT / "examples" / "toy").glob("*.yaml")]
    assert len(files) >= 4
    assert f"{len(files)} document(s) checked: valid" in result.stdout


def test_validate_prints_each_problem_with_its_field_path_and_fails() -> None:
    bad = ROOT / "tests" / "data" / "invalid" / "min-resident-exceeds-idle-after.yaml"
    result = run_cli("validate", str(ROOT / "examples"), str(bad))
    assert result.returncode == 1
    assert (
        f"{bad}: ModelDeployment default/bad-min-resident-exceeds-idle-after: spec.swapPolicy.minResident:"
        in result.stdout
    )


def test_validate_reports_unreadable_yaml_and_missing_documents(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("spec: [unclosed\n")
    result = run_cli("validate", str(broken))
    assert result.returncode == 1 and "cannot read YAML" in result.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli("validate", str(empty)).returncode == 1


def test_every_registered_subcommand_loads_and_has_a_handler() -> None:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if a.dest == "command")
    assert "validate" in subparsers.choices  # type: ignore[operator]
    for name, sub in subparsers.choices.items():  # type: ignore[union-attr]
        assert callable(sub.get_default("handler")), name


def test_no_subcommand_is_an_error() -> None:
    with pytest.raises(SystemExit):
        cli.main([])
