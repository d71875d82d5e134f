"""TraPO: semi-supervised RL — unlabelled prompts train on their majority answer when their
pass-rate trajectory resembles those of labelled prompts.

Yang et al., "TraPO: A Semi-Supervised Reinforcement Learning Framework for Boosting LLM
Reasoning", arXiv 2512.13106, following `ShenzhiYang2000/TRAPO`
`Weakly_Supervised/Research/Semi_RL/semi_ray_trainer.py` (`_generate_pseudo_labels_and_update_passrate`,
`_compute_trajectory_cosine`, `filter_dict_by_topk`, `filter_dict_by_threshold`); docs/methods/trapo.md.

Two places. Target: a labelled prompt (`Pool.labeled`) keeps its dataset label; an
unlabelled one gets the unique majority m of its group's answers (None — no target — on a
tie or without answers). History, one entry per visit (first `capacity` visits kept):
labelled P_lab[q] += [pass rate against the label]; unlabelled P_unl[q] += [#{a_i = m} / G].

Admission, on step s (0-based count of `observe` calls with groups):

    s < warm_up : drop every rollout of unlabelled prompts (train on labelled ones only)
    otherwise   : DB = {P_lab[q] : q labelled, seen} ∪ {snapshots of selected P_unl} (update_db)
                  L  = min length over DB;  ẑ(v) = (v[:L] − mean) / (std_unbiased + 1e-8)
                  s(q) = mean_{d ∈ DB} cos(ẑ_d, ẑ_q)        (aggregate="max": the max)
                  keep S = TopK(s, k = max(1, ⌊topk · n_unl⌋)) ∪ {q : s(q) ≥ thres}
                  over the n_unl distinct unlabelled prompts of the batch; drop the others;
                  with update_db, add each selected P_unl[q] (as it is now) to DB.

The selection is made in `observe` (against DB as it was before the step's additions, then
added) and read by `admission` for the prompts of that last observed batch: call `observe`
before `admit`, as the Scheduler documents.

Option (off by default), reconstructed from the DE-Venus paper's text on "TraPO v2"
(arXiv 2609.03324; no public code): `promote=True` promotes an unlabelled prompt whose
last pass rate ≥ `promote_pass_rate`, whose OLS trend over its trajectory is > 0 and whose
last `promote_window` majorities are one answer: that answer becomes its persistent label
(kept in state, checkpointed), and the prompt counts as labelled from then on.

>>> import numpy as np
>>> from rlpace import Pool, Feedback, Scheduler
>>> s = Scheduler(Pool(["x"] * 2, labeled=[True, False]), "trapo", warm_up=1)
>>> fb = Feedback([0, 1], [[1, 0], [1, 1]], answers=[["1", "2"], ["5", "5"]], step=0)
>>> s.targets(fb)
[None, '5']
>>> s.observe(fb); s.admit(fb).tolist()                         # warm-up: unlabelled dropped
[[True, True], [False, False]]
"""

from __future__ import annotations

from ..errors import InputError
from typing import NamedTuple

import numpy as np

from ._base import ADMISSION, TARGET, Admission, DataPolicy, Method, Targets
from ._compose import compose
from ._checks import check_choice, check_int, check_real
from ._olr import _rounds
from ._vote import ols_slopes, require_answers, votes_of

_EPS = 1e-8


