"""GRPO with an adaptive data Scheduler — the whole recipe, top to bottom.

    setup:  tasks → Pool → Scheduler (+ training labels);  base policy (tiny, cached) or
            --model DIR;  optimizer;  the optional signals the policy reads (below)
    loop:   propose B prompts → generate G rollouts per prompt (with an allocation policy,
            N_i of the step's W: Scheduler.allocate) → verify → observe → admit (+ refills) →
            advantages on the kept rollouts → loss weights (per token: Scheduler.token_weights) →
            loss (GRPO / Dr. GRPO / DAPO / GSPO, optional KL) → step
            held-out greedy eval every k steps; one JSONL record per step; checkpoints
    end:    final eval, summary.json

Optional signals. Each is one small component in its own file, built in setup from what the
policy declares it reads (`DataPolicy.reads`, `DataPolicy.update_losses`) — None otherwise —
and called by name at fixed points of the loop. The points, in the order they run each step:

    1  start     LossCurves.measure            held-out loss probe → observe_losses (epiplexity; lossprobe.py)
                 GradSignal.update_reference   held-out reference gradient (diem, dvc; gradsignal.py)
                 OracleMeasurement.measure     every prompt's pass rate, not charged (oracle_*; oracle.py)
    2  propose   lilo_select                   LILO: probe k·B candidates, keep the top B (sampling.py)
                 FreshItems.propose            generated: / grid: cells of new items (generated.py)
    3  rounds    FreshItems.sample             G rollouts on the new items
                 Supervision.round_feedback    labels, targets, the reward place (supervision.py)
                 (GradSignal present: the round is observed after the loss forward, point 4)
    4  loss      FreshItems.before_update      generated: the buffer's NLL before the update
                 Supervision.trained_feedback  the batch's answers, the advantage place
                 GradSignal.forward, .observe  per-rollout features of the unit-weight loss, then
                                               every round observed, trained groups with features
                 (nothing trained: GradSignal.observe without features, here)
    5  end       FreshItems.after_update       generated: the generator's step, gen/* fields
                 Supervision.step_metrics      sup/* fields

A new signal is a new file with a `build(...)` that returns None unless the policy reads it,
and one call at the point where its input exists.

The Scheduler is driven by its separate calls (observe and admission per round; token_weights
and advantage_weights on the trained batch), not `Scheduler.step`: the loss and advantage
weights are those of the trained batch — the first B admitted groups across refill rounds —
not of each round; and with gradient features, admission reads the state before the step and
the features exist only for the trained groups, once every round is in.

The objectives are pure functions in `rlpace.train.losses`; sampling and log-probs in
`rlpace.train.rollout`; rollout groups in `rlpace.train.sampling`. Everything that can be
wrong with the input is checked before the first rollout (`check_config`, the task spec, the
policy name, the model directory, the resume directory).

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

from ...advise._record import PilotRecorder
from ...errors import InputError
from ...optim import build_optimizer
from ...policies import make_method
from ...scheduler import Scheduler
from ...tasks import make_taskset, parse_mistakes
from ...tasks._features import prompt_features
from ...tasks._generator import GENERATED_PREFIX, family_configs, generated_taskset
from ...tasks._grid import GRID_PREFIX, grid_cells, grid_pool
from ...types import Feedback, group_advantages, informative_groups
from ..checkpoint import check_resumable, load_checkpoint, restore_domain_tokens, save_checkpoint
from ..config import TrainConfig
from ..evaluate import GreedyMemo, heldout_accuracy
from ..generated import FreshItems, cell_pool
from ..gradfeatures import GradFeatures, heldout_reference, needs_grad_features
from ..gradsignal import GradSignal
from ..logging import StepLogger
from ..lossprobe import LossCurves
from ..losses import OBJECTIVES, advantages, aggregation_units, kl_k3, logp_grad_scale, policy_loss
from ..model import ModeSwitch, build_base_policy, check_model_dir, load_policy
from ..oracle import OracleMeasurement
from ..report import rollouts_before
from ..rollout import Rollout, completion_logprobs, encode_prompts, left_pad, right_pad
from ..sampling import SAMPLE, lilo_select, sample_groups, step_generator, uses_oracle
from ..supervision import Supervision, check_fractions

__all__ = ["train", "check_config", "base_policy", "summarize"]


def check_config(cfg: TrainConfig) -> None:
    """ValueError naming the field and the fix for any invalid value (no work done)."""
    def need(ok, msg):
        if not ok:
            raise InputError(msg)
    need(cfg.steps >= 0, f"steps must be ≥ 0; got {cfg.steps}.")
    need(cfg.batch_prompts >= 1, f"batch_prompts must be ≥ 1; got {cfg.batch_prompts}.")
    need(cfg.group_size >= 2, f"group_size must be ≥ 2 (a group of 1 has no advantage signal); got {cfg.group_size}.")
    need(isinstance(cfg.rollout_budget, (int, np.integer)) and not isinstance(cfg.rollout_budget, bool)
         and cfg.rollout_budget >= 0,
         f"rollout_budget must be a whole number of rollouts per step ≥ 0 (0 = batch_prompts × group_size); "
         f"got {cfg.rollout_budget!r}.")
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
    need(cfg.optimizer in ("adamw", "iso_adamw", "muon", "iso_muon"),
         f"optimizer must be one of adamw, iso_adamw, muon, iso_muon; got {cfg.optimizer!r}.")
    need(cfg.lr_warmup >= 0, f"lr_warmup must be ≥ 0; got {cfg.lr_warmup}.")
    need(cfg.epochs >= 1, f"epochs must be ≥ 1; got {cfg.epochs}.")
    need(cfg.eval_every >= 1, f"eval_every must be ≥ 1; got {cfg.eval_every}.")
    need(cfg.kl_coef >= 0, f"kl_coef must be ≥ 0; got {cfg.kl_coef}.")
    need(cfg.lilo_candidates >= 0, f"lilo_candidates must be ≥ 0 (0 = off); got {cfg.lilo_candidates}.")
    need(cfg.lilo_probes >= 2 or cfg.lilo_candidates == 0,
         f"lilo_probes must be ≥ 2 to estimate p(1−p); got {cfg.lilo_probes}.")
    need(cfg.max_refill_rounds >= 0, f"max_refill_rounds must be ≥ 0; got {cfg.max_refill_rounds}.")
    need(cfg.oracle_every >= 1, f"oracle_every must be ≥ 1 (steps between oracle measurements); "
                                f"got {cfg.oracle_every}.")
    need(cfg.oracle_rollouts >= 1, f"oracle_rollouts must be ≥ 1 (rollouts per prompt per oracle measurement); "
                                   f"got {cfg.oracle_rollouts}.")
    need(cfg.threads >= 1, f"threads must be ≥ 1; got {cfg.threads}.")
    need(cfg.loss_probe_every >= 1, f"loss_probe_every must be ≥ 1 (steps between loss probes); got "
                                    f"{cfg.loss_probe_every}.")
    need(cfg.loss_probe_per_domain >= 1, f"loss_probe_per_domain must be ≥ 1; got {cfg.loss_probe_per_domain}.")
    if cfg.tasks.strip().startswith(GENERATED_PREFIX):
        family_configs(cfg.tasks.strip()[len(GENERATED_PREFIX):].strip())        # names the valid families
        need(cfg.lilo_candidates == 0, "tasks=generated:<family> chooses the prompts itself; set lilo_candidates=0.")
    need(cfg.gen_lr >= 0 and math.isfinite(cfg.gen_lr),      # 0: π stays uniform (the fixed-mix baseline)
         f"gen_lr must be a finite number ≥ 0; got {cfg.gen_lr}.")
    need(cfg.gen_entropy >= 0 and math.isfinite(cfg.gen_entropy),
         f"gen_entropy must be a finite number ≥ 0; got {cfg.gen_entropy}.")
    need(cfg.gen_buffer >= 1, f"gen_buffer must be ≥ 1; got {cfg.gen_buffer}.")
    need(cfg.heldout_per_domain >= 1, f"heldout_per_domain must be ≥ 1; got {cfg.heldout_per_domain}.")
    check_fractions(cfg.labeled_fraction, cfg.label_noise)          # partial / noisy labels
    need(not cfg.tasks.strip().startswith(GENERATED_PREFIX) or (cfg.labeled_fraction == 1 and cfg.label_noise == 0),
         "tasks=generated:<family> draws fresh items; set labeled_fraction=1 and label_noise=0.")
    if cfg.tasks.strip().startswith(GRID_PREFIX):
        grid_cells(cfg.tasks.strip())                                 # names the valid families
        need(cfg.lilo_candidates == 0 and cfg.labeled_fraction == 1 and cfg.label_noise == 0,
             "tasks=grid:<family> rolls out fresh items of the proposed cells; set lilo_candidates=0, "
             "labeled_fraction=1 and label_noise=0.")
    need(cfg.lilo_candidates == 0 or (cfg.labeled_fraction == 1 and cfg.label_noise == 0),
         "lilo_candidates > 0 scores its probes against the true labels; with labeled_fraction < 1 or "
         "label_noise > 0 set lilo_candidates=0.")
    need(cfg.grad_features in ("auto", "on", "off"), f"grad_features must be auto, on or off; got {cfg.grad_features!r}.")
    need(cfg.grad_params in ("lm_head", "last_block", "all"),
         f"grad_params must be lm_head, last_block or all; got {cfg.grad_params!r}.")
    need(cfg.grad_dim >= 1, f"grad_dim must be ≥ 1 (feature dimension); got {cfg.grad_dim}.")
    need(cfg.grad_reference in ("heldout", "previous", "none"),
         f"grad_reference must be heldout, previous or none; got {cfg.grad_reference!r}.")
    need(cfg.grad_ref_every >= 1, f"grad_ref_every must be ≥ 1; got {cfg.grad_ref_every}.")
    parse_mistakes(cfg.warmup_mistakes)
    try:
        kw = json.loads(cfg.policy_kwargs)
    except json.JSONDecodeError as e:
        raise InputError(f"policy_kwargs must be a JSON object like '{{\"c\": 0.5}}'; got "
                         f"{cfg.policy_kwargs!r} ({e}).") from None
    need(isinstance(kw, dict), f"policy_kwargs must be a JSON object; got {cfg.policy_kwargs!r}.")
    if cfg.device.startswith("cuda"):
        need(torch.cuda.is_available(), f"device={cfg.device!r} but torch sees no CUDA device; use device=cpu.")
    if cfg.model:
        check_model_dir(cfg.model)


def base_policy(cfg: TrainConfig, tasks, progress: bool | None = None):
    """Directory of the tiny base policy for this config (built once, then cached)."""
    return build_base_policy(
        tasks, hidden=cfg.hidden, layers=cfg.layers, heads=cfg.heads, warmup_steps=cfg.warmup_steps,
        warmup_batch=cfg.warmup_batch, warmup_lr=cfg.warmup_lr, warmup_decay=cfg.warmup_decay,
        warmup_mistakes=parse_mistakes(cfg.warmup_mistakes, cfg.tasks),     # 'default': the suite's shares
        seed=cfg.seed, cache_dir=cfg.cache_dir or None, progress=cfg.progress if progress is None else progress)


def train(cfg: TrainConfig, *, eval_memo: GreedyMemo | None = None) -> dict:
    """Run the recipe; returns the summary (also written to `out/summary.json`).

    `eval_memo`: greedy held-out completions shared with other runs of this process (the
    `rlpace compare` runner passes one, so the runs of one base share their step-0
    evaluation); None (a plain run) never hashes the weights."""
    from tqdm.auto import tqdm

    # ---- 0. check everything that can fail, before any work -----------------------------
    check_config(cfg)
    full_tasks, tasks, pool, sched, sup = _build_data(cfg)
    out = Path(cfg.out)
    ckpt_dir = out / "checkpoint"
    if cfg.resume:
        check_resumable(ckpt_dir, cfg)

    # ---- 1. setup: policy, reference, optimizer, tokenized pool, the signals read --------
    torch.set_num_threads(cfg.threads)
    model_dir = cfg.model or base_policy(cfg, full_tasks)
    model, tok = load_policy(model_dir, cfg.device)
    ref = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef > 0 else None
    opt = build_optimizer(cfg.optimizer, model, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)  # iso_*: frames
    train_mode = ModeSwitch(model)          # model.train(mode) without its recursive walk, twice a step
    prompt_tokens = encode_prompts(tok, [it.prompt for it in tasks.train], cfg.chat)
    b, g = cfg.batch_prompts, cfg.group_size
    w = allocated_budget(cfg, sched)          # rollouts per step that Scheduler.allocate splits; None: G each
    oracle = OracleMeasurement.build(sched, model, tok, tasks, prompt_tokens, cfg)   # oracle_*
    curves = LossCurves.build(sched, model, tok, tasks, pool, cfg)                   # epiplexity
    grads = GradSignal.build(sched, model, tok, tasks, pool, cfg, sup.active, GradFeatures)   # diem, dvc
    fresh = FreshItems.build(tasks, pool, cfg)                                       # generated:, grid:
    domain_tokens = np.zeros(pool.n_domains)     # float64[K] kept completion tokens trained on
    step, spent, seconds = 0, 0, 0.0
    if cfg.resume:
        saved = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched)    # counters
        step, spent, seconds = saved["step"], saved["rollouts"], saved["seconds"]
        domain_tokens = restore_domain_tokens(saved, pool.n_domains)
        for part in (fresh, grads):
            if part is not None:
                part.load_counters(saved)
        _truncate_log(out / "metrics.jsonl", step)
    else:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    log = StepLogger(out, cfg.logger, config=cfg.to_dict(), start_step=step)   # metrics.jsonl (+ TB, wandb)
    pilot = (PilotRecorder(cfg.record, pool, success_threshold=cfg.success_threshold, restart_at=step)
             if cfg.record else None)        # `rlpace advise`'s record: one line per generated batch
    heldout_n = {d: len(v) for d, v in tasks.heldout_by_domain().items()}   # the record's eval "n" per domain

    def evaluate(rec):
        acc = heldout_accuracy(model, tok, tasks, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat,
                               batch=cfg.eval_batch, memo=eval_memo)
        rec.update({f"eval/{k}": v for k, v in acc.items()})
        return acc

    def counters() -> dict:          # what a checkpoint restores besides model, optimizer, Scheduler
        return {"step": step, "rollouts": spent, "seconds": seconds, "domain_tokens": domain_tokens.tolist(),
                "generator": fresh.generator_json() if fresh else None,
                "grad_ref": grads.ref_json() if grads else None}

    # ---- 2. the loop ---------------------------------------------------------------------
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {sched.name}", disable=not cfg.progress)
    last_acc = None
    while step < cfg.steps and not (cfg.max_rollouts and spent >= cfg.max_rollouts):
        t0 = time.perf_counter()
        rec: dict = {"step": step}
        if step % cfg.eval_every == 0:
            last_acc = evaluate(rec)
        # 2a. measurements the policy reads, before this step's proposal
        if curves:
            rec.update(curves.measure(step, domain_tokens))
        if grads:
            grads.update_reference(step, heldout_reference)
        train_mode(False)
        oracle_rollouts = oracle.measure(step) if oracle else 0    # logged apart, not charged to the budget

        # 2b. propose B prompts (LILO: probe k·B candidates and keep the most learnable)
        probe_rollouts = probe_tokens = 0
        if cfg.lilo_candidates:
            ids, probe_rollouts, probe_tokens = lilo_select(sched, model, tok, tasks, prompt_tokens, cfg, step)
        else:
            ids = fresh.propose(sched, b, step, 0) if fresh else sched.propose(b)

        # 2c. generate → verify → observe → admit; refill dropped groups while asked to.
        # The Scheduler always sees GRPO group-normalised advantages (`group_advantages`),
        # whatever the objective: DUMP, SEC, EXP3 and top-k read one scale under every loss.
        pieces, fbs, admitted, round_, gen_tokens = [], [], 0, 0, probe_tokens     # fbs: each round's Feedback
        while True:
            rng = step_generator(cfg, step, round_, SAMPLE)
            n_i = sched.allocate(ids, len(ids) * w // b) if w else None    # int64[B] rollouts per prompt
            grp = (fresh.sample(model, tok, tasks, g, rng, sup.token_stats) if fresh else
                   sample_groups(model, tok, tasks, prompt_tokens, ids, g, cfg, rng, token_stats=sup.token_stats,
                                 sizes=n_i))
            grp, fb = sup.round_feedback(sched, grp, step)     # training labels, targets, the reward place
            fbs.append(fb)
            if grads is None:        # with features: observed after the loss forward (2d); admission
                sched.observe(fb)    # then reads the state before this step
            adm = sched.admission(fb)                           # keep bool[B, G]: what enters the loss
            pieces.append((grp, adm.keep))
            gen_tokens += grp.tokens
            admitted += int(adm.keep.any(axis=1).sum())
            if adm.refill <= 0 or admitted >= b or round_ >= cfg.max_refill_rounds:
                break
            round_ += 1
            ids = fresh.propose(sched, int(adm.refill), step, round_) if fresh else sched.propose(int(adm.refill))
        rollouts = probe_rollouts + sum(len(p[0].completions) for p in pieces)
        spent += rollouts

        # 2d. the training batch (the first B groups with an admitted rollout), loss, step(s)
        batch = _training_batch(pieces, b, g)
        if fresh:
            fresh.before_update(model, tok)
        stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        t_train = time.perf_counter()
        if batch.taken:
            train_mode(True)
            trained = _update(model, ref, opt, tok, sched, cfg, step, batch, not adm.full_group_advantages,
                              sup, grads, fbs, stats)
            np.add.at(domain_tokens, pool.domains[batch.ids], trained)
        elif grads:
            grads.observe(sched, fbs)                   # nothing trained: the rounds without features
        if fresh:
            rec.update(fresh.after_update(model, tok, bool(batch.taken)))

        # 2e. one JSONL record per step (and, with record=, the pilot record's lines)
        all_rewards = np.concatenate([_rollout_rewards(p[0]) for p in pieces])
        dt = time.perf_counter() - t0
        seconds += dt
        rec.update(stats)
        rec.update({
            "reward_mean": float(all_rewards.mean()),
            # first round's share of groups with a non-zero advantage, by the record's rule (Knapsack
            # RL's "effective gradient ratio"; padding and groups of N_i <= 1 have none)
            "informative_groups": float(informative_groups(fbs[0].advantages).mean()),
            "groups_trained": batch.taken, "refill_rounds": round_,
            "prompt_ids": [int(i) for p in pieces for i in p[0].ids],
            **({"group_sizes": [int(n) for p in pieces for n in p[0].sizes]} if w else {}),
            "rollouts": rollouts, "probe_rollouts": probe_rollouts, "rollouts_total": spent,
            "oracle_rollouts": oracle_rollouts,
            "tokens": gen_tokens, "seconds": dt, "train_seconds": time.perf_counter() - t_train,
            "seconds_total": seconds,
        })
        rec.update({f"sched/{k}": v for k, v in sched.metrics().items()})
        rec.update(sup.step_metrics())          # labelled share, relabels, target accuracy
        log(rec)
        if pilot:         # every batch of the step (refills too), all it cost (probes too), the eval before it
            # the held-out set's size per domain goes with the accuracies (advise fits the held-out solved share)
            pilot.write_step(fbs, rollouts=rollouts,
                             eval={**last_acc, "n": heldout_n} if "eval/mean" in rec else None)
        step += 1
        bar.update(1)
        bar.set_postfix(acc=f"{last_acc['mean']:.2f}" if last_acc else "-", reward=f"{rec['reward_mean']:.2f}")

        # 2f. checkpoint (model, optimizer, Scheduler, counters; the RNG is the step)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg, counters=counters())
    bar.close()

    # ---- 3. final evaluation, checkpoint, summary --------------------------------------
    final = {"step": step, "final": True}
    acc = evaluate(final)
    log(final)
    if pilot:
        pilot.write_eval(step, {**acc, "n": heldout_n})
    log.close()
    save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg, counters=counters())
    summary = summarize(out / "metrics.jsonl")
    summary.update({"policy": sched.name, "model_dir": str(model_dir), "config": cfg.to_dict()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _build_data(cfg: TrainConfig):
    """(every item, the items trained on, Pool, Scheduler, Supervision) of a checked config;
    InputError where the task spec and the policy cannot go together (before any work)."""
    spec = cfg.tasks.strip()
    generated = spec.startswith(GENERATED_PREFIX)      # the generator picks the prompts
    grid = spec.startswith(GRID_PREFIX)                # the Scheduler picks cells of a family's sizes
    full_tasks = (generated_taskset if generated else make_taskset)(
        spec if generated else cfg.tasks, train_per_domain=cfg.train_per_domain,
        heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)        # the base policy is built from every item
    # training labels drawn from the seed (labeled_fraction, label_noise); a method without a
    # target or reward place trains on the labelled prompts only ("labelled-only")
    sup = Supervision(full_tasks, cfg, make_method(cfg.policy, **json.loads(cfg.policy_kwargs)))
    tasks = sup.tasks
    if (generated or grid) and sup.places:
        raise InputError(f"tasks={cfg.tasks!r} rolls out fresh items of proposed cells, which the supervision "
                         f"places of policy={cfg.policy!r} ({', '.join(sorted(sup.places))}) cannot follow; "
                         f"use a fixed task set (e.g. tasks=embedded).")
    # per-prompt features for the pass-rate predictor (criticality_is / _grid, mopps' prior):
    # [family one-hot, size, log prompt length], cheap and deterministic (rlpace.tasks._features)
    pool = (cell_pool(tasks) if generated           # generated: one cell per size, fresh items
            else grid_pool(tasks) if grid           # grid: one cell per size with its features, fresh items
            else tasks.pool(features=prompt_features(tasks), labeled=sup.pool_labeled))
    sched = Scheduler(pool, cfg.policy, seed=cfg.seed, success_threshold=cfg.success_threshold,
                      **json.loads(cfg.policy_kwargs))
    if generated and (sched.method.mixture is not None or sched.method.selection.name != "uniform_pool"):
        raise InputError(f"tasks={cfg.tasks!r} chooses the prompts itself, so policy={cfg.policy!r} may not "
                         f"have a mixture or a selection; admission and reweighting policies are fine "
                         f"(e.g. policy=uniform or policy=dapo_dynamic_sampling).")
    if allocated_budget(cfg, sched):
        _check_allocation(cfg, sched, sup, generated or grid)
    if grid and uses_oracle(sched):
        raise InputError(f"tasks={cfg.tasks!r} rolls out fresh items, which an oracle cannot measure in "
                         f"advance; use another policy (e.g. policy=criticality_grid) or tasks=embedded:<names>.")
    return full_tasks, tasks, pool, sched, sup


def allocated_budget(cfg: TrainConfig, sched) -> int | None:
    """W, the rollouts each step splits by `Scheduler.allocate` (`rollout_budget`, default B·G),
    when the policy has an allocation place or `rollout_budget` is set; None: G per prompt."""
    if sched.method.allocation is None and not cfg.rollout_budget:
        return None
    return int(cfg.rollout_budget or cfg.batch_prompts * cfg.group_size)


def _check_allocation(cfg: TrainConfig, sched, sup: Supervision, fresh: bool) -> None:
    """InputError when the step's rollout allocation cannot run: a budget outside the allocation
    policy's bounds, or a component that reads rectangular [B, G] groups (the supervision places
    and noisy labels, gradient features, fresh items of generated: / grid: tasks). Training on the
    labelled prompts only (labeled_fraction < 1 without a place) is plain rollouts: allowed."""
    b, w, policy = cfg.batch_prompts, allocated_budget(cfg, sched), sched.method.allocation
    name = policy.name if policy is not None else "an even split"
    lo, hi = (policy.bounds or (0, None)) if policy is not None else (0, None)
    if w < max(1, b * lo) or (hi is not None and w > b * hi):
        raise InputError(f"rollout_budget={w} must lie in [batch_prompts·min_n, batch_prompts·max_n] = "
                         f"[{b}·{lo}, {b}·{hi if hi is not None else '∞'}] for {name} (min_n, max_n: its "
                         f"bounds; at least 1); raise or lower rollout_budget (0 = batch_prompts × group_size), "
                         f"or change the policy's min_n / max_n.")
    clash = ("tasks=generated: / grid: (fresh items of proposed cells)" if fresh else
             "label_noise > 0 or a target, reward or advantage place (ttrl, trapo, ...)" if sup.active else
             "gradient features (diem, dvc or grad_features=on)" if needs_grad_features(sched, cfg.grad_features)
             else "")
    if clash:
        raise InputError(f"policy={cfg.policy!r} allocates rollouts per prompt ({name}, ragged groups), which "
                         f"the built-in trainer cannot combine with {clash}: those read G rollouts per prompt. "
                         f"Drop the allocation (policy without knapsack / gvm / oracle_allocation, "
                         f"rollout_budget=0) or the other part.")


class TrainingBatch(NamedTuple):
    """The groups the step trains on: the first B with an admitted rollout, in round order.
    N = Σ N_i rollouts (Bt·G without an allocation); G' = G, or max N_i for ragged groups."""

    prompts: list                # N prompt token-id lists, group after group
    completions: list            # N completion token-id lists
    ids: np.ndarray              # int64[Bt]      pool positions
    rewards: np.ndarray          # float[Bt, G']  training rewards (0 after a ragged group's N_i)
    keep: np.ndarray             # bool[Bt, G']   admitted rollouts (False after N_i)
    src: list                    # Bt (round, row) of each group in the step's rounds
    taken: int                   # Bt
    sizes: np.ndarray | None = None    # int64[Bt] N_i of each group (allocated rollouts); None = G each


