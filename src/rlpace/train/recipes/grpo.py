"""GRPO with an adaptive data Scheduler — the whole recipe, top to bottom.

    setup:  tasks → Pool → Scheduler;  base policy (tiny, cached) or --model DIR;  optimizer
    loop:   propose → generate G rollouts per prompt → verify → observe → admit (+refills)
            → advantages on the kept rollouts → loss weights (per token: Scheduler.token_weights)
            → loss (GRPO / Dr. GRPO / DAPO / GSPO, optional KL) → step
            held-out greedy eval every k steps; one JSONL record per step; checkpoints
            loss-curve policies (epiplexity): probe NLL per domain every k steps → observe_losses
            supervision (issue 14; labeled_fraction, label_noise, ttrl / olr / trapo / self_certainty):
            answers → sched.targets → verify against target or training label → sched.rewards
            → observe, admit → advantages × sched.advantage_weights (rlpace.train.supervision)
    end:    final eval, summary.json

The objectives are pure functions in `rlpace.train.losses`; sampling and log-probs in
`rlpace.train.rollout`; rollout groups and the measurements made besides training (LILO
probes, the oracle measurement, the loss probe) in `rlpace.train.sampling`; partial / noisy
labels in `rlpace.train.supervision`; fresh procedural items (`generated:`, `grid:`) in
`rlpace.train.generated`; per-rollout gradient features in `rlpace.train.gradfeatures`. Everything that can be wrong with the input is checked before
the first rollout (`check_config`, the task spec, the policy name, the model directory,
the resume directory).

Run it:  `rlpace train steps=150 policy=dump`   or   `train(TrainConfig(steps=150))`.
"""

from __future__ import annotations

from ...errors import InputError
import copy
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

from ...optim import build_optimizer
from ...policies import make_method
from ...scheduler import Scheduler
from ...tasks import make_taskset, parse_mistakes
from ...tasks._features import prompt_features
from ...tasks._grid import GRID_PREFIX, cell_keys, grid_cells, grid_pool
from ...tasks._generator import (GENERATED_PREFIX, buffer_push, family_configs, generated_taskset,
                                 generator_init, generator_probs, generator_to_json, generator_update)
from ...types import Feedback, group_advantages
from ..checkpoint import (check_resumable, load_checkpoint, restore_domain_tokens, restore_grad_ref,
                          save_checkpoint)
from ..config import TrainConfig
from ..evaluate import heldout_accuracy
from ..gradfeatures import (FirstToken, GradFeatures, heldout_reference, needs_grad_features, needs_ref_grad,
                           split_with_grads)
from ..logging import StepLogger
from ..losses import OBJECTIVES, advantages, aggregation_units, kl_k3, logp_grad_scale, policy_loss
from ..model import build_base_policy, check_model_dir, load_policy
from ..report import rollouts_before
from ..rollout import Rollout, completion_logprobs, encode_prompts, left_pad, right_pad
from ..sampling import (SAMPLE, build_loss_probe, lilo_select, oracle_measure, probe_losses, sample_groups,
                        step_generator, uses_losses, uses_oracle)
from ..supervision import Supervision, check_fractions
from ..generated import buffer_nll, cell_pool, draw, fresh_source, generator_state, sample_fresh

__all__ = ["train", "check_config", "base_policy", "summarize"]


def check_config(cfg: TrainConfig) -> None:
    """ValueError naming the field and the fix for any invalid value (no work done)."""
    def need(ok, msg):
        if not ok:
            raise InputError(msg)
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
    check_fractions(cfg.labeled_fraction, cfg.label_noise)          # issue 14: partial / noisy labels
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


