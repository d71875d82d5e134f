# The two commands a newcomer runs:   make demo   |   make test
# Both create .venv from scratch: CPU torch first (pinned, from the machine's wheel),
# then rlpace with every extra. Override VENV=... to use another location.
VENV    ?= .venv
PY      := $(VENV)/bin/python
PIP     := $(VENV)/bin/pip
EXTRAS  := train,trl,verl,prepare,report,dev
STAMP   := $(VENV)/.rlpace-installed

export OMP_NUM_THREADS ?= 1
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test install clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/rlpace demo

test: $(STAMP)
	$(PY) -m pytest tests

clean:
	rm -rf $(VENV) runs .pytest_cache
