"""Supervision in the built-in trainer (partial and noisy labels; DE-Venus, arXiv 2609.03324): which training
prompts keep their label, which labels are corrupted, each rollout's extracted answer and token
statistics, and the Scheduler's target → reward → advantage places around the loss.

    setup:      labels = make_labels(items, labeled_fraction, label_noise, seed)   # from the seed, not state
                a method without a target or reward place trains on the labelled prompts only
    each round: answers[B, G] (+ token entropy / self-certainty when the method reads them)
                targets = sched.targets(Feedback(rewards=0, answers, ...))   # None: keep the training label
                r_ij    = verify(completion_ij, targets[i] or training label of i)   # neither: 0
                r       = sched.rewards(Feedback(r, answers, ...))           # the reward place
                → observe, admission (unchanged)
    batch:      advantages × sched.advantage_weights(fb_t)                   # Ã = w · Â, w ∈ [0, 1]

Evaluation never goes through here: held-out items are always graded against their truth. The
hidden truth of the training prompts is used for one thing only, measurement: each step logs
how often the targets (pseudo-labels, relabels) and the effective training labels are right
(`sup/target_accuracy`, `sup/label_accuracy`) and the reward against the truth
(`sup/true_reward_mean`) — what a trainer on real unlabelled data cannot see.

Example:
    >>> from rlpace.tasks import Item
    >>> items = [Item(f"x{i}=", str(i % 3), "d", 1.0, i) for i in range(10)]
    >>> lab = make_labels(items, labeled_fraction=0.5, label_noise=0.4, seed=0)
    >>> int(lab.labeled.sum()), int(lab.noisy.sum()), sum(a is None for a in lab.answers)
    (5, 2, 5)
"""

from __future__ import annotations

from ..errors import InputError
import inspect
import json
import math
from typing import NamedTuple, Sequence

import numpy as np

from ..policies._base import supervising_places
from ..tasks._verify import extract_tagged, last_boxed
from ..types import Feedback, group_advantages

__all__ = ["Labels", "make_labels", "check_fractions", "extract_answer", "relabel", "supervising_places",
           "reads_token_stats", "Supervision"]

_STREAM = 0x514          # random streams of the label draws: [seed, _STREAM, 0|1, domain]
_STAT_READS = frozenset({"token_stats", "token_entropy", "self_certainty", "mean_logprob"})
_STATS = ("token_entropy", "self_certainty", "mean_logprob")


# ---- labels ---------------------------------------------------------------------------------
class Labels(NamedTuple):
    """What training may use of each training prompt's ground truth (N = len(items)).

    labeled: bool[N] — the prompt keeps a label for training (`Pool.labeled`).
    noisy: bool[N] — its training label is a wrong answer (`label_noise`); False where unlabelled.
    answers: tuple of N str | None — the training label: the truth, a wrong answer where
        `noisy`, None where unlabelled.
    """

    labeled: np.ndarray
    noisy: np.ndarray
    answers: tuple


def check_fractions(labeled_fraction: float, label_noise: float) -> None:
    """ValueError naming the field when labeled_fraction ∉ (0, 1] or label_noise ∉ [0, 1)."""
    lf, ln = labeled_fraction, label_noise
    if isinstance(lf, bool) or not isinstance(lf, (int, float)) or not (math.isfinite(lf) and 0 < lf <= 1):
        raise InputError(f"labeled_fraction must be a number in (0, 1] (1 = every training prompt keeps its "
                         f"label); got {lf!r}.")
    if isinstance(ln, bool) or not isinstance(ln, (int, float)) or not (math.isfinite(ln) and 0 <= ln < 1):
        raise InputError(f"label_noise must be a number in [0, 1) (0 = clean labels); got {ln!r}.")


def _share(fraction: float, n: int) -> int:
    """round(fraction · n), halves up (not banker's rounding: 0.5 · 5 → 3)."""
    return int(math.floor(fraction * n + 0.5))


