# Every target creates the venv (python3.12) and installs the project first, so a
# fresh machine needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON312 ?= $(shell for p in python3.12 $$HOME/.pyenv/versions/3.12*/bin/python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do $$p -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
JOBS ?= 2

.PHONY: demo test setup clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON312)" || { echo "python3.12 not found: install it or pass PYTHON312=/path/to/python3.12"; exit 1; }
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) -m kvjax.demo

test: setup
	$(PY) -m pytest -n $(JOBS) --durations=30 tests

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