def _sizes(grp, g: int) -> np.ndarray:
    """int64[B] rollouts of each group of a round: its allocation, else G each."""
    return grp.sizes if getattr(grp, "sizes", None) is not None else np.full(len(grp.ids), g, np.int64)


def _rollout_rewards(grp) -> np.ndarray:
    """float[N] the round's rewards, one per generated rollout (a ragged round's padding left out)."""
    r = grp.rewards
    return r.ravel() if getattr(grp, "sizes", None) is None else r[np.arange(r.shape[1]) < grp.sizes[:, None]]


def _training_batch(pieces: list, b: int, g: int) -> TrainingBatch:
    """The first `b` groups of the rounds `pieces` [(Groups, keep bool[B, G])] with an admitted rollout."""
    prompts, comps, rows, src = [], [], [], []
    for pi, (grp, keep) in enumerate(pieces):
        n_i = _sizes(grp, g)
        start = np.concatenate([[0], np.cumsum(n_i)])         # first rollout of each group (prompt-major)
        for j in np.flatnonzero(keep.any(axis=1))[: b - len(rows)]:
            prompts += grp.prompts[start[j]:start[j + 1]]
            comps += grp.completions[start[j]:start[j + 1]]
            rows.append((grp.ids[j], grp.rewards[j, :n_i[j]], keep[j, :n_i[j]]))
            src.append((pi, j))                     # round and row of each trained group
    if not rows:
        return TrainingBatch([], [], np.zeros(0, np.int64), np.zeros((0, g)), np.zeros((0, g), bool), [], 0)
    sizes = np.array([len(r_) for _, r_, _ in rows], dtype=np.int64)                   # [Bt]
    ragged = any(getattr(grp, "sizes", None) is not None for grp, _ in pieces)
    rewards = np.zeros((len(rows), int(sizes.max())), dtype=rows[0][1].dtype)         # [Bt, G']
    keep_ = np.zeros(rewards.shape, dtype=bool)
    for k, (_, r_, k_) in enumerate(rows):
        rewards[k, :len(r_)], keep_[k, :len(k_)] = r_, k_
    return TrainingBatch(prompts, comps, np.array([i for i, _, _ in rows], dtype=np.int64), rewards, keep_, src,
                         len(rows), sizes if ragged else None)


