# The two commands a newcomer runs:   make demo   |   make test
# Both create .venv from scratch: CPU torch first (pinned, from the machine's wheel),
# then rlpace with every extra. Override VENV=... to use another location.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
EXTRAS  := train,trl,verl,prepare,report,dev,docs
STAMP   := $(VENV)/.rlpace-installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install clean test-main test-verl07 test-docs test-trinity

$(STAMP): pyproject.toml Makefile
	test -x $(PIP) || python3 -m venv --clear $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlpace demo

# `make test` runs every suite in TEST_SUITES, even after one fails, prints which passed and
# which failed, and fails at the end if any did. A new suite is one line here plus its target.
TEST_SUITES := test-main
TEST_SUITES += test-verl07
TEST_SUITES += test-trinity
TEST_SUITES += test-docs

test:
	@passed=""; failed=""; \
	for s in $(TEST_SUITES); do \
	  echo "==== make $$s"; \
	  if $(MAKE) --no-print-directory $$s; then passed="$$passed $$s"; else failed="$$failed $$s"; fi; \
	done; \
	echo "==== test suites passed:$${passed:- none}"; \
	echo "==== test suites failed:$${failed:- none}"; \
	test -z "$$failed"

test-main: $(STAMP)
	$(PY) -m pytest tests

# The documentation site (mkdocs.yml): a broken link or anchor, a page missing from the nav or a
# docstring the API reference cannot render fails the build.
test-docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache site

# A venv beside the main one for an engine whose pins conflict with it: $(call side_venv,DIR,PINS)
# installs torch, then PINS (pip requirement words; kept in a variable, as they may hold commas),
# then rlpace with its dev extra, and touches DIR/.rlpace-installed. Each line is a recipe line.
define side_venv
test -x $(1)/bin/pip || python3 -m venv --clear $(1)
$(1)/bin/pip install -q --upgrade pip
$(1)/bin/pip install -q torch==2.13.0
$(1)/bin/pip install -q $(2)
$(1)/bin/pip install -q -e ".[dev]"
touch $(1)/.rlpace-installed
endef

# ---- verl 0.7 environment: rlpace.adapters.verl RlpaceSampler, tests/verl07 ---------------------
# verl 0.5-0.7 still has the curriculum-sampler hook (data.sampler.class_path) that 0.8 removed.
# verl 0.7.1 resolves numpy<2, and pyarrow must then stay <21 (26.x needs numpy 2), so it lives in
# a second venv; the main one keeps verl 0.9. The main test run skips tests/verl07 (no sampler hook).
VENV07  ?= .venv-verl07
STAMP07 := $(VENV07)/.rlpace-installed

PINS07  := "verl==0.7.1" "numpy<2" "pyarrow>=19,<21"

$(STAMP07): pyproject.toml Makefile
	$(call side_venv,$(VENV07),$(PINS07))

test-verl07: $(STAMP07)
	$(VENV07)/bin/python -m pytest tests/verl07 -p no:cacheprovider
# ---- end of the verl 0.7 block ------------------------------------------------------------------

# ---- Trinity-RFT environment: rlpace.adapters.trinity, tests/trinity_rft ------------------------
# trinity-rft 0.6.0 needs transformers>=5.12.1 and verl 0.9.1 (the main venv) transformers<5.11,
# so it lives in its own venv; pip then resolves verl 0.8.0, which pins numpy<2, so pyarrow must
# stay <21 as in the verl 0.7 venv. SQLAlchemy's asyncio module (imported by Trinity's buffer)
# needs greenlet, which trinity-rft does not declare. The main test run skips tests/trinity_rft.
VENVTR  ?= .venv-trinity
STAMPTR := $(VENVTR)/.rlpace-installed

PINSTR  := "trinity-rft==0.6.0" "pyarrow>=19,<21" greenlet

$(STAMPTR): pyproject.toml Makefile
	$(call side_venv,$(VENVTR),$(PINSTR))

test-trinity: $(STAMPTR)
	$(VENVTR)/bin/python -m pytest tests/trinity_rft -p no:cacheprovider -p no:logging
# ---- end of the Trinity-RFT block ---------------------------------------------------------------
