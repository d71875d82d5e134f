import os

import pytest

# torch on 2 shared cores: one thread, or a step gets 10x slower (ecosystem.md §2.5).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A base-policy cache directory shared by the tests of one module (built tiny models are
    reused within the module, never across modules)."""
    return str(tmp_path_factory.mktemp("cache"))
