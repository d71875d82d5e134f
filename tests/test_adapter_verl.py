"""rlpace.adapters.verl against the installed verl 0.9 (CPU, no Ray).

The dataset is built the way verl builds it (`get_dataset_class` → `data.custom_cls`),
iterated by a `StatefulDataLoader` with verl's collate function and sampler, and fed
synthetic post-advantage `DataProto` batches whose rows are shuffled like verl's batch
balancing. A reference Scheduler driven by hand-built `Feedback` must end in the same
state; a restored loader must replay the uninterrupted run's batches.
"""

from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("verl")
pytest.importorskip("torchdata")

import torch  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn, get_dataset_class  # noqa: E402

import rlpace.adapters.verl as rv  # noqa: E402
from rlpace import Feedback, Scheduler, compose  # noqa: E402
from rlpace.policies import make_policy  # noqa: E402
from rlpace.policies._base import REWEIGHTING, DataPolicy, EmptyState  # noqa: E402
from verl07._verl_data import (data_config, load_example, make_tokenizer, outcome,  # noqa: E402
                               rollout_batch, write_parquet)

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture
def files(tmp_path):
    return (write_parquet(tmp_path / "train.parquet"), write_parquet(tmp_path / "val.parquet", n=8),
            str(tmp_path / "cache"))


def build(cfg, tok, path=None):
    ds = create_rl_dataset(cfg.train_files if path is None else [path], cfg, tok, None)
    loader = StatefulDataLoader(ds, batch_size=cfg.train_batch_size, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(cfg, ds))
    return ds, loader


def batch_positions(ds, batch_dict):
    return ds.scheduler.pool.index_of([e["index"] for e in batch_dict["extra_info"]])


def test_dataset_class_comes_from_verl_config(files, tok):
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache)
    assert get_dataset_class(cfg) is rv.RlpaceDataset
    ds, _ = build(cfg, tok)
    assert isinstance(ds, rv.RlpaceDataset) and ds.scheduler.name == "dump"
    # pool: domain from data_source, stable ids from extra_info.index (100 + row)
    assert ds.scheduler.pool.ids.tolist() == list(range(100, 140))
    assert ds.scheduler.pool.domain_names == ("logic", "math")
    val_ds = create_rl_dataset(cfg.val_files, cfg, tok, None)          # same class, validation files
    assert val_ds.scheduler is None
    assert [r["index"] for r in val_ds.__getitems__([3, 1])] == [103, 101]


def test_batches_follow_scheduler_and_feedback_reaches_it(files, tok):
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache)
    ds, loader = build(cfg, tok)
    ref = Scheduler(ds.scheduler.pool, "dump", seed=3)
    seen_acc = np.zeros(len(ref.pool), np.int64)
    for step, batch_dict in zip(range(6), loader):
        # the batch is exactly the Scheduler's proposal (same state → same draw)
        assert batch_positions(ds, batch_dict).tolist() == ref.propose(4).tolist()
        proto, positions, rew, adv, rows, order = rollout_batch(batch_dict, step, acc=step % 2 == 0,
                                                                pool=ref.pool, seed=11)
        ds.on_batch_end(proto)
        ref.observe(Feedback(positions, rew, adv, step=step))
        for p in order:
            idx = batch_dict["extra_info"][p]["index"]
            seen_acc[ref.pool.index_of([idx])[0]] += sum(outcome(idx, g, step) for g in range(3))
    got, want = ds.scheduler.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # success comes from `acc` on even steps (there score = 0.7 − 0.5·acc would give the
    # opposite answer) and from the score on odd steps (no `acc` extra; score = acc there)
    assert ds.scheduler.history.successes.tolist() == seen_acc.tolist() and seen_acc.sum() > 0
    assert ds.scheduler.history.attempts.sum() == 6 * 4 * 3


def test_resume_from_data_pt_replays_next_batches(files, tok, tmp_path):
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache)

    def run(ds, loader, steps, start=0):
        out, it = [], iter(loader)
        for step in range(start, start + steps):
            batch_dict = next(it)
            out.append(batch_positions(ds, batch_dict).tolist())
            ds.on_batch_end(rollout_batch(batch_dict, step, pool=ds.scheduler.pool)[0])
        return out, it

    ds_a, loader_a = build(cfg, tok)
    full, _ = run(ds_a, loader_a, 8)
    ds_b, loader_b = build(cfg, tok)
    first, _ = run(ds_b, loader_b, 3)
    torch.save(loader_b.state_dict(), tmp_path / "data.pt")          # what verl writes
    ds_c, loader_c = build(cfg, tok)
    loader_c.load_state_dict(rv.load_data_pt(str(tmp_path / "data.pt")))    # weights_only=True
    rest, _ = run(ds_c, loader_c, 5, start=3)
    assert first + rest == full
    assert len({tuple(b) for b in full}) > 1                          # not a constant draw


def test_trainer_mixin_observes_before_save_scales_advantages_and_logs(files, tok):
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache)
    ds, loader = build(cfg, tok)

    def weights_from_pass_rate():
        def apply(state, pool, batch):
            return np.repeat(1.0 + batch.pass_rate[:, None], batch.rewards.shape[1], axis=1)
        return DataPolicy(REWEIGHTING, lambda pool: EmptyState(), lambda s, p, b: s, apply, name="w")

    ds.rlpace = rv.VerlFeedback(Scheduler(ds.scheduler.pool, compose(make_policy("dump"),
                                                                     weights_from_pass_rate())))
    received = {}

    class Base:
        def _update_actor(self, batch):
            received["adv"] = batch.batch["advantages"].clone()
            return DataProto.from_dict(tensors={}, meta_info={"metrics": {"actor/pg_loss": 0.5}})

    class Trainer(rv.RlpaceTrainerMixin, Base):
        pass

    t = Trainer()
    t.train_dataset, t.train_dataloader, t.global_steps = ds, loader, 7
    batch_dict = next(iter(loader))
    proto, positions, rew, adv, rows, order = rollout_batch(batch_dict, 0, pool=ds.scheduler.pool)
    before = proto.batch["advantages"].clone()
    out = t._update_actor(proto)
    # per-row weight = 1 + pass rate of the row's group (acc ≥ 0.5), by a plain loop
    w = np.array([1.0 + np.mean([outcome(batch_dict["extra_info"][p]["index"], g, 0) for g in range(3)])
                  for p, _ in rows])
    torch.testing.assert_close(received["adv"], before * torch.tensor(w, dtype=torch.float32)[:, None])
    assert out.meta_info["metrics"]["actor/pg_loss"] == 0.5
    assert out.meta_info["metrics"]["rlpace/groups_observed"] == 4.0
    assert int(ds.scheduler.history.last_step.max()) == 7
    ds.on_batch_end(proto)                                            # verl's later hook: no double count
    assert ds.scheduler.history.attempts.sum() == 12


