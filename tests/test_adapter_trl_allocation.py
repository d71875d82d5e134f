"""Rollout allocation and the pilot record in `RlpaceGRPOTrainer`, on the real TRL trainer with
the tiny local model.

`knapsack` (min_n = 1, so prompts can get fewer rollouts than G) decides N_i = k_i·G per
proposed prompt through `Scheduler.allocate(ids, B·G, unit=G)`; the trainer generates k_i
copies of the prompt (G rollouts each) and merges them into one group for the advantage. The
reward depends on (prompt id, row in the generation batch, step), so two copies of a prompt
get different rewards (`rule`) and the run is reproducible across a resume. Checked: the layout of
copies, Σ rollouts = budget, the merged advantages against an independent numpy computation
over the k·G rewards, the ragged feedback, exact resume, the pilot record read back and
accepted by `rlpace advise`, and the combinations that are refused.
Runtime: about 1–2 minutes at 1 thread.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("trl")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import PROMPTS, dataset, lm, outcome, probe_trainer  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler  # noqa: E402
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset  # noqa: E402
from rlpace.advise import read_pilot  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore"), pytest.mark.slow]
G, B, STEPS, SAVE = 2, 4, 10, 5


def rule(index: int, row: int, step: int) -> float:
    """Prompts 1000, 1004 always fail, 1001, 1005 always pass (p̂ ∈ {0, 1}: few rollouts), the
    others vary with the row and the step (0 < p̂ < 1: the knapsack's items)."""
    return {0: 0.0, 1: 1.0}.get(index % 4, outcome(index, row, step))


def knapsack_scheduler(dataset):
    return Scheduler(pool_from_dataset(dataset), "knapsack", min_n=1, max_n=8, min_count=2, seed=5)


def run(lm, dataset, out, *, resume=None, record=None, scale_rewards="group", steps=STEPS, sched=None, **kw):
    seen, observed, allocations, trained = [], [], [], []
    sched = sched or knapsack_scheduler(dataset)
    allocate, step = sched.allocate, sched.step
    sched.allocate = lambda ids, budget, unit=1: allocations.append((ids.copy(), allocate(ids, budget, unit=unit))) \
        or allocations[-1][1]
    sched.step = lambda fb, features=None: observed.append(fb) or step(fb, features)

    def reward(prompts, completions, index, trainer_state, **kw):
        r = [rule(i, j, trainer_state.global_step) for j, i in enumerate(index)]
        seen.append((trainer_state.global_step, list(index), r))
        return r

    tok = AutoTokenizer.from_pretrained(lm)
    probe = probe_trainer(RlpaceGRPOTrainer, tok, PROMPTS, G,
                          lambda t, o, ids: trained.append((ids, o["advantages"].double().numpy().copy(),
                                                            o["completion_mask"].sum(-1).numpy().copy())))
    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=B * G, num_generations=G, max_completion_length=3,
                     max_steps=steps, logging_steps=1, save_strategy="steps", save_steps=SAVE, beta=0.0,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3,
                     scale_rewards=scale_rewards)
    trainer = probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=dataset, processing_class=tok, scheduler=sched, record=record, **kw)
    trainer.train(resume_from_checkpoint=resume)
    return dict(seen=seen, observed=observed, allocations=allocations, trained=trained, sched=sched,
                trainer=trainer)


@pytest.fixture(scope="module")
def allocated(lm, dataset, tmp_path_factory):
    out = tmp_path_factory.mktemp("alloc")
    return run(lm, dataset, out, record=out / "pilot.jsonl")


def trl_group_advantages(x):
    """TRL's scale_rewards="group" formula over one group: unbiased std, eps 1e-4."""
    x = np.asarray(x, dtype=np.float64)
    return (x - x.mean()) / (x.std(ddof=1) + 1e-4)


