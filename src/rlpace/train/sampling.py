"""Rollout groups, and what the built-in recipe measures besides its training rollouts.

    sample_groups   B prompts × G sampled completions, verified against the truth
    lilo_select     LILO's probes: k·B candidates × m rollouts, keep the top-B by p̂(1−p̂)
                    (charged to the budget)
    oracle_measure  every training prompt's pass rate, m rollouts each, fed to the Scheduler
                    as one Feedback (oracle_* measurement tools; never charged to the budget)
    probe_losses    teacher-forced NLL of reference answers per domain (loss-curve policies:
                    epiplexity)

Every random draw comes from `step_generator(cfg, step, round, stream)`, one stream per use
(SAMPLE, PROBE, ORACLE), so a resumed run repeats the uninterrupted one exactly.

These are the measurements; when the recipe runs them, and what it logs, is the business of
its components: `rlpace.train.oracle.OracleMeasurement`, `rlpace.train.lossprobe.LossCurves`
(LILO has no state: the recipe calls `lilo_select` at its proposal).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..types import Feedback
from .config import TrainConfig
from .rollout import Rollout, completion_logprobs, decode_completions, encode_prompts, generate, left_pad, right_pad

__all__ = ["SAMPLE", "PROBE", "ORACLE", "Groups", "step_generator", "sample_groups", "lilo_select",
           "uses_oracle", "oracle_measure", "uses_losses", "LossProbe", "build_loss_probe", "answer_rollout",
           "probe_losses"]

SAMPLE, PROBE = 0, 1          # random streams of the generation seed
ORACLE = 2                    # stream of the oracle measurement


class Groups(NamedTuple):
    """B prompts × G sampled completions, verified. Ragged groups (`sizes`, an allocation
    policy's N_i): prompts, completions and texts hold the Σ N_i rollouts, prompt-major, and
    every [B, G] field is [B, max N] with 0 after row i's first N_i columns."""

    ids: np.ndarray              # int64[B]     pool positions
    prompts: list                # B·G token-id lists (prompt of each rollout)
    completions: list            # B·G token-id lists (EOS included when produced)
    rewards: np.ndarray          # float32[B, G]
    tokens: int                  # completion tokens generated
    lengths: np.ndarray          # int64[B, G] completion tokens of each rollout (EOS included)
    texts: tuple = ()            # B·G decoded completions (what the verifier read)
    token_entropy: np.ndarray | None = None    # float64[B, G] mean H(p_t) over response tokens (token_stats)
    self_certainty: np.ndarray | None = None   # float64[B, G] mean KL(U ‖ p_t) over response tokens
    mean_logprob: np.ndarray | None = None     # float64[B, G] mean log p_t(o_t) over response tokens
    sizes: np.ndarray | None = None            # int64[B] N_i rollouts of each prompt (ragged); None = G each


def step_generator(cfg: TrainConfig, step: int, round_: int, stream: int) -> torch.Generator:
    """The torch generator of one random stream at (seed, step, round): what makes a resumed
    run sample exactly what the uninterrupted one did."""
    seed = int(np.random.SeedSequence([cfg.seed, step, round_, stream]).generate_state(1)[0])
    return torch.Generator(device=cfg.device).manual_seed(seed)


def sample_groups(model, tok, tasks, prompt_tokens, ids, g: int, cfg: TrainConfig, gen,
                  token_stats: bool = False, sizes=None) -> Groups:
    """Generate g rollouts for each pool position in `ids` and score them against the truth;
    with `token_stats`, also each rollout's mean token entropy, self-certainty and log-probability.
    `sizes` int[B] (an allocation, `Scheduler.allocate`): N_i rollouts of prompt i instead of g
    each, as ragged `Groups` (N_i = 0: the prompt gets none)."""
    ids = np.asarray(ids, dtype=np.int64)
    n_i = np.full(len(ids), g, np.int64) if sizes is None else np.asarray(sizes, dtype=np.int64)   # [B]
    prompts = [prompt_tokens[i] for i, n in zip(ids, n_i) for _ in range(n)]                     # Σ N_i rows
    if prompts:      # ragged: one row per rollout (no shared prompt forward); else G rows per prompt
        ro = generate(model, prompts if sizes is not None else [prompt_tokens[i] for i in ids],
                      repeats=1 if sizes is not None else g, max_new_tokens=cfg.max_new_tokens,
                      eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, temperature=cfg.temperature,
                      generator=gen, stats=token_stats)
        texts = decode_completions(tok, ro)
        lens = ro.completion_mask.sum(1).long().tolist()
        comps = [row[:n] for row, n in zip(ro.completion_ids.tolist(), lens)]
    else:
        ro, texts, lens, comps = None, [], [], []
    items = [tasks.train[i] for i, n in zip(ids, n_i) for _ in range(n)]
    width = g if sizes is None else int(n_i.max(initial=0))
    valid = np.arange(width)[None, :] < n_i[:, None]                                  # [B, G or max N]

    def grouped(flat, dtype):            # Σ N_i values, prompt-major → [B, G or max N], 0 after N_i
        out = np.zeros(valid.shape, dtype)
        out[valid] = flat
        return out

    rewards = grouped(tasks.score(items, texts) if items else [], np.float32)
    stats = {}
    if token_stats and ro is not None:   # masked means over each rollout's tokens (EOS included)
        n_tok = ro.completion_mask.sum(1).clamp(min=1).double()
        stats = {k: grouped((getattr(ro, src).double().sum(1) / n_tok).cpu().numpy(), np.float64)
                 for k, src in (("token_entropy", "token_entropy"), ("self_certainty", "self_certainty"),
                                ("mean_logprob", "token_logprob"))}
    return Groups(ids, prompts, comps, rewards, int(sum(lens)), grouped(lens, np.int64), tuple(texts), **stats,
                  sizes=None if sizes is None else n_i)


def lilo_select(sched, model, tok, tasks, prompt_tokens, cfg: TrainConfig, step: int):
    """LILO (Foster et al. 2025, arXiv 2502.12272): propose k·B candidates, spend `lilo_probes`
    rollouts on each, keep the B with the largest p̂(1−p̂) (ties: proposal order).
    Returns (ids int64[B], probe rollouts spent, probe tokens generated). The probes only
    score; they are neither trained on nor observed by the Scheduler (LILO keeps only the
    scores), but they cost generation, so both counts are charged to the budget."""
    b = cfg.batch_prompts
    cand = sched.propose(cfg.lilo_candidates * b)
    probe = sample_groups(model, tok, tasks, prompt_tokens, cand, cfg.lilo_probes, cfg,
                          step_generator(cfg, step, 0, PROBE))
    p = (probe.rewards >= cfg.success_threshold).mean(axis=1)
    keep = np.argsort(-(p * (1.0 - p)), kind="stable")[:b]
    return cand[keep], cand.size * cfg.lilo_probes, probe.tokens


# ---- oracle measurement ------------------------------------------------------------------
def uses_oracle(sched) -> bool:
    """Whether a policy of the Scheduler reads the pass-rate measurement of every training
    prompt (`DataPolicy.reads` holds "measurement": the oracle_* measurement tools)."""
    return any("measurement" in p.reads for p in sched.method.policies().values())


def oracle_measure(sched, model, tok, tasks, prompt_tokens, cfg: TrainConfig, step: int) -> int:
    """Measure every training prompt's current pass rate with m = `oracle_rollouts` extra
    rollouts (the training sampling: same temperature and token budget, batched
    `eval_batch` prompts at a time) and feed them to the Scheduler as ONE measurement
    `Feedback(all ids, rewards[N, m], step)`; an oracle policy overwrites its per-prompt
    pass rate with it. Returns the rollouts spent, N·m, which the recipe logs as
    `oracle_rollouts` and never adds to the budget counter: the oracle is an upper bound
    on what scheduling could save, not a method."""
    n, m = len(tasks.train), cfg.oracle_rollouts
    gen = step_generator(cfg, step, 0, ORACLE)
    chunk = max(1, cfg.eval_batch)
    rewards = np.concatenate([sample_groups(model, tok, tasks, prompt_tokens, np.arange(s, min(n, s + chunk)),
                                            m, cfg, gen).rewards for s in range(0, n, chunk)])   # [N, m]
    sched.observe(Feedback(np.arange(n, dtype=np.int64), rewards, step=step))
    return n * m


# ---- held-out loss probe ---------------------------------------------------------------------
def uses_losses(sched) -> bool:
    """Whether a policy of the Scheduler learns from held-out loss curves (`epiplexity`)."""
    return any(p.update_losses is not None for p in sched.method.policies().values())


class LossProbe(NamedTuple):
    """A fixed probe set: prompts with their reference answers, teacher-forced."""

    rollout: Rollout             # [P] prompt (left-padded) + answer + EOS (right-padded)
    domains: np.ndarray          # int64[P] pool domain code of each row
    names: tuple                 # pool domain labels (code order)


def build_loss_probe(tasks, pool, tok, cfg: TrainConfig) -> LossProbe:
    """The first `loss_probe_per_domain` held-out items of each domain (its first training
    items where it has no held-out ones): never trained on, fixed for the whole run."""
    held = tasks.heldout_by_domain()
    items, codes = [], []
    for code, name in enumerate(pool.domain_names):
        src = held.get(name) or [it for it in tasks.train if it.domain == name]
        chosen = list(src[: cfg.loss_probe_per_domain])
        items += chosen
        codes += [code] * len(chosen)
    return LossProbe(answer_rollout(tok, items, cfg), np.asarray(codes, dtype=np.int64), tuple(pool.domain_names))


def answer_rollout(tok, items, cfg: TrainConfig) -> Rollout:
    """Each item's prompt (left-padded) with its reference answer + EOS as the completion."""
    prompts = encode_prompts(tok, [it.prompt for it in items], cfg.chat)
    answers = [tok.encode(it.answer, add_special_tokens=False) + [tok.eos_token_id] for it in items]
    p_ids, p_mask = left_pad(prompts, tok.pad_token_id)
    c_ids, c_mask = right_pad(answers, tok.pad_token_id)
    dev = cfg.device
    return Rollout(p_ids.to(dev), p_mask.to(dev), c_ids.to(dev), c_mask.to(dev))


@torch.no_grad()
def probe_losses(model, probe: LossProbe) -> np.ndarray:
    """float64[K] mean NLL per answer token (nats) of each domain's probe rows, in one batched
    forward at temperature 1: Σ_rows Σ_t −log π(a_t | q, a_<t) / Σ_rows (answer tokens + EOS);
    NaN for a domain without probe rows."""
    logp = completion_logprobs(model, probe.rollout, 1.0)                            # [P, T]
    mask = probe.rollout.completion_mask.float()
    nll = (-(logp * mask).sum(1)).double().cpu().numpy()                             # [P]
    ntok = mask.sum(1).double().cpu().numpy()                                        # [P]
    k = len(probe.names)
    num = np.bincount(probe.domains, weights=nll, minlength=k)
    den = np.bincount(probe.domains, weights=ntok, minlength=k)
    # LossFeedback bounds a loss to [0, 1e4]; a −inf log-prob (fp16 underflow) would break it
    return np.where(den > 0, np.minimum(num / np.maximum(den, 1.0), 1e4), np.nan)