def test_mixin_composes_with_real_ray_trainer():
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    T = type("T", (rv.RlpaceTrainerMixin, RayPPOTrainer), {})
    assert T._update_actor is rv.RlpaceTrainerMixin._update_actor
    assert T.__mro__.index(RayPPOTrainer) > T.__mro__.index(rv.RlpaceTrainerMixin)



def test_group_rows_matches_a_reference_loop():
    from rlpace.adapters._convert import group_rows, scatter_to_rows
    rng = np.random.default_rng(0)
    for _ in range(50):
        b, g = rng.integers(1, 9), rng.integers(1, 5)
        keys = np.repeat(np.array([f"u{rng.integers(10**6)}-{i}" for i in range(b)], dtype=object), g)
        ids = np.repeat(rng.permutation(1000)[:b], g)
        perm = rng.permutation(b * g)
        keys, ids = keys[perm], ids[perm]
        ref: dict = {}
        for r, k in enumerate(keys):                    # first appearance, engine order
            ref.setdefault(k, []).append(r)
        assert [x.tolist() for x in group_rows(keys, ids)] == list(ref.values())
        idx = np.stack(group_rows(keys, ids))
        vals = rng.random(idx.shape)
        out = scatter_to_rows(vals, idx, b * g)
        for (bb, gg), r in np.ndenumerate(idx):
            assert out[r] == vals[bb, gg]
    with pytest.raises(ValueError, match="different prompt ids"):
        group_rows(["a", "a"], [1, 2])

# ---- bad input: each a ValueError naming the fix, before training starts -------------------
def test_missing_or_duplicate_index_is_rejected(tmp_path, tok):
    val = write_parquet(tmp_path / "val.parquet", n=8)
    for kw, msg in (({"index": False}, "extra_info.index is missing"), ({"duplicate": True}, "duplicates")):
        train = write_parquet(tmp_path / f"t{len(kw)}{list(kw)[0]}.parquet", **kw)
        cfg = data_config(train, val, cache_dir=str(tmp_path / "c"))
        with pytest.raises(ValueError, match=msg):
            create_rl_dataset(cfg.train_files, cfg, tok, None)


@pytest.mark.parametrize("over,msg", [({"shuffle": True}, "data.shuffle"),
                                      ({"dataloader_num_workers": 2}, "dataloader_num_workers"),
                                      ({"sampler": {"class_path": "pkg://rlpace.adapters.verl",
                                                    "class_name": "RlpaceSampler"}}, "ignored by verl"),
                                      ({"rlpace": {"policy": "dump", "sed": 1}}, "unknown data.rlpace")])
def test_bad_loader_config_is_rejected(files, tok, over, msg):
    train, val, cache = files
    with pytest.raises(ValueError, match=msg):
        create_rl_dataset([train], data_config(train, val, cache_dir=cache, **over), tok, None)


def test_same_train_and_val_files_is_rejected(files, tok):
    train, _, cache = files
    with pytest.raises(ValueError, match="same files"):
        create_rl_dataset([train], data_config(train, train, cache_dir=cache), tok, None)


def test_checkpoint_of_another_pool_is_rejected(files, tok, tmp_path):
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache)
    ds, loader = build(cfg, tok)
    next(iter(loader))
    state = loader.state_dict()
    other = write_parquet(tmp_path / "other.parquet", offset=500)
    ds2, loader2 = build(data_config(other, val, cache_dir=cache), tok)
    loader2.load_state_dict(state)                 # verl's _load_checkpoint: torchdata keeps it ...
    with pytest.raises(ValueError, match="different pool"):
        iter(loader2)                              # ... and applies it when fit() opens the loader


@pytest.mark.parametrize("version,feature", [("0.10.0", "dataset"), ("0.7.1", "dataset"),
                                             ("0.9.1", "sampler"), ("0.8.0", "replay_buffer"),
                                             ("0.10.0.dev0", "dataset"), ("0.10.0rc1", "replay_buffer"),
                                             ("0.10.0.dev0", "v1_trainer"), ("0.9.0rc1", "replay_buffer")])
def test_engine_version_outside_range_is_rejected(monkeypatch, version, feature):
    monkeypatch.setattr(rv.verl, "__version__", version)
    with pytest.raises(ValueError, match=f"supports verl >="):
        rv.check_verl_version(feature)


@pytest.mark.parametrize("version", ["0.9.1", "0.9.2rc1", "0.9.3.post1"])
def test_engine_version_inside_range_passes(monkeypatch, version):
    monkeypatch.setattr(rv.verl, "__version__", version)
    rv.check_verl_version("replay_buffer")                 # a pre-release of 0.9.2 is inside [0.9, 0.10)


@pytest.mark.parametrize("feature,module,name", [
    ("replay_buffer", "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer", "_dapo_filtered_keys"),
    ("replay_buffer", "verl.trainer.ppo.v1.replay_buffer.tq", "kv_clear"),
    ("replay_buffer", "verl.trainer.ppo.v1.replay_buffer.ReplayBuffer", "_clear_groups"),
    ("v1_trainer", "verl.trainer.ppo.v1.trainer_base.PPOTrainer", "_compute_advantage"),
    ("legacy_trainer", "verl.trainer.ppo.ray_trainer", "extract_reward"),
    ("legacy_trainer", "verl.trainer.ppo.ray_trainer.RayPPOTrainer", "_update_actor")])
