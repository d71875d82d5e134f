"""Rollout allocation and the pilot record on verl's legacy trainer (`RlpaceTrainerMixin`),
against the installed verl 0.9 (CPU, no Ray).

`legacy_step` replays the lines of `RayPPOTrainer.fit` that build a step's rows, with verl's own
code at each: the loader batch → `DataProto.from_single_dict` → a uid per prompt row →
`_get_gen_batch` (the mixin's, over verl's) → `gen_batch.repeat(rollout.n, interleave=True)` →
generation (here: one response per row, scored by a fixed rule) → `batch.repeat(rollout.n,
interleave=True)` → `union` → verl's `_balance_batch` (2 data-parallel ranks) → verl's
`compute_advantage` (GRPO) → the mixin's `_update_actor` (over a stub that keeps the batch
the actor would train on) → `on_batch_end`.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

pytest.importorskip("verl")
pytest.importorskip("torchdata")

import torch  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage  # noqa: E402
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

import rlpace.adapters.verl as rv  # noqa: E402
from rlpace import group_advantages  # noqa: E402
from rlpace.advise import read_pilot  # noqa: E402
from rlpace.policies._base import ALLOCATION, DataPolicy, EmptyState  # noqa: E402
from verl07._verl_data import data_config, make_tokenizer, write_parquet  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")

B, N = 4, 3                       # prompts per step, actor_rollout_ref.rollout.n
SHARES = np.array([0, 1, 4, 7])   # the test allocation: N_i by rank of the pool position in the batch


def ranked_allocation():
    """An allocation policy that gives the batch's prompts 0, 1, 4, 7 rollouts by increasing pool
    position (B = 4, budget 12), so N_i = 0 and N_i = 1 both occur every step."""
    def apply(state, pool, ids, budget):
        assert (len(ids), budget) == (B, B * N)
        out = np.zeros(len(ids), np.int64)
        out[np.argsort(ids, kind="stable")] = SHARES
        return out
    return DataPolicy(ALLOCATION, lambda pool: EmptyState(), lambda s, p, b: s, apply, name="test_ranked",
                      bounds=(0, 7))


def score(index: int, k: int, step: int) -> float:
    """The verifier's result of the k-th rollout of prompt `index` at `step`."""
    return float((index * 5 + k * 3 + step) % 7 < 3)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


class Actor:
    """The last base class of the trainer: keeps the batch `_update_actor` would train on."""

    def _update_actor(self, batch):
        self.trained = batch
        return DataProto.from_dict(tensors={}, meta_info={"metrics": {}})


Trainer = type("Trainer", (rv.RlpaceTrainerMixin, Actor, RayPPOTrainer), {})


def make_trainer(tmp_path, tok, policy, *, record=None, name="train", kwargs=None, prompts=40):
    train = write_parquet(tmp_path / f"{name}.parquet", n=prompts)
    val = write_parquet(tmp_path / f"{name}_val.parquet", n=8)
    cfg = data_config(train, val, cache_dir=str(tmp_path / "cache"), batch=B,
                      policy=policy if isinstance(policy, str) else "uniform")
    if kwargs:
        cfg.rlpace.kwargs = kwargs
    if record is not None:
        cfg.rlpace.record = str(record)
    ds = create_rl_dataset(cfg.train_files, cfg, tok, None)
    if not isinstance(policy, str):
        ds.rlpace = rv.VerlFeedback(rv.Scheduler(ds.scheduler.pool, policy), reward_key="acc",
                                    record=ds.rlpace.record)
    loader = StatefulDataLoader(ds, batch_size=B, num_workers=0, drop_last=True, collate_fn=collate_fn,
                                sampler=create_rl_sampler(cfg, ds))
    t = object.__new__(Trainer)            # verl's trainer without __init__ (no workers)
    t.config = OmegaConf.create({
        "data": {"train_batch_size": B},
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True, "gamma": 1.0, "lam": 1.0},
        "actor_rollout_ref": {"rollout": {"n": N}, "actor": {"ppo_mini_batch_size": 2}}})
    t.train_dataset, t.train_dataloader, t.global_steps = ds, loader, 0
    t._get_dp_size = lambda wg, role: 2
    t.actor_rollout_wg = None
    return t


