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
from ._vote import answer_hash, ols_slope, require_answers, unique_majority


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

    def walk(state, batch):
        """Per row: the visit appended to the prompt's history (rows of one prompt in order)
        and the decision. Pure: pending appends live in a dict, not in `state`."""
        answers = require_answers(batch, "olr")
        g = answers.shape[1]
        pending: dict[int, tuple] = {}
        for i, pos in enumerate(batch.prompt_ids.tolist()):
            if pos in pending:
                rates, majs, visits = pending[pos]
            else:
                k = min(int(state.visits[pos]), cap)
                rates, majs, visits = (list(state.rate[pos, :k]), list(state.majority[pos, :k]),
                                       int(state.visits[pos]))
            m, count = unique_majority(answers[i], ties="abstain")
            p = count / g if m is not None else 0.0
            mh = answer_hash(m)
            rates, majs = (rates + [p])[-cap:], (majs + [mh])[-cap:]
            slope = ols_slope(rates)
            h, h_count = unique_majority([str(x) for x in majs], ties="abstain")
            agree = h is not None and int(h) == mh
            ok = m is not None and visits > start_step and slope >= slope_threshold and agree
            lr = float(state.label_rate[pos])
            if ok and min_pass_rate is not None:
                ok = p >= min_pass_rate
            if ok and margin is not None:
                ok = bool(np.isfinite(lr)) and p - lr >= margin
            evidence = {"visit": visits, "slope": slope, "pass_rate": p,
                        "history_majority_share": h_count / len(majs)}
            if margin is not None:
                evidence["label_pass_rate"] = lr
            yield i, pos, (m if ok else None), p, mh, evidence, (rates, majs, visits + 1)
            pending[pos] = (rates, majs, visits + 1)

    def apply(state, pool, batch):
        labels, decisions = [None] * batch.prompt_ids.shape[0], []
        for i, pos, target, p, mh, evidence, _ in walk(state, batch):
            if target is not None:
                labels[i] = target
                decisions.append({"row": i, "rule": "olr", "decision": "relabel", "target": target,
                                  "evidence": evidence})
        return Targets(labels, decisions)

    def update(state, pool, batch):
        if batch.prompt_ids.shape[0] == 0:
            return state
        if batch.answers is None:
            return state._replace(no_answers=state.no_answers + batch.prompt_ids.shape[0])
        relabels = 0
        last = {}
        for i, pos, target, p, mh, evidence, hist in walk(state, batch):
            relabels += target is not None
            if target is None:      # verified against the dataset label: its pass rate
                state.label_rate[pos] = batch.pass_rate[i]
            last[pos] = hist
        for pos, (rates, majs, visits) in last.items():
            k = len(rates)
            state.rate[pos, :k], state.majority[pos, :k], state.visits[pos] = rates, majs, visits
        b = batch.prompt_ids.shape[0]
        return state._replace(relabels=state.relabels + relabels, kept=state.kept + (b - relabels))

    def metrics(state, pool):
        return {"supervision/relabels": float(state.relabels),
                "supervision/kept_label": float(state.kept),
                "supervision/groups_without_answers": float(state.no_answers)}

    return DataPolicy(TARGET, init, update, apply, name="olr", metrics=metrics,
                      reads=frozenset({"answers"}))