def test_a_missing_verl_internal_fails_at_start_up_naming_it(monkeypatch, feature, module, name):
    import importlib
    mod, _, attr = module.rpartition(".")
    try:
        owner = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError):
        owner = importlib.import_module(module)
    rv.check_verl_internals(feature)                        # verl 0.9.1 has every name
    monkeypatch.delattr(owner, name)
    with pytest.raises(ValueError, match=f"verl's '.*{name}'"):
        rv.check_verl_internals(feature)


def test_a_changed_trajectory_key_format_or_buffer_state_fails_loudly(monkeypatch, v1):
    import inspect
    fake, make = v1
    src = inspect.getsource
    monkeypatch.setattr(inspect, "getsource", lambda m: src(m).replace("{uid}_{session_id}_{i}", "{uid}-{i}"))
    with pytest.raises(ValueError, match="session_id"):
        rv.check_verl_internals("replay_buffer")
    # a verl whose stale eviction no longer goes through _clear_groups (where weights are dropped)
    monkeypatch.setattr(inspect, "getsource", lambda m: src(m).replace("self._clear_groups(partition_id, evicted_uids)",
                                                                       "self._evict(partition_id, evicted_uids)"))
    with pytest.raises(ValueError, match="_clear_groups"):
        rv.check_verl_internals("replay_buffer")
    monkeypatch.setattr(inspect, "getsource", src)
    buf, _, _ = make(lambda b: np.ones(b.rewards.shape, bool))
    rv.check_verl_internals("replay_buffer_state", buf)
    del buf.prompt_global_steps
    with pytest.raises(ValueError, match="prompt_global_steps"):
        rv.check_verl_internals("replay_buffer_state", buf)


def test_v1_buffer_state_names_are_checked_when_it_is_built(monkeypatch, v1):
    from verl.trainer.ppo.v1 import replay_buffer as rb
    fake, make = v1
    init = rb.ReplayBuffer.__init__

    def renamed(self, *a, **k):                    # a verl that renamed finished_keys
        init(self, *a, **k)
        self.done_keys = self.__dict__.pop("finished_keys")
    monkeypatch.setattr(rb.ReplayBuffer, "__init__", renamed)
    with pytest.raises(ValueError, match="finished_keys"):
        make(lambda b: np.ones(b.rewards.shape, bool))


def test_sampler_on_verl_09_names_the_dataset_path():
    with pytest.raises(ValueError, match="RlpaceDataset"):
        rv.RlpaceSampler  # noqa: B018 - verl's loader does getattr(module, class_name)


# ---- V1 trainer: replay buffer over a stand-in TransferQueue ---------------------------------
# TransferQueue needs Ray actors and a rollout server; these tests run verl's real
# ReplayBuffer.sample loop (eviction, 2k refill, draining, selection) over an in-memory
# stand-in implementing the four calls it makes: kv_list, kv_batch_get, kv_clear.
class FakeTQ:
    def __init__(self):
        self.tags, self.values, self.cleared = {"train": {}}, {"train": {}}, []

    def add_group(self, uid, index, rewards, step, acc=None):
        self.tags["train"][uid] = {"is_prompt": True, "status": "finished", "global_steps": step}
        for s, r in enumerate(rewards):
            key = f"{uid}_{s}_0"
            scores = torch.zeros(4)
            scores[-1] = r
            info = {} if acc is None else {"acc": acc[s]}
            self.tags["train"][key] = {"status": "success", "global_steps": step}
            self.values["train"][key] = {"rm_scores": scores, "index": index,
                                         "extra_fields": {"reward_extra_info": info}}

    def kv_list(self, partition_id=None):
        return {p: dict(t) for p, t in self.tags.items()}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return {f: [self.values[partition_id][k][f] for k in keys] for f in select_fields}

    def kv_batch_put(self, keys, partition_id, fields):
        for k, name in ((k, n) for k in keys for n in fields.keys()):
            self.values[partition_id][k][name] = fields[name][keys.index(k)]

    def kv_clear(self, keys, partition_id):
        for k in keys:
            self.tags[partition_id].pop(k, None)
            self.values[partition_id].pop(k, None)
        self.cleared.extend(keys)


class StubTrainer:
    """What the V1 replay buffer reaches through `refill_fn.__self__`: the train dataset's bridge."""
    rlpace_applies_weights = False

    def __init__(self, bridge=None, refill=lambda n: None, applies_weights=False):
        from types import SimpleNamespace
        self.train_dataset = SimpleNamespace(rlpace=bridge)
        self._refill, self.rlpace_applies_weights = refill, applies_weights

    def _add_prompts_to_generate(self, n):
        return self._refill(n)


def _admission(keep_fn, name):
    from rlpace.policies._base import ADMISSION, Admission
    return DataPolicy(ADMISSION, lambda pool: EmptyState(), lambda s, p, b: s,
                      lambda s, p, b: Admission(keep_fn(b), 0), name=name)


@pytest.fixture
def v1(monkeypatch):
    rb = pytest.importorskip("verl.trainer.ppo.v1.replay_buffer")
    from rlpace import Pool
    from rlpace.adapters import _verl_v1
    fake = FakeTQ()
    monkeypatch.setattr(rb, "tq", fake)

    def make(keep_fn, batch=3, reward_key="acc", method=None, applies_weights=False):
        pool = Pool(["math", "logic"] * 5, ids=list(range(100, 110)))
        sched = Scheduler(pool, method or compose(make_policy("uniform"), _admission(keep_fn, "test_admission")))
        refills = []
        trainer = StubTrainer(rv.VerlFeedback(sched, reward_key=reward_key), lambda n: refills.append(n) or
                              [fake.add_group("uD", 103, [0.0, 1.0], 2), fake.add_group("uE", 104, [1.0, 1.0], 2)],
                              applies_weights)
        buf = _verl_v1.RlpaceReplayBuffer(
            trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
            max_off_policy_strategy="drop", poll_interval=0.0, refill_fn=trainer._add_prompts_to_generate,
            sampler_kwargs={"train_batch_size": batch, "gen_batch_size": 1})
        return buf, sched, refills
    return fake, make


