#!/usr/bin/env bash
# Set up, build the example specs into generated/, and run one generated kernel against
# its reference (on the GPU if there is one, else on the Triton interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fusegen build specs
.venv/bin/python scripts/demo.py