def make_labels(items: Sequence, labeled_fraction: float = 1.0, label_noise: float = 0.0,
                seed: int = 0) -> Labels:
    """The training labels of `items` (a TaskSet's `train`), drawn per distribution from `seed`:

    * labelled: in each domain d with n_d items, max(1, round(f · n_d)) of them, uniformly
      (f = `labeled_fraction`; at least one, so no domain is left without a labelled prompt);
    * noisy: of the m_d labelled items of d, round(η · m_d) (η = `label_noise`), uniformly;
      each gets the answer of a uniformly drawn other item of d whose answer differs (a
      wrong answer the policy can realise: OLR's "active" noise, arXiv 2604.03993), or of
      any other item when every item of d has the same answer.

    The draws depend only on (seed, domain), not on training state, so a resumed run has the
    same labels. Answers are compared after `.strip()`.
    """
    check_fractions(labeled_fraction, label_noise)
    truth = [str(it.answer) for it in items]
    domains = np.array([it.domain for it in items], dtype=object)
    n = len(items)
    labeled, noisy = np.zeros(n, bool), np.zeros(n, bool)
    answers: list = list(truth)
    for code, d in enumerate(sorted(set(domains.tolist()))):
        idx = np.flatnonzero(domains == d)
        rng = np.random.default_rng([seed, _STREAM, 0, code])
        lab = np.sort(rng.permutation(idx)[: max(1, _share(labeled_fraction, idx.size))])
        labeled[lab] = True
        rng = np.random.default_rng([seed, _STREAM, 1, code])
        for i in np.sort(rng.permutation(lab)[: _share(label_noise, lab.size)]):
            wrong = [j for j in idx if truth[j].strip() != truth[i].strip()] or \
                    [j for j in range(n) if truth[j].strip() != truth[i].strip()]
            if not wrong:
                raise InputError(f"label_noise={label_noise} needs a wrong answer for the prompts of {d!r}, "
                                 f"but every training item has the answer {truth[i]!r}; use label_noise=0.")
            answers[i] = truth[wrong[int(rng.integers(len(wrong)))]]
            noisy[i] = True
    return Labels(labeled, noisy, tuple(a if ok else None for a, ok in zip(answers, labeled)))


# ---- answers --------------------------------------------------------------------------------
def extract_answer(completion: str, ability: str = "exact") -> str | None:
    """The final answer of a completion as the task's verifier reads it (`rlpace.tasks._verify`),
    stripped; None when there is none. The text in the last `<answer>...</answer>` pair when
    there is one; else the whole completion for exact-match and reasoning-gym items, and the
    content of the last `\\boxed{}` for math items (math-verify's first choice; TTRL-v2's
    `extract_answer`, which also yields None without a box). An empty answer is None: TTRL-v2
    leaves such rollouts out of the vote.

    >>> extract_answer(" 42\\n"), extract_answer("<answer> 7 </answer>"), extract_answer("  ")
    ('42', '7', None)
    >>> extract_answer("so \\\\boxed{\\\\frac{1}{2}}.", "math"), extract_answer("1/2", "math")
    ('\\\\frac{1}{2}', None)
    """
    if not isinstance(completion, str):
        return None
    got = extract_tagged(completion)
    if got is None:
        got = last_boxed(completion) if ability == "math" else completion
    got = None if got is None else got.strip()
    return got or None


def relabel(item, answer: str):
    """`item` graded against `answer` instead of its ground truth (`Item.answer`, and the
    `answer` of its JSON entry for scorers that read the entry: reasoning-gym)."""
    entry = item.entry
    if entry:
        try:
            e = json.loads(entry)
        except ValueError:
            e = None
        if isinstance(e, dict) and "answer" in e:
            entry = json.dumps({**e, "answer": answer})
    return item._replace(answer=answer, entry=entry)


# ---- what the method reads --------------------------------------------------------------------
def reads_token_stats(method) -> bool:
    """Whether the trainer computes per-rollout token entropy, self-certainty and mean
    log-probability: when a policy declares it reads one of them (`DataPolicy.reads`:
    self_certainty, entropy_min), or the method has a reward or advantage place. Otherwise
    they are skipped: they cost a softmax over the vocabulary per generated token."""
    reads = frozenset().union(*(getattr(p, "reads", frozenset()) for p in method.policies().values()))
    return bool(reads & _STAT_READS) or bool(supervising_places(method) & {"reward", "advantage"})


