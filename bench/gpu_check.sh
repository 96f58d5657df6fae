#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py) on a machine with PyTorch and transformers but no internet: the wheels and the
# tokenizer that `make gpu-check-wheels` put in .cache/gpu-check/ (carried with the tree) go into a folder on the
# PYTHONPATH, with --no-deps (the machine has their dependencies), then the check runs. Extra arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRIED=${CARRIED:-.cache/gpu-check}
[ -d "$CARRIED/wheels" ] || { echo "no $CARRIED/wheels: run \`make gpu-check-wheels\` on a connected machine" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
SITE=$(mktemp -d)
"$PYTHON" -m pip --disable-pip-version-check -q install --no-index --no-deps --target "$SITE" "$CARRIED"/wheels/*.whl
PYTHONPATH="$PWD:$SITE" exec "$PYTHON" bench/gpu_check.py --tokenizer "$CARRIED/tokenizer" "$@"
