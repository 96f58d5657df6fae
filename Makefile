# The two commands a new user needs (see README):
#   make quickstart   set up .venv and run the main job on the offline default
#   make test         set up .venv (with test tools) and run the test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: venv test-venv quickstart test bench clean

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

# Until the training loop lands, the main job is (1) the BFCL-V3 evaluation of the oracle policy on all four
# multi-turn categories: it proves the environment, the safe dispatch and the official-equivalent scorer; and
# (2) the shipped SmolLM2 on the held-out BFCL-lite split, offline on the CPU: the starting point training improves.
quickstart: venv
	@for category in multi_turn_base multi_turn_miss_func multi_turn_miss_param multi_turn_long_context; do \
		$(BIN)/coevolve eval --env bfcl --category $$category --policy oracle || exit 1; \
	done
	$(BIN)/coevolve eval --env bfcl-lite --split test --policy model:smollm2 --demos 3 --max-new-tokens 64

# pytest exits 5 when it collected no test: make treats every non-zero exit as failure, so that fails too.
test: test-venv
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: venv
	$(BIN)/python bench/env_step.py
	$(BIN)/python bench/signals.py
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/zero_shot.py
	$(BIN)/python bench/train_step.py
	$(BIN)/python bench/feedback.py --tasks 24

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
