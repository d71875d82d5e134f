import os

# torch on 2 shared cores: one thread, or a step gets 10x slower (ecosystem.md §2.5).
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
