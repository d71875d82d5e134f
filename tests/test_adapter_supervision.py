"""Supervision transforms (pseudo-labels, label noise) inside verl's legacy trainer and TRL's GRPOTrainer.

verl: the batch is built the way `RayPPOTrainer.fit` builds it (a loader batch of the
RlpaceDataset → `DataProto.from_single_dict` → uid → `repeat(interleave=True)`, which makes
the G rows of a prompt share one `reward_model` dict) and scored through verl's own reward
path (`load_reward_manager` → `NaiveRewardManager.run_single`, one rollout at a time, as the
agent loop scores); a stand-in `fit` then runs the order of verl's `fit` — `extract_reward`
(looked up in `verl.trainer.ppo.ray_trainer`, where the mixin wraps it), token-level scores,
verl's real `compute_advantage` (GRPO) and `_update_actor`. Expected numbers come from plain
loops over the scripted answers.

verl V1: finished groups written by verl's agent-loop write path into a real TransferQueue
(in a subprocess, as tests/test_adapter_verl_tq.py), read by `RlpaceReplayBuffer`.

TRL: a real GRPOTrainer run on a tiny random CPU model (tests/_tiny_lm.py); the
completions are whatever the model samples, so the expected targets and rewards are
recomputed from the completions the reward function saw.
"""

from __future__ import annotations

import textwrap
import uuid
from collections import Counter

import numpy as np
import pytest

from rlpace import Pool, Scheduler, compose
from rlpace.adapters._supervision import extract_answer, row_targets, token_stats
from rlpace.policies._base import TARGET, DataPolicy, EmptyState, Targets

pytestmark = pytest.mark.filterwarnings("ignore")


# ---------------------------------------------------------------- engine-free pieces
def test_extract_answer_reads_the_last_tag_or_box():
    assert extract_answer("a <answer>1</answer> b <answer> 2  3 </answer>") == "2  3"
    assert extract_answer("x \\boxed{\\frac{1}{2}} then \\fbox{ 4 }") == "4"
    assert extract_answer("x \\boxed{\\frac{1}{2}}.") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{a{b}c}") == "a{b}c"              # braces matched
    assert extract_answer("\\boxed{unclosed") is None
    assert extract_answer("nothing here") is None and extract_answer("<answer></answer>") is None
    assert extract_answer([{"role": "assistant", "content": "<answer>9</answer>"}]) == "9"
    assert extract_answer(None) is None


def test_token_stats_match_a_reference_loop():
    import torch
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 4, 5)) * 2
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    tokens = rng.integers(0, 5, size=(3, 4))
    out = token_stats(torch.tensor(logits), torch.tensor(mask), temperature=0.7, tokens=torch.tensor(tokens))
    for r in range(3):
        ent, sc, lp = [], [], []
        for t in range(4):
            if not mask[r, t]:
                continue
            z = logits[r, t] / 0.7
            p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
            ent.append(-(p * np.log(p)).sum())
            sc.append(np.mean(np.log((1 / 5) / p)) * 1.0)                   # KL(U || p) = Σ_j (1/V) log((1/V)/p_j)
            lp.append(np.log(p[tokens[r, t]]))
        want = [np.mean(v) if v else 0.0 for v in (ent, sc, lp)]
        got = [out[k][r] for k in ("token_entropy", "self_certainty", "mean_logprob")]
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_row_targets_spreads_targets_and_marks_unverified_rows():
    t, z = row_targets(["a", None, None], np.array([True, True, False]), np.array([[5, 0], [1, 4], [3, 2]]), 7)
    assert t.tolist() == ["a", None, None, None, None, "a", None]
    assert z.tolist() == [False, False, True, True, False, False, False]


def first_seen_majority() -> DataPolicy:
    """A target policy written here (TTRL-v2's vote: most common non-None answer, first seen on
    ties) for unlabelled prompts; labelled prompts keep the dataset label."""
    def apply(state, pool, batch):
        labels = []
        for b, p in enumerate(batch.prompt_ids):
            votes = [a for a in batch.answers[b] if a is not None]
            labels.append(None if pool.labeled[p] or not votes else Counter(votes).most_common(1)[0][0])
        return Targets(labels, [])
    return DataPolicy(TARGET, lambda pool: EmptyState(), lambda s, p, b: s, apply, name="test_majority",
                      reads=frozenset({"answers"}))


def reference_majority(answers, labeled):
    votes = [a for a in answers if a is not None]
    return None if labeled or not votes else Counter(votes).most_common(1)[0][0]


# ---------------------------------------------------------------- verl
G = 4
REWARD_FILE = textwrap.dedent('''
    import json
    import os
    import re

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        found = re.findall(r"<answer>(.*?)</answer>", solution_str)
        pred = found[-1].strip() if found else ""
        if os.environ.get("RLPACE_TEST_CALLS"):          # a record of every call, for the tests
            with open(os.environ["RLPACE_TEST_CALLS"], "a") as f:
                f.write(json.dumps([extra_info["index"], solution_str, ground_truth]) + "\\n")
        ok = float(pred != "" and pred == str(ground_truth).strip())
        return {"score": ok, "acc": ok, "pred": pred}
''')


def answer_text(index: int, g: int, step: int) -> str | None:
    """Scripted answer of rollout g of prompt `index` at `step` (None: no answer tag)."""
    table = {0: ["7", "7", "3", None], 1: ["2", "5", "5", "2"], 2: [None, None, None, None],
             3: ["11", "4", "4", "9"]}
    return table[(index + step) % 4][g]


def olr_answer(index: int, g: int, step: int) -> str | None:
    """Every prompt's majority answer is "m<index>" (never its dataset label <index + 1>); it
    wins 2, 3, 4 of the 4 votes at steps 0, 1, 2: its pass rate rises 0.5, 0.75, 1.0."""
    return f"m{index}" if g < min(2 + step, 4) else ["x", None][g % 2]


def response(index, g, step, answers=answer_text):
    a = answers(index, g, step)
    return "so" if a is None else f"so <answer>{a}</answer>"


@pytest.fixture(scope="module")
def verl_env(tmp_path_factory):
    pytest.importorskip("verl")
    pytest.importorskip("torchdata")
    from verl07._verl_data import make_tokenizer
    root = tmp_path_factory.mktemp("verl_sup")
    (root / "reward_fn.py").write_text(REWARD_FILE)
    from tokenizers import decoders
    tok = make_tokenizer()
    tok.backend_tokenizer.decoder = decoders.ByteLevel()      # decode back to the text (the shared one spaces it)
    return tok, root


