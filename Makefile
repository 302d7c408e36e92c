# torch_tpu: every target builds what it needs. `make demo` runs the main job; `make test` passes the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP_PINS := torch==2.13.0 jax==0.10.2 jaxlib==0.10.2

.PHONY: venv demo test test-slow bench bench-compile lint clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(PIP_PINS)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The demo succeeds when the evaluation ran to a report, whatever its verdict (pass 0, fail 1, inconclusive 3: the
# verdict is printed and written to the report); bad input (2) or a crash without a report is an error.
DEMO_OUT ?= report
demo: venv
	@rm -f $(DEMO_OUT)/report.json; \
	$(VENV)/bin/torch-tpu evaluate examples.workloads:tiny_lm --reference cpu \
		--prices torch_tpu/kit/example_prices.json --out $(DEMO_OUT)/; status=$$?; \
	if [ -f $(DEMO_OUT)/report.json ] && { [ $$status -le 1 ] || [ $$status -eq 3 ]; }; then \
		echo "make demo: the evaluation ran to a report (torch-tpu evaluate exit status $$status): $(DEMO_OUT)/report.html"; \
	else echo "make demo: the evaluation did not run to a report (exit status $$status)" >&2; \
		[ $$status -ne 0 ] && exit $$status; exit 1; fi

test: venv
	$(PY) -m ruff check torch_tpu tests bench examples
	$(PY) -m ruff format --check torch_tpu tests bench examples
	$(PY) -m pytest -q -p no:cacheprovider

test-slow: venv
	$(PY) -m pytest -q -p no:cacheprovider -m slow

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
