# The two commands a newcomer needs; each one sets up its environment first (fast when done).
# PROFILE picks the stack: classic (the default: Python 3.11, TensorFlow 2.15, Horovod,
# Petastorm) or current (Python 3.13, the newest TensorFlow with tf-keras, numpy 2, pyarrow 18+;
# engine tf_collective): `make run PROFILE=current`; or torch (Python 3.11, the classic stack
# with PyTorch's CPU build instead of Petastorm and Horovod). `make test` runs all three.
.PHONY: setup setup-current setup-torch run test test-classic test-current test-torch test-fast

PROFILE ?= classic
VENV_classic := .venv
VENV_current := .venv-current
VENV_torch := .venv-torch
VENV := $(VENV_$(PROFILE))

setup:
	bash scripts/setup.sh $(PROFILE)

setup-current:
	bash scripts/setup.sh current

setup-torch:
	bash scripts/setup.sh torch

# The main job, end to end, on the embedded defaults.
run: setup
	$(VENV)/bin/hvdflow run

# The test suite of the three profiles: lint, every classic test (slow ones included), then the
# current profile's unit tier and the tests marked `current`, then the torch profile's unit tier
# and the tests marked `torch`. Fails when no test ran.
test: test-classic test-current test-torch

test-classic:
	bash scripts/setup.sh classic
	@# Airflow's own environment, for the Airflow test (tests/flows/test_airflow.py).
	bash scripts/setup.sh airflow
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	@# Bytecode for the checkout's own modules: an editable install is never compiled, and under
	@# PYTHONDONTWRITEBYTECODE each of the suite's ~600 Python processes compiled what it imported.
	.venv/bin/python -m compileall -q hvdflow infra training tasks flows bench serving tests
	.venv/bin/python -m pytest -n 2 --durations=25 -m "not torch" $(PYTEST_ARGS)

test-current: setup-current
	.venv-current/bin/python -m compileall -q hvdflow infra training tasks flows bench serving tests
	.venv-current/bin/python -m pytest -n 2 --durations=15 -m "unit or current" $(PYTEST_ARGS)

test-torch: setup-torch
	.venv-torch/bin/python -m compileall -q hvdflow infra training tasks flows bench serving tests
	.venv-torch/bin/python -m pytest -n 2 --durations=10 -m "unit or torch" $(PYTEST_ARGS)

# The unit tier alone (no JVM, server or subprocess): under a minute, for the edit-test loop.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -m unit $(PYTEST_ARGS)