def write_parquet(path, n=8, all_labeled=False):
    """verl schema; even positions are labelled (extra_info.labeled), odd ones are not
    (`all_labeled`: every prompt)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [{"data_source": "math", "prompt": [{"role": "user", "content": f"what is {i} plus 1?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"index": 100 + i, "labeled": all_labeled or i % 2 == 0}} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def verl_config(root, policy, kwargs=None, n=8, all_labeled=False, reward_file="reward_fn.py"):
    from omegaconf import OmegaConf
    from verl07._verl_data import data_config
    tag = f"{policy}_{n}_{all_labeled}"
    data = data_config(write_parquet(root / f"train_{tag}.parquet", n, all_labeled),
                       write_parquet(root / f"val_{tag}.parquet", n, all_labeled),
                       cache_dir=str(root / f"cache_{tag}"), policy=policy)
    if kwargs:
        data.rlpace.kwargs = kwargs
    return OmegaConf.create({
        "data": OmegaConf.to_container(data),
        "reward": {"reward_manager": {"source": "register", "name": "naive"},
                   "custom_reward_function": {"path": str(root / reward_file), "name": "compute_score"},
                   "sandbox_fusion": None},
        "algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": True}})


def rollout(batch_dict, step, tok, manager, answers=answer_text):
    """The post-rollout batch as verl's legacy `fit` has it at `extract_reward`: repeated with
    interleave (shared reward_model dicts), generation tensors, the streaming reward of each
    rollout from verl's reward manager (`run_single` on a one-row DataProto, as the agent loop
    calls it) assembled like the agent loop's `_postprocess`. `test_g` records each row's
    rollout number."""
    import torch
    from verl import DataProto
    batch = DataProto.from_single_dict(batch_dict)
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    batch = batch.repeat(repeat_times=G, interleave=True)
    for k in list(batch.batch.keys()):
        batch.batch.pop(k)
    n, P, R = len(batch), 3, 32
    idx = [e["index"] for e in batch.non_tensor_batch["extra_info"]]
    texts = [response(i - 100, r % G, step, answers) for r, i in enumerate(idx)]
    responses = torch.full((n, R), tok.pad_token_id, dtype=torch.long)
    att = torch.zeros(n, P + R, dtype=torch.long)
    att[:, :P] = 1
    for r, t in enumerate(texts):
        ids = tok.encode(t)
        assert len(ids) <= R and tok.decode(ids, skip_special_tokens=True) == t
        responses[r, :len(ids)] = torch.tensor(ids)
        att[r, P:P + len(ids)] = 1
    gen = DataProto.from_dict(tensors={"prompts": torch.ones(n, P, dtype=torch.long), "responses": responses,
                                       "attention_mask": att, "response_mask": att[:, P:].clone()},
                              non_tensors={"test_g": np.arange(n) % G})
    batch = batch.union(gen)
    outs = [manager.loop.run_until_complete(manager.run_single(batch[i:i + 1])) for i in range(n)]
    batch.batch["rm_scores"] = manager.assemble_rm_scores(batch, [o["reward_score"] for o in outs])
    keys = list(outs[0]["reward_extra_info"])
    for k in keys:
        batch.non_tensor_batch[k] = np.array([o["reward_extra_info"][k] for o in outs])
    batch.meta_info["reward_extra_keys"] = keys
    return batch


def verl_trainer(cfg, ds, tok, log):
    """A stand-in for RayPPOTrainer that runs the order of verl's `fit` on prepared batches."""
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer

    import rlpace.adapters.verl as rv

    class Base:
        def fit(self):
            for step, batch in enumerate(self.batches):
                self.global_steps = step
                self._balance_batch(batch, metrics={})
                reward_tensor, extra = ray_trainer.extract_reward(batch)          # the name fit calls
                if self.entropys is not None:                                     # fit's old-log-prob block
                    old, _ = self._compute_old_log_prob(batch)
                    old.batch.pop("entropys")
                    batch = batch.union(old)
                batch.batch["token_level_scores"] = reward_tensor
                batch.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = ray_trainer.compute_advantage(batch, adv_estimator="grpo", num_repeat=G,
                                                      norm_adv_by_std_in_grpo=True)
                self._update_actor(batch)

        def _compute_old_log_prob(self, batch):
            ent = self.entropys(batch)
            return DataProto.from_dict(tensors={"entropys": ent, "old_log_probs": -ent}), 0.0

        def _balance_batch(self, batch, metrics):          # reorders rows, as verl's does
            import torch
            batch.reorder(torch.as_tensor(np.random.default_rng(self.global_steps).permutation(len(batch))))

        def _update_actor(self, batch):
            nt = batch.non_tensor_batch
            log.append({"scores": batch.batch["token_level_scores"].sum(-1).double().numpy(),
                        "adv": batch.batch["advantages"].double().numpy(),
                        "mask": batch.batch["response_mask"].double().numpy(),
                        "target": list(nt["rlpace_target"]), "g": nt["test_g"].tolist(),
                        "ids": [e["index"] for e in nt["extra_info"]], "uid": list(nt["uid"]),
                        "reward_model": list(nt["reward_model"])})
            return DataProto.from_dict(tensors={}, meta_info={"metrics": {}})

    class Trainer(rv.RlpaceTrainerMixin, Base):
        def __init__(self):
            self.config, self.tokenizer, self.train_dataset, self.train_dataloader = cfg, tok, ds, None
            self.global_steps = 0
            self.entropys = None
    return Trainer()


def build_verl(cfg, tok):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn
    ds = create_rl_dataset(cfg.data.train_files, cfg.data, tok, None)
    loader = StatefulDataLoader(ds, batch_size=cfg.data.train_batch_size, num_workers=0, drop_last=True,
                                collate_fn=collate_fn, sampler=create_rl_sampler(cfg.data, ds))
    return ds, loader


def grpo_reference(scores, uids):
    """verl's GRPO outcome advantage by a loop: (r − mean) / (unbiased std + 1e-6) per uid."""
    out = np.zeros(len(scores))
    for u in set(uids):
        rows = [i for i, v in enumerate(uids) if v == u]
        r = np.asarray(scores)[rows]
        out[rows] = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    return out


def run_verl(verl_env, steps=2, policy="uniform", kwargs=None, sched_factory=None, answers=answer_text, n=8,
             all_labeled=False, entropys=None, reward_file="reward_fn.py"):
    """`steps` steps through the mixin; records what verl trained on, what the Scheduler
    answered (`targets`) and observed, and the reward_model dicts before supervision."""
    from verl.trainer.ppo.reward import load_reward_manager

    import rlpace.adapters.verl as rv
    tok, root = verl_env
    cfg = verl_config(root, policy, kwargs, n, all_labeled, reward_file)
    ds, loader = build_verl(cfg, tok)
    if sched_factory is not None:
        ds.rlpace = rv.VerlFeedback(sched_factory(ds.scheduler.pool))
    sched = ds.scheduler
    manager = load_reward_manager(cfg, tok)
    log, observed, answered, before = [], [], [], []
    observe, targets = sched.observe, sched.targets
    sched.observe = lambda fb: observed.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append(fb) or _step(fb, features)
    sched.targets = lambda fb: answered.append((fb, targets(fb))) or answered[-1][1]
    trainer = verl_trainer(cfg, ds, tok, log)
    trainer.entropys = entropys
    def draws():                        # epochs of the loader, as verl's fit loops over them
        while True:
            yield from loader

    it = draws()

    def batches():                      # drawn lazily: each draw follows the previous step's feedback
        for step in range(steps):
            b = rollout(next(it), step, tok, manager, answers)
            rms = list(b.non_tensor_batch["reward_model"])
            before.append((rms, [d["ground_truth"] for d in rms], list(b.non_tensor_batch["uid"])))
            yield b
    trainer.batches = batches()
    trainer.fit()
    return dict(sched=sched, log=log, observed=observed, answered=answered, before=before)


