"""RlpaceSelector and RlpaceGroupFeedback against the installed Trinity-RFT 0.6 (run in
.venv-trinity: `make test-trinity`; the main env has no Trinity and skips this module).

The explorer's selector loop, with Trinity's own classes: `get_taskset_scheduler` builds the
`TasksetScheduler` and loads the selector from its dotted `selector_type`; its `read()`
gives `Task`s from a JSON-lines taskset through Trinity's `TaskFileReader`; each task's
real `MathWorkflow` with Trinity's `AccuracyReward` scores the answers of a scripted model
(what vLLM would return); the experiences go through a real `ExperiencePipeline` (serialized,
operators from the registry) whose metrics reach `TasksetScheduler.feedback`; the checkpoint
is `StateManager.save_explorer` / `load_explorer`, the explorer's own JSON file. Only the
model is scripted: vLLM does not run on CPU.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import numpy as np
import pytest

pytest.importorskip("trinity.buffer.task_scheduler")

import torch  # noqa: E402
from trinity.buffer.operators import create_operators  # noqa: E402
from trinity.buffer.pipelines.experience_pipeline import ExperiencePipeline  # noqa: E402
from trinity.buffer.task_scheduler import get_taskset_scheduler  # noqa: E402
from trinity.common.config import (Config, DataSelectorConfig, FormatConfig, OperatorConfig,  # noqa: E402
                                   StorageConfig)
from trinity.common.experience import Experience  # noqa: E402
from trinity.manager.state_manager import StateManager  # noqa: E402

import rlpace.adapters.trinity as rt  # noqa: E402
from rlpace import Feedback, InputError, Pool, Scheduler  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")
N, B, G, SEED = 18, 4, 4, 3
P = {"easy": 0.9, "hard": 0.1, "mid": 0.5}          # the scripted model's success rate per domain
DOMAINS = [("easy", "hard", "mid")[i % 3] for i in range(N)]
SELECTOR = "rlpace.adapters.trinity.RlpaceSelector"
OPERATOR = "rlpace.adapters.trinity.RlpaceGroupFeedback"


class ScriptedModel:
    """Stands in for Trinity's ModelWrapper: `chat(messages, n)` answers task i correctly with
    probability P[domain of i], drawn from rng([7, step, i]) (what `expected_rewards` redraws)."""

    def __init__(self, step: int):
        self.step = step

    def chat(self, messages, n=1, **_):
        i = int(re.search(r"What is (\d+)\+1", messages[-1]["content"]).group(1))
        right = np.random.default_rng([7, self.step, i]).random(n) < P[DOMAINS[i]]
        return [Experience(tokens=torch.tensor([1, 2, 3]), prompt_length=1,
                           response_text=f"The answer is \\boxed{{{i + 1 if r else -5}}}.") for r in right]


def expected_rewards(step: int, i: int) -> list[float]:
    return (np.random.default_rng([7, step, i]).random(G) < P[DOMAINS[i]]).astype(float).tolist()


def config(root, policy="dump", operator=OPERATOR, **kwargs) -> Config:
    root.mkdir(exist_ok=True)
    with open(root / "train.jsonl", "w") as f:
        for i, d in enumerate(DOMAINS):
            f.write(json.dumps({"question": f"What is {i}+1?", "answer": str(i + 1), "data_source": d}) + "\n")
    cfg = Config()
    cfg.buffer.batch_size, cfg.buffer.total_epochs = B, 20
    sel = DataSelectorConfig(selector_type=SELECTOR, seed=SEED,
                             kwargs={"policy": policy, "domain_key": "data_source", **kwargs})
    cfg.buffer.explorer_input.tasksets = [StorageConfig(
        name="toy", path=str(root), split="train", repeat_times=G, batch_size=B, total_epochs=20,
        default_workflow_type="math_workflow", default_reward_fn_type="accuracy_reward",
        format=FormatConfig(prompt_key="question", response_key="answer"), data_selector=sel)]
    cfg.buffer.trainer_input.experience_buffer = StorageConfig(
        name="exp", storage_type="file", path=str(root / "exp.jsonl"), schema_type="experience", wrap_in_ray=False)
    cfg.data_processor.experience_pipeline.save_input = False
    cfg.data_processor.experience_pipeline.operators = [OperatorConfig(name=operator)]
    return cfg


async def pipeline(cfg) -> ExperiencePipeline:
    pipe = ExperiencePipeline(cfg)
    # ExperiencePipeline.prepare() minus the auxiliary-model allocation (it imports vLLM)
    await pipe.output.acquire()
    pipe.operators = create_operators(cfg.data_processor.experience_pipeline.operators, {})
    return pipe


def experiences(tasks, step: int) -> list:
    """Each task's real workflow run on the scripted model, as Trinity's WorkflowRunner runs it."""
    exps = []
    for t_id, task in enumerate(tasks):
        task = dataclasses.replace(task, batch_id=step, task_id=t_id)          # as Trinity's scheduler
        wf = task.to_workflow(model=ScriptedModel(step))
        wf.set_repeat_times(G, 0)
        for e in wf.run():
            e.eid.batch, e.eid.task = task.batch_id, task.task_id
            e.info["task_index"] = task.index
            exps.append(e)
    return exps


async def explore(taskset, pipe, first: int, last: int) -> list[list[int]]:
    """Explorer steps first..last: read → run each task's workflow → pipeline → feedback."""
    batches = []
    for step in range(first, last + 1):
        tasks = await taskset.read()
        taskset.feedback(await pipe.process(Experience.serialize_many(experiences(tasks, step))))
        batches.append([t.index["index"] for t in tasks])
    return batches


