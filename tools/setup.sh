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
# the versions the tests last passed on (constraints.txt; `make constraints` moves them on)
"$venv/bin/python" -m pip install --quiet -c constraints.txt -e '.[dev]'
"$venv/bin/python" tools/install_kube_tools.py "$venv/bin"
"$venv/bin/python" tools/install_triton.py --python "$python" --venv .venv-triton
"$venv/bin/python" -m modelswap_client.native_build  # the allocation shim (docs/CUDA.md)