def expected_verl_step(log, step, target_of):
    """Hand-computed (targets per row, scores per row) for one logged verl step."""
    want_t, want_s = [], []
    for i, g in zip(log["ids"], log["g"]):
        p = i - 100
        t = target_of(p)
        a = answer_text(p, g, step)
        gt = t if t is not None else (str(p + 1) if p % 2 == 0 else None)
        want_t.append(t)
        want_s.append(float(a is not None and gt is not None and a == gt))
    return want_t, np.array(want_s)


def check_shared_dicts_untouched(before, log):
    rms, gts, uids = before
    for u in set(uids):                  # repeat(interleave=True) shares one dict per prompt
        rows = [r for r, v in enumerate(uids) if v == u]
        assert all(rms[r] is rms[rows[0]] for r in rows)
    assert [d["ground_truth"] for d in rms] == gts        # no target was written into them
    by_uid = dict(zip(uids, rms))
    for u, t, d in zip(log["uid"], log["target"], log["reward_model"]):
        if t is None:
            assert d is by_uid[u]
        else:                            # a fresh per-row dict carries the target
            assert d is not by_uid[u] and d["ground_truth"] == t
            assert d["dataset_ground_truth"] == by_uid[u]["ground_truth"]


def test_verl_majority_target_rescored_by_verls_reward_manager(verl_env):
    """A target policy written here, so every number is known: unlabelled prompts are
    re-verified against the first-seen majority of their answers by verl's reward manager,
    labelled ones keep their streaming score; the shared reward_model dicts are not touched;
    verl's GRPO advantages follow the new scores; the Scheduler observes the answers."""
    out = run_verl(verl_env, steps=2, sched_factory=lambda pool: Scheduler(pool, compose(first_seen_majority()),
                                                                           seed=1))
    assert len(out["log"]) == 2
    for step, (log, before) in enumerate(zip(out["log"], out["before"])):
        def target_of(p):
            return reference_majority([answer_text(p, g, step) for g in range(G)], p % 2 == 0)
        want_t, want_s = expected_verl_step(log, step, target_of)
        assert log["target"] == want_t
        assert any(t is not None for t in want_t) and any(t is None for t in want_t)
        np.testing.assert_array_equal(log["scores"], want_s)
        np.testing.assert_allclose(log["adv"], grpo_reference(want_s, log["uid"])[:, None] * log["mask"],
                                   rtol=1e-5, atol=1e-6)
        check_shared_dicts_untouched(before, log)
    sched = out["sched"]
    for step, fb in enumerate(out["observed"]):
        assert fb.rewards.shape == (4, G)
        for b, p in enumerate(fb.prompt_ids):
            q = int(sched.pool.ids[p]) - 100
            group = [answer_text(q, g, step) for g in range(G)]       # generation order, despite balancing
            assert list(fb.answers[b]) == group
            gt = str(q + 1) if q % 2 == 0 else reference_majority(group, False)
            assert fb.rewards[b].tolist() == [float(a is not None and a == gt) for a in group]


def test_ttrl_runs_through_verls_reward_path(verl_env):
    """The registered `ttrl` method (data.rlpace.policy=ttrl): pseudo-labels of unlabelled
    prompts are TTRL's first-seen majority, verl's reward manager scores agreement with
    them, and the method's counters count them."""
    out = run_verl(verl_env, steps=3, policy="ttrl")
    sched = out["sched"]
    assert sched.name == "ttrl"
    made = no_target = 0
    for step, log in enumerate(out["log"]):
        def target_of(p):
            return reference_majority([answer_text(p, g, step) for g in range(G)], p % 2 == 0)
        want_t, want_s = expected_verl_step(log, step, target_of)
        assert log["target"] == want_t
        np.testing.assert_array_equal(log["scores"], want_s)
        np.testing.assert_allclose(log["adv"], grpo_reference(want_s, log["uid"])[:, None] * log["mask"],
                                   rtol=1e-5, atol=1e-6)
        check_shared_dicts_untouched(out["before"][step], log)
        firsts = {i: t for i, t in zip(log["ids"], want_t) if (i - 100) % 2 == 1}
        made += sum(t is not None for t in firsts.values())
        no_target += sum(t is None for t in firsts.values())
    m = sched.metrics()
    assert (m["supervision/pseudo_labels"], m["supervision/no_target"]) == (made, no_target) and made > 0


def test_olr_relabels_inside_verls_trainer_with_the_schedulers_targets(verl_env, monkeypatch, tmp_path):
    """`olr` (start_step=0) on 4 labelled prompts, all drawn every step: the majority "m<i>"
    (never the label) has pass rates 0.5, 0.75, 1.0, so OLR keeps the label at step 0 and
    relabels from step 1 on (slope 0.25 ≥ 0.05, history majority agrees). verl's reward
    function sees exactly the targets `Scheduler.targets` returned."""
    import json

    from rlpace.policies import make_policy
    calls_file = tmp_path / "calls.jsonl"
    monkeypatch.setenv("RLPACE_TEST_CALLS", str(calls_file))
    from rlpace.policies._base import SELECTION

    def every_prompt():                  # all N prompts each step, in pool order
        return DataPolicy(SELECTION, lambda pool: EmptyState(), lambda s, p, b: s,
                          lambda state, pool, n, probs, arms, rng: np.arange(n) % len(pool), name="test_all")
    out = run_verl(verl_env, steps=3, answers=olr_answer, n=4, all_labeled=True,
                   sched_factory=lambda pool: Scheduler(pool, compose(every_prompt(),
                                                                      make_policy("olr", start_step=0))))
    assert len(out["answered"]) == 3
    for step, (log, (fb, targets)) in enumerate(zip(out["log"], out["answered"])):
        want = [None] * 4 if step == 0 else [f"m{int(out['sched'].pool.ids[p]) - 100}" for p in fb.prompt_ids]
        assert targets == want
        by_id = {int(out["sched"].pool.ids[p]): t for p, t in zip(fb.prompt_ids, targets)}
        assert log["target"] == [by_id[i] for i in log["ids"]]
        want_s = np.array([float(olr_answer(i - 100, g, step) == (by_id[i] or str(i - 100 + 1)))
                           for i, g in zip(log["ids"], log["g"])])
        np.testing.assert_array_equal(log["scores"], want_s)
    # what verl's reward function was called with when re-verifying: the targets, per rollout
    calls = [json.loads(line) for line in open(calls_file)]
    assert len(calls) == 3 * 4 * G + 2 * 4 * G          # streaming scores + re-verification of steps 1, 2
    relabelled = [c for c in calls if str(c[2]).startswith("m")]
    assert len(relabelled) == 2 * 4 * G                 # steps 1 and 2, every rollout of 4 prompts
    assert all(c[2] == f"m{c[0] - 100}" for c in relabelled)
    log = out["sched"].supervision_log()
    assert log and all(d["rule"].startswith("olr") for d in log)