async def explore_fully_async(taskset, pipe, steps: int, window: int, finish: bool = False) -> list[list[int]]:
    """Trinity's fully_async explorer (`Explorer.explore_step`): read step s, and when `window`
    batches are in flight (`explorer.max_inflight_batches`) finish the oldest first (its feedback
    reaches the selector then), then submit s. After the last read the batches stay in flight
    (the explorer's weight-sync watcher writes its checkpoint then), or with `finish` are
    finished in order (`finish_current_steps`, what every other sync style does before it
    writes one)."""
    batches, in_flight = [], []
    for step in range(1, steps + 1):
        tasks = await taskset.read()
        if len(in_flight) >= window:
            taskset.feedback(await pipe.process(Experience.serialize_many(in_flight.pop(0))))
        in_flight.append(experiences(tasks, step))
        batches.append([t.index["index"] for t in tasks])
    while finish and in_flight:
        taskset.feedback(await pipe.process(Experience.serialize_many(in_flight.pop(0))))
    return batches


def selector(taskset) -> rt.RlpaceSelector:
    return taskset.tasksets[0].reader.selector


def run(cfg, steps: int, state=None):
    async def go():
        taskset = get_taskset_scheduler(state or {}, cfg)
        first = (state or {}).get("latest_iteration", 0) + 1
        return taskset, await explore(taskset, await pipeline(cfg), first, first + steps - 1)
    return asyncio.run(go())


def assert_same_state(a: Scheduler, b: Scheduler):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)


def test_trinity_loads_the_selector_and_every_rollout_reaches_the_scheduler(tmp_path):
    taskset, batches = run(config(tmp_path / "a"), steps=5)
    sel = selector(taskset)
    assert isinstance(sel, rt.RlpaceSelector) and sel.scheduler.name == "dump"
    # reference: the same Scheduler driven by hand with the rewards the scripted model earns
    ref = Scheduler(Pool(DOMAINS), "dump", seed=SEED)
    for step, ids in enumerate(batches, start=1):
        assert ref.propose(B).tolist() == ids                      # Trinity read what rlpace proposed
        ref.observe(Feedback(np.array(ids), np.array([expected_rewards(step, i) for i in ids]),
                             step=step - 1))
    assert_same_state(sel.scheduler, ref)
    m = sel.scheduler.metrics()
    assert m["rollouts_observed"] == 5 * B * G and m["groups_observed"] == 5 * B
    wins = sum(sum(expected_rewards(s, i)) for s, ids in enumerate(batches, 1) for i in ids)
    assert int(sel.scheduler.history.successes.sum()) == wins and 0 < wins < 5 * B * G