def test_v1_buffer_evicts_by_rlpace_admission_and_refills(v1):
    fake, make = v1
    buf, sched, refills = make(lambda b: np.repeat((b.rewards.std(axis=1) > 0)[:, None], 2, axis=1))
    fake.add_group("uA", 100, [1.0, 0.0], 1)
    fake.add_group("uB", 101, [1.0, 1.0], 1)          # no variance: evicted
    fake.add_group("uC", 102, [0.0, 1.0], 1)
    meta, metrics = buf.sample(global_steps=2, partition_id="train", batch_size=3)
    assert refills == [2]                               # verl's sync rule: 2 prompts per eviction
    assert sorted({k.split("_")[0] for k in meta.keys}) == ["uA", "uC", "uD"]
    assert metrics["training/filter_groups/evicted_samples"] == 2      # uB, then uE after refill
    assert metrics["rlpace/groups_observed"] == 5.0
    h = sched.history
    assert h.attempts[:5].tolist() == [2] * 5 and h.attempts[5:].sum() == 0
    assert h.successes[:5].tolist() == [1, 2, 1, 1, 2]
    assert h.last_step[:5].tolist() == [1, 1, 1, 2, 2]  # the step each prompt was sampled at
    assert {"uB", "uE"} <= set(fake.cleared)


def test_v1_buffer_clears_dropped_rollouts_inside_kept_groups(v1):
    fake, make = v1
    buf, sched, _ = make(lambda b: b.success, batch=2)  # keep successful rollouts only
    fake.add_group("uA", 100, [0.2, 0.1, 0.3], 1, acc=[1, 0, 1])   # success read from acc
    fake.add_group("uB", 101, [0.9, 0.9, 0.9], 1, acc=[0, 1, 0])
    meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=2)
    assert sorted(meta.keys) == ["uA_0_0", "uA_2_0", "uB_1_0"]
    assert sched.history.successes[:2].tolist() == [2, 1]


def test_v1_buffer_needs_batch_sizes_and_the_dataset(v1, monkeypatch):
    from rlpace.adapters import _verl_v1
    kw = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
              max_off_policy_strategy="drop", refill_fn=StubTrainer()._add_prompts_to_generate)
    with pytest.raises(ValueError, match="sampler_kwargs needs"):
        _verl_v1.RlpaceReplayBuffer(sampler_kwargs={}, **kw)
    with pytest.raises(ValueError, match="gen_batch_size must be 1"):
        _verl_v1.RlpaceReplayBuffer(sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 4}, **kw)
    with pytest.raises(ValueError, match=r"refill_fn.__self__"):       # not bound to a trainer
        _verl_v1.RlpaceReplayBuffer(sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1},
                                    **{**kw, "refill_fn": lambda n: None})
    buf = _verl_v1.RlpaceReplayBuffer(sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1}, **kw)
    with pytest.raises(ValueError, match="RlpaceDataset"):              # the trainer has no rlpace dataset
        buf.rlpace  # noqa: B018
    assert rv.RlpaceReplayBuffer is _verl_v1.RlpaceReplayBuffer   # what custom_sampler.name loads


def test_legacy_entry_point_swaps_in_the_mixin(monkeypatch):
    m = load_example("verl_legacy_trainer")
    original = m.runner_module.RayPPOTrainer
    monkeypatch.setattr(m.runner_module, "RayPPOTrainer", original)   # restored after the test
    monkeypatch.setattr(m._TaskRunner, "run", lambda self, config: m.runner_module.RayPPOTrainer)
    runner = m.RlpaceTaskRunner.__ray_actor_class__
    built = runner.run(runner.__new__(runner), config=None)             # what the Ray actor executes
    assert built.__mro__[1] is rv.RlpaceTrainerMixin and built.__mro__[2] is original


# ---- admission in the legacy mixin, safe data.pt, V1 without the buffer ----------------------
def test_mixin_applies_admission_with_kept_subset_advantages(files, tok):
    """G = 3. Groups at pool positions divisible by 3 are dropped; others at even positions are
    kept whole (verl's advantages stay); the rest keep their first two rollouts in engine
    order (PODS): those train on GRPO advantages of the two kept rewards, the third on nothing."""
    from rlpace.policies._base import ADMISSION, Admission
    train, val, cache = files
    ds, loader = build(data_config(train, val, cache_dir=cache), tok)

    def keep_fn(b):
        keep = np.ones(b.rewards.shape, bool)
        keep[b.prompt_ids % 2 == 1, 2] = False
        keep[b.prompt_ids % 3 == 0] = False
        return keep

    ds.rlpace = rv.VerlFeedback(Scheduler(ds.scheduler.pool, compose(make_policy("uniform"), DataPolicy(
        ADMISSION, lambda pool: EmptyState(), lambda s, p, b: s, lambda s, p, b: Admission(keep_fn(b), 0),
        name="test_admission"))))
    received = {}

    class Base:
        def _update_actor(self, batch):
            received["adv"] = batch.batch["advantages"].clone()
            received["mask"] = batch.batch["response_mask"].clone()
            return DataProto.from_dict(tensors={}, meta_info={"metrics": {}})

    t = type("T", (rv.RlpaceTrainerMixin, Base), {})()
    t.train_dataset, t.train_dataloader, t.global_steps = ds, loader, 1
    kinds = set()
    for step, batch_dict in zip(range(3), loader):
        proto, positions, rew, adv, rows, order = rollout_batch(batch_dict, step, pool=ds.scheduler.pool)
        adv_in, mask_in = proto.batch["advantages"].clone(), proto.batch["response_mask"].clone()
        t._update_actor(proto)
        want_adv, want_mask = adv_in.clone(), mask_in.clone()
        for p in order:                                   # plain loop over groups, rows in engine order
            rr = [r for r, (q, _) in enumerate(rows) if q == p]
            idx = batch_dict["extra_info"][p]["index"]
            v = np.array([float(outcome(idx, g, step)) for _, g in (rows[r] for r in rr)])
            pos = int(ds.scheduler.pool.index_of([idx])[0])
            if pos % 3 == 0:
                kinds.add("dropped")
                for r in rr:
                    want_adv[r], want_mask[r] = 0.0, 0.0
            elif pos % 2 == 1:
                kinds.add("thinned")
                k = v[:2]
                for r, x in zip(rr[:2], k):
                    a = (x - k.mean()) / (k.std() + 1e-6) if k.std() > 0 else 0.0
                    want_adv[r] = float(a) * mask_in[r]
                want_adv[rr[2]], want_mask[rr[2]] = 0.0, 0.0
            else:
                kinds.add("whole")
        torch.testing.assert_close(received["adv"], want_adv)
        torch.testing.assert_close(received["mask"], want_mask)
    assert kinds == {"dropped", "thinned", "whole"}


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        import pathlib
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def _resume_trainer(ds, folder, step=3):
    from omegaconf import OmegaConf

    class Base:
        def _load_checkpoint(self):
            return None

    t = type("T", (rv.RlpaceTrainerMixin, Base), {})()
    t.train_dataset, t.global_steps = ds, step
    t.config = OmegaConf.create({"trainer": {"resume_mode": "resume_path", "resume_from_path": str(folder),
                                             "default_local_dir": str(folder)}})
    return t


