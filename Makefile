# The two commands a newcomer needs; each one sets up .venv first (fast when already done).
.PHONY: setup run test test-fast

setup:
	bash scripts/setup.sh

# The main job, end to end, on the embedded defaults.
run: setup
	.venv/bin/hvdflow run

# The test suite: lint, then every test (slow ones included). Fails when no test ran.
test: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	@# Bytecode for the checkout's own modules: an editable install is never compiled, and under
	@# PYTHONDONTWRITEBYTECODE each of the suite's ~600 Python processes compiled what it imported.
	.venv/bin/python -m compileall -q hvdflow infra training tasks flows bench serving tests
	.venv/bin/python -m pytest -n 2 --durations=25 $(PYTEST_ARGS)

# The unit tier alone (no JVM, server or subprocess): under a minute, for the edit-test loop.
test-fast: setup
	.venv/bin/ruff check .
	.venv/bin/python -m pytest -m unit $(PYTEST_ARGS)