def test_resume_through_the_explorer_checkpoint_is_exact(tmp_path):
    cfg = config(tmp_path / "a", policy="recommended")             # dump mixture + MoPPS selection
    full, full_batches = run(cfg, steps=6)
    first, _ = run(cfg, steps=3)
    ckpt = tmp_path / "ckpt"
    StateManager(str(ckpt), explorer_name="explorer").save_explorer(3, first.state_dict())
    state = StateManager(str(ckpt), explorer_name="explorer").load_explorer()
    assert json.load(open(ckpt / "explorer_meta.json"))["latest_iteration"] == 3
    resumed, batches = run(cfg, steps=3, state=state)
    assert batches == full_batches[3:]
    assert_same_state(selector(resumed).scheduler, selector(full).scheduler)


def test_fully_async_runs_on_lagged_feedback_and_its_in_flight_checkpoint_is_refused(tmp_path):
    """Trinity's fully_async sync style: each proposal sees the feedback of batches up to
    `max_inflight_batches` + 1 steps old (the selector equals a Scheduler driven by hand with that
    lag). Its checkpoint is written while batches are in flight and a resumed explorer never
    generates them again: resuming from it is refused (naming the sync styles that resume
    exactly), with the selector's state unchanged; a checkpoint with every batch collected loads."""
    cfg, W, S = config(tmp_path / "a"), 2, 6
    taskset = get_taskset_scheduler({}, cfg)
    batches = asyncio.run(explore_fully_async(taskset, asyncio.run(pipeline(cfg)), S, W))
    ref = Scheduler(Pool(DOMAINS), "dump", seed=SEED)
    for step, ids in enumerate(batches, start=1):
        assert ref.propose(B).tolist() == ids
        if step > W:                                     # the oldest batch, finished before step is submitted
            old = batches[step - W - 1]
            ref.observe(Feedback(np.array(old), np.array([expected_rewards(step - W, i) for i in old]),
                                 step=step - W - 1))
    assert_same_state(selector(taskset).scheduler, ref)
    assert int(ref.counters.groups) == (S - W) * B
    ckpt = tmp_path / "ckpt"
    StateManager(str(ckpt), explorer_name="explorer").save_explorer(S, taskset.state_dict())
    state = StateManager(str(ckpt), explorer_name="explorer").load_explorer()
    assert state["taskset_states"][0][rt._IN_FLIGHT] == batches[S - W:]          # the W lost batches
    with pytest.raises(InputError, match=f"{W} batch.*{W * B} tasks.*fully_async.*fixed, explorer_driven and "
                                         f"trainer_driven"):
        get_taskset_scheduler(state, cfg)
    # the same run with its in-flight batches collected (what the other sync styles checkpoint)
    cfg2 = config(tmp_path / "b")
    done = get_taskset_scheduler({}, cfg2)
    assert asyncio.run(explore_fully_async(done, asyncio.run(pipeline(cfg2)), S, W, finish=True)) == batches
    assert done.state_dict()[0][rt._IN_FLIGHT] == []
    assert int(selector(done).scheduler.counters.groups) == S * B
    resumed = get_taskset_scheduler({"latest_iteration": S, "taskset_states": done.state_dict()}, cfg2)
    assert_same_state(selector(resumed).scheduler, selector(done).scheduler)


def test_a_batch_that_sends_no_feedback_is_not_left_in_flight(tmp_path):
    """A batch whose tasks all failed sends no feedback; the next batch's feedback (Trinity
    finishes batches in order) closes it too, so a later sync-style checkpoint still loads.
    Partial feedback (over-rollout: only the tasks that finished) closes its batch."""
    sel = selector(get_taskset_scheduler({}, config(tmp_path / "a", policy="uniform")))
    first, second, third = sel.get_indices(B), sel.get_indices(B), sel.get_indices(B)
    sel.feedback(second, [[1.0, 0.0, 1.0, 0.0]] * B)                   # nothing ever came for `first`
    assert sel.state_dict()[rt._IN_FLIGHT] == [third]
    sel.feedback(third[:2], [[0.0, 1.0, 0.0, 0.0]] * 2)                # over-rollout: 2 of 4 tasks
    assert sel.state_dict()[rt._IN_FLIGHT] == []
    assert int(sel.scheduler.counters.groups) == B + 2


