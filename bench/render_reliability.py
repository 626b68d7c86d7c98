"""Render docs/RELIABILITY.md from the reliability suite's results (`make reliability`).

    python -m bench.render_reliability start    # empty this machine's results folder, note the run
    python -m bench.render_reliability folder   # print that folder (for MODELSWAP_RELIABILITY_OUT)
    python -m bench.render_reliability finish N # note pytest's exit status N in the run
    python -m bench.render_reliability render   # write docs/RELIABILITY.md

The tests append one JSON line per thing tried to `<section>.jsonl` in
`bench/results/<machine-class>/reliability/` (`tests/support/reliability.py`); `start`
writes `run.json` there (command, machine, commit, time). `render` reads the newest run
among the committed folders, so the document is a function of committed files only (a
test checks it). The "Input limits" block between LIMITS_BEGIN and LIMITS_END is written
by hand from the limits the code enforces and kept verbatim.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.results_schema import RESULTS, load_average, machine, machine_class

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "RELIABILITY.md"
COMMAND = "make reliability"
LIMITS_BEGIN = "<!-- limits:begin -->"
LIMITS_END = "<!-- limits:end -->"
RUN_FILE = "run.json"
MIB = 1 << 20

#: Sections this renderer lays out itself, in this order; any other section a test
#: records is rendered as a plain table after them.
KNOWN = ("faults", "load", "inputs", "fuzz", "access")


def folder_for(machine_class_name: str) -> Path:
    return RESULTS / machine_class_name / "reliability"


def this_machine_folder() -> Path:
    return folder_for(machine_class(machine()))


def start(folder: Path, command: str = COMMAND) -> None:
    """An empty results folder with the run's description."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    m = machine()
    run = {
        "command": command,
        "machine_class": machine_class(m),
        "machine": m,
        "git_commit": _git_commit(),
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_start": load_average(),
    }
    (folder / RUN_FILE).write_text(json.dumps(run, indent=2) + "\n")


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False, cwd=ROOT
        ).stdout.strip()
    except OSError:
        return ""