def generate(gen_batch, step):
    """One response per row (what verl's agent loop returns), scored by `score`: the k-th row of
    a uid is its k-th rollout."""
    uids, extra = gen_batch.non_tensor_batch["uid"], gen_batch.non_tensor_batch["extra_info"]
    seen: dict = {}
    acc = []
    for u, e in zip(uids, extra):
        k = seen.setdefault(u, 0)
        seen[u] = k + 1
        acc.append(score(e["index"], k, step))
    r, length = len(uids), 4
    lengths = torch.tensor([1 + (i * 7) % length for i in range(r)])
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    scores = torch.zeros(r, length)
    scores[torch.arange(r), lengths - 1] = torch.tensor(acc)
    return DataProto.from_dict(
        tensors={"responses": torch.ones(r, length, dtype=torch.long), "response_mask": mask,
                 "attention_mask": torch.cat([torch.ones(r, 2), mask], 1).long(), "rm_scores": scores},
        non_tensors={"acc": np.array(acc), "multi_modal_inputs": np.array([{}] * r, dtype=object)})


def legacy_step(t, it, step):
    """verl's legacy fit, one step (module docstring). Returns (trained batch, verl's GRPO
    advantages before the mixin, the loader batch's stable ids)."""
    t.global_steps = step
    batch = DataProto.from_single_dict(next(it))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
    gen_batch = t._get_gen_batch(batch)
    n = t.config.actor_rollout_ref.rollout.n
    out = generate(gen_batch.repeat(repeat_times=n, interleave=True), step)
    batch = batch.repeat(repeat_times=n, interleave=True)
    batch = batch.union(out)
    t._balance_batch(batch, metrics={})
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator="grpo", num_repeat=n, norm_adv_by_std_in_grpo=True,
                              config=t.config.algorithm)
    verl_adv = batch.batch["advantages"].clone()
    t._update_actor(batch)
    t.train_dataset.on_batch_end(batch=batch)
    return t.trained, verl_adv


def per_prompt(batch, values):
    """{stable id: [values of its rows in generation order]} and {stable id: uid set}."""
    by, uids = {}, {}
    for e, u, v, k in zip(batch.non_tensor_batch["extra_info"], batch.non_tensor_batch["uid"], values,
                          np.argsort(np.argsort(batch.non_tensor_batch["uid"], kind="stable"), kind="stable")):
        by.setdefault(e["index"], []).append(v)
        uids.setdefault(e["index"], set()).add(u)
    return by, uids


def test_legacy_allocation_rows_share_the_uid_and_verls_grpo_equals_group_advantages(tmp_path, tok):
    from rlpace import compose
    from rlpace.policies import make_policy
    t = make_trainer(tmp_path, tok, compose(make_policy("uniform"), ranked_allocation()))
    sched = t.train_dataset.rlpace.scheduler
    observed = []
    step_of = sched.step
    sched.step = lambda fb, features=None: observed.append(fb) or step_of(fb, features)
    it = iter(t.train_dataloader)
    for step in (1, 2, 3):
        before = int(sched.counters.rollouts)
        trained, verl_adv = legacy_step(t, it, step)
        fb = observed[-1]
        ids = sched.pool.ids[fb.prompt_ids]
        want_n = np.zeros(B, np.int64)
        want_n[np.argsort(fb.prompt_ids, kind="stable")] = SHARES
        # rows: prompt i has N_i rows, all sharing one uid; N_i = 0 prompts are absent; Σ = B·n
        assert len(trained) == B * N == 12
        rows_of = {}
        for e, u in zip(trained.non_tensor_batch["extra_info"], trained.non_tensor_batch["uid"]):
            rows_of.setdefault(e["index"], []).append(u)
        assert {i: len(v) for i, v in rows_of.items()} == {int(i): int(k) for i, k in zip(ids, want_n) if k}
        assert all(len(set(v)) == 1 for v in rows_of.values())
        # the Scheduler saw one ragged Feedback: every prompt, its N_i rewards (in the balanced row order)
        assert fb.group_sizes.tolist() == want_n.tolist() and fb.step == step
        for b, (i, k) in enumerate(zip(ids, want_n)):
            assert sorted(fb.rewards[b, :k].tolist()) == sorted(score(int(i), j, step) for j in range(k))
        assert int(sched.counters.rollouts) - before == 12                    # rollouts counted
        # verl's GRPO over the duplicated rows = rlpace.group_advantages(group_sizes=N, ddof=1),
        # except that verl gives a one-rollout prompt A = r and the mixin sets it to 0
        adv = trained.batch["advantages"]
        seq = (adv * trained.batch["response_mask"]).sum(-1) / trained.batch["response_mask"].sum(-1)
        verl_seq = (verl_adv * trained.batch["response_mask"]).sum(-1) / trained.batch["response_mask"].sum(-1)
        ref = group_advantages(fb.rewards, group_sizes=fb.group_sizes, ddof=1)
        k_of = {int(i): b for b, i in enumerate(ids)}
        got, got_verl = per_prompt(trained, seq.tolist())[0], per_prompt(trained, verl_seq.tolist())[0]
        for i, b in k_of.items():
            k = int(want_n[b])
            if k == 0:
                continue
            # rows of a prompt in generation order: the balance reorders them, the rewards tell them apart
            r = fb.rewards[b, :k]
            loop = (r - r.mean()) / (r.std(ddof=1) + 1e-6) if k > 1 else np.zeros(1)      # independent loop
            np.testing.assert_allclose(sorted(got[i]), sorted(loop), atol=1e-5)
            np.testing.assert_allclose(sorted(got[i]), sorted(ref[b, :k]), atol=1e-5)
            if k == 1:
                assert got_verl[i] == [pytest.approx(float(r[0]))]           # verl's singleton rule: A = r
            else:
                np.testing.assert_allclose(sorted(got_verl[i]), sorted(loop), atol=1e-5)
        assert any(np.ptp(ref[b, :int(want_n[b])]) > 0 for b in range(B) if want_n[b] > 1)   # not all-zero


