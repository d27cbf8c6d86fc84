#!/usr/bin/env bash
# The wheels a bare GPU machine needs to run train.py, evaluate.py and the table engine with no network, into .whl/
# (gitignored; ~20 MB, so it travels with the working tree: the device tool's carry=[".whl", ...]). The lent machines
# run Python 3.12 with torch, lightning, transformers, tokenizers, pandas and numpy already installed; what they lack
# is pinned here to this venv's versions (pip freeze), plus attnlab itself as a wheel (rebuilt: configs travel in it).
# On the device: python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl; PYTHONPATH=/tmp/site.
# Usage: bash experiments/device_wheels.sh (needs the registries: PyPI; run it where `make install` ran).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
# binary wheels for CPython 3.12 on manylinux x86-64
BINARY=(hydra-core omegaconf datasets dill multiprocess torchdata more-itertools zstandard mwparserfromhell lm_eval
    hydra-joblib-launcher hydra-submitit-launcher submitit pydantic pydantic_core annotated-types typing-inspection
    pytz chardet sniffio)
SOURCE=(antlr4-python3-runtime sqlitedict word2number)  # published as source only: built here (pure Python)
frozen=$("$PYTHON" -m pip freeze)
pins() {  # the venv's version of each named package, as name==version
    for name in "$@"; do
        pattern=$(sed 's/[-_]/[-_]/g' <<<"$name")
        grep -i -m1 "^${pattern}==" <<<"$frozen" || { echo "device_wheels: $name is not installed in $PYTHON" >&2; exit 1; }
    done
}
binary=$(pins "${BINARY[@]}")  # (assigned alone: a missing package stops the script here)
source=$(pins "${SOURCE[@]}")
mkdir -p .whl
rm -f .whl/*.whl  # wheels of earlier pins would hand pip two versions of one package
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d .whl $binary
"$PYTHON" -m pip wheel -q --no-deps -w .whl $source .
du -sh .whl