def test_copies_follow_the_allocation_and_the_budget_is_spent_exactly(allocated):
    seen, observed, trained, pool = allocated["seen"], allocated["observed"], allocated["trained"], \
        allocated["sched"].pool
    assert len(seen) == len(observed) == len(trained) == STEPS
    copies_seen = set()
    for (step, index, r), fb, (ids, *_) in zip(seen, observed, trained):
        sizes = fb.group_sizes if fb.group_sizes is not None else np.full(len(fb.prompt_ids), G)
        assert sizes.sum() == B * G == len(r)                        # Σ N_i = budget
        assert (sizes % G == 0).all()
        # proposal i's k_i = N_i / G copies fill k_i group slots in a row
        assert np.repeat(pool.ids[fb.prompt_ids], sizes // G).tolist() == ids == index[::G]
        # the ragged group of a proposal holds its copies' rewards, in row order
        start = np.cumsum(sizes) - sizes
        for i, (a, n) in enumerate(zip(start, sizes)):
            np.testing.assert_array_equal(fb.rewards[i, :n], r[a:a + n])
        copies_seen |= set((sizes // G).tolist())
    assert {0, 1}.issubset(copies_seen) and max(copies_seen) >= 2     # the run exercised merging
    trainer = allocated["trainer"]
    assert trainer.rlpace_rollouts_total == STEPS * B * G
    assert int(allocated["sched"].counters.rollouts) == STEPS * B * G


def runs_of_copies(ids):
    """(first slot, copies) of each run of one prompt's consecutive group slots."""
    out, j = [], 0
    while j < len(ids):
        k = 1
        while j + k < len(ids) and ids[j + k] == ids[j]:
            k += 1
        out.append((j, k))
        j += k
    return out


def check_merged_advantages(res, admission=False):
    """Each prompt's rows train on TRL's formula over all its k·G rewards; with a DAPO admission
    a prompt whose k·G rewards are all equal is dropped (advantage 0, completion mask 0).
    Returns (merged prompts, dropped prompts) seen."""
    merged = dropped = 0
    for (_, index, r), (ids, adv, mask_rows) in zip(res["seen"], res["trained"]):
        r = np.asarray(r)
        for j, k in runs_of_copies(ids):
            rows = slice(j * G, (j + k) * G)
            if admission and r[rows].min() == r[rows].max():
                dropped += 1
                assert (adv[rows] == 0).all() and (mask_rows[rows] == 0).all()
                continue
            np.testing.assert_allclose(adv[rows], trl_group_advantages(r[rows]), rtol=1e-5, atol=1e-6)
            assert (mask_rows[rows] > 0).all()
            merged += k >= 2
    return merged, dropped


def test_merged_prompts_train_on_the_advantages_of_all_their_rollouts(allocated):
    merged, _ = check_merged_advantages(allocated)
    assert merged >= 2


def test_zero_lag_allocates_at_generation_time(lm, dataset, tmp_path):
    z = run(lm, dataset, tmp_path, steps=6, zero_lag=True)
    merged, _ = check_merged_advantages(z)
    assert merged >= 1
    for fb, (ids, *_), (want_ids, n) in zip(z["observed"], z["trained"], z["allocations"]):
        np.testing.assert_array_equal(fb.prompt_ids, want_ids)
        assert np.repeat(z["sched"].pool.ids[want_ids], n // G).tolist() == ids


def test_an_admission_drops_merged_groups_without_refills(lm, dataset, tmp_path):
    """dapo_dynamic_sampling + knapsack, max_refill_rounds=0: a prompt whose k·G rewards are all
    equal leaves the loss (every copy's rows); the others train on their merged advantages."""
    sched = Scheduler(pool_from_dataset(dataset), "dapo_dynamic_sampling+knapsack", min_n=1, max_n=8, min_count=2,
                      seed=5)
    res = run(lm, dataset, tmp_path, steps=6, sched=sched, max_refill_rounds=0)
    merged, dropped = check_merged_advantages(res, admission=True)
    assert merged >= 1 and dropped >= 1


def test_scheduler_sees_one_ragged_group_per_prompt_with_rlpace_advantages(allocated):
    from rlpace import group_advantages
    for fb in allocated["observed"]:
        sizes = fb.group_sizes if fb.group_sizes is not None else np.full(len(fb.prompt_ids), G)
        want = group_advantages(fb.rewards, group_sizes=sizes)
        np.testing.assert_allclose(fb.advantages, want, rtol=1e-12)


def test_the_allocation_is_what_the_scheduler_decided(allocated):
    """Every generated chunk is an allocation of its proposal (lag 1: one chunk ahead)."""
    allocations = allocated["allocations"]
    for fb, (ids, n) in zip(allocated["observed"], allocations):
        np.testing.assert_array_equal(fb.prompt_ids, ids)
        sizes = fb.group_sizes if fb.group_sizes is not None else np.full(len(ids), G)
        np.testing.assert_array_equal(sizes, n)
        assert n.sum() == B * G and (n % G == 0).all()


def test_resume_is_exact_with_allocation_and_the_record_is_truncated(allocated, lm, dataset, tmp_path):
    ckpt = allocated["trainer"].args.output_dir + f"/checkpoint-{SAVE}"
    record = tmp_path / "pilot.jsonl"
    full = allocated["trainer"].args.output_dir + "/pilot.jsonl"
    shutil.copy(full, record)             # a crash after the last step: the resumed run rewrites steps ≥ 5
    resumed = run(lm, dataset, tmp_path, resume=ckpt, record=record)
    assert [s[1:] for s in resumed["seen"]] == [s[1:] for s in allocated["seen"][SAVE:]]
    for a, b in zip(resumed["observed"], allocated["observed"][SAVE:]):
        np.testing.assert_array_equal(a.prompt_ids, b.prompt_ids)
        np.testing.assert_array_equal(a.group_sizes, b.group_sizes)
    for (ia, aa, _), (ib, ab, _) in zip(resumed["trained"], allocated["trained"][SAVE:]):
        assert ia == ib
        np.testing.assert_allclose(aa, ab, rtol=1e-6)
    a, b = allocated["sched"].state_dict(), resumed["sched"].state_dict()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert resumed["trainer"].rlpace_rollouts_total == STEPS * B * G
    body = lambda p: open(p).read().splitlines()[1:]             # noqa: E731 (the header has a timestamp)
    assert body(record) == body(full)


def test_the_pilot_record_is_what_the_trainer_generated(allocated):
    """One line per generation batch; each generated group of G a row (a prompt's copies are
    rows of their own), the pool's stable ids, the step, the rollouts spent."""
    pilot = read_pilot(allocated["trainer"].args.output_dir + "/pilot.jsonl")
    assert pilot.ids == "pool" and pilot.group_size == G
    want_ids, want_steps, want_rewards = [], [], []
    for step, index, r in allocated["seen"]:
        want_ids += index[::G]
        want_steps += [step] * B
        want_rewards.append(np.reshape(r, (B, G)))
    assert list(pilot.prompt_ids) == want_ids
    assert pilot.step.tolist() == want_steps == [t for t in range(STEPS) for _ in range(B)]
    np.testing.assert_array_equal(pilot.rewards, np.concatenate(want_rewards))
    assert pilot.step_rollouts == {t: B * G for t in range(STEPS)}


def advise_on_pilot(dataset, tmp_path, capsys) -> int:
    """`rlpace advise --pilot tmp_path/pilot.jsonl` on the dataset's pool (dump, one draw) into
    tmp_path/o; its exit code."""
    from rlpace.cli import main
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"data_source": r["data_source"], "extra_info": {"index": r["index"]}}) + "\n"
                            for r in dataset))
    rc = main(["advise", "--pilot", str(tmp_path / "pilot.jsonl"), "--pool", str(pool), "--budget-rollouts",
               str(12 * B * G * 5), "--policies", "dump", "--draws", "1", "--jobs", "1", "--out", str(tmp_path / "o")])
    capsys.readouterr()
    return rc