def test_data_pt_is_loaded_without_running_code(files, tok, tmp_path):
    train, val, cache = files
    ds, loader = build(data_config(train, val, cache_dir=cache), tok)
    it = iter(loader)
    for step in range(2):
        ds.on_batch_end(rollout_batch(next(it), step, pool=ds.scheduler.pool)[0])
    good = tmp_path / "good"
    good.mkdir()
    torch.save(loader.state_dict(), good / "data.pt")                 # what verl writes
    ds2, _ = build(data_config(train, val, cache_dir=cache), tok)
    _resume_trainer(ds2, good)._load_checkpoint()                     # weights_only=True + numpy allow-list
    want = ds.scheduler.state_dict()
    for k, v in ds2.scheduler.state_dict().items():
        np.testing.assert_array_equal(v, want[k], err_msg=k)
    bad = tmp_path / "bad"
    bad.mkdir()
    marker = tmp_path / "pwned"
    torch.save({"_dataset_state": {"rlpace": _Evil(str(marker))}}, bad / "data.pt")
    with pytest.raises(ValueError, match="refuses to unpickle"):
        _resume_trainer(ds2, bad)._load_checkpoint()
    assert not marker.exists()


def _v1_trainer(cfg, tok, replay_buffer):
    """verl's real PPOTrainerSync, without __init__ (no Ray), ready for `_init_dataloader`."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    t = object.__new__(PPOTrainerSync)
    t.config = OmegaConf.create({"data": OmegaConf.to_container(cfg), "algorithm": {},
                                 "trainer": {"use_v1": True, "v1": {"trainer_mode": "sync", "sampler": {}},
                                             "total_epochs": 1, "total_training_steps": None},
                                 "actor_rollout_ref": {}})
    if isinstance(replay_buffer, _verl_v1_buffers()):
        t.config.trainer.v1.sampler.custom_sampler = {"path": "pkg://rlpace.adapters.verl",
                                                      "name": type(replay_buffer).__name__}
    t.config.data.val_batch_size = None
    t.tokenizer, t.processor, t.trainer_mode, t.parameter_sync_step = tok, None, "sync", 1
    t.replay_buffer = replay_buffer
    return t


def _verl_v1_buffers():
    from rlpace.adapters import _verl_v1
    return (_verl_v1.RlpaceReplayBuffer, _verl_v1.RlpaceReplayBufferAsync)


def test_v1_trainer_without_rlpace_replay_buffer_is_refused(files, tok, monkeypatch):
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from rlpace.adapters import _verl_v1
    train, val, cache = files
    cfg = data_config(train, val, cache_dir=cache, gen_batch_size=1)
    kw = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
              max_off_policy_strategy="drop")
    plain = ReplayBuffer(sampler_kwargs={}, train_batch_size=4, gen_batch_size=1, refill_fn=lambda n: None, **kw)
    with pytest.raises(ValueError, match="custom_sampler.name=RlpaceReplayBuffer"):
        _v1_trainer(cfg, tok, plain)._init_dataloader()
    t = _v1_trainer(cfg, tok, None)
    t.replay_buffer = ours = _verl_v1.RlpaceReplayBuffer(sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1},
                                                         refill_fn=t._add_prompts_to_generate, **kw)
    t.config.trainer.v1.sampler.custom_sampler = {"path": "pkg://rlpace.adapters.verl", "name": "RlpaceReplayBuffer"}
    t._init_dataloader()
    assert isinstance(t.train_dataset, rv.RlpaceDataset) and ours.rlpace is t.train_dataset.rlpace
    ds, _ = build(cfg, tok)                     # outside a V1 trainer (legacy, tests): no check
    assert ds.scheduler is not None


def test_v1_async_resume_does_not_observe_the_groups_verl_restores_twice(v1, files, tok, tmp_path):
    """verl's async V1 modes checkpoint TransferQueue, and a resumed run restores the finished
    groups still waiting to be sampled. The buffer decided (observed, weighed) them before the
    checkpoint; resumed from `data.pt` (the dataset's state, read back as rlpace reads it) it
    must neither observe them again nor lose their weights. Step 1 finishes uA and uB and trains
    uA; a checkpoint; step 2 finishes uC and trains the waiting uB: the resumed run's weights and
    Scheduler state equal the uninterrupted run's."""
    from rlpace.adapters import _verl_v1
    fake, _ = v1
    train, val, cache = files
    weight = DataPolicy(REWEIGHTING, lambda p: EmptyState(), lambda s, p, b: s,
                        lambda s, p, b: np.tile(2.0 + np.arange(b.rewards.shape[1]), (b.rewards.shape[0], 1)),
                        name="test_two_plus_g")

    def start(state=None):
        ds, _ = build(data_config(train, val, cache_dir=cache, policy="uniform"), tok)
        ds.rlpace = rv.VerlFeedback(Scheduler(ds.scheduler.pool, compose(make_policy("uniform"), weight), seed=3))
        if state is not None:
            ds.load_state_dict(state)
        buf = _verl_v1.RlpaceReplayBufferAsync(
            trainer_mode="colocate_async", trainer_config={}, max_off_policy_threshold=None,
            max_off_policy_strategy="drop", poll_interval=0.0, refill_fn=StubTrainer(ds.rlpace, applies_weights=True)._add_prompts_to_generate,
            sampler_kwargs={"train_batch_size": 1, "gen_batch_size": 1})
        return ds, buf

    def step(buf, t):
        meta, _ = buf.sample(global_steps=t, partition_id="train", batch_size=1)
        keys = sorted(meta.keys)
        w = buf.pop_weights(keys)
        fake.kv_clear(meta.keys, "train")                       # verl's fit clears the trained batch
        return keys, w

    def run(resume):
        fake.tags["train"].clear()
        fake.values["train"].clear()
        ds, buf = start()
        fake.add_group("uA", 100, [1.0, 0.0], 1)
        fake.add_group("uB", 101, [0.0, 1.0], 1)
        first = step(buf, 1)
        if resume:                                               # data.pt, read back as rlpace reads it
            torch.save({"dataset_state": ds.state_dict()}, tmp_path / "data.pt")
            ds, buf = start(rv.load_data_pt(str(tmp_path / "data.pt"))["dataset_state"])
        fake.add_group("uC", 102, [1.0, 1.0], 2)
        return first, step(buf, 2), ds.scheduler

    (k1, w1), (k2, w2), sched = run(False)
    (k1r, w1r), (k2r, w2r), sched_r = run(True)
    assert {k1[0][:2], k2[0][:2]} == {"uA", "uB"} and (k1, k2) == (k1r, k2r)
    np.testing.assert_array_equal(w2r, w2)
    np.testing.assert_array_equal(w2, [2.0, 3.0])               # the waiting group's weights, kept
    assert int(sched_r.counters.groups) == int(sched.counters.groups) == 3
    from _isolated import assert_state_equal
    assert_state_equal(sched_r.state_dict(), sched.state_dict())


def separated_config(kind: str, data):
    """verl's own config of its resource-separated trainers (`one_step_off` or `fully_async`),
    composed by Hydra from the yaml verl installs (both extend ppo_trainer, so `trainer.use_v1`
    stays True there), with the test's `data` node."""
    import importlib
    import os
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf, open_dict
    pkg, name = {"one_step_off": ("one_step_off_policy", "one_step_off_ppo_trainer"),
                 "fully_async": ("fully_async_policy", "fully_async_ppo_trainer")}[kind]
    folder = os.path.join(os.path.dirname(importlib.import_module(f"verl.experimental.{pkg}").__file__), "config")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=folder, version_base=None):
        # one-step-off's yaml names ppo_trainer by a path relative to verl's repository
        root = compose(config_name=name, overrides=["hydra.searchpath=[pkg://verl.trainer.config]"])
    GlobalHydra.instance().clear()
    with open_dict(root):
        root.data = data
    return root


