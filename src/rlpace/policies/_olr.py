"""OLR: relabel a prompt with its majority answer when that answer's pass rate is rising and
its past majorities agree (learning under noisy labels).

Yang et al., "Can LLMs Learn to Reason Robustly under Noisy Supervision?", arXiv 2604.03993,
following `ShenzhiYang2000/OLR` `verl/trainer/ppo/ray_trainer.py`
(`_generate_pseudo_labels_and_update_passrate_weak_noise_label`, `_get_slope`,
`_get_freq_list_count_freq`); docs/methods/olr.md.

On visit v (0-based, counted per prompt) of prompt q, with the G answers of its group:

    m      = unique majority of the answers (None on a tie: '__NoMajorityAnswer__')
    P[q]  += [ #{i : a_i = m} / G ]          # the majority's pass rate (0 without majority)
    M[q]  += [ m ]
    slope  = OLS slope of P[q] against 0..len−1 over the whole history (0 if < 2 points)
    h      = unique majority of M[q]         # the history's majority ("no majority" entries count)
    target = m              if v > start_step and slope ≥ slope_threshold and h == m
             dataset label  otherwise        # re-decided every visit; the label is never overwritten

An unlabelled prompt (`Pool.labeled` False) has no dataset label: its target is None ("no
target") unless it is relabelled.

`Scheduler.targets` decides as though this visit were already appended (the code appends
before deciding); `observe` appends it. Per-prompt histories are fixed-capacity arrays: the
last `capacity` visits are kept (OLR's scripts run 10 epochs, i.e. 10 visits per prompt).

Options (off by default) reconstructed from the DE-Venus paper's text on "NL-OLR v2"
(arXiv 2609.03324; no public code): `min_pass_rate` — also require P ≥ this (an absolute
threshold); `margin` — also require P − (the prompt's last pass rate against its dataset
label) ≥ margin (a margin over the current label; unknown before a non-relabelled visit).

>>> import numpy as np
>>> from rlpace import Pool, Feedback, Scheduler
>>> s = Scheduler(Pool(["x"]), "olr", start_step=1)
>>> for v, k in enumerate([1, 2, 3]):   # "7" gets k + 1 of 4 votes: a tie (P = 0), then P = .75, 1
...     fb = Feedback([0], np.zeros((1, 4)), answers=[["7"] * (k + 1) + ["8"] * (3 - k)], step=v)
...     t = s.targets(fb); s.observe(fb)
>>> t, s.metrics()["supervision/relabels"]
(['7'], 1.0)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._base import TARGET, DataPolicy, Targets
from ._checks import check_int, check_real
from ._vote import ols_slopes, row_modes, votes_of


class OlrState(NamedTuple):
    rate: np.ndarray        # float64[N, C] majority pass rate of the last C visits, oldest first
    majority: np.ndarray    # int64[N, C]   answer_hash of each visit's majority (0 = none)
    visits: np.ndarray      # int64[N]      visits recorded (may exceed C)
    label_rate: np.ndarray  # float64[N]    last pass rate against the dataset label; NaN unknown
    relabels: np.ndarray    # int64[]       visits relabelled with the majority
    kept: np.ndarray        # int64[]       visits that kept the dataset label
    no_answers: np.ndarray  # int64[]       groups observed without Feedback.answers (not recorded)
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"rate": "unit", "visits": "nonneg", "label_rate": "unit", "relabels": "nonneg",
                   "kept": "nonneg", "no_answers": "nonneg"}


def olr(slope_threshold: float = 0.05, start_step: int = 4, capacity: int = 16,
        min_pass_rate: float | None = None, margin: float | None = None) -> DataPolicy:
    """OLR (arXiv 2604.03993): relabel with the majority when its pass-rate slope ≥ `slope_threshold` and past majorities agree.

    Args:
        slope_threshold: minimum OLS slope of the majority pass rate per visit (OLR: 0.05).
        start_step: warm-up in visits of the prompt: relabelling needs visit index > this
            (0-based; OLR's `start_select_epoch` = 4, so from the 6th visit on).
        capacity: visits kept per prompt (the last `capacity`; memory 16·N·capacity bytes).
        min_pass_rate: option (DE-Venus v2 reconstruction): also require the majority's
            pass rate ≥ this. None: off.
        margin: option (DE-Venus v2 reconstruction): also require it to exceed the prompt's
            last pass rate against its dataset label by ≥ this. None: off.
    """
    slope_threshold = check_real("olr", "slope_threshold", slope_threshold)
    start_step = check_int("olr", "start_step", start_step, low=0)
    cap = check_int("olr", "capacity", capacity, low=2)
    if min_pass_rate is not None:
        min_pass_rate = check_real("olr", "min_pass_rate", min_pass_rate, low=0, high=1)
    if margin is not None:
        margin = check_real("olr", "margin", margin, low=-1, high=1)

    def init(pool):
        n = len(pool)
        return OlrState(np.zeros((n, cap)), np.zeros((n, cap), np.int64), np.zeros(n, np.int64),
                        np.full(n, np.nan), np.array(0, np.int64), np.array(0, np.int64),
                        np.array(0, np.int64))

    def append_visit(r_new, m_new, k, p, mh):
        """Append one visit (pass rate p float64[R], majority hash mh [R]) to R histories
        r_new, m_new [R, C] holding k int64[R] visits each, in place: at column k, or shifting
        the oldest out of a full history (k == C)."""
        full = k == cap
        if full.any():
            r_new[full] = np.roll(r_new[full], -1, axis=1)
            m_new[full] = np.roll(m_new[full], -1, axis=1)
        at = np.where(full, cap - 1, k)
        r_new[np.arange(k.shape[0]), at] = p
        m_new[np.arange(k.shape[0]), at] = mh

    def walk(state, batch, votes, record_label_rate: bool, relabel=None):
        """Every row's visit appended to its prompt's history and the decision, for all rows at
        once: (relabel bool[B], majority winner int64[B], values, pass rate float64[B],
        evidence columns, histories of the batch's distinct prompts after the batch).

        Pure: the histories are copies. A prompt twice in one batch sees its earlier row's
        visit (rows are taken in rounds: first occurrences, then second ones, ...). With
        `record_label_rate` (observe), a row that keeps the dataset label records its pass
        rate before the prompt's next row in the batch reads it, as in a loop over rows.
        With `relabel` bool[B] (the decision already made for this visit on this state: `update`
        given the targets), the visits are appended under it and nothing is decided again (the
        evidence columns are then zeros)."""
        b, g = votes.answers.shape
        win, count, mh = votes.majorities("abstain")
        values = votes.values
        has_m = win >= 0
        p = np.where(has_m, count / g, 0.0)                             # majority pass rate
        ids = batch.prompt_ids
        uniq, inv = _unique_inverse(ids)
        rate, maj = state.rate[uniq], state.majority[uniq]              # copies [U, C]
        visits, label_rate = state.visits[uniq], state.label_rate[uniq]
        ok = np.zeros(b, bool)
        ev = {"visit": np.zeros(b, np.int64), "slope": np.zeros(b), "share": np.zeros(b),
              "label_rate": np.zeros(b)}
        for rows in _rounds(inv, distinct=uniq.size == b):
            u = inv[rows]
            k = np.minimum(visits[u], cap)
            r_new, m_new = rate[u], maj[u]
            append_visit(r_new, m_new, k, p[rows], mh[rows])
            length = np.minimum(k + 1, cap)
            lr = label_rate[u]
            slope, share = np.zeros(rows.size), np.zeros(rows.size)
            if relabel is not None:
                okr = relabel[rows]
            else:
                okr = decide(rows, u, visits, lr, r_new, m_new, length, has_m, p, mh, slope, share)
            ok[rows] = okr
            ev["visit"][rows], ev["slope"][rows] = visits[u], slope
            ev["share"][rows], ev["label_rate"][rows] = share, lr
            rate[u], maj[u], visits[u] = r_new, m_new, visits[u] + 1
            if record_label_rate:      # verified against the dataset label: its pass rate
                label_rate[u[~okr]] = batch.pass_rate[rows[~okr]]
        return ok, win, values, p, ev, (uniq, rate, maj, visits, label_rate)

    def decide(rows, u, visits, lr, r_new, m_new, length, has_m, p, mh, slope, share):
        """bool[R]: OLR's rule for rows `rows` of one round, their histories r_new / m_new
        [R, C] already holding this visit; writes each row's slope and history share."""
        cols = np.arange(cap)
        # the cheap conditions first; the slope and the history's majority only where the
        # decision still depends on them (none on a prompt's first start_step + 1 visits)
        okr = has_m[rows] & (visits[u] > start_step)
        if min_pass_rate is not None:
            okr &= p[rows] >= min_pass_rate
        if margin is not None:
            okr &= np.isfinite(lr) & (p[rows] - lr >= margin)
        cand = np.flatnonzero(okr)
        if cand.size:
            slope[cand] = ols_slopes(r_new[cand], length[cand])
            cand = cand[slope[cand] >= slope_threshold]
            hist, n, want = m_new[cand], length[cand], mh[rows][cand]
            valid = cols < n[:, None]
            same = np.count_nonzero((hist == want[:, None]) & valid, axis=1)
            agree = 2 * same > n                   # a strict majority is the unique mode
            unsure = np.flatnonzero(~agree)
            if unsure.size:
                first, _, n_top = row_modes(hist[unsure], valid[unsure])
                agree[unsure] = (n_top == 1) & (hist[unsure, first] == want[unsure])
            okr[:] = False
            okr[cand[agree]] = True
            share[cand] = same / n                 # where mh is the unique mode: its share
        return okr

    def append_visits(state, batch, votes, relabel):
        """`walk(..., record_label_rate=True, relabel=relabel)` written into the state's arrays,
        for a batch of distinct prompts (one round): each visit appended in place (at column
        `visits`, or shifting the oldest out of a full history) without copying the batch's
        histories out and back, and the dataset label's pass rate recorded where kept."""
        ids = batch.prompt_ids
        g = votes.answers.shape[1]
        win, count, mh = votes.majorities("abstain")
        p = np.where(win >= 0, count / g, 0.0)
        v = state.visits[ids]
        full = v >= cap
        if full.any():
            f = ids[full]
            state.rate[f] = np.roll(state.rate[f], -1, axis=1)
            state.majority[f] = np.roll(state.majority[f], -1, axis=1)
        at = np.minimum(v, cap - 1)
        state.rate[ids, at], state.majority[ids, at] = p, mh
        state.visits[ids] = v + 1
        state.label_rate[ids[~relabel]] = batch.pass_rate[~relabel]

    def decide_distinct(state, batch, votes):
        """`walk(state, batch, votes, record_label_rate=False)`'s decision and evidence (no
        histories) for a batch of distinct prompts: only the rows that pass the cheap conditions
        (a majority, past `start_step`, the options' thresholds) gather their histories and
        append this visit to copies of them; every other row keeps its label whatever its
        history, so its copy would be read for nothing (at N = 10⁶ nearly every row of a step
        is a first visit)."""
        b, g = votes.answers.shape
        win, count, mh = votes.majorities("abstain")
        has_m = win >= 0
        p = np.where(has_m, count / g, 0.0)
        ids = batch.prompt_ids
        visits, lr = state.visits[ids], state.label_rate[ids]
        pre = has_m & (visits > start_step)
        if min_pass_rate is not None:
            pre &= p >= min_pass_rate
        if margin is not None:
            pre &= np.isfinite(lr) & (p - lr >= margin)
        ok = np.zeros(b, bool)
        ev = {"visit": visits, "slope": np.zeros(b), "share": np.zeros(b), "label_rate": lr}
        rows = np.flatnonzero(pre)
        if rows.size:
            q = ids[rows]
            k = np.minimum(visits[rows], cap)
            r_new, m_new = state.rate[q], state.majority[q]               # copies [R, C]
            append_visit(r_new, m_new, k, p[rows], mh[rows])
            slope, share = np.zeros(rows.size), np.zeros(rows.size)
            ok[rows] = decide(rows, rows, visits, lr[rows], r_new, m_new, np.minimum(k + 1, cap),
                              has_m, p, mh, slope, share)
            ev["slope"][rows], ev["share"][rows] = slope, share
        return ok, win, votes.values, p, ev

    def apply(state, pool, batch):
        votes = votes_of(batch, "olr")
        if _distinct(batch.prompt_ids):
            ok, win, values, p, ev = decide_distinct(state, batch, votes)
        else:
            ok, win, values, p, ev, _ = walk(state, batch, votes, record_label_rate=False)
        labels: list = [None] * batch.prompt_ids.shape[0]
        decisions = []
        for i in np.flatnonzero(ok).tolist():
            target = values[win[i]]
            labels[i] = target
            evidence = {"visit": int(ev["visit"][i]), "slope": float(ev["slope"][i]),
                        "pass_rate": float(p[i]), "history_majority_share": float(ev["share"][i])}
            if margin is not None:
                evidence["label_pass_rate"] = float(ev["label_rate"][i])
            decisions.append({"row": i, "rule": "olr", "decision": "relabel", "target": target,
                              "evidence": evidence})
        return Targets(labels, decisions)

    def update(state, pool, batch):
        b = batch.prompt_ids.shape[0]
        if b == 0:
            return state
        if batch.answers is None:
            return state._replace(no_answers=state.no_answers + b)
        # The target place's decision for this visit, made on this state (`Batch.targets`: the
        # Scheduler hands over what `targets` returned for this Feedback, or what its own call
        # for the decision log returned): appended under it, not decided again. Without
        # `margin` a label pass rate recorded between a prompt's rows never changes a decision
        # (only the margin reads it); with `margin` this pass records them, so it decides itself.
        handed = getattr(batch, "targets", None)
        votes = votes_of(batch, "olr")
        if handed is not None and margin is None and len(handed) == b and _distinct(batch.prompt_ids):
            ok = np.array([t is not None for t in handed], dtype=bool)
            append_visits(state, batch, votes, ok)
        else:
            relabel = None if handed is None or margin is not None or len(handed) != b else \
                np.array([t is not None for t in handed], dtype=bool)
            ok, _, _, _, _, (uniq, rate, maj, visits, label_rate) = walk(
                state, batch, votes, record_label_rate=True, relabel=relabel)
            state.rate[uniq], state.majority[uniq], state.visits[uniq] = rate, maj, visits
            state.label_rate[uniq] = label_rate
        relabels = int(np.count_nonzero(ok))
        return state._replace(relabels=state.relabels + relabels, kept=state.kept + (b - relabels))

    def metrics(state, pool):
        return {"supervision/relabels": float(state.relabels),
                "supervision/kept_label": float(state.kept),
                "supervision/groups_without_answers": float(state.no_answers)}

    return DataPolicy(TARGET, init, update, apply, name="olr", metrics=metrics,
                      reads=frozenset({"answers"}))


def _rounds(inv: np.ndarray, distinct: bool = False):
    """Row indices of a batch in rounds: each prompt's first row (the first round), then each
    one's second row, ...; `inv` int64[B] is the row's prompt (any integer label). One round
    when the batch's prompts are distinct (the common case; `distinct` says it is known)."""
    b = inv.shape[0]
    if distinct:
        yield np.arange(b, dtype=np.int64)
        return
    order = np.argsort(inv, kind="stable")
    head = np.ones(b, bool)
    head[1:] = inv[order[1:]] != inv[order[:-1]]
    starts = np.flatnonzero(head)
    rank = np.empty(b, np.int64)
    rank[order] = np.arange(b) - np.repeat(starts, np.diff(np.append(starts, b)))
    if b == 0 or rank.max() == 0:
        yield np.arange(b, dtype=np.int64)
        return
    for r in range(int(rank.max()) + 1):
        yield np.flatnonzero(rank == r)


def _distinct(ids: np.ndarray) -> bool:
    """Whether int64[B] `ids` holds no value twice (one sort of B ids)."""
    s = np.sort(ids)
    return not (s[1:] == s[:-1]).any()


def _unique_inverse(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`np.unique(ids, return_inverse=True)` of int64[B] ids from one stable argsort (np.unique
    goes through several more passes; B = 512 ids per step)."""
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    head = np.ones(s.shape[0], bool)
    head[1:] = s[1:] != s[:-1]
    inv = np.empty(s.shape[0], np.int64)
    inv[order] = np.cumsum(head) - 1
    return s[head], inv