# ---------------------------------------------------------------- TRL
def trl_answer(completion) -> str | None:
    """A deterministic extractor for the tiny random model's output: its length mod 3 (empty
    completions state no answer), so groups disagree and votes are not trivial."""
    return str(len(completion) % 3) if completion else None


def run_trl(lm, dataset, out, sched, *, steps=3, g=4, extractor=trl_answer, target_column="solution",
            on_generate=None):
    """A real GRPOTrainer run; records each reward-function call, TRL's advantages and the
    Scheduler's answers to `targets` and its observations."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from rlpace.adapters.trl import RlpaceGRPOTrainer
    calls, advantages, observed, answered, generated = [], [], [], [], []
    observe, targets = sched.observe, sched.targets
    sched.observe = lambda fb: observed.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append(fb) or _step(fb, features)
    sched.targets = lambda fb: answered.append((fb, targets(fb))) or answered[-1][1]

    def reward(prompts, completions, solution, index, trainer_state, **kw):
        calls.append((trainer_state.global_step, list(index), list(completions), list(solution)))
        return [float(extractor(c) is not None and extractor(c) == s) for c, s in zip(completions, solution)]

    class Probe(RlpaceGRPOTrainer):
        def _generate(self, prompts):
            res = super()._generate(prompts)
            generated.append(([list(p) for p in res[0]], [list(c) for c in res[1]]))
            if on_generate is not None:
                on_generate(self, *generated[-1])
            return res

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            advantages.append(output["advantages"].clone())
            return output

    cfg = GRPOConfig(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=2 * g, num_generations=g, max_completion_length=6,
                     max_steps=steps, logging_steps=1, save_strategy="no", beta=0.0, temperature=0.9,
                     dataloader_num_workers=0, gradient_checkpointing=False, learning_rate=1e-3)
    trainer = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                    train_dataset=dataset, processing_class=AutoTokenizer.from_pretrained(lm),
                    scheduler=sched, answer_extractor=extractor, target_column=target_column)
    trainer.train()
    return dict(calls=calls, adv=advantages, observed=observed, answered=answered, generated=generated,
                trainer=trainer)


@pytest.fixture(scope="module")
def trl_parts(tmp_path_factory):
    pytest.importorskip("trl")
    import torch
    from _tiny_lm import build_tiny_lm
    from datasets import Dataset
    torch.set_num_threads(1)
    prompts = [f"what is {i} plus 3?" for i in range(8)]
    lm = build_tiny_lm(tmp_path_factory.mktemp("lm"), prompts)
    ds = Dataset.from_list([{"prompt": p, "index": 1000 + i, "data_source": "math", "solution": "1"}
                            for i, p in enumerate(prompts)])
    return lm, ds


def test_ttrl_runs_inside_trls_trainer(trl_parts, tmp_path):
    """`ttrl` with odd prompts unlabelled, G = 4 over 3 steps: each step's targets are the
    first-seen majority of the extracted answers (reference loop over the completions the
    reward function saw), the reward function is called again with those targets as
    `solution`, and TRL trains on agreement rewards: advantages (r − mean)/(std + 1e-4)."""
    import torch
    lm, ds = trl_parts
    g = 4
    from rlpace.adapters.trl import pool_from_dataset
    pool = pool_from_dataset(ds.add_column("labeled", [i % 2 == 0 for i in range(len(ds))]))
    assert pool.labeled.tolist() == [True, False] * 4 and pool_from_dataset(ds).labeled.all()
    out = run_trl(lm, ds, tmp_path, Scheduler(pool, "ttrl", seed=3), g=g)
    calls, adv, observed = out["calls"], out["adv"], out["observed"]
    assert len(observed) == 3 and len(adv) == 3
    n_second = 0
    by_step = {}
    for c in calls:
        by_step.setdefault(c[0], []).append(c)
    for k, (fb, a) in enumerate(zip(observed, adv)):
        first = by_step[fb.step][0]
        _, index, completions, solution = first
        assert solution == ["1"] * len(index)                    # the dataset column, first call
        answers = np.array([trl_answer(c) for c in completions], dtype=object).reshape(-1, g)
        ids = np.array(index).reshape(-1, g)[:, 0]
        labeled = (ids - 1000) % 2 == 0
        want_t = [reference_majority(list(answers[b]), labeled[b]) for b in range(len(ids))]
        assert out["answered"][k][1] == want_t
        if any(t is not None for t in want_t):
            _, index2, completions2, solution2 = by_step[fb.step][1]       # the re-verification call
            n_second += 1
            assert completions2 == completions
            assert solution2 == [want_t[r // g] if want_t[r // g] is not None else "1" for r in range(len(index))]
        want_r = np.zeros(answers.shape)
        for b in range(len(ids)):
            gt = "1" if labeled[b] else want_t[b]
            want_r[b] = [float(gt is not None and x == gt) for x in answers[b]]
        np.testing.assert_array_equal(fb.rewards, want_r)
        assert [list(r) for r in fb.answers] == [list(r) for r in answers]
        rr = torch.tensor(want_r)
        base = (rr - rr.mean(1, keepdim=True)) / (rr.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(a.double(), base.view(-1), rtol=1e-5, atol=1e-5)
    assert n_second >= 1


def test_olr_runs_inside_trls_trainer_with_the_schedulers_targets(trl_parts, tmp_path):
    """`olr` (start_step=0, slope_threshold=0) with an extractor that always answers "m" while
    the label is "1": prompts are drawn every step (pool order), the first visit keeps the
    label (reward 0), later visits are relabelled to "m" (slope 0 ≥ 0, history agrees) and
    the reward function re-verifies against exactly the targets `Scheduler.targets` gave."""
    from rlpace.policies import make_policy
    from rlpace.policies._base import SELECTION
    lm, ds = trl_parts
    g = 2

    def first_two():
        return DataPolicy(SELECTION, lambda pool: EmptyState(), lambda s, p, b: s,
                          lambda state, pool, n, probs, arms, rng: np.arange(n) % 2, name="test_first_two")
    sched = Scheduler(Pool(ds["data_source"], ids=ds["index"]),
                      compose(first_two(), make_policy("olr", start_step=0, slope_threshold=0.0)))
    out = run_trl(lm, ds, tmp_path, sched, g=g, steps=3, extractor=lambda c: "m")
    by_step = {}
    for c in out["calls"]:
        by_step.setdefault(c[0], []).append(c)
    assert [t for _, t in out["answered"]] == [[None, None], ["m", "m"], ["m", "m"]]
    for k, fb in enumerate(out["observed"]):
        targets = out["answered"][k][1]
        calls = by_step[fb.step]
        assert len(calls) == (1 if k == 0 else 2)
        if k:
            assert calls[1][3] == [targets[r // g] for r in range(len(calls[1][1]))]
        np.testing.assert_array_equal(fb.rewards, np.full((2, g), 0.0 if k == 0 else 1.0))
    assert [d["decision"] for d in sched.supervision_log()] == ["relabel"] * 4


def test_self_certainty_reward_comes_from_an_extra_forward_in_trl(trl_parts, tmp_path):
    """`self_certainty` on unlabelled prompts: the Feedback carries each rollout's mean
    KL(U ‖ p_t) at the sampling temperature — checked against a per-sequence forward without
    padding and a numpy loop — and TRL trains on it as the reward."""
    import torch
    lm, ds = trl_parts
    g, temp = 2, 0.9
    reference = []

    def on_generate(trainer, prompt_ids, completion_ids):
        vals = []
        with torch.no_grad():
            for p, c in zip(prompt_ids, completion_ids):
                if not c:
                    vals.append(0.0)
                    continue
                logits = trainer.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:len(p) - 1 + len(c)]
                z = logits.double().numpy() / temp
                kl = []
                for t in range(len(c)):
                    logp = z[t] - np.log(np.exp(z[t] - z[t].max()).sum()) - z[t].max()
                    kl.append(np.mean(-np.log(len(z[t])) - logp))          # Σ_j (1/V) log((1/V) / p_j)
                vals.append(float(np.mean(kl)))
        reference.append(np.array(vals))

    pool = Pool(ds["data_source"], ids=ds["index"], labeled=[False] * len(ds))
    out = run_trl(lm, ds, tmp_path, Scheduler(pool, "self_certainty", seed=0), g=g, steps=2, target_column=None,
                  on_generate=on_generate)
    assert len(out["observed"]) == 2
    for fb, ref, a in zip(out["observed"], reference, out["adv"]):
        np.testing.assert_allclose(fb.self_certainty.ravel(), ref, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(fb.rewards, fb.self_certainty, rtol=1e-6)     # via TRL's float32 rewards
        rr = torch.tensor(fb.rewards)
        base = (rr - rr.mean(1, keepdim=True)) / (rr.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(a.double(), base.view(-1), rtol=1e-4, atol=1e-4)
        assert (ref > 0).all()


def test_entropy_min_reward_after_verls_old_log_prob_pass(verl_env):
    """`entropy_min` (token level): verl computes per-token entropies in its old-log-prob pass
    (then `fit` pops them); the mixin averages them over the response mask and the reward
    place writes −mean H into the unlabelled rows' sequence scores, which verl's
    `compute_advantage` then reads. Entropy of row r at token t: 0.1·g + 0.01·t."""
    import torch

    def entropys(batch):
        g = torch.as_tensor(batch.non_tensor_batch["test_g"].astype(np.float64))
        t = torch.arange(batch.batch["responses"].shape[1], dtype=torch.float64)
        return (0.1 * g[:, None] + 0.01 * t[None, :]).float()

    out = run_verl(verl_env, steps=2, policy="entropy_min", entropys=entropys)
    for step, log in enumerate(out["log"]):
        lengths = log["mask"].sum(-1)
        want = []
        for i, g, L in zip(log["ids"], log["g"], lengths):
            p = i - 100
            if p % 2 == 0:
                a = answer_text(p, g, step)
                want.append(float(a is not None and a == str(p + 1)))
            else:
                want.append(-np.mean([0.1 * g + 0.01 * t for t in range(int(L))]))
        np.testing.assert_allclose(log["scores"], want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(log["adv"], grpo_reference(np.array(want), log["uid"])[:, None] * log["mask"],
                                   rtol=1e-4, atol=1e-5)
        assert log["target"] == [None] * len(want)
    fb = out["observed"][0]
    assert fb.token_entropy is not None and (fb.token_entropy >= 0).all()


def test_v1_trainer_refuses_token_statistic_rewards(verl_env, monkeypatch):
    """verl's own V1 trainer building the dataset with `entropy_min` is refused before any rollout
    (token statistics exist after sampling; only rlpace's V1 trainer applies them); `ttrl` is built."""
    from test_adapter_verl import StubTrainer, _v1_trainer

    from rlpace.adapters import _verl_v1
    import rlpace.adapters.verl as rv
    tok, root = verl_env
    kw = dict(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
              max_off_policy_strategy="drop", refill_fn=StubTrainer()._add_prompts_to_generate)
    for policy, ok in (("entropy_min", False), ("ttrl", True)):
        cfg = verl_config(root, policy).data
        cfg.gen_batch_size = 1
        buf = _verl_v1.RlpaceReplayBuffer(sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1}, **kw)
        t = _v1_trainer(cfg, tok, buf)
        if ok:
            t._init_dataloader()
            assert isinstance(t.train_dataset, rv.RlpaceDataset)
        else:
            with pytest.raises(ValueError, match="token statistic 'token_entropy'.*trainer_mode=rlpace_sync"):
                t._init_dataloader()