def test_one_step_off_trainer_feeds_the_dataset_through_on_batch_end(files, tok):
    """verl's one-step-off-policy trainer (its real config: trainer.use_v1 stays True there)
    builds the dataset without the V1 refusal, and its own post-step hook
    (`SeparateRayPPOTrainer._fit_experimental`) reaches the Scheduler: after 3 steps its
    state equals a Scheduler fed the same Feedback by hand."""
    from types import SimpleNamespace
    from verl.experimental.separation.ray_trainer import SeparateRayPPOTrainer
    import json
    import os
    train, val, cache = files
    record = os.path.join(os.path.dirname(cache), "pilot.jsonl")
    root = separated_config("one_step_off", data_config(train, val, cache_dir=cache,
                                                         rlpace={"policy": "dump", "seed": 3, "record": record}))
    assert root.trainer.use_v1 and root.rollout.n_gpus_per_node == 8 and "async_training" not in root
    ds = create_rl_dataset(root.data.train_files, root.data, tok, None)
    loader = StatefulDataLoader(ds, batch_size=4, num_workers=0, drop_last=True, collate_fn=collate_fn,
                                sampler=create_rl_sampler(root.data, ds))
    ref = Scheduler(ds.scheduler.pool, "dump", seed=3)
    trainer = SimpleNamespace(train_dataset=ds)
    for step, batch_dict in zip(range(3), loader):
        assert batch_positions(ds, batch_dict).tolist() == ref.propose(4).tolist()
        proto, positions, rew, adv, _, _ = rollout_batch(batch_dict, step, pool=ref.pool, seed=5)
        SeparateRayPPOTrainer._fit_experimental(trainer, proto)          # verl's call of on_batch_end
        ref.observe(Feedback(positions, rew, adv, step=step))
    got, want = ds.scheduler.state_dict(), ref.state_dict()
    assert sorted(got) == sorted(want) and ds.scheduler.history.attempts.sum() == 3 * 4 * 3
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    # the pilot record (data.rlpace.record) is written on the same hook: one line per step
    lines = [json.loads(x) for x in open(record)][1:]
    assert [line["step"] for line in lines] == [0, 1, 2] and all(line["rollouts"] == 12 for line in lines)


@pytest.mark.parametrize("policy,match", [("dump+dapo_dynamic_sampling", "admission"),
                                          ("per_advantage", "reweighting"), ("ttrl", "target"),
                                          ("entropy_min", "reward"), ("knapsack", "allocation")])
def test_one_step_off_trainer_refuses_places_it_would_not_apply(files, tok, policy, match):
    train, val, cache = files
    root = separated_config("one_step_off", data_config(train, val, cache_dir=cache, policy=policy))
    with pytest.raises(ValueError, match=f"{match}.*one-step-off-policy trainer.*rlpace_colocate_async"):
        create_rl_dataset(root.data.train_files, root.data, tok, None)


