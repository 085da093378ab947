# The two commands: `make bench` and `make test`. Both build .venv with a Python >= 3.12 found on
# this machine: python3.12/python3.13/python3 on PATH, else the oldest pyenv install of 3.12 or
# later (the version jax and egglog were tested on).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python

FIND_PYTHON := for p in python3.12 python3.13 python3.14 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then \
	    command -v $$p; exit 0; fi; done; \
	if command -v pyenv >/dev/null 2>&1; then \
	  v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.(1[2-9])(\.[0-9]+)?$$' | sort -V | head -n 1); \
	  if [ -n "$$v" ]; then echo "$$(pyenv root)/versions/$$v/bin/python3"; exit 0; fi; fi; \
	echo "no Python >= 3.12 found (tried python3.12, python3.13, python3.14, python3 and pyenv)" >&2; exit 1

.PHONY: bench test lint fuzz clean venv
venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@py=$$($(FIND_PYTHON)) && echo "using $$py" && $$py -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,plots,exact]'
	@touch $@

bench: venv
	$(VENV)/bin/jaxrw bench --suite all --size small

lint: venv
	$(VENV)/bin/ruff check jaxrw tests
	$(VENV)/bin/ruff format --check jaxrw tests

test: lint
	$(PY) -m pytest -q -x -p no:cacheprovider

fuzz: venv
	$(PY) -m jaxrw.bench.fuzz --examples 10000

clean:
	rm -rf $(VENV) build *.egg-info
