#!/usr/bin/env bash
# The GPU benchmark as one prepared command, for a GPU host (under 10 minutes on one GPU):
#
#   bash bench/gpu.sh                        # dependencies from the package registries
#   WHEELHOUSE=wheels bash bench/gpu.sh      # offline: dependencies only from local wheel files
#
# It builds its own virtualenv (.venv-gpu; the CPU .venv pins a CPU torch): requirements/gpu.txt with base.txt in
# one resolution (gpu.txt's pins of torch, transformers and numpy replace base.txt's: vLLM 0.33 needs them), then
# the --no-deps packages, and runs bench/gpu.py, which appends a dated section to BENCHMARKS.md. Extra arguments go
# to bench/gpu.py; `--setup` only builds the virtualenv; `--requirements` prints the combined requirement list.
# Fill a wheelhouse on a connected machine with the GPU host's Python and platform: `make gpu-wheels`.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
PYTHON=${PYTHON:-python3}
# requirements/gpu.txt plus base.txt, a package pinned in gpu.txt replacing base.txt's pin (see gpu.txt for why).
# base.txt's packages a GPU host goes without: trackio 0.43 (its latest) needs pillow < 13 and vLLM 0.33 pillow >= 13,
# so pip's resolver refuses the two together; report to tensorboard or wandb there.
WITHOUT="trackio"
requirements() {
    cat requirements/gpu.txt
    local pinned
    pinned=$(sed -n 's/^\([A-Za-z0-9_.-]*\)==.*/\1/p' requirements/gpu.txt | paste -sd'|')
    grep -Ev "^($pinned|$WITHOUT)==" requirements/base.txt
    cat requirements/test.txt  # so the GPU tests run there too: .venv-gpu/bin/python -m pytest -m gpu
}
if [ "${1:-}" = "--requirements" ]; then requirements; exit 0; fi
FROM=()
if [ -n "${WHEELHOUSE:-}" ]; then
    [ -d "$WHEELHOUSE" ] || { echo "WHEELHOUSE=$WHEELHOUSE is not a folder (fill it with: make gpu-wheels)" >&2; exit 2; }
    FROM=(--no-index --find-links "$WHEELHOUSE")
fi
command -v nvidia-smi >/dev/null 2>&1 || echo "warning: no nvidia-smi here; bench/gpu.py needs a CUDA GPU" >&2
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
if [ ! -f "$VENV/.installed" ]; then
    requirements > "$VENV/requirements.txt"
    "${PIP[@]}" install ${FROM[@]+"${FROM[@]}"} -r "$VENV/requirements.txt"
    "${PIP[@]}" install ${FROM[@]+"${FROM[@]}"} --no-deps -r requirements/nodeps.txt
    touch "$VENV/.installed"
fi
if [ "${1:-}" = "--setup" ]; then echo "$VENV is ready (run the package with PYTHONPATH=$PWD)"; exit 0; fi
# The package runs from the source tree (PYTHONPATH): no build step, so no build backend is needed offline.
PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" bench/gpu.py "$@"
