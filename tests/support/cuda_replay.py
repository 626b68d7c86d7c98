"""Recordings of CUDA call sequences (tests/support/cuda_recorder.py): combine, compare, and
configure the fake from one (standard library only, like the recorder).

A recording (``tests/data/cuda_recordings/<backend>.json``) is::

    {"backend": "cuda-vmm", "meta": {...}, "calls": {"agent": [call, ...], "client": [...]}}

`compare(expected, actual)` says, as readable unified diffs per role, where two recordings'
call sequences differ: function names, normalised arguments, error codes and outputs. The
outputs of `MACHINE_FACTS` (driver version, GPU name, PCI bus id, memory sizes) are machine
properties, not the API's behaviour, and compare as ``<fact>``; event polls that answered
"not ready" are dropped (how often a copy is polled is timing, not the API).
`fake_gaps(recording, driver, runtime)` names every function, enum member, handle type and
struct field a recording used that the given (fake) modules lack.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from tests.support.cuda_recorder import read_jsonl

#: calls whose outputs describe the machine rather than the API's behaviour
MACHINE_FACTS = frozenset(
    {
        "cuDriverGetVersion", "cuDeviceGetName", "cuDeviceGetPCIBusId", "cuDeviceTotalMem",
        "cuMemGetInfo", "cudaMemGetInfo",
    }
)  # fmt: skip

#: "not ready" answers of a poll: how many there are is timing
_POLLS = {
    "cuEventQuery": "CUresult.CUDA_ERROR_NOT_READY",
    "cudaEventQuery": "cudaError_t.cudaErrorNotReady",
    "cuStreamQuery": "CUresult.CUDA_ERROR_NOT_READY",
}

_ENUM = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")
_TYPED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\((.*)\)$")
_SYMBOL = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)#\d+")

#: the fake names a device attribute by its driver enum name; runtime attributes map to them
_RT_ATTRIBUTES = {
    "cudaDevAttrConcurrentManagedAccess": "CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS",
    "cudaDevAttrPageableMemoryAccessUsesHostPageTables": (
        "CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES"
    ),
}


def combine(backend: str, files: dict[str, str]) -> dict[str, Any]:
    """One recording from each role's `.jsonl` file."""
    calls: dict[str, list[dict[str, Any]]] = {}
    metas: dict[str, dict[str, Any]] = {}
    for role, path in files.items():
        meta, role_calls = read_jsonl(path)
        metas[role] = meta
        calls[role] = role_calls
    first = next(iter(metas.values()), {})
    recording: dict[str, Any] = {
        "backend": backend,
        "meta": {
            "bindings_version": first.get("bindings_version", ""),
            "fake": any(m.get("fake") for m in metas.values()),
            "python": first.get("python", ""),
        },
        "calls": calls,
    }
    recording["meta"]["facts"] = facts_of(recording)
    return recording


