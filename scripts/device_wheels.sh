#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine lacks: it has torch, triton and transformers,
# not pydantic or black (fusegen's own needs), nor pytest-xdist (run_suite.sh's
# hopper-tests run four at a time: one by one the GPU tests take minutes of device time),
# nor gemlite (issue 31's int4 anchor). A `run` call carries them (carry [".whl"]) and
# installs them there, in every call (the machine is a fresh one after 30 s idle):
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD
# The versions are the ones scripts/setup.sh put in .venv; the machine runs CPython 3.12
# on x86-64 Linux.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/setup.sh
mkdir -p .whl
pip_quiet() { .venv/bin/python -m pip "$@" --quiet --disable-pip-version-check 2>&1 \
    | grep -v "^WARNING: Location" || true; }
version() { .venv/bin/python -c "import importlib.metadata as m; print(m.version('$1'))"; }
for package in pydantic pydantic_core annotated-types typing-inspection black platformdirs \
    pytokens pytest-xdist execnet; do
    pip_quiet download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$package==$(version "$package")"
done
# gemlite is on the index as source only: its pure-Python wheel is built here; it needs tqdm.
pip_quiet download --no-deps --only-binary=:all: -d .whl tqdm
source_dir=$(mktemp -d)
pip_quiet download --no-deps --no-binary=:all: -d "$source_dir" gemlite==0.6.0.post2
pip_quiet wheel --no-deps -w .whl "$source_dir"/gemlite-*.tar.gz
rm -rf "$source_dir"
ls .whl