class TrapoState(NamedTuple):
    rate: np.ndarray          # float64[N, C] pass-rate trajectory, the first C visits
    majority: np.ndarray      # int64[N, C]   answer_hash of each visit's majority (0 = none)
    visits: np.ndarray        # int64[N]      visits recorded (may exceed C)
    db: np.ndarray            # float64[N, C] snapshot of a selected unlabelled trajectory (update_db)
    db_len: np.ndarray        # int64[N]      its length; 0 = not in the database
    selected_at: np.ndarray   # int64[N]      step at which the prompt was last selected; −1 never
    steps: np.ndarray         # int64[]       observe calls with groups (TraPO's epochs → steps)
    promoted: np.ndarray      # bool[N]       promoted to labelled (option `promote`)
    label: np.ndarray         # <U[N]         promoted label ("" = none); width grows as needed
    selected: np.ndarray      # int64[]       unlabelled groups admitted after warm-up
    dropped: np.ndarray       # int64[]       unlabelled groups dropped (warm-up or not selected)
    promotions: np.ndarray    # int64[]       prompts promoted
    score: np.ndarray         # float64[N]    similarity s(q) at the last selection round; NaN never
                              #               scored or shorter than the database (not selectable)
    scored_at: np.ndarray     # int64[N]      step of that round; −1 never
    compared: np.ndarray      # int64[2]      (L, database rows) of the last selection round
    #: value rules `Scheduler.load_state_dict` checks for each field (policies/_state_checks.py)
    STATE_RULES = {"rate": "unit", "visits": "nonneg", "db": "unit", "db_len": "nonneg",
                   "selected_at": "step", "steps": "nonneg", "selected": "nonneg", "dropped": "nonneg",
                   "promotions": "nonneg", "scored_at": "step", "compared": "nonneg"}


def _znorm(x: np.ndarray) -> np.ndarray:
    """Row-wise (v − mean) / (std_unbiased + 1e-8); zeros for length < 2 (torch.std of one
    value is NaN; a constant trajectory has z = 0 either way)."""
    if x.shape[-1] < 2:
        return np.zeros_like(x)
    return (x - x.mean(axis=-1, keepdims=True)) / (x.std(axis=-1, ddof=1, keepdims=True) + _EPS)


