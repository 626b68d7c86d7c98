"""docs/RELIABILITY.md is the renderer's output of the committed results, and the renderer
keeps the hand-written limits block and says exactly what was lost."""

from __future__ import annotations

import json
from pathlib import Path

from bench.render_reliability import (
    LIMITS_BEGIN,
    LIMITS_END,
    OUT,
    RUN_FILE,
    limits_block,
    newest_run,
    read_sections,
    render,
    render_committed,
)

LIMITS = f"{LIMITS_BEGIN}\n| input | limit |\n|---|---|\n| YAML | 1 MiB |\n{LIMITS_END}"
RUN = {"command": "make reliability", "machine_class": "cpu-2cpu-nogpu",
       "machine": {"cpu_model": "cpu", "cpus": 2, "memory_bytes": 1 << 30, "gpu": "none"},
       "git_commit": "abc", "recorded_at": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_the_committed_document_is_the_rendering_of_the_committed_results() -> None:
    assert OUT.exists(), "docs/RELIABILITY.md is missing: run `make reliability`"
    assert OUT.read_text() == render_committed(), (
        "docs/RELIABILITY.md differs from the committed results: run "
        "`python -m bench.render_reliability render` (or `make reliability`)"
    )


def test_the_limits_block_is_kept_verbatim_and_every_section_rendered() -> None:
    sections = {
        "faults": [
            {
                "test": "t",
                "target": "agent",
                "moment": "12.5 s",
                "outcome": "recovered",
                "recovery_seconds": 1.234,
                "answers_checked": 10,
                "wrong": 0,
                "lost_bytes": 0,
            }
        ],
        "load": [
            {
                "phase": "1. cold",
                "models": 3,
                "cold": 3,
                "clients": 1000,
                "requests": 1000,
                "throughput_rps": 50.0,
                "p50_seconds": 1.0,
                "p99_seconds": 2.0,
                "refusals": 3,
                "wrong": 0,
                "hung": 0,
                "swap_ins_expected": 3,
                "swap_ins_seen": 3,
                "rss_bytes": 100 << 20,
                "fds": 40,
                "threads": 20,
            }
        ],
        "inputs": [{"test": "t", "input": "a | pipe", "outcome": "400"}],
        "access": [{"check": "token missing", "outcome": "401"}],
        "fuzz": [{"test": "t", "input": "v2 infer, JSON", "tried": 3, "answers": "3 x 400"}],
    }
    doc = render(RUN, sections, LIMITS)
    assert LIMITS in doc
    assert "Nothing: no byte of any model lost" in doc and "1,010 requests checked" in doc
    assert "| agent | 12.5 s | recovered | 1.23 | 10 | 0 | 0 |" in doc
    assert "| 3/3 | 100 | 40 | 20 |" in doc
    assert "a \\| pipe" in doc  # a cell cannot break its table
    assert "token missing" in doc and "make reliability" in doc
    assert "the suite's end was not recorded" in doc
    ended = render({**RUN, "pytest_exit_status": 1, "finished_at": "x"}, sections, LIMITS)
    assert "pytest exit status 1, some tests failed" in ended
    assert doc.index("## Input limits") < doc.index("## Access checks")
    assert doc.index("## Inputs tried") < doc.index("## Fuzzing") < doc.index("## Input limits")
    assert "| v2 infer, JSON | 3 | 3 x 400 |" in doc and "schemathesis" in doc

    lost = {**sections, "faults": [{**sections["faults"][0], "lost_bytes": 4096, "wrong": 2}]}
    said = render(RUN, lost, LIMITS)
    assert "2 wrong answers" in said and "- agent at 12.5 s: 4,096 bytes" in said


def test_limits_block_of_a_document_without_one_is_empty() -> None:
    assert limits_block("# no block") == f"{LIMITS_BEGIN}\n{LIMITS_END}"
    assert limits_block(f"before\n{LIMITS}\nafter") == LIMITS


def test_the_newest_run_is_rendered(tmp_path: Path) -> None:
    for name, when in (("old", "2026-01-01T00:00:00Z"), ("new", "2026-02-01T00:00:00Z")):
        folder = tmp_path / name / "reliability"
        folder.mkdir(parents=True)
        (folder / RUN_FILE).write_text(json.dumps({**RUN, "recorded_at": when}))
        (folder / "load.jsonl").write_text(json.dumps({"phase": name}) + "\n")
    newest = newest_run(tmp_path)
    assert newest == tmp_path / "new" / "reliability"
    assert read_sections(newest) == {"load": [{"phase": "new"}]}
    assert newest_run(tmp_path / "none") is None