def train(cfg: TrainConfig) -> dict:
    """Run the recipe; returns the summary (also written to `out/summary.json`)."""
    from tqdm.auto import tqdm

    # ---- 0. check everything that can fail, before any work -----------------------------
    check_config(cfg)
    generated = cfg.tasks.strip().startswith(GENERATED_PREFIX)   # the generator picks the prompts
    grid = cfg.tasks.strip().startswith(GRID_PREFIX)     # the Scheduler picks cells of a family's sizes
    tasks = (generated_taskset if generated else make_taskset)(
        cfg.tasks.strip() if generated else cfg.tasks, train_per_domain=cfg.train_per_domain,
        heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
    full_tasks = tasks                           # the base policy is built from every item
    # issue 14: training labels drawn from the seed (labeled_fraction, label_noise); a method
    # without a target or reward place trains on the labelled prompts only ("labelled-only")
    sup = Supervision(tasks, cfg, make_method(cfg.policy, **json.loads(cfg.policy_kwargs)))
    tasks = sup.tasks
    if (generated or grid) and sup.places:
        raise InputError(f"tasks={cfg.tasks!r} rolls out fresh items of proposed cells, which the supervision "
                         f"places of policy={cfg.policy!r} ({', '.join(sorted(sup.places))}) cannot follow; "
                         f"use a fixed task set (e.g. tasks=embedded).")
    # per-prompt features for the pass-rate predictor (criticality_is / _grid, mopps' prior):
    # [family one-hot, size, log prompt length], cheap and deterministic (rlpace.tasks._features)
    pool = (cell_pool(tasks) if generated           # generated: one cell per size, fresh items (issue 15)
            else grid_pool(tasks) if grid           # grid: one cell per size with its features, fresh items
            else tasks.pool(features=prompt_features(tasks), labeled=sup.pool_labeled))
    sched = Scheduler(pool, cfg.policy, seed=cfg.seed, success_threshold=cfg.success_threshold,
                      **json.loads(cfg.policy_kwargs))
    if generated and (sched.method.mixture is not None or sched.method.selection.name != "uniform_pool"):
        raise InputError(f"tasks={cfg.tasks!r} chooses the prompts itself, so policy={cfg.policy!r} may not "
                         f"have a mixture or a selection; admission and reweighting policies are fine "
                         f"(e.g. policy=uniform or policy=dapo_dynamic_sampling).")
    if grid and uses_oracle(sched):
        raise InputError(f"tasks={cfg.tasks!r} rolls out fresh items, which an oracle cannot measure in "
                         f"advance; use another policy (e.g. policy=criticality_grid) or tasks=embedded:<names>.")
    out = Path(cfg.out)
    ckpt_dir = out / "checkpoint"
    if cfg.resume:
        check_resumable(ckpt_dir, cfg)

    # ---- 1. setup: policy, reference, optimizer, tokenized pool -------------------------
    torch.set_num_threads(cfg.threads)
    model_dir = cfg.model or base_policy(cfg, full_tasks)
    model, tok = load_policy(model_dir, cfg.device)
    ref = copy.deepcopy(model).requires_grad_(False) if cfg.kl_coef > 0 else None
    opt = build_optimizer(cfg.optimizer, model, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.0)  # iso_*: frames
    lr_at = lambda s: cfg.lr * min(1.0, (s + 1) / max(1, cfg.lr_warmup))      # noqa: E731
    prompt_tokens = encode_prompts(tok, [it.prompt for it in tasks.train], cfg.chat)
    clip_low = None if cfg.clip_low < 0 else cfg.clip_low
    clip_high = None if cfg.clip_high < 0 else cfg.clip_high
    b, g = cfg.batch_prompts, cfg.group_size
    measure = uses_oracle(sched)                 # oracle_* policies: measured pass rates (issue 10)
    # loss-curve policies (epiplexity): probe NLL per domain against completion tokens trained on
    probe = build_loss_probe(tasks, pool, tok, cfg) if uses_losses(sched) else None
    domain_tokens = np.zeros(pool.n_domains)     # float64[K] kept completion tokens trained on
    # per-rollout gradient features (issue 11): only when a policy reads them (diem, dvc)
    gf = (GradFeatures(model, cfg.grad_params, cfg.grad_dim, cfg.seed)
          if needs_grad_features(sched, cfg.grad_features) else None)
    if gf is not None and sup.active:
        raise InputError(f"policy={cfg.policy!r} with labeled_fraction / label_noise or a target, reward or "
                         f"advantage place cannot run with gradient features (grad_features=off, or drop "
                         f"diem / dvc): the built-in trainer does not carry answers through them yet.")
    ref_probe = (probe or build_loss_probe(tasks, pool, tok, cfg)) \
        if gf is not None and cfg.grad_reference == "heldout" and needs_ref_grad(sched) else None
    grad_ref = None                              # float32[d] Feedback.ref_grad (checkpointed)
    gen = generator_init(pool.n_domains, cfg.gen_buffer) if generated else None   # checkpointed
    fresh = fresh_source(tasks, pool, cfg.seed) if generated or grid else None    # what fresh items need
    step, spent, seconds = 0, 0, 0.0
    if cfg.resume:
        counters = load_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched)
        step, spent, seconds = counters["step"], counters["rollouts"], counters["seconds"]
        domain_tokens = restore_domain_tokens(counters, pool.n_domains)
        gen = generator_state(counters, pool, cfg) if generated else None
        grad_ref = restore_grad_ref(counters, gf)
        _truncate_log(out / "metrics.jsonl", step)
    else:
        shutil.rmtree(ckpt_dir, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text("")
    (out / "config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    log = StepLogger(out, cfg.logger, config=cfg.to_dict(), start_step=step)   # metrics.jsonl (+ TB, wandb)

    def evaluate(rec):
        acc = heldout_accuracy(model, tok, tasks, max_new_tokens=cfg.max_new_tokens, chat=cfg.chat,
                               batch=cfg.eval_batch)
        rec.update({f"eval/{k}": v for k, v in acc.items()})
        return acc

    # ---- 2. the loop ---------------------------------------------------------------------
    def counters() -> dict:          # what a checkpoint restores besides model, optimizer, Scheduler
        return {"step": step, "rollouts": spent, "seconds": seconds, "domain_tokens": domain_tokens.tolist(),
                "generator": None if gen is None else generator_to_json(gen),
                "grad_ref": None if grad_ref is None else grad_ref.tolist()}

    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {sched.name}", disable=not cfg.progress)
    last_acc = None
    while step < cfg.steps and not (cfg.max_rollouts and spent >= cfg.max_rollouts):
        t0 = time.perf_counter()
        rec: dict = {"step": step}
        if step % cfg.eval_every == 0:
            last_acc = evaluate(rec)
        if probe is not None and step % cfg.loss_probe_every == 0:
            model.eval()
            nll = probe_losses(model, probe)                                          # [K] nats
            measured = {str(d): (float(domain_tokens[i]), float(nll[i]))
                        for i, d in enumerate(pool.domain_names) if np.isfinite(nll[i])}
            sched.observe_losses(measured, step=step)
            rec.update({f"probe_loss/{d}": v for d, (_, v) in measured.items()})
        if ref_probe is not None and step % cfg.grad_ref_every == 0:
            model.eval()           # Feedback.ref_grad: gradient feature of the held-out answers' NLL
            grad_ref = heldout_reference(model, gf, ref_probe.rollout, cfg.temperature)

        # 2a. propose B prompts (LILO: probe k·B candidates and keep the most learnable)
        model.eval()
        # oracle_* policies only: measure every prompt, logged apart, not charged to the budget
        oracle_rollouts = 0
        if measure and step % cfg.oracle_every == 0:
            oracle_rollouts = oracle_measure(sched, model, tok, tasks, prompt_tokens, cfg, step)
        probe_rollouts = probe_tokens = 0
        if cfg.lilo_candidates:
            ids, probe_rollouts, probe_tokens = lilo_select(sched, model, tok, tasks, prompt_tokens, cfg, step)
        else:
            keys = None if gen is None else draw(gen, b, cfg, step, 0)                # int64[B, 4] fresh items
            ids = sched.propose(b) if gen is None else keys[:, 0]
            keys = cell_keys(ids, step, 0) if grid else keys                          # grid: fresh items of the cells

        # 2b. generate → verify → observe → admit; refill dropped groups while asked to.
        # The Scheduler always sees GRPO group-normalised advantages (`group_advantages`),
        # whatever the objective: DUMP, SEC, EXP3 and top-k read one scale under every loss.
        pieces, admitted, round_, gen_tokens = [], 0, 0, probe_tokens
        fbs = []                                                # each round's Feedback
        sup_fbs = []                                            # each round's Feedback with answers (issue 14)
        drawn = []                                              # generated: each round's item keys
        while True:
            if fresh is None:
                grp = sample_groups(model, tok, tasks, prompt_tokens, ids, g, cfg,
                                    step_generator(cfg, step, round_, SAMPLE), token_stats=sup.token_stats)
            else:          # new items of the drawn sizes; grp.ids are their cells
                grp = sample_fresh(model, tok, tasks, fresh, keys, g, cfg, step_generator(cfg, step, round_, SAMPLE),
                                   token_stats=sup.token_stats)
                drawn.append(keys)
            if sup.active:
                # answers → sched.targets → verify against target / training label → sched.rewards
                grp, fb = sup.feedback(sched, grp, step)
                sup_fbs.append(fb)
            else:
                fb = Feedback(grp.ids, grp.rewards, group_advantages(grp.rewards), step, lengths=grp.lengths)
            if gf is None:
                sched.observe(fb)                               # every group, kept or not
            else:
                # With gradient features every round is observed after the loss forward (2d), so the
                # trained groups carry Feedback.grads; admission reads the state before this step.
                fbs.append(fb)
            adm = sched.admission(fb)                           # keep bool[B, G]: what enters the loss
            pieces.append((grp, adm.keep))
            gen_tokens += grp.tokens
            admitted += int(adm.keep.any(axis=1).sum())
            if adm.refill <= 0 or admitted >= b or round_ >= cfg.max_refill_rounds:
                break
            round_ += 1
            if gen is not None:
                keys = draw(gen, int(adm.refill), cfg, step, round_)
            ids = sched.propose(int(adm.refill)) if gen is None else keys[:, 0]
            keys = cell_keys(ids, step, round_) if grid else keys
        rollouts = probe_rollouts + sum(p[0].rewards.size for p in pieces)
        spent += rollouts

        # 2c. the training batch: the first B groups with an admitted rollout. Advantages
        # are recomputed on each group's kept rollouts (PODS, GFPO: the subset is trained as
        # if it were the group; equal to the full-group advantages when a group is kept whole),
        # unless the admission policy says otherwise (`Admission.full_group_advantages`: topk).
        prompts, comps, rows, src = [], [], [], []
        for pi, (grp, keep) in enumerate(pieces):
            for j in np.flatnonzero(keep.any(axis=1))[: b - len(rows)]:
                prompts += grp.prompts[j * g:(j + 1) * g]
                comps += grp.completions[j * g:(j + 1) * g]
                rows.append((grp.ids[j], grp.rewards[j], keep[j]))
                src.append((pi, j))                     # round and row of each trained group
        taken = len(rows)

        # generator: NLL of previously generated items before this step's update (the reward's "before")
        nll_before = buffer_nll(model, tok, fresh, gen, cfg) if gen is not None else None

        # 2d. loss and optimizer step(s)
        stats = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0}
        t_train = time.perf_counter()
        if taken:
            model.train()
            dev = cfg.device
            n = len(comps)
            p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
            c_ids, c_mask = right_pad(comps, tok.pad_token_id)
            ids_t = np.array([i for i, _, _ in rows], dtype=np.int64)                        # [Bt]
            rew_t = np.stack([r_ for _, r_, _ in rows])                                      # [Bt, G]
            keep_np = np.stack([k_ for _, _, k_ in rows])                                    # [Bt, G]
            subset = not adm.full_group_advantages       # the method's rule, e.g. True for topk
            adv_t = advantages(torch.from_numpy(rew_t), cfg.objective,
                               torch.from_numpy(keep_np) if subset else None).reshape(-1).to(dev)  # [N]
            keep_t = torch.from_numpy(keep_np.reshape(-1)).float().to(dev)                   # [N] 0/1
            fb_t = Feedback(ids_t, rew_t, group_advantages(rew_t), step,
                            lengths=np.array([len(x) for x in comps], dtype=np.int64).reshape(taken, g))
            if sup.active:          # the trained rows' answers / token statistics; Ã = w · Â (issue 14)
                fb_t = sup.batch_feedback(fb_t, sup_fbs, src)
                w_adv = sup.advantage_weights(sched, fb_t)                                   # [Bt, G] or None
                if w_adv is not None:
                    adv_t = adv_t * torch.from_numpy(w_adv.reshape(-1)).float().to(dev)
            mb = cfg.micro_batch or n                    # a multiple of G: whole groups per chunk
            chunks = [slice(s, min(n, s + mb)) for s in range(0, n, mb)]
            batches = [Rollout(p_ids[c].to(dev), p_mask[c].to(dev), c_ids[c].to(dev), c_mask[c].to(dev))
                       for c in chunks]
            total_units = sum(aggregation_units(cfg.objective, r.completion_mask, keep_t[c])
                              for r, c in zip(batches, chunks)) or 1.0
            total_tokens = float((c_mask * keep_t.cpu()[:, None]).sum()) or 1.0
            with torch.no_grad():
                # π_old of every token, before the first update: the Scheduler's token weights
                # are normalised over the whole batch. One forward, one epoch: that forward's own
                # log-probs are π_old, read inside the loop (no extra pass).
                old = ([completion_logprobs(model, r, cfg.temperature, g) for r in batches]
                       if cfg.epochs > 1 or len(batches) > 1 else None)
                ref_lp = ([completion_logprobs(ref, r, cfg.temperature, g) for r in batches]
                          if ref is not None else None)
            pre = None
            if gf is not None:
                # Features (issue 11): one forward (per-row for exact last_block/all features, else
                # the shared prompt forward), the unit-weight loss's per-rollout gradient features,
                # then weights; the graph is kept and reused by the first epoch's weighted backward
                # (rlpace.train.gradfeatures). Exact lm_head features need no per-row forward: the
                # first token's share of the shared prompt call comes from its repeated logits (FirstToken).
                head_exact = cfg.grad_exact and cfg.grad_params == "lm_head"
                pre, feats = [], []            # pre: per chunk (logp, ∂L₁/∂logp, ∂L₁/∂w, clip fraction)
                for k, (r, c) in enumerate(zip(batches, chunks)):
                    unit = torch.ones_like(r.completion_mask).requires_grad_(True)          # [n, T] weights 1
                    with gf.capture():       # grad_exact, not lm_head: one row per rollout in every call
                        logp, z0 = completion_logprobs(model, r, cfg.temperature,
                                                       g if head_exact or not cfg.grad_exact else 1, first_logits=True)
                        lo = policy_loss(cfg.objective, logp, old[k] if old else logp.detach(), adv_t[c],
                                         r.completion_mask, keep_t[c], unit, clip_low=clip_low, clip_high=clip_high,
                                         max_tokens=cfg.max_new_tokens)
                    share = aggregation_units(cfg.objective, r.completion_mask, keep_t[c]) / total_units
                    first = FirstToken(z0) if head_exact and z0 is not None else None
                    f_k, (g_logp, g_unit) = gf.features(lo.loss * share, logp.shape[0], not cfg.grad_exact,
                                                        first_token=first, wrt=(logp, unit))          # [n, d]
                    feats.append(f_k)
                    pre.append((logp, g_logp, g_unit, lo.clip_fraction))
                feats = feats[0] if len(feats) == 1 else torch.cat(feats)
                grads_np = feats.cpu().numpy().reshape(taken, g, gf.dim)                   # [Bt, G, d]
                fb_t = fb_t.with_grads(grads_np, grad_ref)
                for pi, fb_r in enumerate(fbs):
                    mine = [i for i, (p_, _) in enumerate(src) if p_ == pi]
                    for part in split_with_grads(fb_r, [src[i][1] for i in mine], fb_t, mine):
                        sched.observe(part)      # fb_t's validated features: not checked twice
                fbs = []
                if cfg.grad_reference == "previous":
                    grad_ref = grads_np.sum(axis=(0, 1))          # the next step's reference
            w_tok = None if old is None else _token_weights(sched, fb_t, old, c_mask, g)  # [N, T]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            for epoch in range(cfg.epochs):
                opt.zero_grad(set_to_none=True)
                for k, (r, c) in enumerate(zip(batches, chunks)):
                    # With features, epoch 0 has the unit-weight loss L₁ and its gradients at the
                    # log-probs and at the weights (the features' autograd call returned them). Every
                    # objective is linear in its loss weights w: the weighted loss is Σ w ⊙ ∂L₁/∂w and
                    # its gradient at the log-probs c ⊙ ∂L₁/∂logp (losses.logp_grad_scale), so the
                    # backward starts at the log-probs and the loss is not evaluated a second time.
                    at_logp = bool(pre) and epoch == 0
                    logp = pre[k][0] if at_logp else completion_logprobs(model, r, cfg.temperature, g)
                    old_k = old[k] if old else logp.detach()
                    if w_tok is None:
                        w_tok = _token_weights(sched, fb_t, [old_k], c_mask, g)
                    w_k = w_tok[c].to(dev)                                                   # [n, T]
                    share = aggregation_units(cfg.objective, r.completion_mask, keep_t[c]) / total_units
                    if at_logp:            # roots of the backward and their incoming gradients
                        _, g_logp, g_unit, clipped = pre[k]
                        loss = (w_k * g_unit).sum()                                 # = weighted loss · share
                        roots, seeds = [logp], [logp_grad_scale(cfg.objective, w_k, r.completion_mask) * g_logp]
                    else:
                        lo = policy_loss(cfg.objective, logp, old_k, adv_t[c], r.completion_mask, keep_t[c],
                                         w_k, clip_low=clip_low, clip_high=clip_high, max_tokens=cfg.max_new_tokens)
                        loss, clipped = lo.loss * share, lo.clip_fraction
                        roots, seeds = [loss], [None]
                    stats["pg_loss"] += loss.item() / cfg.epochs
                    stats["clip_fraction"] += clipped * share / cfg.epochs
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
            trained = (c_mask.sum(1).double().numpy().reshape(taken, g) * keep_np).sum(1)   # [Bt] tokens
            np.add.at(domain_tokens, pool.domains[ids_t], trained)

        for fb_r in fbs:                                # features on, nothing trained: plain feedback
            sched.observe(fb_r)

        # generator: reward = the buffer's NLL drop from this step (prequential epiplexity gain)
        if gen is not None:
            if taken and nll_before is not None:
                model.eval()
                nll_after = buffer_nll(model, tok, fresh, gen, cfg)
                configs = np.concatenate([pool.domains[p[0].ids] for p in pieces])    # every drawn prompt
                gen = generator_update(gen, configs, nll_before - nll_after, lr=cfg.gen_lr,
                                       entropy_coef=cfg.gen_entropy)
                rec.update({"gen/reward": nll_before - nll_after, "gen/buffer_nll": nll_after})
            gen = buffer_push(gen, np.concatenate(drawn))             # the real items of this step
            rec.update({f"gen/prob/{d}": float(q) for d, q in zip(pool.domain_names, generator_probs(gen))})

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
            "oracle_rollouts": oracle_rollouts,
            "tokens": gen_tokens, "seconds": dt, "train_seconds": time.perf_counter() - t_train,
            "seconds_total": seconds,
        })
        rec.update({f"sched/{k}": v for k, v in sched.metrics().items()})
        rec.update(sup.step_metrics())          # labelled share, relabels, target accuracy (issue 14)
        log(rec)
        step += 1
        bar.update(1)
        bar.set_postfix(acc=f"{last_acc['mean']:.2f}" if last_acc else "-", reward=f"{rec['reward_mean']:.2f}")

        # 2f. checkpoint (model, optimizer, Scheduler, counters; the RNG is the step)
        if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
            save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg,
                            counters=counters())
    bar.close()

    # ---- 3. final evaluation, checkpoint, summary --------------------------------------
    final = {"step": step, "final": True}
    evaluate(final)
    log(final)
    log.close()
    save_checkpoint(ckpt_dir, model=model, optimizer=opt, scheduler=sched, config=cfg,
                    counters=counters())
    summary = summarize(out / "metrics.jsonl")
    summary.update({"policy": sched.name, "model_dir": str(model_dir), "config": cfg.to_dict()})
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _token_weights(sched, fb: Feedback, old_logp: list, c_mask: torch.Tensor, g: int) -> torch.Tensor:
    """float32[N, T] loss weights of the training batch's tokens from the Scheduler
    (`Scheduler.token_weights`): a rollout-level reweighter's weight on each real token, or
    a token-level one's (`ar`) from the sampling policy's token probabilities exp(old_logp)."""
    lp = torch.cat([x.detach().float().cpu() for x in old_logp])                     # [N, T]
    bt, t = fb.rewards.shape[0], lp.shape[1]
    probs = torch.exp(lp).clamp(max=1.0).reshape(bt, g, t).double().numpy()          # [Bt, G, T]
    mask = (c_mask > 0).reshape(bt, g, t).numpy()
    w = sched.token_weights(fb, np.where(mask, probs, 0.0), mask)                    # [Bt, G, T]
    return torch.from_numpy(w.reshape(bt * g, t)).float()


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