def test_fully_async_trainer_is_refused_naming_the_setting_and_the_fix(files, tok):
    """verl's fully-async trainer (its real config, `async_training`): its rollouter never passes
    a finished step to the dataset, so the dataset refuses to be built, naming the setting and
    the V1 trainer's fully-async mode; the validation copy (not scheduled) is built as verl's."""
    train, val, cache = files
    root = separated_config("fully_async", data_config(train, val, cache_dir=cache))
    assert root.trainer.use_v1 and root.async_training.trigger_parameter_sync_step == 4
    with pytest.raises(ValueError,
                       match="async_training.*no on_batch_end.*trainer.v1.trainer_mode=rlpace_separate_async"):
        create_rl_dataset(root.data.train_files, root.data, tok, None)
    assert create_rl_dataset(root.data.val_files, root.data, tok, None).rlpace is None


def test_v1_buffer_without_rewards_at_sampling_time_names_the_fix(v1):
    fake, make = v1
    buf, sched, _ = make(lambda b: np.ones(b.rewards.shape, bool), batch=1)
    fake.add_group("uA", 100, [1.0, 0.0], 1)
    for v in fake.values["train"].values():            # a colocated reward model has not scored yet
        del v["rm_scores"]
    with pytest.raises(ValueError, match="enable_resource_pool=True"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)
    assert sched.history.attempts.sum() == 0


def test_v1_feedback_carries_grpo_advantages_of_the_rewards(v1):
    fake, make = v1
    got = []
    buf, sched, _ = make(lambda b: np.ones(b.rewards.shape, bool), batch=1)
    observe = sched.observe
    sched.observe = lambda fb: got.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (the replay buffer calls it)
    sched.step = lambda fb, features=None: got.append(fb) or _step(fb, features)
    fake.add_group("uA", 100, [1.0, 0.0, 0.0, 0.0], 1)
    buf.sample(global_steps=1, partition_id="train", batch_size=1)
    # (r − 0.25) / (sqrt(0.1875) + 1e-6), by hand
    s = np.sqrt(0.1875) + 1e-6
    np.testing.assert_allclose(got[0].advantages, [[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]], rtol=1e-12)


# ---- rlpace's V1 trainers: registration, config, weights, resume (stand-in TransferQueue) -------
def test_rlpace_v1_trainers_are_registered_and_hand_verl_its_own_mode(monkeypatch):
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl.trainer.ppo.v1.trainer_separate_async import PPOTrainerSeparateAsync

    from rlpace.adapters import _verl_v1_trainer as vt
    seen = []
    for owner in (PPOTrainer, PPOTrainerSeparateAsync):        # verl's __init__ builds workers: record instead
        monkeypatch.setattr(owner, "__init__", lambda self, config: seen.append(OmegaConf.to_container(config)))
    for name, mode, buffer in (("rlpace_sync", "sync", "RlpaceReplayBuffer"),
                               ("rlpace_colocate_async", "colocate_async", "RlpaceReplayBufferAsync"),
                               ("rlpace_separate_async", "separate_async", "RlpaceReplayBufferAsync")):
        assert get_trainer_cls(name) is vt.MODES[name]
        cfg = OmegaConf.create({"data": {"train_batch_size": 8},
                                "trainer": {"v1": {"trainer_mode": name, "sampler": {"sampler_kwargs": None}}}})
        vt.MODES[name](cfg)
        v1 = seen[-1]["trainer"]["v1"]
        assert v1["trainer_mode"] == mode and v1["rlpace_trainer"] is True
        assert v1["sampler"]["custom_sampler"] == {"path": "pkg://rlpace.adapters.verl", "name": buffer}
        assert v1["sampler"]["sampler_kwargs"] == {"train_batch_size": 8, "gen_batch_size": 1}
        assert seen[-1]["data"]["gen_batch_size"] == 1
    cfg = OmegaConf.create({"data": {"train_batch_size": 8}, "trainer": {"v1": {
        "trainer_mode": "rlpace_sync", "sampler": {"custom_sampler": {"path": "x.py", "name": "MyBuffer"}}}}})
    with pytest.raises(ValueError, match="custom_sampler.name=MyBuffer"):
        vt.RlpacePPOTrainerSync(cfg)


def test_v1_entry_point_registers_the_trainers_inside_the_actor(monkeypatch):
    m = load_example("verl_v1_trainer")
    from verl.trainer.ppo.v1 import get_trainer_cls
    base = m.TaskRunnerV1.__ray_actor_class__
    monkeypatch.setattr(base, "run", lambda self, config: get_trainer_cls(config))    # what verl's run looks up
    runner = m.RlpaceTaskRunnerV1.__ray_actor_class__
    from rlpace.adapters._verl_v1_trainer import RlpacePPOTrainerColocateAsync
    assert runner.run(runner.__new__(runner), "rlpace_colocate_async") is RlpacePPOTrainerColocateAsync


@pytest.mark.parametrize("policy,match", [("per_advantage", "loss weights"), ("entropy_min", "token_entropy")])
def test_v1_buffer_under_verls_own_trainer_refuses_what_only_rlpaces_trainer_applies(v1, policy, match):
    fake, make = v1
    from rlpace.policies import make_method
    buf, sched, _ = make(None, method=make_method(policy))
    fake.add_group("uA", 100, [1.0, 0.0], 1)
    with pytest.raises(ValueError, match=f"{match}.*trainer_mode=rlpace_sync"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)
    assert sched.history.attempts.sum() == 0


def test_v1_gradient_feature_policies_are_refused_not_silently_unweighted(v1):
    fake, make = v1
    from rlpace.policies import make_method
    buf, sched, _ = make(None, method=make_method("diem"), applies_weights=True)
    fake.add_group("uA", 100, [1.0, 0.0], 1)
    with pytest.raises(ValueError, match="gradient features"):
        buf.sample(global_steps=1, partition_id="train", batch_size=1)


