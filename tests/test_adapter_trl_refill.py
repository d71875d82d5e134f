"""RlpaceGRPOTrainer with DAPO dynamic sampling: dropped groups are refilled from new proposals.

TRL's real `GRPOTrainer` on the tiny Qwen2 of `_tiny_lm` (8 prompts, G = 2, B = 2 prompts per
generation batch). The reward makes a group informative (rewards [1, 0]) or uniform ([0, 0])
by a rule of (prompt id, trainer step, round), the round being how many times the reward
function was already called at that step, so every round's outcome is known in advance and
replays on resume. An independent reference picks the trained batch: the first B groups with
a kept rollout in (round, position) order; at the round limit the rest of the batch is made of
the first dropped groups (masked out). The trainer's batch must be exactly that, with B·G rows.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import PROMPTS, dataset, informative, lm, probe_trainer, refill_reward  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler, compose  # noqa: E402
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B = 2, 2
STEPS_SURPLUS = 16


def run(lm, dataset, out, *, steps=6, resume=None, max_refill_rounds=2, policy="dapo_dynamic_sampling",
        ga=1, spg=1, ni=1, save_steps=3, zero_lag=False, pilot=None):
    calls, trained, metrics = [], [], []     # calls: (step, round, ids, rewards) per reward call
    sched = Scheduler(pool_from_dataset(dataset), compose(make_policy("uniform"), make_policy(policy)), seed=3)
    reward = refill_reward(calls, G)

    tok = AutoTokenizer.from_pretrained(lm)

    def record(trainer, o, ids):
        trained.append(dict(ids=ids, rows=o["completion_mask"].sum(-1).tolist(), n_items=int(o["num_items_in_batch"]),
                            mask_sum=int(o["completion_mask"].sum()), adv=o["advantages"].clone()))
        metrics.append({k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("rlpace/")})

    Probe = probe_trainer(RlpaceGRPOTrainer, tok, PROMPTS, G, record)

    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=B * G // spg, num_generations=G, max_completion_length=4,
                     max_steps=steps, logging_steps=1, save_strategy="steps" if save_steps else "no",
                     save_steps=save_steps or 500, beta=0.0, dataloader_num_workers=0, gradient_checkpointing=False,
                     learning_rate=1e-3, gradient_accumulation_steps=ga, steps_per_generation=spg, num_iterations=ni)
    trainer = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=dataset, processing_class=tok, scheduler=sched,
                    max_refill_rounds=max_refill_rounds, zero_lag=zero_lag, record=pilot)
    trainer.train(resume_from_checkpoint=resume)
    return dict(calls=calls, trained=trained, metrics=metrics, sched=sched, trainer=trainer)


def reference(calls, max_refill_rounds):
    """Per generation batch (the calls of one step): (rounds, trained prompt ids, kept flags)."""
    out = []
    for step in sorted({c[0] for c in calls}):
        rounds = [c for c in calls if c[0] == step]
        groups = [(c[2][k * G], max(c[3][k * G:(k + 1) * G]) != min(c[3][k * G:(k + 1) * G]))
                  for c in rounds for k in range(B)]
        kept = [g for g in groups if g[1]]
        n_rounds = next((r + 1 for r in range(max_refill_rounds + 1)
                         if sum(g[1] for g in groups[:(r + 1) * B]) >= B), max_refill_rounds + 1)
        batch = (kept + [g for g in groups if not g[1]])[:B]
        out.append((n_rounds, len(rounds), [g[0] for g in batch], [g[1] for g in batch]))
    return out


@pytest.fixture(scope="module")
def refilled(lm, dataset, tmp_path_factory):
    return run(lm, dataset, tmp_path_factory.mktemp("refill"))


def test_the_trained_batch_is_the_first_kept_groups_and_keeps_its_size(refilled):
    ref = reference(refilled["calls"], 2)
    assert len(ref) == len(refilled["trained"]) == 6
    kinds = set()
    for (want_rounds, got_rounds, ids, kept), t in zip(ref, refilled["trained"]):
        assert got_rounds == want_rounds                      # refills stop as soon as B groups are kept
        assert t["ids"] == ids and len(t["rows"]) == B * G    # the configured size, whatever was dropped
        for k in range(B):
            rows = t["rows"][k * G:(k + 1) * G]
            assert all(x > 0 for x in rows) if kept[k] else all(x == 0 for x in rows)
            # kept groups train on TRL's advantages of [1, 0]: ±0.5 / (std(ddof=1) + 1e-4)
            want = [0.5 / (np.sqrt(0.5) + 1e-4), -0.5 / (np.sqrt(0.5) + 1e-4)] if kept[k] else [0.0, 0.0]
            np.testing.assert_allclose(t["adv"][k * G:(k + 1) * G].numpy(), want, rtol=1e-5)
        assert t["n_items"] == t["mask_sum"]
        kinds.add("refilled" if want_rounds > 1 and all(kept) else "limit" if not all(kept) else "first")
    assert kinds == {"first", "refilled", "limit"}, kinds     # the run covers all three cases


def test_every_rollout_is_counted_refills_included(refilled):
    sizes = np.cumsum([len(c[2]) for c in refilled["calls"]])
    per_batch = np.cumsum([r[1] for r in reference(refilled["calls"], 2)]) * B * G
    assert [m["rlpace/rollouts_total"] for m in refilled["metrics"]] == per_batch.tolist()
    assert per_batch[-1] == sizes[-1]
    assert int(refilled["sched"].history.attempts.sum()) == sizes[-1]          # the Scheduler saw them all
    assert [m["rlpace/refill_rounds"] for m in refilled["metrics"]] == [r[1] - 1 for r in reference(refilled["calls"], 2)]
    assert [m["rlpace/kept_fraction_trained"] for m in refilled["metrics"]] == \
        [sum(r[3]) / B for r in reference(refilled["calls"], 2)]
    assert [m["rlpace/refill_surplus_groups"] for m in refilled["metrics"]] == surplus(refilled["calls"])


def surplus(calls):
    """Per generation batch: kept groups generated beyond the B trained (one process)."""
    return [max(0, sum(max(c[3][k * G:(k + 1) * G]) > min(c[3][k * G:(k + 1) * G])
                       for c in calls if c[0] == step for k in range(B)) - B)
            for step in sorted({c[0] for c in calls})]


def test_the_pilot_record_has_a_line_per_round(lm, dataset, tmp_path):
    """Refills are batches of the pilot record too: one line per round, in round order, with the
    step's rollouts (B·G each)."""
    import json
    r = run(lm, dataset, tmp_path, steps=6, save_steps=0, pilot=tmp_path / "pilot.jsonl")
    lines = [json.loads(x) for x in (tmp_path / "pilot.jsonl").read_text().splitlines()[1:]]
    assert [(x["step"], x["prompt_ids"], x["rewards"], x["rollouts"]) for x in lines] == \
        [(c[0], c[2][::G], np.reshape(c[3], (B, G)).tolist(), B * G) for c in r["calls"]]
    assert len(lines) > 6                                          # some step refilled