def test_groups_of_one_prompt_twice_in_a_batch_stay_apart(tmp_path):
    cfg = config(tmp_path / "a", policy="uniform")
    sel = selector(get_taskset_scheduler({}, cfg))
    op = create_operators([OperatorConfig(name=OPERATOR)], {})[0]
    exps = []
    # row 5 read twice in one batch (tasks 0 and 1); task 0's run 1 has two turns (the last
    # one's reward counts), its run 2 no reward (left out)
    for task, run_id, turn, r in ((0, 0, 0, 1.0), (0, 1, 0, 0.0), (0, 1, 1, 1.0), (0, 2, 0, None),
                                  (1, 0, 0, 0.0), (1, 1, 0, 0.0)):
        e = Experience(tokens=torch.tensor([1, 2]), prompt_length=1, reward=r)
        e.eid.batch, e.eid.task, e.eid.run, e.eid.step = 1, task, run_id, turn
        e.info["task_index"] = {"index": 5, "taskset_id": 0}
        exps.append(e)
    out, metric = asyncio.run(op.process(exps))
    assert out == exps
    assert metric["selector_metric"] == {0: {"indices": [5, 5], "values": [[1.0, 1.0], [0.0, 0.0]]}}
    sel.feedback(**metric["selector_metric"][0])
    assert sel.scheduler.history.attempts[5] == 4 and sel.scheduler.history.successes[5] == 2


def test_group_means_are_refused_and_change_nothing(tmp_path):
    """Trinity's own pass_rate_calculator sends one mean per task: not a group."""
    cfg = config(tmp_path / "a", operator="pass_rate_calculator")
    taskset = get_taskset_scheduler({}, cfg)
    before = selector(taskset).state_dict()
    with pytest.raises(InputError, match="RlpaceGroupFeedback"):
        asyncio.run(explore(taskset, asyncio.run(pipeline(cfg)), 1, 1))
    assert selector(taskset).state_dict()[rt._STATE] != before[rt._STATE]       # proposal counted
    sched = selector(taskset).scheduler
    assert int(sched.counters.observations) == 0 and sched.history.attempts.sum() == 0


@pytest.mark.parametrize("policy, needs", [("dapo_dynamic_sampling", "admission"),
                                           ("per_advantage", "reweighting"), ("ttrl", "target"),
                                           ("oracle_boundary", "measurement"), ("epiplexity", "per-token losses")])
def test_methods_the_selector_cannot_serve_are_refused(tmp_path, policy, needs):
    with pytest.raises(InputError, match=needs):
        get_taskset_scheduler({}, config(tmp_path / "a", policy=policy))


def test_bad_config_and_foreign_checkpoints_are_refused(tmp_path):
    with pytest.raises(InputError, match="unknown data_selector.kwargs"):
        get_taskset_scheduler({}, config(tmp_path / "a", temperature=0.1))
    with pytest.raises(InputError, match="not a column"):
        get_taskset_scheduler({}, config(tmp_path / "b", domain_key="topic"))
    shuffled = {"latest_iteration": 2, "taskset_states": [{"current_index": 8}]}    # Trinity's shuffle selector
    with pytest.raises(InputError, match="another selector's state"):
        get_taskset_scheduler(shuffled, config(tmp_path / "c"))


def test_the_version_gate_refuses_releases_outside_the_tested_range(tmp_path, monkeypatch):
    cfg = config(tmp_path / "a")
    for v in ("0.7.0", "0.6.1.dev0", "0.5.2"):
        monkeypatch.setattr(rt.trinity, "__version__", v)
        with pytest.raises(InputError, match="trinity-rft"):
            get_taskset_scheduler({}, cfg)
    monkeypatch.setattr(rt.trinity, "__version__", "0.6.0")
    get_taskset_scheduler({}, cfg)