def test_legacy_allocation_resumes_exactly_with_knapsack(tmp_path, tok):
    """knapsack (min_n 1, p̂ valid after 3 rollouts) on 12 prompts, 4 a step, over 4 epochs: the rows of
    every step after a restore from data.pt (mid-epoch) equal the uninterrupted run's."""
    policy, kw = "knapsack", {"min_count": 3, "max_n": 8, "min_n": 1}

    def forever(loader):                   # verl's epoch loop: a fresh pass over the loader each epoch
        while True:
            yield from loader

    def rows(t, it, step):
        trained, _ = legacy_step(t, it, step)
        return sorted((e["index"], float(s)) for e, s in zip(trained.non_tensor_batch["extra_info"],
                                                            trained.batch["rm_scores"].sum(-1).tolist()))

    a = make_trainer(tmp_path, tok, policy, name="a", kwargs=kw, prompts=12)
    it = forever(a.train_dataloader)
    full = [rows(a, it, s) for s in range(1, 13)]
    b = make_trainer(tmp_path, tok, policy, name="b", kwargs=kw, prompts=12)
    it = forever(b.train_dataloader)
    first = [rows(b, it, s) for s in range(1, 8)]
    torch.save(b.train_dataloader.state_dict(), tmp_path / "data.pt")      # mid-epoch (step 7 of 3-step epochs)
    c = make_trainer(tmp_path, tok, policy, name="c", kwargs=kw, prompts=12)
    c.train_dataloader.load_state_dict(rv.load_data_pt(str(tmp_path / "data.pt")))
    it = forever(c.train_dataloader)
    rest = [rows(c, it, s) for s in range(8, 13)]
    assert first + rest == full
    assert [len(r) for r in full] == [B * N] * 12
    per = [np.unique([i for i, _ in r], return_counts=True)[1].tolist() for r in full]
    # knapsack moved rollouts between prompts: rows per prompt that are not copies of rollout.n = 3
    assert sum(c % N != 0 for p in per for c in p) >= 2


def test_legacy_pilot_record_round_trips_and_resume_truncates_it_exactly(tmp_path, tok):
    """data.rlpace.record: one line per step from the driver's train dataset, read back by
    `rlpace.advise.read_pilot` equal to what the Scheduler observed; a run restored from data.pt
    keeps the lines of the steps its checkpoint had observed and rewrites the rest, so its record
    equals the uninterrupted run's."""
    def run(t, steps, it=None):
        sched = t.train_dataset.rlpace.scheduler
        seen = []
        step_of = sched.step
        sched.step = lambda fb, features=None: seen.append(fb) or step_of(fb, features)
        it = iter(t.train_dataloader) if it is None else it
        for s in steps:
            legacy_step(t, it, s)
        return seen

    rec_a, rec_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rec_b.write_text('{"stale": "a previous run\'s file is replaced"}\n')
    a = make_trainer(tmp_path, tok, "dump", record=rec_a, name="a")
    seen = run(a, range(1, 7))
    pilot = read_pilot(rec_a)
    assert pilot.ids == "pool" and pilot.kind == "training"
    assert pilot.step.tolist() == [s for fb in seen for s in [fb.step] * fb.batch_size] == \
        [s for s in range(1, 7) for _ in range(B)]
    assert list(pilot.prompt_ids) == [int(i) for fb in seen for i in a.train_dataset.scheduler.pool.ids[fb.prompt_ids]]
    np.testing.assert_array_equal(pilot.rewards, np.concatenate([fb.rewards for fb in seen]))
    assert pilot.step_rollouts == {s: B * N for s in range(1, 7)} and pilot.rollouts == 6 * B * N

    b = make_trainer(tmp_path, tok, "dump", record=rec_b, name="b")
    it = iter(b.train_dataloader)
    run(b, range(1, 4), it)
    torch.save(b.train_dataloader.state_dict(), tmp_path / "data.pt")       # the checkpoint after step 3
    run(b, range(4, 6), it)                                                 # steps the restart repeats
    assert len(read_pilot(rec_b).steps) == 5
    c = make_trainer(tmp_path, tok, "dump", record=rec_b, name="c")
    c.train_dataloader.load_state_dict(rv.load_data_pt(str(tmp_path / "data.pt")))
    run(c, range(4, 7))
    got, want = read_pilot(rec_b), read_pilot(rec_a)
    assert got.step.tolist() == want.step.tolist()
    assert list(got.prompt_ids) == list(want.prompt_ids)
    np.testing.assert_array_equal(got.rewards, want.rewards)
    lines = rec_b.read_text().splitlines()
    assert len(lines) == 1 + 6 and '"format": "rlpace-pilot"' in lines[0]


