#!/usr/bin/env bash
# Create .venv (once) and install fusegen with what its tests need, at pinned versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check \
    --constraint requirements/pins.txt --editable ".[test]" 2>&1 \
    | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import fusegen, torch, triton; print(f'fusegen {fusegen.__version__}, torch {torch.__version__}, triton {triton.__version__}')"
