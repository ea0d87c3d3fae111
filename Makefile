# Two commands do all the set-up: `make run` and `make test`; `make check` is the fast
# tier while working (docs/testing.md).
PYTHON ?= python3
PORT ?= 8000
# pytest-xdist workers: one per core (`make test TEST_WORKERS=1` runs in one process).
TEST_WORKERS ?= auto
VENV := .venv
# Python caches compiled modules (and pytest its rewritten tests) in __pycache__ even
# where the caller's environment says not to: the suite starts hundreds of interpreters
# (servers, workers, agents, render children), each of which would compile again.
unexport PYTHONDONTWRITEBYTECODE
BIN := $(VENV)/bin

.PHONY: run test check lint worker beat clean

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	# The project itself (editable): the `bellwether` command in $(BIN) (docs/ci.md).
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed requirements-dev.txt
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $@

## run: install, migrate, load the demo and serve everything on 127.0.0.1:$(PORT) (embedded mode)
run: $(VENV)/.installed
	@# A port in use (another make run?) stops here, before the database is touched.
	@$(BIN)/python -c 'import socket, sys; socket.create_server(("127.0.0.1", int(sys.argv[1]))).close()' \
		$(PORT) 2>/dev/null || { echo "make run: 127.0.0.1:$(PORT) is in use (another make run?); \
	choose another port: make run PORT=8001" >&2; exit 1; }
	DATABASE_URL= REDIS_URL= $(BIN)/python manage.py migrate --noinput
	DATABASE_URL= REDIS_URL= PORT=$(PORT) $(BIN)/python manage.py load_demo
	DATABASE_URL= REDIS_URL= $(BIN)/python manage.py runserver 127.0.0.1:$(PORT)

## test: install the dev requirements and run the whole suite (set DATABASE_URL/REDIS_URL for PostgreSQL/Redis)
test: lint
	SECRET_KEY=$${SECRET_KEY:-test-only-secret} $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup \
		$(PYTEST_ARGS)

## check: the fast tier: ruff, then every test that starts no process and is not marked
## slow, on SQLite, with fewer property examples
check: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	DATABASE_URL= REDIS_URL= BELLWETHER_REQUIRE_SERVICES= SECRET_KEY=test-only-secret \
		HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-check} \
		$(BIN)/pytest -n $(TEST_WORKERS) -m "not processes and not slow" $(PYTEST_ARGS)

## lint: ruff, and the architecture's import contracts (.importlinter)
lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/lint-imports

## worker / beat: production processes (need DATABASE_URL, REDIS_URL, SECRET_KEY)
worker: $(VENV)/.installed
	$(BIN)/celery -A project worker --loglevel=INFO

beat: $(VENV)/.installed
	$(BIN)/celery -A project beat --loglevel=INFO

clean:
	rm -rf $(VENV) var staticfiles .pytest_cache .ruff_cache .hypothesis