def test_allocation_without_the_mixin_or_with_a_bad_budget_is_refused(tmp_path, tok):
    from rlpace import Pool, Scheduler
    from rlpace.adapters._verl_allocation import check_legacy_allocation
    from rlpace.adapters._verl_core import refuse_gradient_features
    from verl07._verl_data import rollout_batch
    # verl's own legacy trainer (no mixin): the first on_batch_end names the entry that applies it
    t = make_trainer(tmp_path, tok, "knapsack")
    batch_dict = next(iter(t.train_dataloader))
    proto = rollout_batch(batch_dict, 0, pool=t.train_dataset.scheduler.pool)[0]
    with pytest.raises(ValueError, match="verl_legacy_trainer.py"):
        t.train_dataset.on_batch_end(proto)
    assert int(t.train_dataset.scheduler.counters.observations) == 0          # nothing observed
    # verl's own V1 trainer (RlpaceReplayBuffer alone) and every other path without allocation
    sched = Scheduler(Pool(["a"] * 4), "knapsack")
    with pytest.raises(ValueError, match="allocation place"):
        refuse_gradient_features(sched)
    refuse_gradient_features(sched, allocation=True)
    # a budget that does not fill whole PPO mini-batches (2 prompts · 3 = 6 rows)
    bridge = rv.VerlFeedback(sched, budget=16)
    with pytest.raises(ValueError, match="multiple of 6"):
        check_legacy_allocation(bridge, t.config)
    check_legacy_allocation(rv.VerlFeedback(sched, budget=18), t.config)
    cfg = data_config(str(tmp_path / "train.parquet"), str(tmp_path / "train_val.parquet"),
                      cache_dir=str(tmp_path / "cache"), batch=B, policy="knapsack")
    for bad in (0, 2.5, "12"):
        cfg.rlpace.budget = bad
        with pytest.raises(ValueError, match="data.rlpace.budget"):
            rv.feedback_from_config(t.train_dataset.scheduler.pool, cfg)
    cfg.rlpace.budget = None
    cfg.rlpace.record, cfg.rlpace.record_reward_range = str(tmp_path / "p.jsonl"), [1.0, 0.0]
    with pytest.raises(ValueError, match="record_reward_range"):
        rv.feedback_from_config(t.train_dataset.scheduler.pool, cfg)
    assert not (tmp_path / "p.jsonl").exists()