def test_trl_target_method_without_target_column_is_refused(trl_parts, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from rlpace.adapters.trl import RlpaceGRPOTrainer
    lm, ds = trl_parts
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                     per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
                     dataloader_num_workers=0)
    kw = dict(model=AutoModelForCausalLM.from_pretrained(lm), args=cfg, train_dataset=ds,
              processing_class=AutoTokenizer.from_pretrained(lm),
              reward_funcs=lambda completions, **k: [0.0] * len(completions))
    pool = Pool(ds["data_source"], ids=ds["index"], labeled=[False] * len(ds))
    with pytest.raises(ValueError, match="target_column='solution'"):
        RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "ttrl"))
    with pytest.raises(ValueError, match="no 'label' column"):
        RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "ttrl"), target_column="label")
    RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "self_certainty"))          # no target place: fine
    # a reward place over several reward functions needs TRL's sum_then_normalize aggregation
    two = dict(kw, reward_funcs=[kw["reward_funcs"]] * 2,
               args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                               per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
                               dataloader_num_workers=0, multi_objective_aggregation="normalize_then_sum"))
    with pytest.raises(ValueError, match="multi_objective_aggregation='normalize_then_sum'"):
        RlpaceGRPOTrainer(**two, scheduler=Scheduler(pool, "self_certainty"))
    RlpaceGRPOTrainer(**two, scheduler=Scheduler(pool, "uniform"))                 # no reward place: fine


