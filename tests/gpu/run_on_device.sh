#!/usr/bin/env bash
# Everything the GPU checks need, in one run on a lent GPU machine (its own python3, with
# torch, transformers, cuda-bindings, nvidia-ml-py, pytest and pytest-timeout; nothing of
# ours installed). Run from the repository root:
#
#     OUT=/some/folder MODELSWAP_BENCH_COMMIT=$(git rev-parse HEAD) bash tests/gpu/run_on_device.sh
#
# (the device tool copies the working tree, not always with its .git: the bench result
# names the commit it is given)
# Writes under $OUT: tests-gpu.log (pytest -v over tests/gpu), record.log, bench.log,
# versions.txt, and bundle.tgz (those logs, the CUDA call recordings, the bench result
# JSON and nvidia-smi's view before and after). Every step runs under its own timeout,
# and a failing step does not stop the next: one run must bring back all it can.
set -u
OUT=${OUT:-/tmp/modelswap-gpu-out}
work="$OUT/work"
mkdir -p "$work/recordings" "$work/results"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/api:$PWD/sidecar:$PWD/client:$PWD${PYTHONPATH:+:$PYTHONPATH}"

step() {  # step NAME TIMEOUT_SECONDS COMMAND...: run, log to $OUT/NAME.log, note the status
    local name=$1 limit=$2
    shift 2
    local started=$SECONDS
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc in $((SECONDS - started)) s" | tee -a "$OUT/versions.txt"
    cp "$OUT/$name.log" "$work/"
}

{
    date -u
    python3 -V
    nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    python3 -c 'import cuda.bindings, pynvml; print("cuda-bindings", cuda.bindings.__version__)'
} >"$OUT/versions.txt" 2>&1
nvidia-smi >"$work/nvidia-smi-before.txt" 2>&1

step native 30 python3 -m modelswap_client.native_build
step tests-gpu 200 python3 -m pytest --confcutdir=tests/gpu -p no:cacheprovider tests/gpu -v -rA
step record 60 python3 tests/gpu/record_cycles.py --out "$work/recordings"
step bench 150 python3 bench/gpu_swap.py --sizes-mib 1024,4096,16384 --repeats 3

cp bench/results/*/gpu-swap.json "$work/results/" 2>/dev/null
nvidia-smi >"$work/nvidia-smi-after.txt" 2>&1
cp "$OUT/versions.txt" "$work/"
tar -czf "$OUT/bundle.tgz" -C "$work" .
rm -rf "$work"