def test_legacy_pilot_record_holds_verls_validations(tmp_path, tok, monkeypatch):
    """The mixin's `_val_metrics_update` (what verl's `_validate` hands its per-sample data sources
    and rewards to) puts each validation into the record: before training (on step 1's line),
    after step 2 (on step 3's line) and after the last step 3 (a line of its own at step 4, written
    by the mixin's `fit` when verl's returns; verl's fit is replaced here by those calls in order). acc_mean is the share of samples whose
    `acc` (else, where a sample has none, its `reward`) is ≥ the success threshold 0.5, computed
    here by hand, acc the same per data source; verl's own metrics are still returned. A resume
    keeps the header and the checkpoint's batch lines, counted without the evaluation lines."""
    from rlpace.adapters._verl_core import _truncate_record
    rec = tmp_path / "p.jsonl"
    t = make_trainer(tmp_path, tok, "uniform", record=rec)
    it = iter(t.train_dataloader)
    src = np.array(["gsm8k", "gsm8k", "gsm8k", "math", "math"], dtype=object)
    vals = [  # (acc per sample or None, the sequence score `reward`) per validation
        ([1.0, 0.0, 1.0, 0.0, 0.0], [1.0, -1.0, 1.0, -1.0, -1.0]),      # 2/5; gsm8k 2/3, math 0
        ([1.0, None, 0.0, 1.0, None], [1.0, 0.7, -1.0, 1.0, 0.2]),       # 0.7 passes, 0.2 fails: 3/5; 2/3, 1/2
        ([1.0, 1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0, -1.0])]        # 4/5; gsm8k 1, math 1/2
    want = [dict(acc_mean=2 / 5, acc={"gsm8k": 2 / 3, "math": 0.0}),
            dict(acc_mean=3 / 5, acc={"gsm8k": 2 / 3, "math": 1 / 2}),
            dict(acc_mean=4 / 5, acc={"gsm8k": 1.0, "math": 1 / 2})]

    def validate(k):
        acc, reward = vals[k]
        infos = {"reward": list(reward), "acc": list(acc)}
        m = t._val_metrics_update(src, [f"u{i}" for i in range(5)], infos, [])
        assert any(key.startswith("val-core/gsm8k/") for key in m)        # verl's metrics, unchanged

    def fit(self):              # verl's loop reduced to its validations and steps, in its order
        validate(0)
        legacy_step(self, it, 1)
        legacy_step(self, it, 2)
        validate(1)
        legacy_step(self, it, 3)
        validate(2)
        assert len(rec.read_text().splitlines()) == 1 + 3          # the last validation waits for fit's end

    monkeypatch.setattr(RayPPOTrainer, "fit", fit)
    t.fit()
    lines = [json.loads(x) for x in rec.read_text().splitlines()[1:]]
    assert [ln["step"] for ln in lines] == [1, 2, 3, 4] and "rewards" not in lines[-1]
    got = [lines[0]["eval"], lines[2]["eval"], lines[3]["eval"]]
    assert lines[1]["eval"] is None
    for g, w in zip(got, want):
        assert g["acc_mean"] == pytest.approx(w["acc_mean"]) and g["acc"] == pytest.approx(w["acc"])
    pilot = read_pilot(rec)
    assert [(s, n) for s, n, _ in pilot.evals] == [(1, 0), (3, 2 * B * N), (4, 3 * B * N)]
    assert [a for _, _, a in pilot.evals] == pytest.approx([w["acc_mean"] for w in want])
    _truncate_record(str(rec), 3)                     # a checkpoint after step 3: the final evaluation goes
    assert [json.loads(x)["step"] for x in rec.read_text().splitlines()[1:]] == [1, 2, 3]
    _truncate_record(str(rec), 1)
    assert [json.loads(x).get("eval") for x in rec.read_text().splitlines()[1:]] == [lines[0]["eval"]]


def test_legacy_pilot_record_holds_the_held_out_prompts_per_data_source(tmp_path, tok):
    """verl's `_validate` repeats each validation prompt's uid over its `val_kwargs.n` samples
    (`test_batch.repeat(n, interleave=True)`): the record's `n` per data source counts distinct
    uids (5 prompts × 2 samples here: gsm8k 3, math 2, counted below from what is passed), the
    accuracies stay per sample (gsm8k 4/6, math 2/4), and `rlpace.advise`'s reader gives both
    back as the pilot's `domain_evals` (what the held-out solved-share fit needs)."""
    rec = tmp_path / "p.jsonl"
    t = make_trainer(tmp_path, tok, "uniform", record=rec)
    it = iter(t.train_dataloader)
    prompts = [("v0", "gsm8k"), ("v1", "gsm8k"), ("v2", "math"), ("v3", "gsm8k"), ("v4", "math")]
    uids = [u for u, _ in prompts for _ in range(2)]
    src = np.array([d for _, d in prompts for _ in range(2)], dtype=object)
    acc = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    t._val_metrics_update(src, uids, {"reward": [2 * a - 1 for a in acc], "acc": acc}, [])
    legacy_step(t, it, 1)
    sizes = {d: len({u for u, x in zip(uids, src) if x == d}) for d in set(src)}
    assert sizes == {"gsm8k": 3, "math": 2}
    ev = json.loads(rec.read_text().splitlines()[1])["eval"]
    assert ev["n"] == sizes and ev["acc"] == pytest.approx({"gsm8k": 4 / 6, "math": 2 / 4})
    assert read_pilot(rec).domain_evals == ((1, pytest.approx({"gsm8k": 4 / 6, "math": 0.5}), sizes),)
