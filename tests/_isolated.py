"""Helpers shared by tests: run a script in its own process session (Ray/TransferQueue
drivers), and compare Scheduler states."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest


def run_result_script(script, args, cwd, timeout: int, what: str) -> dict:
    """Run `python script *args` in its own session (so that a timeout also kills Ray's helper
    processes, which outlive the driver otherwise) and return the JSON of its last
    `RESULT {...}` line; fail the test with the script's stderr when it has none."""
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_DEDUP_LOGS="0")
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(cwd), start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{what} did not finish within {timeout} s (Ray on a loaded machine); rerun alone")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lines = [x for x in stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def require_verl_transfer_queue() -> None:
    """Skip the calling test module unless verl, TransferQueue and Ray import (call at module level)."""
    for name in ("verl", "transfer_queue", "ray"):
        pytest.importorskip(name)


# The start of every TransferQueue test script: this folder on the path (the tests folder comes as
# the script's last argument), Ray with 2 logical CPUs and TransferQueue with one storage unit
# (its default 2 units plus the controller exceed 2 CPUs, and `tq.init()` then waits forever).
_TQ_SCRIPT_START = textwrap.dedent('''
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[-1])
    import numpy as np, ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    import transfer_queue as tq
    from omegaconf import OmegaConf
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
''')


def run_tq_script(body: str, args, tmp_path, name: str, timeout: int) -> dict:
    """Write `_TQ_SCRIPT_START + body` to tmp_path/name, run it with `args` then the tests folder
    (see `run_result_script`) and return its RESULT JSON."""
    script = tmp_path / name
    script.write_text(_TQ_SCRIPT_START + textwrap.dedent(body))
    return run_result_script(script, [*args, os.path.dirname(os.path.abspath(__file__))], tmp_path, timeout,
                             "TransferQueue/Ray")