def test_v1_loss_weights_are_kept_per_session_and_resume_exactly(v1, monkeypatch):
    """difficulty_band's weights depend on the Scheduler's history: two steps uninterrupted and
    two steps with the Scheduler restored from its state after the first (what data.pt holds;
    the buffer holds no weight across steps) give the same weights and the same final state."""
    from _isolated import assert_state_equal
    from rlpace.policies import make_method
    fake, make = v1

    def two_steps(restart):
        fake.tags["train"].clear()
        fake.values["train"].clear()
        buf, sched, _ = make(None, batch=2, method=make_method("difficulty_band"), applies_weights=True)
        fake.add_group("uA", 100, [1.0, 0.0], 1)
        fake.add_group("uB", 101, [1.0, 1.0], 1)
        meta, _ = buf.sample(global_steps=1, partition_id="train", batch_size=2)
        w1 = buf.pop_weights(meta.keys)
        if restart:
            state = sched.state_dict()
            buf, sched, _ = make(None, batch=2, method=make_method("difficulty_band"), applies_weights=True)
            sched.load_state_dict(state)
        fake.add_group("uC", 100, [0.0, 0.0], 2)
        fake.add_group("uD", 102, [1.0, 0.0], 2)
        meta, _ = buf.sample(global_steps=2, partition_id="train", batch_size=2)
        return sorted(meta.keys), w1, buf.pop_weights(sorted(meta.keys)), sched.state_dict()

    keys, w1, w2, state = two_steps(False)
    keys_r, w1_r, w2_r, state_r = two_steps(True)
    assert keys == keys_r == ["uC_0_0", "uC_1_0", "uD_0_0", "uD_1_0"]
    np.testing.assert_array_equal(w1, w1_r)
    np.testing.assert_array_equal(w2, w2_r)
    assert_state_equal(state, state_r)
    # the weights are the Scheduler's own loss weights of each group, per rollout (a reference
    # Scheduler fed the same Feedback by hand)
    from rlpace import Pool
    ref = Scheduler(Pool(["math", "logic"] * 5, ids=list(range(100, 110))), make_method("difficulty_band"))
    ref.step(Feedback(ref.pool.index_of([100, 101]), [[1.0, 0.0], [1.0, 1.0]], step=1))
    r2 = ref.step(Feedback(ref.pool.index_of([100, 102]), [[0.0, 0.0], [1.0, 0.0]], step=2))
    np.testing.assert_allclose(w2, r2.weights.ravel())
    assert not np.all(w2 == 1.0)                  # the weights are not trivially 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_v1_buffer_drops_the_weights_of_groups_verl_evicts(v1, mode):
    """verl clears groups it evicts after rlpace decided them (async: stale past
    `max_off_policy_threshold`; sync: the surplus it discards once a batch is full); their
    loss weights must go with them. Each of 40 steps: one fresh group (trained: its weights
    popped, as `_compute_advantage` does) and one group it evicts; afterwards the weight map
    is empty, and each trained group's weights are the hand-computed 2 + g."""
    fake, _ = v1
    from rlpace import Pool
    from rlpace.adapters import _verl_v1
    weight = DataPolicy(REWEIGHTING, lambda p: EmptyState(), lambda s, p, b: s,
                        lambda s, p, b: np.tile(2.0 + np.arange(b.rewards.shape[1]), (b.rewards.shape[0], 1)),
                        name="test_two_plus_g")
    sched = Scheduler(Pool(["math"] * 4, ids=[100, 101, 102, 103]), compose(make_policy("uniform"), weight))
    trainer = StubTrainer(rv.VerlFeedback(sched, reward_key="acc"), applies_weights=True)
    cls = _verl_v1.RlpaceReplayBuffer if mode == "sync" else _verl_v1.RlpaceReplayBufferAsync
    buf = cls(trainer_mode="sync" if mode == "sync" else "colocate_async", trainer_config={},
              max_off_policy_threshold=None if mode == "sync" else 1, max_off_policy_strategy="drop",
              poll_interval=0.0, refill_fn=trainer._add_prompts_to_generate,
              sampler_kwargs={"train_batch_size": 1, "gen_batch_size": 1})
    for t in range(2, 42):
        fake.add_group(f"fresh{t}", 100 + t % 2, [1.0, 0.0, 1.0], t)
        # async: drawn 2 steps ago, stale (span 3 > 1); sync: finished with the same step, one too many
        fake.add_group(f"extra{t}", 102 + t % 2, [0.0, 1.0, 1.0], t if mode == "sync" else t - 2)
        meta, _ = buf.sample(global_steps=t, partition_id="train", batch_size=1)
        (uid,) = {k.split("_")[0] for k in meta.keys}
        if mode == "async":
            assert uid == f"fresh{t}"
        np.testing.assert_array_equal(buf.pop_weights(sorted(meta.keys)), [2.0, 3.0, 4.0])
        fake.kv_clear(meta.keys, "train")                            # verl's fit clears the trained batch
        evicted = ({f"fresh{t}", f"extra{t}"} - {uid}).pop()
        assert evicted in fake.cleared
        assert buf.rlpace_weights == {}, (t, buf.rlpace_weights)
    assert int(sched.counters.groups) == 80          # every group was observed, the evicted ones too


@pytest.mark.parametrize("policy,match", [("diem", "gradient features")])
def test_legacy_mixin_refuses_gradient_features_at_fit(policy, match):
    from types import SimpleNamespace
    from rlpace import Pool
    fit = []

    class Base:
        def fit(self):
            fit.append(1)

    class T(rv.RlpaceTrainerMixin, Base):
        train_dataloader = None
        train_dataset = SimpleNamespace(rlpace=rv.VerlFeedback(Scheduler(Pool(["a"] * 4), policy)))
    with pytest.raises(ValueError, match=match):
        T().fit()
    assert fit == []
    T.train_dataset = SimpleNamespace(rlpace=rv.VerlFeedback(Scheduler(Pool(["a"] * 4), "dump")))
    T().fit()
    assert fit == [1]