def _update(model, ref, opt, tok, sched, cfg: TrainConfig, step: int, batch: TrainingBatch, subset: bool,
            sup: Supervision, grads: GradSignal | None, fbs: list, stats: dict) -> np.ndarray:
    """One GRPO update on `batch`: advantages on the kept rollouts → loss weights → `epochs`
    optimizer steps; adds the step's loss, pg_loss, kl and clip_fraction to `stats`. Returns
    float64[Bt] completion tokens trained on per group.

    Advantages are recomputed on each group's kept rollouts (PODS, GFPO: the subset is trained
    as if it were the group; equal to the full-group advantages when a group is kept whole),
    unless the admission policy says otherwise (`subset` False: `Admission.full_group_advantages`).

    Allocated rollouts (`batch.sizes`, ragged groups of N_i): the advantage of prompt i's
    rollouts is taken over its own N_i (mean and population std as above, the trainer's
    setting for every group — not Knapsack RL's unbiased std and ±5 clip, which
    `rlpace.group_advantages(ddof=1, clip=5.0)` gives; N_i = 1 gets A = 0), and the loss keeps
    the objective's normaliser over the batch's rollouts (tokens for DAPO): every rollout weighs
    the same, so prompt i enters the step in proportion to N_i, as in verl's GRPO over the
    duplicated rows Knapsack RL trains on. The forward shares a prompt over a chunk's groups
    when they have one size, else runs one row per rollout. The caller puts the model in train mode."""
    dev, g, n, taken = cfg.device, cfg.group_size, len(batch.completions), batch.taken
    sizes = batch.sizes if batch.sizes is not None else np.full(taken, g, np.int64)        # [Bt] N_i
    valid = np.arange(batch.rewards.shape[1])[None, :] < sizes[:, None]                    # [Bt, G'] real rollouts
    clip_low = None if cfg.clip_low < 0 else cfg.clip_low
    clip_high = None if cfg.clip_high < 0 else cfg.clip_high
    p_ids, p_mask = left_pad(batch.prompts, tok.pad_token_id)
    c_ids, c_mask = right_pad(batch.completions, tok.pad_token_id)
    rew_t, keep_np = batch.rewards, batch.keep                                          # [Bt, G]
    over = keep_np if subset else valid if batch.sizes is not None else None   # the rollouts A is taken over
    adv_t = advantages(torch.from_numpy(rew_t), cfg.objective, None if over is None else torch.from_numpy(over))
    adv_t = adv_t[torch.from_numpy(valid)].to(dev)                                          # [N]
    keep_t = torch.from_numpy(keep_np[valid]).float().to(dev)                               # [N] 0/1
    lengths = np.zeros(valid.shape, np.int64)                                               # [Bt, G']
    lengths[valid] = [len(x) for x in batch.completions]
    fb_t = Feedback(batch.ids, rew_t, group_advantages(rew_t, group_sizes=batch.sizes), step, lengths=lengths,
                    group_sizes=batch.sizes)
    fb_t, w_adv = sup.trained_feedback(sched, fb_t, fbs, batch.src)     # supervision: Ã = w · Â
    if w_adv is not None:
        adv_t = adv_t * torch.from_numpy(w_adv.reshape(-1)).float().to(dev)
    chunks, gs = _chunks(sizes, cfg.micro_batch or n)     # whole groups; gs: each chunk's shared group size
    batches = [Rollout(p_ids[c].to(dev), p_mask[c].to(dev), c_ids[c].to(dev), c_mask[c].to(dev)) for c in chunks]
    units = [aggregation_units(cfg.objective, r.completion_mask, keep_t[c]) for r, c in zip(batches, chunks)]
    total_units = sum(units) or 1.0
    shares = [u / total_units for u in units]    # each chunk's share of the batch's loss
    total_tokens = float((c_mask * keep_t.cpu()[:, None]).sum()) or 1.0
    pack = True      # one forward per group over [prompt | its G completions] (rollout.completion_logprobs)
    with torch.no_grad():
        # π_old of every token, before the first update: the Scheduler's token weights
        # are normalised over the whole batch. One forward, one epoch: that forward's own
        # log-probs are π_old, read inside the loop (no extra pass).
        old = ([completion_logprobs(model, r, cfg.temperature, gk, packed=pack) for r, gk in zip(batches, gs)]
               if cfg.epochs > 1 or len(batches) > 1 else None)
        ref_lp = ([completion_logprobs(ref, r, cfg.temperature, gk, packed=pack) for r, gk in zip(batches, gs)]
                  if ref is not None else None)

    def loss_of(k, logp, weights):               # chunk k's objective at log-probs logp, loss weights [n, T]
        r, c = batches[k], chunks[k]
        return policy_loss(cfg.objective, logp, old[k] if old else logp.detach(), adv_t[c], r.completion_mask,
                           keep_t[c], weights, clip_low=clip_low, clip_high=clip_high, max_tokens=cfg.max_new_tokens)

    pre = None
    if grads is not None:       # features of the unit-weight loss; then the rounds are observed with them
        pre, feats = grads.forward(batches, shares, lambda r, gs, packed: completion_logprobs(
            model, r, cfg.temperature, gs, first_logits=True, packed=packed), loss_of)
        fb_t = grads.observe(sched, fbs, batch.src, fb_t, feats)
    w_tok = None if old is None else _token_weights(sched, fb_t, old, c_mask, valid)  # [N, T]
    for group in opt.param_groups:
        group["lr"] = cfg.lr * min(1.0, (step + 1) / max(1, cfg.lr_warmup))
    for epoch in range(cfg.epochs):
        opt.zero_grad(set_to_none=True)
        for k, (r, c) in enumerate(zip(batches, chunks)):
            # With features, epoch 0 has the unit-weight loss L₁ and its gradients at the
            # log-probs and at the weights (the features' autograd call returned them). Every
            # objective is linear in its loss weights w: the weighted loss is Σ w ⊙ ∂L₁/∂w and
            # its gradient at the log-probs c ⊙ ∂L₁/∂logp (losses.logp_grad_scale), so the
            # backward starts at the log-probs and the loss is not evaluated a second time.
            at_logp = bool(pre) and epoch == 0
            logp = pre[k][0] if at_logp else completion_logprobs(model, r, cfg.temperature, gs[k], packed=pack)
            if w_tok is None:
                w_tok = _token_weights(sched, fb_t, [logp.detach()], c_mask, valid)
            w_k = w_tok[c].to(dev)                                                   # [n, T]
            if at_logp:            # roots of the backward and their incoming gradients
                _, g_logp, g_unit, clipped = pre[k]
                loss = (w_k * g_unit).sum()                                 # = weighted loss · share
                roots, seeds = [logp], [logp_grad_scale(cfg.objective, w_k, r.completion_mask) * g_logp]
            else:
                lo = loss_of(k, logp, w_k)
                loss, clipped = lo.loss * shares[k], lo.clip_fraction
                roots, seeds = [loss], [None]
            stats["pg_loss"] += loss.item() / cfg.epochs
            stats["clip_fraction"] += clipped * shares[k] / cfg.epochs
            if ref is not None:
                tok_share = float((r.completion_mask * keep_t[c][:, None]).sum()) / total_tokens
                kl = kl_k3(logp, ref_lp[k], r.completion_mask, keep_t[c])
                kl_loss = cfg.kl_coef * kl * tok_share
                roots, seeds = ([logp, kl_loss], seeds + [None]) if at_logp else ([loss + kl_loss], [None])
                loss = loss + kl_loss
                stats["kl"] += kl.item() * tok_share / cfg.epochs
            torch.autograd.backward(roots, seeds)
            stats["loss"] += loss.item() / cfg.epochs
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
    tokens = np.zeros(valid.shape)                                                           # [Bt, G']
    tokens[valid] = c_mask.sum(1).double().numpy()
    return (tokens * keep_np).sum(1)                                                         # [Bt] tokens