def test_surplus_kept_groups_of_the_last_round_are_counted(lm, dataset, tmp_path):
    """A refill round is a whole chunk: when it brings more kept groups than the batch lacks,
    the rest are discarded and logged as rlpace/refill_surplus_groups."""
    r = run(lm, dataset, tmp_path, steps=STEPS_SURPLUS, save_steps=0)
    got = [m["rlpace/refill_surplus_groups"] for m in r["metrics"]]
    assert got == surplus(r["calls"]) and sum(got) > 0


def test_without_refills_the_batch_shrinks(lm, dataset, tmp_path):
    plain = run(lm, dataset, tmp_path, steps=3, max_refill_rounds=0, save_steps=0)
    assert all(c[1] == 0 for c in plain["calls"])                   # one round per step
    for c, t in zip(plain["calls"], plain["trained"]):
        kept = [informative(c[2][k * G], c[0], 0) for k in range(B)]
        assert [r > 0 for r in t["rows"][::G]] == kept


def test_resume_replays_the_refills(refilled, lm, dataset, tmp_path):
    ckpt = refilled["trainer"].args.output_dir + "/checkpoint-3"
    resumed = run(lm, dataset, tmp_path, resume=ckpt)
    assert resumed["calls"] == [c for c in refilled["calls"] if c[0] >= 3]
    assert [t["ids"] for t in resumed["trained"]] == [t["ids"] for t in refilled["trained"][3:]]
    assert resumed["metrics"][-1]["rlpace/rollouts_total"] == refilled["metrics"][-1]["rlpace/rollouts_total"]
    a, b = refilled["sched"].state_dict(), resumed["sched"].state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("ga,spg,ni,zero_lag", [(2, 2, 1, False), (1, 2, 2, False), (1, 1, 1, True)],
                         ids=["accum2_spg2", "spg2_iter2", "zero_lag"])
def test_refills_under_accumulation_and_iterations(lm, dataset, tmp_path, ga, spg, ni, zero_lag):
    """The generation batch (B·G rows over `steps_per_generation` micro-batches) is refilled
    the same way, in both lag modes; each generation's trained batch is the reference's."""
    r = run(lm, dataset, tmp_path, steps=4 * ni, ga=ga, spg=spg, ni=ni, save_steps=0, zero_lag=zero_lag)
    ref = reference(r["calls"], 2)
    assert len(ref) == len(r["trained"]) >= 2
    for (want_rounds, got_rounds, ids, kept), t in zip(ref, r["trained"]):
        assert got_rounds == want_rounds and t["ids"] == ids and len(t["rows"]) == B * G
        assert [x > 0 for x in t["rows"][::G]] == kept


def test_bad_refill_settings_are_rejected(lm, dataset, tmp_path):
    kw = dict(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=lambda completions, **k: [0.0] * len(completions),
              train_dataset=dataset)
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                max_completion_length=4, dataloader_num_workers=0)
    sched = Scheduler(pool_from_dataset(dataset), compose(make_policy("uniform"), make_policy("dapo_dynamic_sampling")))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_refill_rounds must be an int ≥ 0"):
            RlpaceGRPOTrainer(**kw, args=GRPOConfig(**base, per_device_train_batch_size=4), scheduler=sched,
                              max_refill_rounds=bad)