def recording_tq_worker(sched):
    """Inside a Ray/TransferQueue test script: record every Feedback `sched` observes, and return
    (observed, worker) — verl's AgentLoopWorkerTQ with its write path and no server (what the
    scripts write groups through). The replay buffer reaches `sched` through its trainer."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    observed = []
    observe = sched.observe
    sched.observe = lambda fb: observed.append(fb) or observe(fb)
    _step = sched.step       # Scheduler.step observes too (adapters call it)
    sched.step = lambda fb, features=None: observed.append(fb) or _step(fb, features)
    worker = object.__new__(AgentLoopWorkerTQ.__ray_actor_class__)
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.processor = None, False, None
    return observed, worker


def run_to_completion_manager(worker):
    """Inside a Ray/TransferQueue test script: verl's AgentLoopManagerTQ with one `worker`
    (`recording_tq_worker`'s), running every submitted batch to completion; `defer = True`
    leaves the prompts pending instead (a checkpoint taken before they run)."""
    import asyncio

    class Manager:
        defer = False
        def generate_sequences(self, batch):
            if self.defer:
                return
            async def go():
                await worker.generate_sequences(batch)
                while worker.background_tasks:
                    await asyncio.gather(*list(worker.background_tasks))
            asyncio.run(go())
    return Manager()


def zero_log_prob_actor():
    """Inside a Ray/TransferQueue test script: an actor whose `compute_log_prob` writes log-probs
    0 and entropies 1 (5 tokens per key) into the TransferQueue; keeping π_old on the CPU
    (separate_async) is a no-op."""
    import torch
    from tensordict import TensorDict
    import transfer_queue as tq

    class Actor:
        def save_model_to_cpu(self, n):
            pass
        def compute_log_prob(self, batch):
            n = len(batch.keys)
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict({
                "log_probs": torch.nested.as_nested_tensor([torch.zeros(5)] * n, layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor([torch.ones(5)] * n, layout=torch.jagged)}, batch_size=n))
            return batch
    return Actor()


def sampled_advantages(t, step: int, batch_size: int) -> dict:
    """Inside a Ray/TransferQueue test script: one V1 training step's data path on trainer `t` —
    the replay buffer's sample, verl's `_compute_old_log_prob` and `_compute_advantage` — and
    {"keys", "advantages" (the first token's), "scores" (rm_scores' last token)} read back from
    the TransferQueue, keys sorted."""
    import transfer_queue as tq
    meta, _ = t.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=batch_size)
    metrics = {}
    meta = t._compute_old_log_prob(meta, metrics)
    meta = t._compute_advantage(meta, metrics)
    keys = sorted(meta.keys)
    got = tq.kv_batch_get(keys=keys, partition_id="train", select_fields=["advantages", "rm_scores"])
    return {"keys": keys, "advantages": [float(a[0]) for a in got["advantages"].unbind()],
            "scores": [float(a[-1]) for a in got["rm_scores"].unbind()]}


V1_TRAINER_CONFIG = {       # the config verl's _compute_old_log_prob / _compute_advantage read
    "algorithm": {"use_kl_in_reward": False, "adv_estimator": "grpo", "gamma": 1.0, "lam": 1.0,
                  "norm_adv_by_std_in_grpo": True},
    "actor_rollout_ref": {"rollout": {"n": 3, "temperature": 1.0, "calculate_log_probs": False},
                          "actor": {"loss_agg_mode": "token-mean", "loss_scale_factor": None}}}


def bare_v1_trainer(mode: str, sched, per_token, *, extra_config=None, global_steps: int = 1,
                    train_batch_size: int = 2, refill=None):
    """Inside a Ray/TransferQueue test script: rlpace's V1 trainer of `mode` ("sync", "async" =
    colocate_async, "separate" = separate_async) without verl's __init__ (no workers), with
    `V1_TRAINER_CONFIG` (+ `extra_config`), an actor whose `compute_log_prob` writes
    `per_token(batch) -> (log_probs, entropies)` (lists of 1-D tensors, one per key) into the
    TransferQueue and records its calls (separate_async swaps the weights to π_old around the
    pass), and rlpace's replay buffer for the mode. `refill(n)` is the trainer's refill function."""
    import torch
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    import transfer_queue as tq
    from rlpace.adapters import _verl_v1, _verl_v1_trainer
    from rlpace.adapters.verl import VerlFeedback
    cls = {"sync": _verl_v1_trainer.RlpacePPOTrainerSync,
           "async": _verl_v1_trainer.RlpacePPOTrainerColocateAsync,
           "separate": _verl_v1_trainer.RlpacePPOTrainerSeparateAsync}[mode]
    t = object.__new__(cls)
    t.config = OmegaConf.create({**V1_TRAINER_CONFIG, **(extra_config or {})})
    t.global_steps = global_steps
    t.local_trigger_step = 1          # separate_async: the second mini-batch of a parameter_sync_step cycle
    t.train_dataset = type("Dataset", (), {"rlpace": VerlFeedback(sched, reward_key="acc")})

    class Actor:
        calls, loaded = [], "current"
        def save_model_to_cpu(self, n):
            self.calls.append(["save", n])
        def restore_model_from_cpu(self, n):
            self.calls.append(["restore", n])
            self.loaded = n
        def clear_cpu_model(self, n):
            self.calls.append(["clear", n])
        def compute_log_prob(self, batch):
            self.calls.append(["log_prob", self.loaded])
            lp, ent = per_token(batch)
            tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict({
                "log_probs": torch.nested.as_nested_tensor(lp, layout=torch.jagged),
                "entropy": torch.nested.as_nested_tensor(ent, layout=torch.jagged)}, batch_size=len(batch.keys)))
            return batch
    t.actor_rollout_wg = Actor()
    if refill is not None:
        t._add_prompts_to_generate = refill.__get__(t)          # bound: the buffer reaches t through it
    kw = dict(trainer_config={}, max_off_policy_threshold=None, max_off_policy_strategy="drop", poll_interval=0.0,
              refill_fn=t._add_prompts_to_generate,
              sampler_kwargs={"train_batch_size": train_batch_size, "gen_batch_size": 1})
    buf_cls = _verl_v1.RlpaceReplayBuffer if mode == "sync" else _verl_v1.RlpaceReplayBufferAsync
    t.replay_buffer = buf_cls(trainer_mode={"sync": "sync", "async": "colocate_async",
                                            "separate": "separate_async"}[mode], **kw)
    return t


def assert_state_equal(a, b):
    """Two `Scheduler.state_dict()`s hold the same keys, dtypes and values."""
    assert a.keys() == b.keys()
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype, k
        np.testing.assert_array_equal(x, y, err_msg=k)


# The start of every two-rank TRL worker script (`run_two_ranks`): imports, the LM and output
# folder from argv, one thread, the rank, and the 8-prompt dataset of two domains.
DDP_WORKER_HEAD = textwrap.dedent('''
    import os, sys
    import numpy as np, torch
    from datasets import Dataset
    from rlpace import Scheduler, compose
    from rlpace.adapters.trl import pool_from_dataset
    from rlpace.policies import make_policy

    lm, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = Dataset.from_list([{"prompt": f"what is {i} plus 3?", "index": 1000 + i,
                             "data_source": ["math", "logic"][i % 2]} for i in range(8)])
''')


def run_ddp_probe(lm, out, ds, sched, reward, *, group: int, max_steps: int, extra=None, **trainer_kw):
    """Inside a two-rank TRL worker: train `RlpaceGRPOTrainer` (the tiny LM at `lm`, G = `group`
    rows per device, 2 accumulation steps, `max_steps`, lr 1e-3, no KL) with `sched` and the
    reward function, recording per generation batch this rank's prompt indices, the gathered
    rewards [B·G] and this rank's advantages as the loss sees them (`extra(o)` records anything
    else of the batch dict). Returns (index, rewards, adv, trainer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from rlpace.adapters.trl import RlpaceGRPOTrainer
    index, rewards, adv = [], [], []

    class Probe(RlpaceGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            o = super()._generate_and_score_completions(inputs)
            index.append([x["index"] for x in inputs])
            rewards.append(self._rlpace_rewards.double().cpu().numpy())
            adv.append(o["advantages"].double().cpu().numpy())
            if extra is not None:
                extra(o)
            return o

    cfg = GRPOConfig(output_dir=out, use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=group, num_generations=group, max_completion_length=2,
                     gradient_accumulation_steps=2, max_steps=max_steps, beta=0.0, save_strategy="no",
                     logging_steps=100, dataloader_num_workers=0, gradient_checkpointing=False,
                     learning_rate=1e-3)
    t = Probe(model=AutoModelForCausalLM.from_pretrained(lm), reward_funcs=reward, args=cfg, train_dataset=ds,
              processing_class=AutoTokenizer.from_pretrained(lm), scheduler=sched, **trainer_kw)
    t.train()
    return index, rewards, adv, t


def run_two_ranks(worker_source: str, lm, tmp_path, port: int, timeout: int = 300) -> None:
    """Write `worker_source` to tmp_path/worker.py and run it on 2 CPU ranks with torchrun
    (gloo), as `worker.py LM_DIR TMP_PATH` with this folder on PYTHONPATH; skip when torchrun is not
    beside the interpreter, fail with the ranks' stderr when they fail. The worker writes its
    results into tmp_path."""
    import shutil
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable))
    if torchrun is None:
        pytest.skip("torchrun not found beside the interpreter")
    script = tmp_path / "worker.py"
    script.write_text(worker_source)
    # the tests folder on PYTHONPATH: the workers import the tests' helpers
    path = os.pathsep.join(filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONPATH=path)
    proc = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(port), str(script), str(lm),
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def run_two_rank_probe(worker: str, tmp_path, port: int, timeout: int = 400):
    """Run `worker` (`DDP_WORKER_HEAD` + a body that saves rank{r}.npz with `world` and the
    gathered `rewards`) on two ranks over a tiny LM of the 8 prompts; return both ranks' arrays,
    checked to come from 2 ranks that gathered the same rewards."""
    from _tiny_lm import build_tiny_lm
    lm = build_tiny_lm(tmp_path / "lm", [f"what is {i} plus 3?" for i in range(8)])
    run_two_ranks(worker, lm, tmp_path, port=port, timeout=timeout)
    r0, r1 = (np.load(tmp_path / f"rank{r}.npz") for r in (0, 1))
    assert int(r0["world"]) == 2
    np.testing.assert_array_equal(r0["rewards"], r1["rewards"])
    return r0, r1