def finish(folder: Path, exit_status: int) -> None:
    """Note how the suite's pytest run ended (0: every test passed or failed as marked)."""
    path = folder / RUN_FILE
    run = json.loads(path.read_text())
    run["pytest_exit_status"] = exit_status
    run["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    path.write_text(json.dumps(run, indent=2) + "\n")


# -- reading ----------------------------------------------------------------------------------


def newest_run(results: Path = RESULTS) -> Path | None:
    """The folder of the newest recorded run (by its `recorded_at`), or None."""
    runs = []
    for path in results.glob(f"*/reliability/{RUN_FILE}"):
        recorded = json.loads(path.read_text()).get("recorded_at", "")
        runs.append((recorded, str(path.parent), path.parent))
    return max(runs)[2] if runs else None


def read_sections(folder: Path) -> dict[str, list[dict[str, Any]]]:
    sections = {}
    for path in sorted(folder.glob("*.jsonl")):
        lines = path.read_text().splitlines()
        sections[path.stem] = [json.loads(line) for line in lines if line.strip()]
    return sections


def limits_block(existing: str) -> str:
    """The hand-written limits block of the current document, verbatim (or an empty one)."""
    begin, end = existing.find(LIMITS_BEGIN), existing.find(LIMITS_END)
    if begin < 0 or end < begin:
        return f"{LIMITS_BEGIN}\n{LIMITS_END}"
    return existing[begin : end + len(LIMITS_END)]


# -- rendering (pure) ------------------------------------------------------------------------

FUZZ_INTRO = (
    "The real agent (its gateway and control API) and the real Triton, fuzzed at once "
    "(`tests/integration/test_reliability_fuzz.py`): schemathesis cases generated from the "
    "control API's OpenAPI document (every operation, data it allows and data it does not, "
    "mostly with the right token), and a seeded generator of hostile gateway requests "
    "(`tests/support/hostile_bodies.py`: v2 infer bodies as JSON and binary tensors, generate "
    "bodies, OpenAI completions, chat and embeddings bodies, odd encodings and headers, raw "
    "HTTP no client library sends) at three toy models. It passes when no answer is a 5xx but "
    "a 503 or 429 with `Retry-After`, each control API answer is one its document declares "
    "with a body of its schema, every request is answered within 20 s, Triton and the agent "
    "are the same processes at the end with no abort in Triton's log, and a model nobody "
    "fuzzes answers correctly every 250 inputs and at the end. A row per kind of input, "
    "its answers by status; the last row sums up."
)


def render(run: dict[str, Any], sections: dict[str, list[dict[str, Any]]], limits: str) -> str:
    m = run.get("machine", {})
    out = [
        "# Reliability: what was tried and what held",
        "",
        f"Generated by `python -m bench.render_reliability render` from the results of "
        f"`{run.get('command', COMMAND)}` in "
        f"`bench/results/{run.get('machine_class', '?')}/reliability/` (one JSON line per "
        "thing tried, written by the tests through `tests/support/reliability.py`); do not "
        "edit by hand except between the limits markers. Every figure comes from that run.",
        "",
        f"- machine: `{run.get('machine_class', '?')}` ({m.get('cpu_model', '?')}, "
        f"{m.get('cpus', '?')} CPUs, {_mib(m.get('memory_bytes', 0)):,} MiB, GPU: "
        f"{m.get('gpu', '?')}; kernel {m.get('kernel', '?')}, Python {m.get('python', '?')})",
        f"- commit `{run.get('git_commit', '')[:12]}`, recorded {run.get('recorded_at', '?')}, "
        f"load average at the start {run.get('load_average_start', [])}",
        f"- {_ending(run)}",
        "",
    ]
    out += _lost(sections)
    out += _faults(sections.get("faults", []))
    out += _load(sections.get("load", []))
    out += _generic("Inputs tried", sections.get("inputs", []),
                    "Each hostile or malformed input and how it was answered (the limits it "
                    "met are stated in the table below).")  # fmt: skip
    out += _generic("Fuzzing", sections.get("fuzz", []), FUZZ_INTRO)
    out += ["## Input limits", "", limits, ""]
    out += _generic("Access checks", sections.get("access", []),
                    "Within the trust model of DESIGN.md §1: what a workload or a caller "
                    "without the token tried, and what it got.")  # fmt: skip
    for name in sorted(set(sections) - set(KNOWN)):
        out += _generic(name.capitalize(), sections[name], "")
    return "\n".join(out).rstrip("\n") + "\n"


def _ending(run: dict[str, Any]) -> str:
    status = run.get("pytest_exit_status")
    if status is None:
        return "the suite's end was not recorded"
    said = "every test passed (or failed as marked xfail)" if status == 0 else "some tests failed"
    return f"finished {run.get('finished_at', '?')}: pytest exit status {status}, {said}"


def _lost(sections: dict[str, list[dict[str, Any]]]) -> list[str]:
    faults, load = sections.get("faults", []), sections.get("load", [])
    lost = [r for r in faults if r.get("lost_bytes")]
    wrong = sum(int(r.get("wrong", 0)) for r in (*faults, *load))
    hung = sum(int(r.get("hung", 0)) for r in load)
    checked = sum(int(r.get("answers_checked", 0)) for r in faults)
    checked += sum(int(r.get("requests", 0)) for r in load)
    out = ["## What was lost", ""]
    if not faults and not load:
        return [*out, "No fault or load results in this run.", ""]
    if not lost and not wrong and not hung:
        out.append(
            f"Nothing: no byte of any model lost, no wrong answer and no hung request over "
            f"{checked:,} requests checked ({len(faults)} faults, {len(load)} load phases)."
        )
    else:
        out.append(f"{wrong} wrong answers and {hung} hung requests over {checked:,} checked.")
        for r in lost:
            out.append(f"- {r.get('target')} at {r.get('moment')}: {r['lost_bytes']:,} bytes")
    return [*out, ""]


def _faults(rows: Sequence[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = [
        "## Faults",
        "",
        "On the node, kill -9 at moments the tests do not choose (a seeded `random.Random`) "
        "while clients call every model through the gateway: recovery is from the kill until "
        "every model answers correctly again, and lost bytes compare each model's reported "
        "HBM and host-store bytes with its size. For the operator, recovery is until every "
        "model is Ready and served by exactly one node. Outcome names every answer that was "
        "not a correct 200 (refusals, no gateway, known findings).",
        "",
        "| fault | moment | outcome | recovery (s) | answers checked | wrong | lost bytes |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        recovery = r.get("recovery_seconds")
        out.append(
            f"| {r.get('target', '')} | {r.get('moment', '')} | {r.get('outcome', '')} | "
            f"{'' if recovery is None else f'{recovery:.2f}'} | {r.get('answers_checked', 0):,} "
            f"| {r.get('wrong', 0)} | {r.get('lost_bytes', 0):,} |"
        )
    return [*out, ""]


def _load(rows: Sequence[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    out = [
        "## Load",
        "",
        "Ten models on a sim GPU with room for three; each phase makes a known set of models "
        "cold, then a burst of concurrent clients (one connection each) calls its models "
        "through the gateway. Swap-ins are planned before the phase and read from the "
        "agent's `/metrics` after it; RSS, fds and threads are the agent's, read from /proc "
        "once the burst's connections closed.",
        "",
        "| phase | models (cold) | clients | requests | answers/s | p50 (s) | p99 (s) | "
        "refused | wrong | hung | swap-ins planned/seen | agent RSS (MiB) | fds | threads |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r.get('phase', '')} | {r.get('models', '')} ({r.get('cold', '')}) | "
            f"{r.get('clients', 0):,} | {r.get('requests', 0):,} | {r.get('throughput_rps', 0)} "
            f"| {r.get('p50_seconds', 0)} | {r.get('p99_seconds', 0)} | {r.get('refusals', 0)} "
            f"| {r.get('wrong', 0)} | {r.get('hung', 0)} | {r.get('swap_ins_expected', 0)}/"
            f"{r.get('swap_ins_seen', 0)} | {_mib(r.get('rss_bytes', 0))} | {r.get('fds', 0)} "
            f"| {r.get('threads', 0)} |"
        )
    reasons: dict[str, int] = {}
    for r in rows:
        for reason, n in (r.get("refusal_reasons") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + int(n)
    if reasons:
        said = ", ".join(f"{n:,} {reason}" for reason, n in sorted(reasons.items()))
        out += ["", f"Refusals by answer and reason, all phases: {said}."]
    return [*out, ""]


def _generic(title: str, rows: Sequence[dict[str, Any]], intro: str) -> list[str]:
    if not rows:
        return []
    columns = _columns(rows)
    out = [f"## {title}", ""]
    if intro:
        out += [intro, ""]
    out.append("| " + " | ".join(c.replace("_", " ") for c in columns) + " |")
    out.append("|" + "---|" * len(columns))
    for r in rows:
        out.append("| " + " | ".join(_cell(r.get(c, "")) for c in columns) + " |")
    return [*out, ""]


def _columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    seen: dict[str, None] = {}
    for r in rows:
        for key in r:
            if key != "test":
                seen.setdefault(key, None)
    return list(seen)


def _cell(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _mib(n: Any) -> int:
    return round(int(n or 0) / MIB)


# -- the command ------------------------------------------------------------------------------


def render_committed(results: Path = RESULTS, doc: Path = OUT) -> str:
    """What docs/RELIABILITY.md must say for the committed results."""
    folder = newest_run(results)
    existing = doc.read_text() if doc.exists() else ""
    if folder is None:
        return "\n".join([
            "# Reliability: what was tried and what held", "",
            f"No run recorded yet: `{COMMAND}` runs the reliability suite and renders this "
            "page from its results.", "", "## Input limits", "", limits_block(existing), "",
        ])  # fmt: skip
    run = json.loads((folder / RUN_FILE).read_text())
    return render(run, read_sections(folder), limits_block(existing))


def main(argv: Sequence[str]) -> int:
    command = argv[0] if argv else "render"
    if command == "start":
        start(this_machine_folder())
    elif command == "folder":
        print(this_machine_folder())
    elif command == "finish" and len(argv) == 2:
        finish(this_machine_folder(), int(argv[1]))
    elif command == "render":
        OUT.write_text(render_committed())
        print(f"wrote {OUT.relative_to(ROOT)}")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
