"""RlpaceSampler against the installed verl 0.7.1 (run in .venv-verl07: `make test-verl07`).

verl's own `create_rl_sampler` loads the sampler from `data.sampler.class_path`; a
`StatefulDataLoader` with verl's collate function draws batches; synthetic
post-advantage `DataProto` batches (rows shuffled like batch balancing) reach
`sampler.update`, and a reference Scheduler fed hand-built `Feedback` must end in the same
state. Exact resume through the dataloader state, and bad input. In the main env (verl
≥ 0.8, no curriculum sampler) the module is skipped.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("verl.experimental.dataset.sampler")

import torch  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402
from verl import DataProto  # noqa: E402
from verl.experimental.dataset.sampler import AbstractCurriculumSampler  # noqa: E402
from verl.trainer.main_ppo import create_rl_sampler  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

import rlpace.adapters.verl as rv  # noqa: E402
from rlpace import Feedback, Scheduler  # noqa: E402
from _verl_data import (data_config, load_example, make_tokenizer, outcome, rollout_batch,  # noqa: E402
                        write_parquet)

pytestmark = pytest.mark.filterwarnings("ignore")
SAMPLER = {"class_path": "pkg://rlpace.adapters.verl", "class_name": "RlpaceSampler"}


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture
def cfg(tmp_path):
    train = write_parquet(tmp_path / "train.parquet")
    return data_config(train, write_parquet(tmp_path / "val.parquet", n=8), cache_dir=str(tmp_path / "c"),
                       sampler=SAMPLER, custom_cls={"path": None, "name": None})


def build(cfg, tok, path=None):
    ds = RLHFDataset(list(cfg.train_files) if path is None else [path], tok, cfg)
    sampler = create_rl_sampler(cfg, ds)
    loader = StatefulDataLoader(ds, batch_size=cfg.train_batch_size, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=sampler)
    return ds, sampler, loader


def positions(sampler, batch_dict):
    return sampler.scheduler.pool.index_of([e["index"] for e in batch_dict["extra_info"]])


def test_verl_loads_the_sampler_and_feedback_reaches_the_scheduler(cfg, tok):
    ds, sampler, loader = build(cfg, tok)
    assert isinstance(sampler, rv.RlpaceSampler) and isinstance(sampler, AbstractCurriculumSampler)
    assert len(sampler) == 40 and len(loader) == 10
    ref = Scheduler(sampler.scheduler.pool, "dump", seed=3)
    expected_successes = np.zeros(len(ref.pool), np.int64)
    for step, batch_dict in zip(range(6), loader):
        assert positions(sampler, batch_dict).tolist() == ref.propose(4).tolist()
        proto, pos, rew, adv, rows, order = rollout_batch(batch_dict, step, acc=step % 2 == 0,
                                                          pool=ref.pool, seed=11)
        sampler.update(batch=proto)                     # what RayPPOTrainer.fit calls
        ref.observe(Feedback(pos, rew, adv, step=step))
        for p in order:
            idx = batch_dict["extra_info"][p]["index"]
            expected_successes[ref.pool.index_of([idx])[0]] += sum(outcome(idx, g, step) for g in range(3))
    got, want = sampler.scheduler.state_dict(), ref.state_dict()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert sampler.scheduler.history.successes.tolist() == expected_successes.tolist()


def test_resume_mid_epoch_replays_next_batches(cfg, tok, tmp_path):
    def run(sampler, loader, steps, start=0):
        out, it = [], iter(loader)
        for step in range(start, start + steps):
            batch_dict = next(it, None)
            if batch_dict is None:                       # epoch end: verl's loop opens a new one
                it = iter(loader)
                batch_dict = next(it)
            out.append(positions(sampler, batch_dict).tolist())
            sampler.update(rollout_batch(batch_dict, step, pool=sampler.scheduler.pool)[0])
        return out

    _, s_a, l_a = build(cfg, tok)
    full = run(s_a, l_a, 13)                             # 10 batches per epoch: crosses an epoch
    _, s_b, l_b = build(cfg, tok)
    first = run(s_b, l_b, 4)
    torch.save(l_b.state_dict(), tmp_path / "data.pt")
    _, s_c, l_c = build(cfg, tok)
    l_c.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=False))
    rest = run(s_c, l_c, 9, start=4)
    assert first + rest == full
    assert l_b.state_dict()["_sampler_iter_state"]["sampler_state"]["pos"] == 16


def test_trainer_mixin_reads_the_sampler(cfg, tok):
    ds, sampler, loader = build(cfg, tok)

    class Base:
        def _update_actor(self, batch):
            return DataProto.from_dict(tensors={}, meta_info={"metrics": {}})

    t = type("T", (rv.RlpaceTrainerMixin, Base), {})()
    t.train_dataset, t.train_dataloader, t.global_steps = ds, loader, 1
    batch_dict = next(iter(loader))
    proto = rollout_batch(batch_dict, 0, pool=sampler.scheduler.pool)[0]
    out = t._update_actor(proto)
    assert out.meta_info["metrics"]["rlpace/groups_observed"] == 4.0
    sampler.update(proto)                                # verl's later hook: already observed
    assert sampler.scheduler.history.attempts.sum() == 12


def test_bad_input_is_rejected(tmp_path, tok, cfg, monkeypatch):
    val = write_parquet(tmp_path / "v.parquet", n=8)
    for kw, msg in (({"index": False}, "extra_info.index is missing"), ({"duplicate": True}, "duplicates")):
        bad = write_parquet(tmp_path / f"b{list(kw)[0]}.parquet", **kw)
        with pytest.raises(ValueError, match=msg):
            build(data_config(bad, val, cache_dir=str(tmp_path / "c"), sampler=SAMPLER), tok)
    with pytest.raises(ValueError, match="dataloader_num_workers"):
        build(data_config(cfg.train_files[0], val, cache_dir=str(tmp_path / "c"), sampler=SAMPLER,
                          dataloader_num_workers=4), tok)
    with pytest.raises(ValueError, match="RlpaceSampler"):      # the ≥ 0.8 dataset, on 0.7
        rv.RlpaceDataset(list(cfg.train_files), tok, cfg)
    monkeypatch.setattr(rv.verl, "__version__", "0.8.0")
    with pytest.raises(ValueError, match="supports verl >=0.5,<0.8"):
        build(cfg, tok)


def test_checkpoint_of_another_pool_is_rejected(cfg, tok, tmp_path):
    _, sampler, loader = build(cfg, tok)
    next(iter(loader))
    state = loader.state_dict()
    other = write_parquet(tmp_path / "o.parquet", offset=500)
    _, _, loader2 = build(cfg, tok, path=other)
    loader2.load_state_dict(state)
    with pytest.raises(ValueError, match="different pool"):
        iter(loader2)


def test_legacy_entry_point_swaps_in_the_mixin(monkeypatch):
    m = load_example("verl_legacy_trainer")
    original = m.runner_module.RayPPOTrainer
    monkeypatch.setattr(m.runner_module, "RayPPOTrainer", original)
    monkeypatch.setattr(m._TaskRunner, "run", lambda self, config: m.runner_module.RayPPOTrainer)
    runner = m.RlpaceTaskRunner.__ray_actor_class__
    built = runner.run(runner.__new__(runner), config=None)
    assert built.__mro__[1] is rv.RlpaceTrainerMixin and built.__mro__[2] is original