def load_recording(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        recording: dict[str, Any] = json.load(f)
    return recording


def _all_calls(recording: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for calls in recording["calls"].values() for c in calls]


def _ok(call: dict[str, Any]) -> bool:
    return str(call.get("code", "")).endswith(("CUDA_SUCCESS", "cudaSuccess"))


def facts_of(recording: dict[str, Any]) -> dict[str, Any]:
    """What the recorded machine was: bindings major, GPU count, device attributes, and the
    outputs of the `MACHINE_FACTS` calls (for the record: GPU name, driver version)."""
    version = str(recording.get("meta", {}).get("bindings_version", ""))
    head = version.split(".", 1)[0]
    facts: dict[str, Any] = {
        "major": int(head) if head.isdigit() else 13,
        "attributes": {},
        "attribute_errors": {},
    }
    for call in _all_calls(recording):
        fn, out = call["fn"], call.get("out") or []
        if fn == "cuDeviceGetAttribute" and "code" in call and not _ok(call):
            match = _ENUM.match(str(call["args"][0]))
            if match:
                facts["attribute_errors"][match.group(2)] = call["code"]
        if not _ok(call) or not out:
            continue
        if fn in ("cuDeviceGetCount", "cudaGetDeviceCount"):
            facts["gpus"] = out[0]
        elif fn == "cuDeviceGetAttribute":
            match = _ENUM.match(str(call["args"][0]))
            if match:
                facts["attributes"][match.group(2)] = out[0]
        elif fn == "cudaDeviceGetAttribute":
            match = _ENUM.match(str(call["args"][0]))
            if match and match.group(2) in _RT_ATTRIBUTES:
                facts["attributes"][_RT_ATTRIBUTES[match.group(2)]] = out[0]
        elif fn == "cuDeviceGetName":
            facts["gpu_name"] = out[0].get("bytes") if isinstance(out[0], dict) else out[0]
        elif fn == "cuDriverGetVersion":
            facts["driver_version"] = out[0]
    return facts


def apply_facts(fake: Any, facts: dict[str, Any]) -> None:
    """Give every device of a `FakeCuda` the recorded attribute values; an attribute the
    driver refused is taken away (the fake then refuses it too, with its own code)."""
    for device in fake.devices:
        device.attributes.update(facts.get("attributes", {}))
        for name in facts.get("attribute_errors", {}):
            device.attributes.pop(name, None)


# --- rendering and comparing --------------------------------------------------------------


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def render(call: dict[str, Any]) -> str:
    """One line: ``fn(args) -> CODE [outputs]`` (``-> raised …`` when the bindings raised)."""
    args = ", ".join(_text(a) for a in call.get("args", []))
    head = f"{call.get('api', '?')}.{call['fn']}({args})"
    if "raised" in call:
        return f"{head} -> raised {call['raised']}"
    if "recorder_error" in call:
        return f"{head} -> the recorder failed: {call['recorder_error']}"
    out = call.get("out") or []
    if call["fn"] in MACHINE_FACTS:
        shown = ", ".join("<fact>" for _ in out)
    else:
        shown = ", ".join(_text(v) for v in out)
    return f"{head} -> {_text(call.get('code'))}" + (f" [{shown}]" if out else "")


def lines(calls: list[dict[str, Any]]) -> list[str]:
    return [
        render(c) for c in calls if not (c["fn"] in _POLLS and _POLLS[c["fn"]] == c.get("code"))
    ]


def compare(
    expected: dict[str, Any],
    actual: dict[str, Any],
    *,
    expected_name: str = "recorded",
    actual_name: str = "replayed",
) -> list[str]:
    """Every difference between two recordings' call sequences, as readable text; [] if none."""
    problems = []
    want, got = expected["calls"], actual["calls"]
    for name, recording in ((expected_name, expected), (actual_name, actual)):
        faults = [c for c in _all_calls(recording) if "recorder_error" in c]
        if faults:
            problems.append(f"{name}: the recorder failed on {len(faults)} calls: {faults[:3]}")
    if sorted(want) != sorted(got):
        problems.append(
            f"roles differ: {expected_name} has {sorted(want)}, {actual_name} has {sorted(got)}"
        )
    for role in sorted(set(want) & set(got)):
        a, b = lines(want[role]), lines(got[role])
        if a == b:
            continue
        diff = difflib.unified_diff(
            a, b, f"{expected_name} ({role})", f"{actual_name} ({role})", lineterm="", n=2
        )
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        where = (
            f"first difference at call {first + 1}"
            if first is not None
            else f"{len(a)} calls vs {len(b)}"
        )
        problems.append(f"role {role}: {where}\n" + "\n".join(diff))
    return problems


# --- does the fake know everything the driver was asked? -----------------------------------


def _walk(value: Any, found: dict[str, set[str]]) -> None:
    if isinstance(value, list):
        for v in value:
            _walk(v, found)
    elif isinstance(value, dict):
        kind = value.get("struct")
        if isinstance(kind, str):
            found.setdefault("struct_type", set()).add(kind)
            found.setdefault("struct", set()).update(f"{kind}.{k}" for k in value if k != "struct")
        for k, v in value.items():
            if k != "struct":
                _walk(v, found)
    elif isinstance(value, str):
        typed = _TYPED.match(value)
        if typed and not value.startswith("$"):
            found.setdefault("type", set()).add(typed.group(1))
            return
        symbol = _SYMBOL.match(value)
        if symbol:
            kind = symbol.group(1)
            if kind[:1].isupper() or kind.startswith("cuda"):  # a handle type, not a region
                found.setdefault("type", set()).add(kind)
            return
        if _ENUM.match(value):
            found.setdefault("enum", set()).add(value)


def fake_gaps(recording: dict[str, Any], driver: Any, runtime: Any) -> list[str]:
    """What a recording used that the modules lack: functions, enum members, handle and
    struct types, struct fields. [] when the modules know all of it."""
    modules = {"driver": driver, "runtime": runtime}
    gaps = []
    found: dict[str, set[str]] = {}
    seen_functions = set()
    for call in _all_calls(recording):
        key = (call.get("api", "driver"), call["fn"])
        if key not in seen_functions:
            seen_functions.add(key)
            if not hasattr(modules.get(key[0]), key[1]):
                gaps.append(f"function {key[0]}.{key[1]} is missing")
        _walk(call.get("args", []), found)
        _walk(call.get("out", []), found)
        if "code" in call:
            _walk(call["code"], found)

    def lookup(name: str) -> Any:
        for module in (driver, runtime):
            if module is not None and hasattr(module, name):
                return getattr(module, name)
        return None

    for name in sorted(found.get("enum", ())):
        kind, member = name.split(".", 1)
        enum_type = lookup(kind)
        if enum_type is None:
            gaps.append(f"enum type {kind} is missing")
        elif not hasattr(enum_type, member):
            gaps.append(f"enum member {name} is missing")
    for name in sorted(found.get("type", ())):
        if lookup(name) is None:
            gaps.append(f"type {name} is missing")
    for kind in sorted(found.get("struct_type", ())):
        if lookup(kind) is None:
            gaps.append(f"struct type {kind} is missing")
    for name in sorted(found.get("struct", ())):
        kind, field = name.split(".", 1)
        struct_type = lookup(kind)
        if struct_type is None:
            continue  # said above
        try:
            try:
                instance = struct_type()
            except TypeError:  # the fake's CUuuid takes its bytes
                instance = struct_type(bytes(16))
        except Exception as e:
            gaps.append(f"struct type {kind} cannot be made: {e}")
            continue
        if not hasattr(instance, field):
            gaps.append(f"struct field {name} is missing")
    return sorted(set(gaps), key=gaps.index)


def main(argv: list[str]) -> int:
    """``python -m tests.support.cuda_replay EXPECTED.json ACTUAL.json``: print the
    differences between two recordings (e.g. a GPU's and the fake's); exit 1 if any."""
    if len(argv) != 2:
        print("usage: python -m tests.support.cuda_replay EXPECTED.json ACTUAL.json")
        return 2
    expected, actual = (load_recording(p) for p in argv)
    problems = compare(expected, actual, expected_name=argv[0], actual_name=argv[1])
    for problem in problems:
        print(problem, end="\n\n")
    print(f"{len(problems)} differences" if problems else "same calls")
    return 1 if problems else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
