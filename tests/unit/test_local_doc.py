"""docs/LOCAL.md's run-directory tree says where `RunDir` really puts each path."""

from __future__ import annotations

import re
from pathlib import Path

from modelswap_sidecar.local.rundir import RunDir

DOC = Path(__file__).resolve().parents[2] / "docs" / "LOCAL.md"


def documented_top_level() -> set[str]:
    text = DOC.read_text()
    block = text.split("## The run directory", 1)[1].split("```", 2)[1]
    # entries directly under `.modelswap/` are indented by exactly two spaces
    return {m.group(1) for m in re.finditer(r"^  (\S+?)/?\s", block, re.MULTILINE)}


def test_every_run_directory_path_is_documented_where_it_sits() -> None:
    run = RunDir(Path("/run/dir"))
    paths = [
        run.state_file, run.token_file, run.agent_settings, run.supervisor_state,
        *run.transient(), run.source_cache,
    ]  # fmt: skip
    for path in paths:
        assert path.parent == run.root, path  # all of them sit directly in the run dir
    assert {p.name for p in paths} <= documented_top_level()