_FB_PARAMS = frozenset(inspect.signature(Feedback).parameters)


def make_feedback(ids, rewards, step, lengths, extra: dict) -> Feedback:
    """Feedback with GRPO group advantages and the supervision fields this `Feedback` accepts."""
    kw = {k: v for k, v in extra.items() if k in _FB_PARAMS and v is not None}
    return Feedback(ids, rewards, group_advantages(np.asarray(rewards, np.float64)), step, lengths=lengths, **kw)


# ---- per run ------------------------------------------------------------------------------------
class Supervision:
    """The labels of one run, what its method reads, and the step's measurements.

    Attributes:
        tasks: the TaskSet training uses: all items, or only the labelled ones when the method
            cannot supervise the others ("labelled-only"); held-out items unchanged.
        labels: `Labels` of `tasks.train`.
        pool_labeled: bool[N] for `TaskSet.pool(labeled=)`, or None when every prompt is labelled.
        places: the method's non-neutral places (`supervising_places`).
        active: whether rounds go through `feedback` (labels changed or a place is non-neutral);
            when False the recipe trains on the truth's rewards, as without supervision.
        token_stats: whether generation computes token entropy / self-certainty.
    """

    def __init__(self, tasks, cfg, method):
        import dataclasses
        check_fractions(cfg.labeled_fraction, cfg.label_noise)
        self.places = supervising_places(method)
        self.token_stats = reads_token_stats(method)
        labels = make_labels(tasks.train, cfg.labeled_fraction, cfg.label_noise, cfg.seed)
        self.pool_labeled = None
        if not labels.labeled.all():
            if self.places & {"target", "reward"}:
                self.pool_labeled = labels.labeled.copy()
            else:     # nothing can supervise the unlabelled prompts: train on the labelled ones only
                keep = np.flatnonzero(labels.labeled)
                tasks = dataclasses.replace(tasks, train=tuple(tasks.train[i] for i in keep))
                labels = Labels(labels.labeled[keep], labels.noisy[keep], tuple(labels.answers[i] for i in keep))
        self.tasks, self.labels = tasks, labels
        self.threshold = cfg.success_threshold
        self.active = bool(self.places or self.pool_labeled is not None or labels.noisy.any())
        self._sums: dict = {}

    # -- the recipe's two points: each generation round, then the trained batch
    def round_feedback(self, sched, grp, step: int):
        """(groups with training rewards, their Feedback) of one generation round: through
        `feedback` when supervision is active, else the truth's rewards with GRPO group
        advantages, as they were sampled (ragged groups: `Feedback.group_sizes`)."""
        if self.active:
            return self.feedback(sched, grp, step)
        sizes = getattr(grp, "sizes", None)
        return grp, Feedback(grp.ids, grp.rewards, group_advantages(grp.rewards, group_sizes=sizes), step,
                             lengths=grp.lengths, group_sizes=sizes)

    def trained_feedback(self, sched, fb_t: Feedback, round_fbs: list, src: list):
        """(the trained batch's Feedback, float64[Bt, G] advantage weights or None): with
        supervision active, `fb_t` gains its rows' answers and token statistics
        (`batch_feedback`) and the advantage place weighs Â (Ã = w · Â)."""
        if not self.active:
            return fb_t, None
        fb_t = self.batch_feedback(fb_t, round_fbs, src)
        return fb_t, self.advantage_weights(sched, fb_t)

    # -- one generation round
    def feedback(self, sched, grp, step: int):
        """(groups with training rewards, their Feedback) for one round of `sample_groups`
        output, whose rewards are against the truth. Order: answers → `sched.targets` →
        verify against target / training label → `sched.rewards`."""
        b, g = grp.rewards.shape
        items = [self.tasks.train[i] for i in grp.ids]
        answers = [[extract_answer(grp.texts[i * g + j], it.ability) for j in range(g)]
                   for i, it in enumerate(items)]
        extra = {"answers": answers, **{k: getattr(grp, k) for k in _STATS}}
        targets = [None] * b
        if hasattr(sched, "targets") and "answers" in _FB_PARAMS:
            # the target place reads answers, never rewards: a placeholder of zeros
            targets = list(sched.targets(make_feedback(grp.ids, np.zeros((b, g)), step, grp.lengths, extra)))
        rewards = np.zeros((b, g), np.float64)
        for i, it in enumerate(items):
            label = targets[i] if targets[i] is not None else self.labels.answers[grp.ids[i]]
            if label is None:
                continue                                   # unlabelled, no target: reward 0
            if str(label).strip() == str(it.answer).strip():
                rewards[i] = grp.rewards[i]                # the truth: already graded
            else:
                rewards[i] = self.tasks.score([relabel(it, str(label))] * g, grp.texts[i * g:(i + 1) * g])
        fb = make_feedback(grp.ids, rewards, step, grp.lengths, extra)
        if hasattr(sched, "rewards") and "reward" in self.places:
            rewards = np.asarray(sched.rewards(fb), dtype=np.float64)
            fb = make_feedback(grp.ids, rewards, step, grp.lengths, extra)
        self._measure(items, grp, targets)
        return grp._replace(rewards=rewards), fb

    def _correct(self, item, answer) -> bool:
        """Whether `answer` is right for `item` by its own verifier (the hidden truth)."""
        return self.tasks.scorers[item.ability](str(answer), item) >= self.threshold

    def _measure(self, items, grp, targets) -> None:
        s = self._sums
        add = lambda k, v: s.__setitem__(k, s.get(k, 0.0) + float(v))    # noqa: E731
        for i, (it, t) in enumerate(zip(items, targets)):
            pid = int(grp.ids[i])
            lab = self.labels.answers[pid]
            add("prompts", 1)
            add("labeled", self.labels.labeled[pid])
            add("noisy", self.labels.noisy[pid])
            if t is not None:
                add("targets", 1)
                add("target_correct", self._correct(it, t))
                if lab is None:
                    add("pseudo_labels", 1)
                elif str(t).strip() != str(lab).strip():
                    add("relabels", 1)
            eff = t if t is not None else lab
            if eff is not None:
                add("effective", 1)
                add("effective_correct", self._correct(it, eff))
        add("true_reward", float(np.sum(grp.rewards)))
        add("rollouts", grp.rewards.size)

    def step_metrics(self) -> dict:
        """This step's `sup/*` record (all rounds), then reset. `target_accuracy` and
        `label_accuracy` are absent when no prompt had a target / a training label."""
        s, self._sums = self._sums, {}
        if not s:
            return {}
        out = {"sup/labeled_share": s["labeled"] / s["prompts"], "sup/noisy_share": s["noisy"] / s["prompts"],
               "sup/targets": int(s.get("targets", 0)), "sup/relabels": int(s.get("relabels", 0)),
               "sup/pseudo_labels": int(s.get("pseudo_labels", 0)),
               "sup/true_reward_mean": s["true_reward"] / s["rollouts"]}
        if s.get("targets"):
            out["sup/target_accuracy"] = s["target_correct"] / s["targets"]
        if s.get("effective"):
            out["sup/label_accuracy"] = s["effective_correct"] / s["effective"]
        return out

    # -- the trained batch
    @staticmethod
    def batch_feedback(fb_t: Feedback, round_fbs: list, src: list) -> Feedback:
        """`fb_t` (the trained groups) with the answers and token statistics of its rows, which
        come from round `src[k][0]`, row `src[k][1]` of `round_fbs`."""
        extra = {}
        for name in ("answers", *_STATS):
            parts = [getattr(round_fbs[p], name, None) for p, _ in src]
            if parts and all(x is not None for x in parts):
                rows = [x[j] for x, (_, j) in zip(parts, src)]
                extra[name] = [list(r) for r in rows] if name == "answers" else np.stack(rows)
        return make_feedback(fb_t.prompt_ids, fb_t.rewards, fb_t.step, fb_t.lengths, extra)

    def advantage_weights(self, sched, fb_t: Feedback) -> np.ndarray | None:
        """float64[Bt, G] in [0, 1] from the advantage place, or None when it is neutral."""
        if "advantage" not in self.places or not hasattr(sched, "advantage_weights"):
            return None
        return np.asarray(sched.advantage_weights(fb_t), dtype=np.float64)
