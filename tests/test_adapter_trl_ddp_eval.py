"""The pilot record's held-out evaluations of `RlpaceGRPOTrainer` on 2 CPU processes (torchrun,
gloo): 5 evaluation prompts × 2 samples over 2 ranks × 2 per device leave the last global batch
half empty, and accelerate pads rank 1's half with samples from the start. The record (written
by rank 0) must hold the share over the 10 real samples only, and the held-out prompts per
data_source over the 5 real prompts. About a minute on 2 cores."""

from __future__ import annotations

import json
import textwrap

import pytest

pytest.importorskip("trl")

from _isolated import DDP_WORKER_HEAD  # noqa: E402
from _tiny_lm import build_tiny_lm  # noqa: E402

pytestmark = [pytest.mark.slow]

WORKER = DDP_WORKER_HEAD + textwrap.dedent('''
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace.adapters.trl import RlpaceGRPOTrainer

    G = 2
    held = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 2000 + i,
                               "data_source": ["math", "logic"][i % 2]} for i in range(5)])

    def reward(prompts, completions, index, trainer_state, **kw):
        if index[0] >= 2000:                       # evaluation: by prompt only (2001 and 2004 pass)
            return [float(i % 3 == 0) for i in index]
        return [float((i * 7 + j % G * 3 + trainer_state.global_step) % 5 < 2) for j, i in enumerate(index)]

    cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=G, per_device_eval_batch_size=G, num_generations=G,
                     max_completion_length=2, max_steps=2, beta=0.0, save_strategy="no",
                     logging_steps=100, dataloader_num_workers=0, gradient_checkpointing=False,
                     learning_rate=1e-3, eval_strategy="steps", eval_steps=2, eval_on_start=True)
    RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                      train_dataset=ds, eval_dataset=held, processing_class=AutoTokenizer.from_pretrained(lm),
                      scheduler=Scheduler(pool_from_dataset(ds), "uniform", seed=5),
                      record=out + "/pilot.jsonl").train()
''')


def test_two_ranks_record_the_evaluation_of_the_real_samples_only(tmp_path):
    """acc_mean = 2 of 5 prompts pass = 0.4 (with the padding it would be 4/12 or 6/12; with
    accelerate's gather_for_metrics cut, len(dataset) % 4 = 1 row of the last batch: 9 rows);
    per data_source: math (2000, 2002, 2004) 1/3, logic (2001, 2003) 1/2. At the start (step 0,
    on step 0's line) and after the last step (2, a line of its own). The held-out prompts per
    data_source are the 5 real ones (math 3, logic 2; the padding's 2 samples would be a sixth)."""
    from _isolated import run_two_ranks
    from rlpace.advise import read_pilot
    lm = build_tiny_lm(tmp_path / "lm", [f"what is {i} plus 3?" for i in range(8)])
    run_two_ranks(WORKER, lm, tmp_path, port=29571)
    lines = [json.loads(x) for x in (tmp_path / "pilot.jsonl").read_text().splitlines()[1:]]
    names = [["math", "logic"][i % 2] for i in range(5)]        # the worker's evaluation data_source
    sizes = {d: names.count(d) for d in set(names)}
    assert sizes == {"math": 3, "logic": 2}
    want = {"acc_mean": pytest.approx(0.4), "acc": {"logic": pytest.approx(0.5), "math": pytest.approx(1 / 3)},
            "n": sizes}
    assert lines[0]["step"] == 0 and lines[0]["eval"] == want
    assert lines[-1] == {"step": 2, "eval": want}
    assert [ln["step"] for ln in lines] == [0, 1, 2]          # one writer: no line twice
    pilot = read_pilot(tmp_path / "pilot.jsonl")
    assert [(s, a) for s, _, a in pilot.evals] == [(0, 0.4), (2, 0.4)]
    assert pilot.domain_evals == tuple((s, want["acc"], sizes) for s in (0, 2))
