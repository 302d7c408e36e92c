# torch_tpu: every target builds what it needs. `make demo` runs the main job; `make test` passes the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# ml_dtypes 0.7.0 takes 0.7 s to import (0.6.0: 5 ms), paid by every process: each rank of every distributed test.
PIP_PINS := torch==2.13.0 jax==0.10.2 jaxlib==0.10.2 ml_dtypes==0.6.0

.PHONY: venv demo test test-slow test-compat bench bench-compile lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_PINS)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The demo succeeds when the evaluation ran to a report, whatever its verdict (pass 0, fail 1, inconclusive 3: the
# verdict is printed and written to the report); bad input (2) or a crash without a report is an error. It includes
# the 2-process DDP evaluation against one process (the report's "Distributed evaluation" section).
DEMO_OUT ?= report
demo: venv
	@rm -f $(DEMO_OUT)/report.json; \
	$(VENV)/bin/torch-tpu evaluate examples.workloads:tiny_lm --reference cpu --nproc-per-node 2 --strategy ddp \
		--prices torch_tpu/kit/example_prices.json --out $(DEMO_OUT)/; status=$$?; \
	if [ -f $(DEMO_OUT)/report.json ] && { [ $$status -le 1 ] || [ $$status -eq 3 ]; }; then \
		echo "make demo: the evaluation ran to a report (torch-tpu evaluate exit status $$status): $(DEMO_OUT)/report.html"; \
	else echo "make demo: the evaluation did not run to a report (exit status $$status)" >&2; \
		[ $$status -ne 0 ] && exit $$status; exit 1; fi

# The suite in two runs: tests/distributed alone (its tests start several processes each: in parallel they would
# oversubscribe the cores), then the rest spread over TEST_WORKERS pytest-xdist workers, a file to a worker
# (`--dist loadfile`: a module's fixtures and compiled programs stay in one process). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: venv
	$(PY) -m ruff check torch_tpu tests bench examples
	$(PY) -m ruff format --check torch_tpu tests bench examples
	$(PY) -m pytest -q -p no:cacheprovider tests/distributed
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile tests --ignore=tests/distributed

test-slow: venv
	$(PY) -m pytest -q -p no:cacheprovider -m slow

# `make test-compat` (not part of `make test`): the fast suite once per supported torch/JAX pair, each in a venv of
# its own under COMPAT_VENVS (outside the checkout; built once, kept). A pair is PYTHON:TORCH:JAX; a pair whose
# Python or wheels are not obtainable here is reported "not installable" and skipped. docs/compatibility.md has
# the results. COMPAT_TESTS narrows the suite (default: all of the fast suite but tests/distributed).
COMPAT_VENVS ?= $(abspath ..)/compat-venvs
COMPAT_PAIRS ?= 3.11:2.13.0:0.10.2 3.11:2.14.1:0.10.2 3.11:2.12.1:0.10.2 3.12:2.11.0:0.11.2
COMPAT_TESTS ?= tests --ignore=tests/distributed
COMPAT_TIMEOUT ?= 5400
COMPAT_DEPS := numpy ml_dtypes pytest pytest-xdist expecttest hypothesis "setuptools>=70.1,<82" transformers kubernetes jsonschema pyyaml \
	matplotlib starlette uvicorn prometheus_client websocket-client

test-compat: SHELL := /bin/bash
test-compat:
	@mkdir -p $(COMPAT_VENVS); summary=$(COMPAT_VENVS)/summary.txt; : > $$summary; \
	for pair in $(COMPAT_PAIRS); do \
		IFS=: read -r py torch jax <<< "$$pair"; venv=$(COMPAT_VENVS)/py$$py-torch$$torch-jax$$jax; \
		if [ ! -f $$venv/.installed ]; then \
			pybin=; for candidate in $$(command -v python$$py) $$(ls $$HOME/.pyenv/versions/$$py*/bin/python$$py 2>/dev/null); do \
				if $$candidate -c '' 2>/dev/null; then pybin=$$candidate; break; fi; done; \
			if [ -z "$$pybin" ]; then echo "$$pair: not installable here (no python$$py)" >> $$summary; continue; fi; \
			rm -rf $$venv && $$pybin -m venv $$venv && \
			$$venv/bin/python -m pip install -q torch==$$torch jax==$$jax jaxlib==$$jax $(COMPAT_DEPS) > $$venv.install.log 2>&1 \
			|| { echo "$$pair: not installable here (see $$venv.install.log)" >> $$summary; continue; }; \
			touch $$venv/.installed; \
		fi; \
		$$venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . > /dev/null; \
		echo "== $$pair: pytest -q $(COMPAT_TESTS)"; \
		$$venv/bin/python -m pip install -q pytest-xdist > /dev/null; \
		timeout $(COMPAT_TIMEOUT) $$venv/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile \
			$(COMPAT_TESTS) > $$venv.pytest.log 2>&1; \
		status=$$?; echo "$$pair: $$(tail -n 1 $$venv.pytest.log) (exit $$status; log $$venv.pytest.log)" | tee -a $$summary; \
	done; echo "--- $$summary"; cat $$summary

bench: venv
	$(PY) bench/eager_overhead.py

bench-compile: venv
	$(PY) bench/compile_step.py
	$(PY) bench/compile_step.py --warm-check

lint: venv
	$(PY) -m ruff check torch_tpu tests bench examples
	$(PY) -m ruff format --check torch_tpu tests bench examples

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
