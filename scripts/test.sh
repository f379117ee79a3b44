#!/usr/bin/env bash
# Set up and run the whole test suite: fusegen's own tests and the generated modules'
# equivalence tests (on the Triton interpreter when there is no GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
workers=$(.venv/bin/python -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))")
.venv/bin/python -m pytest -q -n "$workers" "$@"
