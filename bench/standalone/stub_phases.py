"""Run by `bench.compare` with the stub environment's Python (.venv-triton): where a new
stub of a real example model spends its time before it can answer, in one fresh process.

    stub_phases.py <real modelswap_client folder> <AutoModel class> <HF folder> <weights bytes>

Prints one JSON object:
- imports_seconds: importing torch and transformers' Auto classes (what model.py does);
- first_build_seconds: building the model once on the meta device, which imports its
  modeling code (transformers does so lazily): once per process, either path;
- load_seconds: `modelswap_client.torch.from_pretrained` on a fresh attachment (the
  stand-in's: this process's memory, no agent): the model built on the meta device and the
  safetensors read into the region;
- bind_seconds: the same call on an attachment whose region already holds those bytes and
  reports them restored with their fingerprint, as a restarted stub's does: the model built
  on meta and bound to the bytes, no weight file read.
Load and bind build the same model the same way, so their difference is what the host
copy saves inside the stub; the rest of a restart (Triton starting the process, the
imports, the tokenizer, the agent) is the same either way.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

STANDALONE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    real_client, class_name, folder, weights_bytes = argv
    started = time.perf_counter()
    import torch  # noqa: F401, PLC0415 - timed: what every stub of these models imports
    import transformers  # noqa: PLC0415
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer  # noqa: F401, PLC0415

    imports_seconds = time.perf_counter() - started
    # the stand-in client first, every other module the real one (as in the plain Triton)
    os.environ["MODELSWAP_REAL_CLIENT"] = real_client
    sys.path.insert(0, str(STANDALONE))
    for name in [k for k in sys.modules if k.split(".")[0] == "modelswap_client"]:
        del sys.modules[name]
    from modelswap_client import client  # noqa: PLC0415
    from modelswap_client import torch as mstorch  # noqa: PLC0415

    cls = getattr(transformers, class_name)
    # the first build imports the model's modeling code (lazily, in transformers): once per
    # process, for either path, so it is timed apart
    started = time.perf_counter()
    with mstorch.empty_parameters():
        mstorch.build_pretrained(cls, folder)
    first_build_seconds = time.perf_counter() - started
    spec = client.RegionSpec("weights", int(weights_bytes))
    fresh = client.attach("fresh", [spec])
    started = time.perf_counter()
    mstorch.from_pretrained(fresh, cls, folder)
    load_seconds = time.perf_counter() - started

    try:
        bind_seconds = timed_bind(client, mstorch, cls, folder, fresh)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "imports_seconds": imports_seconds,
                "first_build_seconds": first_build_seconds,
                "load_seconds": load_seconds,
                "bind_seconds": bind_seconds,
            }
        )
    )
    return 0


def timed_bind(client: Any, mstorch: Any, cls: Any, folder: str | Path, fresh: Any) -> float:
    """Seconds `from_pretrained` takes to bind a copy of `fresh`'s committed bytes (a new
    stand-in attachment reporting them restored with `fresh`'s fingerprint); RuntimeError
    when it loads afresh instead (the figure would be a load's)."""
    source = fresh.regions["weights"]
    restored = client.attach("restored", [client.RegionSpec("weights", source.size_bytes)])
    try:
        ctypes.memmove(restored.regions["weights"].address, source.address, source.size_bytes)
        restored.restored = restored.committed = True
        restored.fingerprint = fresh.fingerprint
        commits: list[str] = []
        restored.commit = lambda fingerprint="", *, replace=False: commits.append(fingerprint)
        started = time.perf_counter()
        mstorch.from_pretrained(restored, cls, folder)
        seconds = time.perf_counter() - started
    finally:
        restored.close()
    if commits:
        raise RuntimeError(f"{folder}: the host copy did not bind (it loaded afresh)")
    return seconds


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