def test_rlpace_advise_accepts_a_trl_pilot(lm, dataset, tmp_path, capsys):
    """A uniform TRL run of 12 steps records a pilot that `rlpace advise --pilot` fits and advises on."""
    sched = Scheduler(pool_from_dataset(dataset), "uniform", seed=1)
    run(lm, dataset, tmp_path, record=tmp_path / "pilot.jsonl", steps=12, sched=sched)
    assert advise_on_pilot(dataset, tmp_path, capsys) == 0
    adv = json.loads((tmp_path / "o" / "advice.json").read_text())
    assert adv["pilot_rollouts"] == 12 * B * G


def test_combinations_that_cannot_work_are_refused(lm, dataset, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(lm)
    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", dataloader_num_workers=0,
                per_device_train_batch_size=B * G, num_generations=G, max_completion_length=3)
    kw = dict(model=model, reward_funcs=lambda completions, **k: [0.0] * len(completions), train_dataset=dataset)
    pool = pool_from_dataset(dataset)
    cases = [
        (dict(scheduler=Scheduler(pool, "knapsack", min_n=4, max_n=8)), {}, "min_n = 4 is above num_generations"),
        (dict(scheduler=Scheduler(pool, "knapsack", max_n=8)), dict(multi_objective_aggregation="normalize_then_sum"),
         "sum_then_normalize"),
        (dict(scheduler=Scheduler(pool, "dapo_dynamic_sampling+knapsack", max_n=8)), {}, "max_refill_rounds=0"),
        (dict(scheduler=Scheduler(pool, "diem+knapsack", max_n=8)), {}, "grad_features='off'"),
        (dict(scheduler=Scheduler(pool, "uniform"), record=tmp_path / "p.jsonl", record_reward_range=(1.0, 0.0)), {},
         "record_reward_range"),
    ]
    for extra, cfg, match in cases:
        with pytest.raises(ValueError, match=match):
            RlpaceGRPOTrainer(**kw, **extra, args=GRPOConfig(**base, **cfg))
    # refills off: the admission drops groups without replacement, accepted
    RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "dapo_dynamic_sampling+knapsack", max_n=8),
                      max_refill_rounds=0, args=GRPOConfig(**base))
    assert not (tmp_path / "p.jsonl").exists()