V1_SCRIPT = textwrap.dedent('''
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np, ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    import transfer_queue as tq
    from omegaconf import OmegaConf
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))

    from rlpace import Pool, Scheduler
    import rlpace.adapters.verl as rv
    from rlpace.adapters import _verl_v1
    from tokenizers import decoders
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl07._verl_data import make_tokenizer
    tok = make_tokenizer()
    tok.backend_tokenizer.decoder = decoders.ByteLevel()

    ANSWERS = json.loads(sys.argv[3])
    LABELS = {"100": "1", "101": "x", "102": "3", "103": "x"}
    pool = Pool(["math"] * 4, ids=[100, 101, 102, 103], labeled=[True, False, True, False])
    sched = Scheduler(pool, "ttrl")
    from _isolated import recording_tq_worker
    observed, worker = recording_tq_worker(sched)                     # verl's write path, no server

    def write_group(uid, index, step):
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "running", "global_steps": step})
        for s, a in enumerate(ANSWERS[str(index)]):
            ids = tok.encode("so" if a is None else "so <answer>" + a + "</answer>")
            out = AgentLoopOutput(prompt_ids=[1, 2], response_ids=ids, response_mask=[1] * len(ids),
                                  metrics=AgentLoopMetrics(), extra_fields={})
            r = float(a is not None and a == LABELS[str(index)])     # the streaming score: dataset label
            out.reward_score = r
            out.extra_fields["reward_extra_info"] = {"acc": r, "score": r, "pred": a or ""}
            asyncio.run(worker._agent_loop_postprocess(
                [out], False, uid=uid, session_id=s, global_steps=step, index=index, data_source="math",
                reward_model={"style": "rule", "ground_truth": LABELS[str(index)]}, extra_info={"index": index}))
        tq.kv_put(key=uid, partition_id="train", tag={"is_prompt": True, "status": "finished", "global_steps": step})

    class Trainer:                        # what verl's refill_fn is bound to: config and tokenizer
        config = OmegaConf.create({"reward": {"reward_manager": {"source": "register", "name": "naive"},
                                              "custom_reward_function": {"path": sys.argv[1], "name": "compute_score"},
                                              "sandbox_fusion": None}})
        tokenizer = tok
        train_dataset = type("Dataset", (), {"rlpace": rv.VerlFeedback(sched, reward_key="acc")})

        def _add_prompts_to_generate(self, n):
            raise AssertionError("ttrl keeps every group")

    buf = _verl_v1.RlpaceReplayBuffer(trainer_mode="sync", trainer_config={}, max_off_policy_threshold=None,
                                      max_off_policy_strategy="drop", poll_interval=0.0,
                                      refill_fn=Trainer()._add_prompts_to_generate,
                                      sampler_kwargs={"train_batch_size": 4, "gen_batch_size": 1})
    for i, uid in enumerate(["uA", "uB", "uC", "uD"]):
        write_group(uid, 100 + i, 1)
    meta, metrics = buf.sample(global_steps=2, partition_id="train", batch_size=4)
    keys = sorted(meta.keys)
    data = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["rm_scores", "responses"])
    print("RESULT " + json.dumps({
        "keys": keys, "scores": {k: float(v.sum()) for k, v in zip(keys, data["rm_scores"])},
        "last": {k: float(v[-1]) for k, v in zip(keys, data["rm_scores"])},
        "observed": [[fb.prompt_ids.tolist(), fb.rewards.tolist(), [list(r) for r in fb.answers]] for fb in observed],
        "metrics": {k: v for k, v in sched.metrics().items() if k.startswith("supervision/")}}), flush=True)
    tq.close()
    ray.shutdown()
''')


@pytest.mark.slow
def test_ttrl_on_verl_v1_replay_buffer_over_real_transfer_queue(verl_env, tmp_path):
    """verl's V1 trainer: finished groups written by verl's own agent-loop write path into a real
    TransferQueue; the replay buffer decodes the responses, votes (TTRL, unlabelled 101 and 103),
    re-verifies with verl's reward manager and writes the new `rm_scores` (what verl's
    `_compute_advantage` reads) before the Scheduler observes the groups."""
    import json
    import os
    pytest.importorskip("transfer_queue")
    pytest.importorskip("ray")
    _, root = verl_env
    answers = {"100": ["1", "2", "1"], "101": ["7", "3", "3"], "102": [None, "5", "5"], "103": ["4", "9", None]}
    script = tmp_path / "v1_run.py"
    script.write_text(V1_SCRIPT)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    from _isolated import run_result_script
    out = run_result_script(script, [root / "reward_fn.py", tests_dir, json.dumps(answers)], tmp_path, 300,
                            "TransferQueue/Ray")
    labels = {100: "1", 102: "3"}
    want = {}
    for uid, index in zip("ABCD", range(100, 104)):
        group = answers[str(index)]
        target = labels.get(index) or reference_majority(group, False)
        for s, a in enumerate(group):
            want[f"u{uid}_{s}_0"] = float(a is not None and a == target)
    assert out["keys"] == sorted(want)
    assert out["scores"] == want and out["last"] == want          # the score sits on the last token
    (ids, rewards, got_answers), = out["observed"]
    for p, r, a in zip(ids, rewards, got_answers):
        assert a == answers[str(100 + p)]
        assert r == [want[f"u{'ABCD'[p]}_{s}_0"] for s in range(3)]
    assert out["metrics"]["supervision/pseudo_labels"] == 2


def test_verl_refuses_token_rewards_it_cannot_compute(verl_env):
    """Before `fit` runs: self-certainty (verl's actor returns no logits) and an entropy reward
    with rollout-correction bypass mode (no old-log-prob pass) are ValueErrors."""
    from omegaconf import OmegaConf
    tok, root = verl_env
    for policy, algo, msg in (("self_certainty", {}, "self-certainty"),
                              ("entropy_min", {"rollout_correction": {"bypass_mode": True}}, "bypass_mode")):
        cfg = verl_config(root, policy)
        cfg.algorithm = OmegaConf.merge(cfg.algorithm, algo)
        ds, _ = build_verl(cfg, tok)
        t = verl_trainer(cfg, ds, tok, [])
        t.batches = iter(())
        with pytest.raises(ValueError, match=msg):
            t.fit()


DDP_WORKER = textwrap.dedent('''
    import json, os, sys
    import numpy as np, torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace import Pool, Scheduler
    from rlpace.adapters.trl import RlpaceGRPOTrainer

    lm, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    G = 2
    ds = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i, "data_source": "math",
                             "solution": "1"} for i in range(8)])
    sched = Scheduler(Pool(ds["data_source"], ids=ds["index"], labeled=[False] * 8), "ttrl", seed=5)
    answered, observed, calls = [], [], []
    targets, observe = sched.targets, sched.observe
    sched.targets = lambda fb: answered.append(targets(fb)) or answered[-1]
    sched.observe = lambda fb: observed.append([fb.prompt_ids.tolist(), fb.rewards.tolist(),
                                                [list(r) for r in fb.answers]]) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append([fb.prompt_ids.tolist(), fb.rewards.tolist(),
                                                            [list(r) for r in fb.answers]]) or _step(fb, features)
    ext = lambda c: str(len(c) % 3) if c else None

    def reward(prompts, completions, index, solution, trainer_state, **kw):
        calls.append([trainer_state.global_step, list(index), list(completions), list(solution)])
        return [float(ext(c) == s) for c, s in zip(completions, solution)]

    # 3 rows per rank, G = 2: the second prompt of each generation batch straddles the ranks
    cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=3, num_generations=G, max_completion_length=6,
                     max_steps=3, beta=0.0, save_strategy="no", logging_steps=100, dataloader_num_workers=0,
                     gradient_checkpointing=False, learning_rate=1e-3)
    RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg,
                      train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched,
                      answer_extractor=ext, target_column="solution").train()
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"answered": answered, "observed": observed, "calls": calls,
                   "state": {k: np.asarray(v).tolist() for k, v in sched.state_dict().items()}}, f)
''')


