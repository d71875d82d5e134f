"""GRPO with an adaptive data Scheduler — the whole recipe, top to bottom.

    setup:  tasks → Pool → Scheduler;  base policy (tiny, cached) or --model DIR;  optimizer
    loop:   propose → generate G rollouts per prompt → verify → observe → admit (+refills)
            → loss weights → loss (GRPO / Dr. GRPO / DAPO / GSPO, optional KL) → step
            held-out greedy eval every k steps; one JSONL record per step; checkpoints
    end:    final eval, summary.json

The objectives are pure functions in `rlpace.train.losses`; sampling and log-probs in
`rlpace.train.rollout`. Everything that can be wrong with the input is checked before
the first rollout (`check_config`, the task spec, the policy name, the model directory,
the resume directory).

Run it:  `rlpace train steps=150 policy=dump`   or   `train(TrainConfig(steps=150))`.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from ...scheduler import Scheduler
from ...tasks import make_taskset, parse_mistakes
from ...types import Feedback
from ..checkpoint import check_resumable, load_checkpoint, save_checkpoint
from ..config import TrainConfig
from ..evaluate import heldout_accuracy
from ..losses import OBJECTIVES, advantages, aggregation_units, kl_k3, policy_loss
from ..model import build_base_policy, check_model_dir, load_policy
from ..report import rollouts_before
from ..rollout import Rollout, completion_logprobs, decode_completions, encode_prompts, generate, left_pad, right_pad

__all__ = ["train", "check_config", "base_policy", "Groups", "sample_groups", "lilo_select", "summarize"]

_SAMPLE, _PROBE = 0, 1          # random streams of the generation seed


def check_config(cfg: TrainConfig) -> None:
    """ValueError naming the field and the fix for any invalid value (no work done)."""
    def need(ok, msg):
        if not ok:
            raise ValueError(msg)
    need(cfg.steps >= 0, f"steps must be ≥ 0; got {cfg.steps}.")
    need(cfg.batch_prompts >= 1, f"batch_prompts must be ≥ 1; got {cfg.batch_prompts}.")
    need(cfg.group_size >= 2, f"group_size must be ≥ 2 (a group of 1 has no advantage signal); got {cfg.group_size}.")
    rollouts = cfg.batch_prompts * cfg.group_size
    need(cfg.micro_batch >= 0 and (cfg.micro_batch == 0 or (rollouts % cfg.micro_batch == 0
                                                             and cfg.micro_batch % cfg.group_size == 0)),
         f"micro_batch={cfg.micro_batch} must be a multiple of group_size={cfg.group_size} (a group shares "
         f"one prompt forward) that divides batch_prompts × group_size = {rollouts}, or 0 for one forward; "
         f"e.g. micro_batch={cfg.group_size * max(1, cfg.batch_prompts // 2)}.")
    need(cfg.objective in OBJECTIVES, f"objective must be one of {', '.join(OBJECTIVES)}; got {cfg.objective!r}.")
    need(cfg.max_new_tokens >= 1, f"max_new_tokens must be ≥ 1; got {cfg.max_new_tokens}.")
    need(cfg.temperature > 0, f"temperature must be > 0; got {cfg.temperature}.")
    need(cfg.lr > 0, f"lr must be > 0; got {cfg.lr}.")
    need(cfg.lr_warmup >= 0, f"lr_warmup must be ≥ 0; got {cfg.lr_warmup}.")
    need(cfg.epochs >= 1, f"epochs must be ≥ 1; got {cfg.epochs}.")
    need(cfg.eval_every >= 1, f"eval_every must be ≥ 1; got {cfg.eval_every}.")
    need(cfg.kl_coef >= 0, f"kl_coef must be ≥ 0; got {cfg.kl_coef}.")
    need(cfg.lilo_candidates >= 0, f"lilo_candidates must be ≥ 0 (0 = off); got {cfg.lilo_candidates}.")
    need(cfg.lilo_probes >= 2 or cfg.lilo_candidates == 0,
         f"lilo_probes must be ≥ 2 to estimate p(1−p); got {cfg.lilo_probes}.")
    need(cfg.max_refill_rounds >= 0, f"max_refill_rounds must be ≥ 0; got {cfg.max_refill_rounds}.")
    need(cfg.threads >= 1, f"threads must be ≥ 1; got {cfg.threads}.")
    need(cfg.heldout_per_domain >= 1, f"heldout_per_domain must be ≥ 1; got {cfg.heldout_per_domain}.")
    parse_mistakes(cfg.warmup_mistakes)
    try:
        kw = json.loads(cfg.policy_kwargs)
    except json.JSONDecodeError as e:
        raise ValueError(f"policy_kwargs must be a JSON object like '{{\"c\": 0.5}}'; got "
                         f"{cfg.policy_kwargs!r} ({e}).") from None
    need(isinstance(kw, dict), f"policy_kwargs must be a JSON object; got {cfg.policy_kwargs!r}.")
    if cfg.device.startswith("cuda"):
        need(torch.cuda.is_available(), f"device={cfg.device!r} but torch sees no CUDA device; use device=cpu.")
    if cfg.model:
        check_model_dir(cfg.model)


class Groups(NamedTuple):
    """B prompts × G sampled completions, verified."""

    ids: np.ndarray              # int64[B]     pool positions
    prompts: list                # B·G token-id lists (prompt of each rollout)
    completions: list            # B·G token-id lists (EOS included when produced)
    rewards: np.ndarray          # float32[B, G]
    tokens: int                  # completion tokens generated


def _generator(cfg: TrainConfig, step: int, round_: int, stream: int) -> torch.Generator:
    seed = int(np.random.SeedSequence([cfg.seed, step, round_, stream]).generate_state(1)[0])
    return torch.Generator(device=cfg.device).manual_seed(seed)


def sample_groups(model, tok, tasks, prompt_tokens, ids, g: int, cfg: TrainConfig, gen) -> Groups:
    """Generate g rollouts for each pool position in `ids` and score them."""
    ro = generate(model, [prompt_tokens[i] for i in ids], repeats=g, max_new_tokens=cfg.max_new_tokens,
                  eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=cfg.temperature, generator=gen)
    prompts = [prompt_tokens[i] for i in ids for _ in range(g)]
    texts = decode_completions(tok, ro)
    items = [tasks.train[i] for i in ids for _ in range(g)]
    rewards = tasks.score(items, texts).reshape(len(ids), g)
    lens = ro.completion_mask.sum(1).long().tolist()
    comps = [row[:n] for row, n in zip(ro.completion_ids.tolist(), lens)]
    return Groups(np.asarray(ids, dtype=np.int64), prompts, comps, rewards, int(sum(lens)))


def lilo_select(sched, model, tok, tasks, prompt_tokens, cfg: TrainConfig, step: int):
    """LILO (Foster et al. 2025, card 9): propose k·B candidates, spend `lilo_probes`
    rollouts on each, keep the B with the largest p̂(1−p̂) (ties: proposal order).
    Returns (ids int64[B], probe rollouts spent). The probes only score; they are neither
    trained on nor observed by the Scheduler (LILO keeps only the scores)."""
    b = cfg.batch_prompts
    cand = sched.propose(cfg.lilo_candidates * b)
    probe = sample_groups(model, tok, tasks, prompt_tokens, cand, cfg.lilo_probes, cfg,
                          _generator(cfg, step, 0, _PROBE))
    p = (probe.rewards >= cfg.success_threshold).mean(axis=1)
    keep = np.argsort(-(p * (1.0 - p)), kind="stable")[:b]
    return cand[keep], cand.size * cfg.lilo_probes


def base_policy(cfg: TrainConfig, tasks, progress: bool | None = None):
    """Directory of the tiny base policy for this config (built once, then cached)."""
    return build_base_policy(
        tasks, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, warmup_steps=cfg.warmup_steps,
        warmup_batch=cfg.warmup_batch, warmup_lr=cfg.warmup_lr, warmup_decay=cfg.warmup_decay,
        warmup_mistakes=parse_mistakes(cfg.warmup_mistakes),
        seed=cfg.seed, cache_dir=cfg.cache_dir or None, progress=cfg.progress if progress is None else progress)


def train(cfg: TrainConfig) -> dict:
    """Run the recipe; returns the summary (also written to `out/summary.json`)."""
    from tqdm.auto import tqdm

    # ---- 0. check everything that can fail, before any work -----------------------------
    check_config(cfg)
    tasks = make_taskset(cfg.tasks, train_per_domain=cfg.train_per_domain,
                         heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
    pool = tasks.pool()
    sched = Scheduler(pool, cfg.policy, seed=cfg.seed, success_threshold=cfg.success_threshold,
                      **json.loads(cfg.policy_kwargs))
    out = Path(cfg.out)
    ckpt_dir = out / "checkpoint"
    if cfg.resume:
        check_resumable(ckpt_dir, cfg)

    # ---- 1. setup: policy, reference, optimizer, tokenized pool -------------------------
    torch.set_num_threads(cfg.threads)
    model_dir = cfg.model or base_policy(cfg, tasks)
    model, tok = load_policy(model_dir, cfg.device)
    ref = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef > 0 else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)
    lr_at = lambda s: cfg.lr * min(1.0, (s + 1) / max(1, cfg.lr_warmup))      # noqa: E731
    prompt_tokens = encode_prompts(tok, [it.prompt for it in tasks.train], cfg.chat)
    clip_low = None if cfg.clip_low < 0 else cfg.clip_low
    clip_high = None if cfg.clip_high < 0 else cfg.clip_high
    b, g = cfg.batch_prompts, cfg.group_size
    step, spent, seconds = 0, 0, 0.0
    if cfg.resume:
        counters = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched)
        step, spent, seconds = counters["step"], counters["rollouts"], counters["seconds"]
        _truncate_log(out / "metrics.jsonl", step)
    else:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    log_path = out / "metrics.jsonl"

    def evaluate(rec):
        acc = heldout_accuracy(model, tok, tasks, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat,
                               batch=cfg.eval_batch)
        rec.update({f"eval/{k}": v for k, v in acc.items()})
        return acc

    # ---- 2. the loop ---------------------------------------------------------------------
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {sched.name}", disable=not cfg.progress)
    last_acc = None
    while step < cfg.steps and not (cfg.max_rollouts and spent >= cfg.max_rollouts):
        t0 = time.perf_counter()
        rec: dict = {"step": step}
        if step % cfg.eval_every == 0:
            last_acc = evaluate(rec)

        # 2a. propose B prompts (LILO: probe k·B candidates and keep the most learnable)
        model.eval()
        probe_rollouts = 0
        if cfg.lilo_candidates:
            ids, probe_rollouts = lilo_select(sched, model, tok, tasks, prompt_tokens, cfg, step)
        else:
            ids = sched.propose(b)

        # 2b. generate → verify → observe → admit; refill dropped groups while asked to
        pieces, admitted, round_, gen_tokens = [], 0, 0, 0
        while True:
            grp = sample_groups(model, tok, tasks, prompt_tokens, ids, g, cfg,
                                _generator(cfg, step, round_, _SAMPLE))
            adv = advantages(torch.from_numpy(grp.rewards), cfg.objective).numpy()     # [B, G]
            fb = Feedback(grp.ids, grp.rewards, adv, step)
            sched.observe(fb)                                   # every group, kept or not
            adm = sched.admission(fb)
            weight = sched.loss_weights(fb) * adm.keep          # [B, G] 0 = not in the loss
            pieces.append((grp, adv, weight))
            gen_tokens += grp.tokens
            admitted += int(adm.keep.any(axis=1).sum())
            if adm.refill <= 0 or admitted >= b or round_ >= cfg.max_refill_rounds:
                break
            round_ += 1
            ids = sched.propose(int(adm.refill))
        rollouts = probe_rollouts + sum(p[0].rewards.size for p in pieces)
        spent += rollouts

        # 2c. the training batch: the first B groups with an admitted rollout
        prompts, comps, adv_list, w_list = [], [], [], []
        taken = 0
        for grp, adv, weight in pieces:
            for j in range(grp.ids.size):
                if taken == b or not weight[j].any():
                    continue
                taken += 1
                prompts += grp.prompts[j * g:(j + 1) * g]
                comps += grp.completions[j * g:(j + 1) * g]
                adv_list.append(adv[j])
                w_list.append(weight[j])

        # 2d. loss and optimizer step(s)
        stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        t_train = time.perf_counter()
        if taken:
            model.train()
            dev = cfg.device
            n = len(comps)
            p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
            c_ids, c_mask = right_pad(comps, tok.pad_token_id)
            adv_t = torch.tensor(np.concatenate(adv_list), dtype=torch.float32, device=dev)   # [N]
            w_t = torch.tensor(np.concatenate(w_list), dtype=torch.float32, device=dev)       # [N]
            mb = cfg.micro_batch or n                    # a multiple of G: whole groups per chunk
            chunks = [slice(s, min(n, s + mb)) for s in range(0, n, mb)]
            batches = [Rollout(p_ids[c].to(dev), p_mask[c].to(dev), c_ids[c].to(dev), c_mask[c].to(dev))
                       for c in chunks]
            total_units = sum(aggregation_units(cfg.objective, r.completion_mask, w_t[c])
                              for r, c in zip(batches, chunks)) or 1.0
            total_tokens = float((c_mask * (w_t.cpu() > 0).float()[:, None]).sum()) or 1.0
            with torch.no_grad():
                old = ([completion_logprobs(model, r, cfg.temperature, g) for r in batches]
                       if cfg.epochs > 1 else None)
                ref_lp = ([completion_logprobs(ref, r, cfg.temperature, g) for r in batches]
                          if ref is not None else None)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            for _ in range(cfg.epochs):
                opt.zero_grad(set_to_none=True)
                for k, (r, c) in enumerate(zip(batches, chunks)):
                    logp = completion_logprobs(model, r, cfg.temperature, g)              # [n, T]
                    lo = policy_loss(cfg.objective, logp, old[k] if old else logp.detach(), adv_t[c],
                                     r.completion_mask, w_t[c], clip_low=clip_low, clip_high=clip_high,
                                     max_tokens=cfg.max_new_tokens)
                    share = aggregation_units(cfg.objective, r.completion_mask, w_t[c]) / total_units
                    loss = lo.loss * share
                    stats["pg_loss"] += lo.loss.item() * share / cfg.epochs
                    stats["clip_fraction"] += lo.clip_fraction * share / cfg.epochs
                    if ref is not None:
                        tok_share = float((r.completion_mask * (w_t[c] > 0).float()[:, None]).sum()) / total_tokens
                        kl = kl_k3(logp, ref_lp[k], r.completion_mask, w_t[c])
                        loss = loss + cfg.kl_coef * kl * tok_share
                        stats["kl"] += kl.item() * tok_share / cfg.epochs
                    loss.backward()
                    stats["loss"] += loss.item() / cfg.epochs
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                opt.step()

        # 2e. one JSONL record per step
        all_rewards = np.concatenate([p[0].rewards.ravel() for p in pieces])
        first = pieces[0][0].rewards
        dt = time.perf_counter() - t0
        seconds += dt
        rec.update(stats)
        rec.update({
            "reward_mean": float(all_rewards.mean()),
            "informative_groups": float((first.std(axis=1) > 0).mean()),
            "groups_trained": taken, "refill_rounds": round_,
            "prompt_ids": [int(i) for p in pieces for i in p[0].ids],
            "rollouts": rollouts, "probe_rollouts": probe_rollouts, "rollouts_total": spent,
            "tokens": gen_tokens, "seconds": dt, "train_seconds": time.perf_counter() - t_train,
            "seconds_total": seconds,
        })
        rec.update({f"sched/{k}": v for k, v in sched.metrics().items()})
        _append_jsonl(log_path, rec)
        step += 1
        bar.update(1)
        bar.set_postfix(acc=f"{last_acc['mean']:.2f}" if last_acc else "-", reward=f"{rec['reward_mean']:.2f}")

        # 2f. checkpoint (model, optimizer, Scheduler, counters; the RNG is the step)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg,
                            counters={"step": step, "rollouts": spent, "seconds": seconds})
    bar.close()

    # ---- 3. final evaluation, checkpoint, summary --------------------------------------
    final = {"step": step, "final": True}
    evaluate(final)
    _append_jsonl(log_path, final)
    save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg,
                    counters={"step": step, "rollouts": spent, "seconds": seconds})
    summary = summarize(out / "metrics.jsonl")
    summary.update({"policy": sched.name, "model_dir": str(model_dir), "config": cfg.to_dict()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _append_jsonl(path: Path, rec: dict) -> None:
    """One record per line, the file opened per write: no handle outlives an exception, and
    a crash leaves every finished step on disk (resume truncates to the checkpoint)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def _truncate_log(path: Path, step: int) -> None:
    """Drop records of steps ≥ `step` (written after the checkpoint we resume from)."""
    if not path.is_file():
        return
    keep = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] < step and not json.loads(line).get("final")]
    path.write_text("".join(line + "\n" for line in keep))


def summarize(metrics_path) -> dict:
    """Base and final held-out accuracy, the accuracy curve and totals from metrics.jsonl."""
    recs = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    evals = [r for r in recs if "eval/mean" in r]
    steps = [r for r in recs if not r.get("final")]
    curve = [{"step": r["step"], "rollouts": rollouts_before(steps, r["step"]),
              **{k[5:]: v for k, v in r.items() if k.startswith("eval/")}} for r in evals]
    groups = sum(1 for _ in steps)
    return {
        "base": curve[0] if curve else {},
        "final": curve[-1] if curve else {},
        "curve": curve,
        "steps": groups,
        "rollouts_total": steps[-1]["rollouts_total"] if steps else 0,
        "informative_fraction": float(np.mean([r["informative_groups"] for r in steps])) if steps else math.nan,
        "seconds_total": steps[-1]["seconds_total"] if steps else 0.0,
    }