def test_the_pilot_record_holds_the_held_out_evaluations(lm, dataset, tmp_path, capsys):
    """A uniform run of 12 steps with an eval dataset, evaluated at the start and every 4 steps:
    the record holds the evaluations at steps 0, 4 and 8 on those steps' batches and the one
    after the last step (12) as a line of its own; each acc_mean is the share of that
    evaluation's completions whose weighted reward (1·f + (−0.5)·g) is ≥ the success threshold
    0.5, computed here from the rewards the reward functions returned, `acc` the same per
    data_source and `n` the evaluation prompts per data_source; TRL's logged eval_reward is the
    mean of those rewards; `rlpace advise` reads it."""
    from datasets import Dataset
    evals = []

    def f(prompts, completions, index, data_source, trainer_state, **kw):
        if index[0] < 2000:                                   # training rows
            return [outcome(i, j, trainer_state.global_step) for j, i in enumerate(index)]
        r = [0.5 * ((i * 3 + j + trainer_state.global_step) % 3) for j, i in enumerate(index)]   # 0, 0.5, 1
        evals.append((trainer_state.global_step, list(data_source), r))
        return r

    def g(prompts, completions, index, **kw):
        return [0.0 if i < 2000 else 1.0 for i in index]

    held = Dataset.from_list([{"prompt": p, "index": 2000 + i, "data_source": ["math", "logic"][i % 3 == 0]}
                              for i, p in enumerate(PROMPTS)])
    tok = AutoTokenizer.from_pretrained(lm)
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=B * G, per_device_eval_batch_size=B * G, num_generations=G,
                     max_completion_length=3, max_steps=12, logging_steps=1, save_strategy="no", beta=0.0,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3,
                     eval_strategy="steps", eval_steps=4, eval_on_start=True, reward_weights=[1.0, -0.5])
    sched = Scheduler(pool_from_dataset(dataset), "uniform", seed=1)
    trainer = RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=[f, g], args=cfg,
                                train_dataset=dataset, eval_dataset=held, processing_class=tok, scheduler=sched,
                                record=tmp_path / "pilot.jsonl")
    trainer.train()

    want = {}
    for step, names, r in evals:
        w = want.setdefault(step, [[], []])
        w[0] += [x - 0.5 for x in r]                          # the weighted sum 1·f − 0.5·g
        w[1] += names
    assert sorted(want) == [0, 4, 8, 12] and all(len(w[0]) == len(PROMPTS) * G for w in want.values())
    lines = [json.loads(x) for x in (tmp_path / "pilot.jsonl").read_text().splitlines()[1:]]
    got = {ln["step"]: ln["eval"] for ln in lines if ln.get("eval") is not None}
    assert sorted(got) == [0, 4, 8, 12]
    assert "rewards" not in lines[-1] and lines[-1]["step"] == 12                  # the final one, alone
    assert sum(ln.get("eval") is not None for ln in lines if "rewards" in ln) == 3   # the others on batches
    for step, (rew, names) in want.items():
        ok = np.array(rew) >= 0.5
        assert got[step]["acc_mean"] == pytest.approx(ok.mean(), abs=1e-12)
        assert got[step]["acc"] == pytest.approx({d: ok[np.array(names) == d].mean() for d in ("logic", "math")})
    logged = {h["step"]: h["eval_reward"] for h in trainer.state.log_history if "eval_reward" in h}
    assert logged == pytest.approx({t: float(np.mean(w[0])) for t, w in want.items()}, abs=1e-6)
    pilot = read_pilot(tmp_path / "pilot.jsonl")
    assert [(t, n) for t, n, _ in pilot.evals] == [(0, 0), (4, 4 * B * G), (8, 8 * B * G), (12, 12 * B * G)]
    assert [a for _, _, a in pilot.evals] == [got[t]["acc_mean"] for t in (0, 4, 8, 12)]
    # the held-out prompts per data_source, counted from the eval dataset (logic: 0, 3, 6; math: the
    # other 5), beside the accuracies; the reader gives both back for the held-out solved-share fit
    names = list(held["data_source"])
    sizes = {d: names.count(d) for d in set(names)}
    assert sizes == {"logic": 3, "math": 5} and all(got[t]["n"] == sizes for t in got)
    assert pilot.domain_evals == tuple((t, pytest.approx(got[t]["acc"]), sizes) for t in (0, 4, 8, 12))
    assert pilot.step.tolist() == [t for t in range(12) for _ in range(B)]
    assert advise_on_pilot(dataset, tmp_path, capsys) == 0
    assert json.loads((tmp_path / "o" / "advice.json").read_text())["pilot_rollouts"] == 12 * B * G