def _chunks(sizes: np.ndarray, rows: int) -> tuple[list, list]:
    """([slice of rows], [group size]) of each forward: whole groups, `rows` or more a chunk
    (micro_batch; the last may hold fewer). A chunk whose groups have one size N shares each
    prompt over N rows (`completion_logprobs(group_size=N)`); mixed sizes forward one row per
    rollout (group_size 1). Equal groups of G with `rows` a multiple of G: chunks of `rows`."""
    chunks, gs, start, first = [], [], 0, 0
    for k, end in enumerate(np.cumsum(sizes)):
        if end - start >= rows or k == len(sizes) - 1:
            part = sizes[first:k + 1]
            chunks.append(slice(start, int(end)))
            gs.append(int(part[0]) if (part == part[0]).all() else 1)
            start, first = int(end), k + 1
    return chunks, gs


def _token_weights(sched, fb: Feedback, old_logp: list, c_mask: torch.Tensor, valid: np.ndarray) -> torch.Tensor:
    """float32[N, T] loss weights of the training batch's tokens from the Scheduler
    (`Scheduler.token_weights`): a rollout-level reweighter's weight on each real token, or
    a token-level one's (`ar`) from the sampling policy's token probabilities exp(old_logp).
    `valid` bool[Bt, G']: where the N rollouts sit in the [Bt, G'] groups (ragged: padding)."""
    lp = torch.cat([x.detach().float().cpu() for x in old_logp])                     # [N, T]
    t = lp.shape[1]
    probs = np.zeros(valid.shape + (t,))                                             # [Bt, G', T]
    probs[valid] = torch.exp(lp).clamp(max=1.0).double().numpy()
    mask = np.zeros(valid.shape + (t,), dtype=bool)
    mask[valid] = (c_mask > 0).numpy()
    w = sched.token_weights(fb, np.where(mask, probs, 0.0), mask)                    # [Bt, G', T]
    return torch.from_numpy(np.ascontiguousarray(w[valid])).float()                  # [N, T]


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
        "oracle_rollouts_total": int(sum(r.get("oracle_rollouts", 0) for r in steps)),
        "informative_fraction": float(np.mean([r["informative_groups"] for r in steps])) if steps else math.nan,
        "seconds_total": steps[-1]["seconds_total"] if steps else 0.0,
    }