@pytest.mark.slow
def test_ttrl_in_trl_votes_on_groups_gathered_across_ranks(trl_parts, tmp_path):
    """Two CPU ranks (torchrun, gloo), 3 rows each with G = 2, so a group straddles the ranks:
    both ranks decide the same targets from the gathered answers (a reference vote over both
    ranks' completions), each rank re-scores its own rows against them, and both Schedulers
    observe the same agreement rewards and end in the same state."""
    import json

    from _isolated import run_two_ranks
    lm, _ = trl_parts
    run_two_ranks(DDP_WORKER, lm, tmp_path, port=29547, timeout=400)
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["answered"] == r1["answered"] and r0["observed"] == r1["observed"] and r0["state"] == r1["state"]
    assert len(r0["observed"]) == 3

    def ext(c):
        return str(len(c) % 3) if c else None
    by_step = [{}, {}]                  # rank -> step -> [first call, re-verification call?]
    for rank, r in enumerate((r0, r1)):
        for c in r["calls"]:
            by_step[rank].setdefault(c[0], []).append(c)
    steps = sorted(by_step[0])
    assert steps == sorted(by_step[1]) and len(steps) == 3
    n_rescored = 0
    for k, (ids, rewards, answers) in enumerate(r0["observed"]):
        a, b = by_step[0][steps[k]][0], by_step[1][steps[k]][0]
        assert a[3] == b[3] == ["1"] * 3                                 # the dataset column
        completions = a[2] + b[2]                                        # process-major = global order
        want_answers = np.array([ext(c) for c in completions], dtype=object).reshape(-1, 2)
        assert answers == [list(x) for x in want_answers]
        want_t = [reference_majority(list(x), False) for x in want_answers]
        assert r0["answered"][k] == want_t
        want_r = [[float(t is not None and x == t) for x in row] for row, t in zip(want_answers, want_t)]
        assert rewards == want_r
        local_t = [want_t[r // 2] for r in range(6)]
        for rank in (0, 1):
            calls = by_step[rank][steps[k]]
            assert len(calls) == (2 if any(t is not None for t in want_t) else 1)
            if len(calls) == 2:
                assert calls[1][2] == calls[0][2]
                assert calls[1][3] == [t if t is not None else "1" for t in local_t[3 * rank:3 * rank + 3]]
                n_rescored += 1
    assert n_rescored > 0


PM_REWARD_FILE = textwrap.dedent('''
    import re

    def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):
        found = re.findall(r"<answer>(.*?)</answer>", solution_str)
        ok = bool(found) and found[-1].strip() == str(ground_truth).strip()
        return {"score": 1.0 if ok else -1.0, "acc": float(ok), "pred": found[-1].strip() if found else ""}
''')


def v1_supervise(verl_env, monkeypatch, answers: dict, labels: dict, labeled: dict, reward_file: str):
    """`RlpaceReplayBuffer._supervise` on finished groups held by a stand-in TransferQueue (the
    real one: test_ttrl_on_verl_v1_replay_buffer_over_real_transfer_queue). Keys
    `u<id>_<session>_0` sorted as strings, as `_dapo_filtered_keys` hands them over; the rows'
    rewards are the streaming `acc` against the parquet label. Returns (rows out, [(key,
    rm_scores written)], the Scheduler)."""
    import torch
    from omegaconf import OmegaConf

    import rlpace.adapters.verl as rv
    from rlpace.adapters import _verl_v1
    from rlpace.adapters._convert import Rows
    tok, root = verl_env
    (root / reward_file).write_text(PM_REWARD_FILE)
    keys = sorted(f"u{i}_{s}_0" for i in answers for s in range(len(answers[i])))
    ans = {k: answers[int(k[1:4])][int(k.split("_")[1])] for k in keys}
    ids = {k: tok.encode("so" if ans[k] is None else f"so <answer>{ans[k]}</answer>") for k in keys}
    puts = []

    class FakeTQ:
        def kv_batch_get(self, keys, partition_id, select_fields):
            idx = [int(k[1:4]) for k in keys]
            return {"responses": [torch.tensor(ids[k]) for k in keys],
                    "reward_model": [{"style": "rule", "ground_truth": labels[i]} for i in idx],
                    "data_source": ["math"] * len(keys), "extra_info": [{"index": i} for i in idx]}

        def kv_batch_put(self, keys, partition_id, fields):
            puts.extend((k, t.tolist()) for k, t in zip(keys, fields["rm_scores"].unbind()))
    monkeypatch.setattr(_verl_v1._rb, "tq", FakeTQ())
    pids = sorted(answers)
    sched = Scheduler(Pool(["math"] * len(pids), ids=pids, labeled=[labeled[i] for i in pids]), "ttrl")

    class Trainer:
        train_dataset = type("Dataset", (), {"rlpace": rv.VerlFeedback(sched, reward_key="acc")})
        config = OmegaConf.create({"reward": {"reward_manager": {"source": "register", "name": "naive"},
                                              "custom_reward_function": {"path": str(root / reward_file),
                                                                         "name": "compute_score"},
                                              "sandbox_fusion": None}})
        tokenizer = tok
    buf = object.__new__(_verl_v1.RlpaceReplayBuffer)
    buf._rlpace_trainer, buf.rlpace_answer_extractor = Trainer(), extract_answer
    buf.partitions = {"train": dict.fromkeys(keys)}
    streaming_acc = np.array([float(ans[k] == labels[int(k[1:4])]) for k in keys])
    rows = Rows(np.array([k.split("_")[0] for k in keys], dtype=object), np.array([int(k[1:4]) for k in keys]),
                streaming_acc)
    return keys, buf._supervise("train", keys, rows, step=0), puts, sched, ids


def test_v1_rescored_rows_train_on_the_reward_managers_score_not_on_acc(verl_env, monkeypatch):
    """verl V1: with a reward function whose score (±1, as verl's math_dapo) differs from its
    `acc` (0/1), re-verified rollouts get the reward manager's *score* in `rm_scores` (what
    verl trains on) while the Scheduler observes `acc`; rollouts of a labelled prompt are not
    rewritten. Unlabelled 101 (parquet label "7", hidden): answers 7, 3, 3 → TTRL target "3"
    → score −1, +1, +1 (acc 0, 1, 1); labelled 100 keeps its streaming score."""
    keys, out, puts, _, ids = v1_supervise(verl_env, monkeypatch, {100: ["1", "2", "1"], 101: ["7", "3", "3"]},
                                           {100: "1", 101: "7"}, {100: True, 101: False}, "reward_pm.py")
    np.testing.assert_array_equal(out.rewards, [1, 0, 1, 0, 1, 1])                 # acc: observed
    assert [k for k, _ in puts] == ["u101_0_0", "u101_1_0", "u101_2_0"]             # only re-verified rows
    for (k, sc), want in zip(puts, [-1.0, 1.0, 1.0]):                               # the manager's score
        assert sc[-1] == want and sum(sc) == want and len(sc) == len(ids[k])


def test_v1_votes_in_session_order_past_ten_rollouts(verl_env, monkeypatch):
    """verl V1 with G = 12: keys sort as strings (`u101_10_0` before `u101_2_0`), but TTRL's
    first-seen tie rule reads the rollouts in session order: session 2 says "b", session 10
    says "a", the others nothing — target "b" (string order would give "a")."""
    group = [None] * 12
    group[2], group[10] = "b", "a"
    keys, out, puts, sched, _ = v1_supervise(verl_env, monkeypatch, {101: group}, {101: "z"}, {101: False},
                                             "reward_pm.py")
    assert keys.index("u101_10_0") < keys.index("u101_2_0")
    got = dict(zip(keys, out.rewards))
    assert got["u101_2_0"] == 1.0 and got["u101_10_0"] == 0.0 and sum(out.rewards) == 1.0
    assert dict(puts)["u101_2_0"][-1] == 1.0 and dict(puts)["u101_10_0"][-1] == -1.0
    assert [a for a in out.answers] == [group[int(k.split("_")[1])] for k in keys]


def test_reward_place_leaves_the_groups_it_does_not_change_on_verls_score(verl_env):
    """Legacy trainer, `entropy_min` with a reward function whose score (±1) differs from its
    `acc` (0/1): the reward place replaces the unlabelled groups' scores by −mean H and leaves
    the labelled groups (which it does not change) on verl's ±1 score — not on `acc`, which
    would put one batch's groups on two scales. Entropy of row r at token t: 0.1·g + 0.01·t."""
    import torch
    tok, root = verl_env
    (root / "reward_pm.py").write_text(PM_REWARD_FILE)

    def entropys(batch):
        g = torch.as_tensor(batch.non_tensor_batch["test_g"].astype(np.float64))
        t = torch.arange(batch.batch["responses"].shape[1], dtype=torch.float64)
        return (0.1 * g[:, None] + 0.01 * t[None, :]).float()

    out = run_verl(verl_env, steps=1, policy="entropy_min", entropys=entropys, reward_file="reward_pm.py")
    log = out["log"][0]
    want, acc = [], []
    for i, g, L in zip(log["ids"], log["g"], log["mask"].sum(-1)):
        p = i - 100
        ok = answer_text(p, g, 0) == str(p + 1)
        acc.append(float(ok) if p % 2 == 0 else None)
        want.append((1.0 if ok else -1.0) if p % 2 == 0 else -np.mean([0.1 * g + 0.01 * t for t in range(int(L))]))
    assert any(a == 0.0 for a in acc)                       # a labelled row where ±1 and acc differ
    np.testing.assert_allclose(log["scores"], want, rtol=1e-5, atol=1e-6)
    fb = out["observed"][0]                                 # rlpace observes acc on labelled prompts
    for b, p in enumerate(fb.prompt_ids):
        q = int(out["sched"].pool.ids[p]) - 100
        if q % 2 == 0:
            assert fb.rewards[b].tolist() == [float(answer_text(q, g, 0) == str(q + 1)) for g in range(G)]


def graded_weights() -> DataPolicy:
    """An advantage policy written here: w = (1 + id mod 3)/3 · (g + 1)/G for rollout g (in
    generation order) of the prompt with stable id `id`, so a weight applied twice, to a
    different row or to a reordered group shows in the advantages."""
    from rlpace.policies._base import ADVANTAGE

    def apply(state, pool, batch):
        ids = np.asarray(pool.ids)[batch.prompt_ids].astype(np.int64)
        g = batch.rewards.shape[1]
        return ((1 + ids % 3) / 3.0)[:, None] * ((np.arange(g) + 1) / g)[None, :]
    return DataPolicy(ADVANTAGE, lambda pool: EmptyState(), lambda s, p, b: s, apply, name="test_graded")


def test_verl_advantage_weights_multiply_verls_advantages_once_on_the_right_rows(verl_env):
    """An advantage place in the legacy trainer: after verl's GRPO advantages (over rows that
    batch balancing reordered), each row's advantage is multiplied by its own weight exactly once
    — reference: a GRPO loop over the streaming scores times w(id, g) from the row's recorded
    rollout number."""
    out = run_verl(verl_env, steps=2, sched_factory=lambda pool: Scheduler(pool, compose(graded_weights()), seed=1))
    assert len(out["log"]) == 2
    for step, log in enumerate(out["log"]):
        scores = np.array([float(answer_text(i - 100, g, step) == str(i - 100 + 1))
                           for i, g in zip(log["ids"], log["g"])])
        np.testing.assert_array_equal(log["scores"], scores)
        w = np.array([(1 + i % 3) / 3.0 * (g + 1) / G for i, g in zip(log["ids"], log["g"])])
        assert len(set(np.round(w, 6))) > 4 and log["g"] != sorted(log["g"])
        np.testing.assert_allclose(log["adv"], (grpo_reference(scores, log["uid"]) * w)[:, None] * log["mask"],
                                   rtol=1e-5, atol=1e-6)


def test_trl_advantage_weights_multiply_trls_advantages_once(trl_parts, tmp_path):
    """An advantage place in TRL: the advantages TRL hands to the loss are its group-normalised
    ones, (r − mean)/(std + 1e-4), times w(id, g) of each row, once."""
    import torch
    lm, ds = trl_parts
    g = 4
    sched = Scheduler(Pool(ds["data_source"], ids=ds["index"]), compose(graded_weights()), seed=2)
    out = run_trl(lm, ds, tmp_path, sched, g=g, steps=2, target_column=None)
    assert len(out["observed"]) == 2
    for fb, a in zip(out["observed"], out["adv"]):
        ids = np.asarray(sched.pool.ids)[fb.prompt_ids].astype(np.int64)
        w = ((1 + ids % 3) / 3.0)[:, None] * ((np.arange(g) + 1) / g)[None, :]
        rr = torch.tensor(fb.rewards)
        base = (rr - rr.mean(1, keepdim=True)) / (rr.std(1, keepdim=True) + 1e-4)
        torch.testing.assert_close(a.double(), (base * torch.tensor(w)).view(-1), rtol=1e-5, atol=1e-5)
        assert (base != 0).any()