def _unit(x: np.ndarray) -> np.ndarray:
    """Rows divided by max(‖row‖, 1e-8) (torch cosine_similarity's clamp): cos = unit(a)·unit(b)."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), _EPS)


def trapo_scores(db: np.ndarray, queries: np.ndarray, aggregate: str = "mean") -> np.ndarray:
    """float64[Q] TraPO's trajectory score of each query row against the database rows
    float64[D, L] (every trajectory already cut to the shortest database length L; queries
    are cut to L here).

    >>> trapo_scores(np.array([[0.0, 0.5, 1.0]]), np.array([[0.1, 0.2, 0.9], [1.0, 0.5, 0.0]])).round(3).tolist()
    [0.918, -1.0]
    """
    length = db.shape[1]
    dbz = _unit(_znorm(np.asarray(db, dtype=np.float64)))
    qz = _unit(_znorm(np.asarray(queries, dtype=np.float64)[:, :length]))
    if aggregate == "mean":
        return qz @ dbz.mean(axis=0)            # mean of cosines = cosine with the mean unit vector
    return (qz @ dbz.T).max(axis=1)


def trapo(warm_up: int = 8, topk: float = 0.1, thres: float = 0.4, update_db: bool = True,
          aggregate: str = "mean", capacity: int = 16, db_min_visits: int = 1, promote: bool = False,
          promote_pass_rate: float = 0.8, promote_window: int = 3) -> Method:
    """TraPO (arXiv 2512.13106): majority targets for unlabelled prompts, admitted after `warm_up` steps when their pass-rate trajectory resembles the labelled ones'.

    Args:
        warm_up: steps (observe calls) during which unlabelled prompts are dropped (TraPO: 8
            epochs; one epoch is len(pool) / prompts-per-step steps).
        topk: share of the batch's unlabelled prompts kept by score, at least one (TraPO: 0.1).
        thres: prompts with score ≥ thres are kept too (TraPO: 0.4).
        update_db: add the selected prompts' trajectories to the database (TraPO: True).
        aggregate: "mean" (TraPO) or "max" over the database of the cosine similarities.
        capacity: visits kept per prompt (the first `capacity`: TraPO compares prefixes).
        db_min_visits: labelled prompts enter the database once seen this often (TraPO: 1,
            every labelled prompt seen; under an adaptive scheduler a labelled prompt seen
            once would cut every comparison to length 1, where all scores are 0).
        promote: option (DE-Venus v2 reconstruction): promote stable unlabelled prompts to
            labelled with their majority answer. Off by default.
        promote_pass_rate: promotion needs the last pass rate ≥ this.
        promote_window: promotion needs this many last majorities to be one answer.
    """
    warm_up = check_int("trapo", "warm_up", warm_up, low=0)
    topk = check_real("trapo", "topk", topk, low=0, high=1)
    thres = check_real("trapo", "thres", thres, low=-1, high=1)
    for flag, value in (("update_db", update_db), ("promote", promote)):
        if not isinstance(value, (bool, np.bool_)):
            raise InputError(f"trapo {flag} must be True or False; got {value!r}.")
    check_choice("trapo", "aggregate", aggregate, ("mean", "max"))
    cap = check_int("trapo", "capacity", capacity, low=2)
    db_min_visits = check_int("trapo", "db_min_visits", db_min_visits, low=1, high=cap)
    promote_pass_rate = check_real("trapo", "promote_pass_rate", promote_pass_rate, low=0, high=1)
    promote_window = check_int("trapo", "promote_window", promote_window, low=1, high=cap)

    def init(pool):
        n = len(pool)
        return TrapoState(np.zeros((n, cap)), np.zeros((n, cap), np.int64), np.zeros(n, np.int64),
                          np.zeros((n, cap)), np.zeros(n, np.int64), np.full(n, -1, np.int64),
                          np.array(0, np.int64), np.zeros(n, bool), np.full(n, "", dtype="<U1"),
                          np.array(0, np.int64), np.array(0, np.int64), np.array(0, np.int64),
                          np.full(n, np.nan), np.full(n, -1, np.int64), np.zeros(2, np.int64))

    def labelled(state, pool, pos):
        return pool.labeled[pos] | state.promoted[pos]

    def promotes(rate, maj, v, mh, p):
        """bool[R]: whether visit v int64[R] (0-based) of each unlabelled prompt, with majority
        hash mh and pass rate p, promotes it; `rate` / `maj` [R, C] already hold this visit
        where v < capacity. Also (slope float64[R]) the OLS trend over the visits kept."""
        k = np.minimum(v + 1, cap)
        slope = ols_slopes(rate, k)
        cols = np.arange(cap)
        recent = (cols >= (k - promote_window)[:, None]) & (cols < k[:, None])
        same = ((maj == mh[:, None]) | ~recent).all(axis=1)
        return (k >= promote_window) & (p >= promote_pass_rate) & (slope > 0) & same, slope

    # ---- the target place ----------------------------------------------------------------
    def target_apply(state, pool, batch):
        answers = require_answers(batch, "trapo")
        pos = batch.prompt_ids
        b, g = answers.shape
        labels: list = [None] * b
        decisions = []
        kept = pool.labeled[pos]
        if promote:
            for i in np.flatnonzero(~kept & state.promoted[pos]).tolist():
                labels[i] = str(state.label[pos[i]])
            kept = kept | state.promoted[pos]
        rows = np.flatnonzero(~kept)
        if rows.size == 0:
            return Targets(labels, decisions)
        votes = votes_of(batch, "trapo")             # every row, once per Feedback: observe reads it too
        win, count, mh = votes.majorities("abstain")
        values = votes.values
        rows = rows[win[rows] >= 0]
        prom = np.zeros(b, bool)
        if promote and rows.size:      # the promotion `observe` will make on this visit, with its evidence
            v, p = state.visits[pos[rows]], count[rows] / g
            rates, majs = state.rate[pos[rows]], state.majority[pos[rows]]       # copies
            fits = np.flatnonzero(v < cap)
            rates[fits, v[fits]], majs[fits, v[fits]] = p[fits], mh[rows][fits]
            yes, slope = promotes(rates, majs, v, mh[rows], p)
            prom[rows] = yes
            evidence = {i: {"pass_rate": float(p[j]), "visit": int(v[j]), "slope": float(slope[j])}
                        for j, i in enumerate(rows.tolist()) if yes[j]}
        # Python ints and lists from here (one conversion each, not a numpy scalar per row)
        win_l, count_l = win.tolist(), count.tolist()
        for i in rows.tolist():             # the unlabelled rows with a unique majority
            m = labels[i] = values[win_l[i]]
            decisions.append({"row": i, "rule": "trapo_majority", "decision": "pseudo_label",
                              "target": m, "evidence": {"votes": count_l[i], "voters": g}})
            if prom[i]:
                decisions.append({"row": i, "rule": "trapo_v2_promotion", "decision": "promote",
                                  "target": m, "evidence": evidence[i]})
        return Targets(labels, decisions)

    # ---- shared history update (both places keep it when `promote`; else the admission) ---
    def update(state, pool, batch):
        b = batch.prompt_ids.shape[0]
        if b == 0:
            return state
        ids = batch.prompt_ids
        g = batch.rewards.shape[1]
        if batch.answers is not None:
            votes = votes_of(batch, "trapo")
            win, count, mh = votes.majorities("abstain")
            values = votes.values
        else:
            win, count, values, mh = np.full(b, -1), np.zeros(b, np.int64), [], np.zeros(b, np.int64)
        step = int(state.steps)
        rate, majority, visits = state.rate, state.majority, state.visits
        promoted, label, promotions = state.promoted, state.label, int(state.promotions)
        for rows in _rounds(ids):       # a prompt twice in the batch: its visits in batch order
            pos = ids[rows]
            lab = labelled(state, pool, pos)
            if batch.answers is None:   # nothing to record for an unlabelled prompt's visit
                rows, pos, lab = rows[lab], pos[lab], lab[lab]
            m = win[rows]
            p = np.where(lab, batch.pass_rate[rows], np.where(m >= 0, count[rows] / g, 0.0))
            v = visits[pos]
            fits = v < cap
            rate[pos[fits], v[fits]], majority[pos[fits], v[fits]] = p[fits], mh[rows][fits]
            visits[pos] = v + 1
            if promote:
                cand = np.flatnonzero(~lab & (m >= 0))
                if cand.size:
                    q = pos[cand]
                    yes = promotes(rate[q], majority[q], v[cand], mh[rows][cand], p[cand])[0]
                    q, new = q[yes], [values[w] for w in m[cand][yes].tolist()]
                    if new and max(map(len, new)) > label.dtype.itemsize // 4:
                        label = label.astype(f"<U{max(map(len, new))}")
                    promoted[q], label[q] = True, new
                    promotions += len(new)
        selected_at, db, db_len = state.selected_at, state.db, state.db_len
        unl = _first_seen(ids[~labelled(state, pool, ids)])              # distinct, batch order
        n_sel = 0
        if step >= warm_up and unl.size and batch.answers is not None:
            lab = np.flatnonzero((pool.labeled | promoted) & (visits >= db_min_visits))
            snap = np.flatnonzero(db_len > 0)
            if lab.size or snap.size:
                length = int(min(np.minimum(visits[lab], cap).min(initial=cap), db_len[snap].min(initial=cap)))
                db_rows = np.concatenate([rate[lab, :length], db[snap, :length]])
                q_len = np.minimum(visits[unl], cap)
                ok = q_len >= length              # TraPO's code raises on a shorter query
                scores = np.full(unl.size, -np.inf)
                if ok.any():
                    scores[ok] = trapo_scores(db_rows, rate[unl[ok]], aggregate)
                k = max(1, int(np.floor(topk * unl.size)))
                order = np.argsort(-scores, kind="stable")[:k]
                chosen = np.zeros(unl.size, bool)
                chosen[order] = True
                chosen |= scores >= thres
                chosen &= ok
                state.score[unl] = np.where(np.isfinite(scores), scores, np.nan)
                state.scored_at[unl] = step
                state.compared[...] = (length, db_rows.shape[0])
                q = unl[chosen]
                selected_at[q] = step
                if update_db:             # snapshot of the trajectory as it is now
                    n_q = np.minimum(visits[q], cap)
                    db[q] = np.where(np.arange(cap) < n_q[:, None], rate[q], db[q])
                    db_len[q] = n_q
                n_sel = int(chosen.sum())
        return state._replace(label=label, steps=state.steps + 1, promotions=np.array(promotions, np.int64),
                              selected=state.selected + n_sel, dropped=state.dropped + (unl.size - n_sel))

    def decisions(state, pool, batch):
        """The keep / drop decision of each unlabelled row of the batch `update` just observed,
        with its evidence: warm-up drops, or the similarity score against the database."""
        step = int(state.steps) - 1
        ids = batch.prompt_ids
        rows = np.flatnonzero(~labelled(state, pool, ids))
        rows = rows[_first_seen(ids[rows], index=True)]                   # first row of each prompt
        if step < warm_up:
            return [{"row": i, "rule": "trapo_warm_up", "decision": "drop",
                     "evidence": {"step": step, "warm_up": warm_up}} for i in rows.tolist()]
        pos = ids[rows]         # gathered once as Python values, not a numpy scalar per row
        scored, kept = (state.scored_at[pos] == step).tolist(), (state.selected_at[pos] == step).tolist()
        score = state.score[pos].tolist()
        length, database = int(state.compared[0]), int(state.compared[1])
        out = []
        for i, sc, was_scored, keep in zip(rows.tolist(), score, scored, kept):
            if was_scored:
                out.append({"row": i, "rule": "trapo_trajectory", "decision": "keep" if keep else "drop",
                            "evidence": {"score": None if np.isnan(sc) else sc, "thres": thres, "topk": topk,
                                         "length": length, "database": database}})
        return out

    # ---- the admission place -----------------------------------------------------------------
    def admission_apply(state, pool, batch):
        pos = batch.prompt_ids
        last = int(state.steps) - 1
        keep_row = pool.labeled[pos] | state.promoted[pos] | (state.selected_at[pos] == last) & (last >= warm_up)
        return Admission(np.repeat(keep_row[:, None], batch.rewards.shape[1], axis=1), 0)

    def metrics(state, pool):
        return {"supervision/kept_unlabeled": float(state.selected),
                "supervision/dropped_unlabeled": float(state.dropped),
                "supervision/promotions": float(state.promotions),
                "supervision/db_size": float(np.count_nonzero(state.db_len))}

    def check_state(state, pool):
        # counts ≥ 0 and rates in [0, 1] are generic field rules (`_state_checks.py`)
        from ._state_checks import bad
        db_len = np.asarray(state.db_len)
        if (db_len > cap).any():
            raise bad("trapo/db_len", f"has lengths above the capacity {cap}", db_len, db_len > cap)
        mismatch = np.asarray(state.promoted) != (np.asarray(state.label) != "")
        if mismatch.any():
            raise bad("trapo/label", "disagrees with trapo/promoted (a promoted prompt has a label, "
                      "no other does)", np.asarray(state.label), mismatch)

    adm = DataPolicy(ADMISSION, init, update, admission_apply, name="trapo", metrics=metrics,
                     check_state=check_state, reads=frozenset({"answers"}), decisions=decisions)
    if promote:
        # The target needs the promoted labels: it keeps its own copy of the same state,
        # updated by the same function on the same batches (deterministic, so the two agree).
        tgt = DataPolicy(TARGET, init, update, target_apply, name="trapo_target",
                         check_state=check_state, reads=frozenset({"answers"}))
    else:
        tgt = DataPolicy(TARGET, _empty, _same, target_apply, name="trapo_target",
                         reads=frozenset({"answers"}))
    return compose(tgt, adm, name="trapo")


def _empty(pool):
    from ._base import EmptyState
    return EmptyState()


def _same(state, pool, batch):
    return state


def _first_seen(ids: np.ndarray, index: bool = False) -> np.ndarray:
    """The distinct values of int64[n] `ids` in first-seen order (`list(dict.fromkeys(ids))`),
    or with `index` the positions of their first occurrences, ascending."""
    _, first = np.unique(ids, return_index=True)
    first = np.sort(first)
    return first if index else ids[first]
