"""Supervision as state (DE-Venus arXiv 2609.03324): the target / reward / advantage
places, `Pool.labeled`, the supervision fields of `Feedback`, and the five methods `ttrl`,
`self_certainty`, `entropy_min`, `olr`, `trapo` — on hand-computed numbers and scripted
trajectories."""

import math
import statistics
from collections import Counter

import numpy as np
import pytest

from _isolated import assert_state_equal

from rlpace import Feedback, Pool, Scheduler, policies
from rlpace.policies import agreement_rewards, compose, make_policy, unique_majority


def _roundtrip_npz(sd, tmp_path):
    path = tmp_path / "state.npz"
    np.savez(path, **sd)
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}




# ---- records ----------------------------------------------------------------------------------
def test_pool_labeled_defaults_true_and_keeps_old_fingerprints():
    # efbd02c89440bf00: Pool(["a", "b", "a"], ids=[5, 6, 7]).fingerprint() before Pool.labeled existed
    assert Pool(["a", "b", "a"], ids=[5, 6, 7]).fingerprint() == "efbd02c89440bf00"
    assert Pool(["a", "b", "a"], ids=[5, 6, 7], labeled=[True] * 3).fingerprint() == "efbd02c89440bf00"
    part = Pool(["a", "b", "a"], ids=[5, 6, 7], labeled=[True, False, True])
    assert part.labeled.tolist() == [True, False, True] and not part.labeled.flags.writeable
    assert part.fingerprint() != "efbd02c89440bf00" and "labeled" in part.fingerprint_parts()
    with pytest.raises(ValueError, match=r"Pool\.labeled"):
        Pool(["a", "b"], labeled=[True])
    with pytest.raises(ValueError, match=r"Pool\.labeled"):
        Pool(["a", "b"], labeled=["yes", "no"])


def test_pool_from_records_reads_extra_info_labeled():
    rows = [{"data_source": "m", "extra_info": {"index": 1, "labeled": True}},
            {"data_source": "m", "extra_info": {"index": 2, "labeled": False}},
            {"data_source": "m", "extra_info": {"index": 3}}]            # missing: labelled
    assert Pool.from_records(rows).labeled.tolist() == [True, False, True]
    assert Pool.from_records(rows[2:]).labeled.tolist() == [True]


def test_feedback_supervision_fields_validated():
    fb = Feedback([0, 1], np.zeros((2, 2)), answers=[["1", None], np.array(["2", "3"])],
                  token_entropy=[[0.1, 0.0], [1.0, 2.0]], self_certainty=[[0.5, -0.1], [0, 0]],
                  mean_logprob=[[-0.1, 0.0], [-2.0, -1.0]], step=0)
    assert fb.answers.shape == (2, 2) and fb.answers.dtype == object and not fb.answers.flags.writeable
    assert fb.answers.tolist() == [["1", None], ["2", "3"]] and type(fb.answers[1, 0]) is str
    for bad in ([["1"], ["2"]], [["1", "2"]], [["1", 2], ["3", "4"]], "12", [[b"1", "2"], ["3", "4"]]):
        with pytest.raises(ValueError, match=r"Feedback\.answers"):
            Feedback([0, 1], np.zeros((2, 2)), answers=bad, step=0)
    for field, bad in (("token_entropy", [[-0.1, 0], [0, 0]]), ("self_certainty", [[np.nan, 0], [0, 0]]),
                       ("mean_logprob", [[0.5, 0], [0, 0]]), ("token_entropy", [[0, 0, 0], [0, 0, 0]])):
        with pytest.raises(ValueError, match=rf"Feedback\.{field}"):
            Feedback([0, 1], np.zeros((2, 2)), step=0, **{field: bad})


# ---- voting --------------------------------------------------------------------------------------
def test_unique_majority_ties_none_and_empty_answers():
    assert unique_majority(["b", "a", "a", "b"], ties="first") == ("b", 2)      # Counter: first seen
    assert unique_majority(["b", "a", "a", "b"], ties="abstain") == (None, 2)
    assert unique_majority([" 3 ", "3", "4", None, None, None]) == ("3", 2)     # None never wins
    assert unique_majority(["", "", "", "7"], ties="first") == ("7", 1)         # empty = no answer
    assert unique_majority([None, "  "], ties="first") == (None, 0)


def test_agreement_reward_numbers():
    r = agreement_rewards([["4", " 4", "5", None], ["x", "x", "y", "x"]], ["4", "x"])
    np.testing.assert_array_equal(r, [[1, 1, 0, 0], [1, 1, 0, 1]])
    np.testing.assert_array_equal(agreement_rewards([["1", "1"]], [None]), [[0, 0]])


# ---- TTRL ------------------------------------------------------------------------------------------
def test_ttrl_targets_labels_ties_none_and_vote_rollouts():
    pool = Pool(["m"] * 5, ids=[10, 11, 12, 13, 14], labeled=[True, False, False, False, False])
    ans = [["1", "2", "2", "2"],            # labelled: keeps its dataset label
           ["7", "8", "8", "7"],            # tie 2–2: the first seen, "7"
           [None, None, None, "5"],         # None never wins: "5"
           [None, "", " ", None],           # no answer at all: no target
           ["3", "3", "9", "9"]]
    fb = Feedback([0, 1, 2, 3, 4], np.zeros((5, 4)), answers=ans, step=4)
    s = Scheduler(pool, "ttrl")
    assert s.targets(fb) == [None, "7", "5", None, "3"]
    assert Scheduler(pool, "ttrl", vote_rollouts=2).targets(fb) == [None, "7", None, None, "3"]
    assert Scheduler(pool, "ttrl", all_prompts=True).targets(fb)[0] == "2"
    before = s.state_dict()
    s.targets(fb)
    assert_state_equal(s.state_dict(), before)                  # targets() changes nothing
    s.observe(fb)
    m = s.metrics()
    assert m["supervision/pseudo_labels"] == 3.0 and m["supervision/no_target"] == 1.0
    log = s.supervision_log()
    assert [(d["prompt_id"], d["target"], d["step"], d["rule"]) for d in log] == [
        (11, "7", 4, "ttrl_majority"), (12, "5", 4, "ttrl_majority"), (14, "3", 4, "ttrl_majority")]
    assert log[1]["evidence"] == {"votes": 1, "voters": 4, "majority_ratio": 0.25}   # ratio over all N
    with pytest.raises(ValueError, match=r"Feedback\.answers"):
        s.targets(Feedback([0], np.zeros((1, 4)), step=0))


def test_supervision_log_is_bounded():
    pool = Pool(["m"] * 50, labeled=[False] * 50)
    s = Scheduler(pool, "ttrl")
    for t in range(25):
        s.observe(Feedback(np.arange(50), np.zeros((50, 2)), answers=[[str(t), "x"]] * 50, step=t))
    log = s.supervision_log()
    assert len(log) == 1000 and log[-1]["step"] == 24 and log[0]["step"] == 5     # 1250 made, last 1000 kept
    assert len(s.supervision_log(3)) == 3 and s.supervision_log(0) == []
    assert len(s.supervision_log(5000)) == 1000
    with pytest.raises(ValueError, match="supervision_log"):
        s.supervision_log(-1)
    assert s.metrics()["supervision/pseudo_labels"] == 1250.0


# ---- self-certainty and entropy rewards ---------------------------------------------------------------
# Two rollouts over a 3-token vocabulary: rollout 0 has tokens with p = (1/4, 1/4, 1/2) and
# p = uniform; rollout 1 only the first token (the second is padding).
LOGITS = np.log(np.array([[[[1.0, 1.0, 2.0], [1.0, 1.0, 1.0]],
                           [[1.0, 1.0, 2.0], [5.0, 1.0, 1.0]]]]))        # [B=1, G=2, T=2, V=3]
MASK = np.array([[[True, True], [True, False]]])


def _stats(logits, mask, key):
    """Masked per-rollout means of a token statistic, by the one definition the trainer, the
    engines and `rlpace select` share (`rlpace.adapters._supervision.token_stats`)."""
    torch = pytest.importorskip("torch")
    from rlpace.adapters._supervision import token_stats
    t, v = logits.shape[-2:]
    out = token_stats(torch.tensor(logits.reshape(-1, t, v)), torch.tensor(mask.reshape(-1, t)))
    return out[key].reshape(mask.shape[:-1])


def self_certainty_from_logits(logits, mask):
    return _stats(logits, mask, "self_certainty")


def token_entropy_from_logits(logits, mask):
    return _stats(logits, mask, "token_entropy")


def _kl_uniform(p):
    return sum((1 / 3) * math.log((1 / 3) / q) for q in p)


def _entropy(p):
    return -sum(q * math.log(q) for q in p)


def test_self_certainty_and_entropy_from_logits_by_hand():
    skew, flat = (0.25, 0.25, 0.5), (1 / 3, 1 / 3, 1 / 3)
    sc = self_certainty_from_logits(LOGITS, MASK)
    assert sc[0, 0] == pytest.approx((_kl_uniform(skew) + _kl_uniform(flat)) / 2, abs=1e-12)
    assert sc[0, 1] == pytest.approx(math.log(32 / 27) / 3, abs=1e-12)      # = KL(U‖(1/4,1/4,1/2))
    ent = token_entropy_from_logits(LOGITS, MASK)
    assert ent[0, 0] == pytest.approx((_entropy(skew) + math.log(3)) / 2, abs=1e-12)
    assert ent[0, 1] == pytest.approx(0.5 * math.log(4) + 0.5 * math.log(2), abs=1e-12)


def test_self_certainty_reward_replaces_unlabelled_rows_only():
    pool = Pool(["m"] * 2, labeled=[True, False])
    sc = self_certainty_from_logits(np.concatenate([LOGITS, LOGITS]), np.concatenate([MASK, MASK]))
    fb = Feedback([0, 1], [[1.0, 0.0], [1.0, 1.0]], self_certainty=sc, step=0)
    s = Scheduler(pool, "self_certainty")
    want1 = [(_kl_uniform((0.25, 0.25, 0.5)) + 0.0) / 2, math.log(32 / 27) / 3]
    np.testing.assert_allclose(s.rewards(fb), [[1.0, 0.0], want1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(Scheduler(pool, "self_certainty", all_prompts=True).rewards(fb),
                               [want1, want1], rtol=0, atol=1e-12)
    before = s.state_dict()
    with pytest.raises(ValueError, match=r"Feedback\.self_certainty"):
        s.rewards(Feedback([0, 1], [[1.0, 0.0], [1.0, 1.0]], step=0))
    assert_state_equal(s.state_dict(), before)
    # only labelled prompts in the batch: nothing to replace, no statistic needed
    np.testing.assert_array_equal(s.rewards(Feedback([0], [[1.0, 0.0]], step=0)), [[1.0, 0.0]])


def test_entropy_min_token_and_sequence_levels():
    pool = Pool(["m"] * 2, labeled=[False, True])
    ent = token_entropy_from_logits(np.concatenate([LOGITS, LOGITS]), np.concatenate([MASK, MASK]))
    fb = Feedback([0, 1], [[1.0, 0.0], [0.0, 1.0]], token_entropy=ent,
                  mean_logprob=[[-0.5, -1.5], [-0.1, -0.2]], step=0)
    h0 = (_entropy((0.25, 0.25, 0.5)) + math.log(3)) / 2
    h1 = _entropy((0.25, 0.25, 0.5))
    np.testing.assert_allclose(Scheduler(pool, "entropy_min").rewards(fb), [[-h0, -h1], [0.0, 1.0]],
                               rtol=0, atol=1e-12)
    np.testing.assert_array_equal(Scheduler(pool, "entropy_min", level="sequence").rewards(fb),
                                  [[-0.5, -1.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"Feedback\.mean_logprob"):
        Scheduler(pool, "entropy_min", level="sequence").rewards(Feedback([0], [[1.0, 0.0]], step=0))
    assert make_policy("entropy_min").reads == frozenset({"token_entropy"})


# ---- OLR ----------------------------------------------------------------------------------------------------
# Three labelled prompts, G = 4, slope_threshold 0.05, start_step 2 (relabel needs visit index > 2).
OLR_ANSWERS = [
    # prompt 100: majority "5" with P = .5, .75, 1, 1, then "6" (P .75), then a tie
    [["5", "5", "6", "7"], ["5", "5", "5", "6"], ["5"] * 4, ["5"] * 4, ["6", "6", "6", "5"], ["5", "5", "6", "6"]],
    # prompt 101: P = .75 every visit: slope 0, never relabelled
    [["9", "9", "9", "8"]] * 6,
    # prompt 102: P = .75, .75, .75, then 1: only the history WITH the current visit has slope ≥ .05
    [["3", "3", "3", "4"]] * 3 + [["3"] * 4] + [["3", "3", "3", "4"]] * 2,
]
# By hand: visit 3 of prompt 100: P = [.5, .75, 1, 1], slope = .875 / 5 = .175, M all "5" → relabel.
# Visit 4: P adds .75: slope = .75 / 10 = .075 but M = 5,5,5,5,6 has majority "5" ≠ "6" → keep.
# Visit 5: tie → no majority → keep. Prompt 102, visit 3: P = [.75, .75, .75, 1]: slope .375 / 5 =
# .075 → relabel (without the current visit the slope is 0); visit 4: slope .25 / 10 = .025 → keep;
# visit 5: slope .125 / 17.5 → keep.
OLR_EXPECTED = [[None, None, None], [None, None, None], [None, None, None], ["5", None, "3"],
                [None, None, None], [None, None, None]]


def _olr_feedback(v):
    return Feedback([0, 1, 2], np.zeros((3, 4)), answers=[OLR_ANSWERS[q][v] for q in range(3)], step=v)


def test_olr_relabels_exactly_when_the_rule_says():
    s = Scheduler(Pool(["m"] * 3, ids=[100, 101, 102]), "olr", start_step=2)
    for v in range(6):
        fb = _olr_feedback(v)
        before = s.state_dict()
        assert s.targets(fb) == OLR_EXPECTED[v], v
        assert_state_equal(s.state_dict(), before)
        s.observe(fb)
    m = s.metrics()
    assert m["supervision/relabels"] == 2.0 and m["supervision/kept_label"] == 16.0
    log = s.supervision_log()
    assert [(d["step"], d["prompt_id"], d["target"], d["decision"]) for d in log] == [
        (3, 100, "5", "relabel"), (3, 102, "3", "relabel")]
    assert log[0]["evidence"]["slope"] == pytest.approx(0.175)
    assert log[1]["evidence"]["slope"] == pytest.approx(0.075)
    assert log[0]["evidence"]["pass_rate"] == 1.0 and log[0]["evidence"]["visit"] == 3


def test_olr_warm_up_threshold_and_margin_option():
    # a later warm-up: visit 3 no longer qualifies, and nothing after it does
    s = Scheduler(Pool(["m"] * 3), "olr", start_step=3)
    got = []
    for v in range(6):
        got.append(s.targets(_olr_feedback(v)))
        s.observe(_olr_feedback(v))
    assert all(t == [None, None, None] for t in got)
    # slope threshold just above prompt 102's 0.075: only prompt 100 (0.175) is relabelled
    s = Scheduler(Pool(["m"] * 3), "olr", start_step=2, slope_threshold=0.076)
    for v in range(3):
        s.observe(_olr_feedback(v))
    assert s.targets(_olr_feedback(3)) == ["5", None, None]
    # margin option: the label's last pass rate is what the rewards said (1.0 here): never +0.1 above
    s = Scheduler(Pool(["m"] * 3), "olr", start_step=2, margin=0.1)
    for v in range(3):
        fb = _olr_feedback(v)
        s.observe(Feedback(fb.prompt_ids, np.ones((3, 4)), answers=fb.answers, step=v))
    assert s.targets(_olr_feedback(3)) == [None, None, None]


@pytest.mark.parametrize("min_pass_rate,want", [(None, "5"), (0.75, "5"), (0.8, None)])
def test_olr_min_pass_rate_option(min_pass_rate, want):
    # P = .5, .5, .75 for majority "5": at visit 2 slope = .25 / 2 = .125 ≥ .05 and the history
    # majority is "5" → relabel, unless the absolute threshold (≥, inclusive) asks more than .75
    s = Scheduler(Pool(["m"]), "olr", start_step=1, min_pass_rate=min_pass_rate)
    groups = [["5", "5", "6", "7"], ["5", "5", "6", "7"], ["5", "5", "5", "6"]]
    for v, ans in enumerate(groups[:2]):
        s.observe(Feedback([0], np.zeros((1, 4)), answers=[ans], step=v))
    assert s.targets(Feedback([0], np.zeros((1, 4)), answers=[groups[2]], step=2)) == [want]


def test_olr_duplicate_rows_see_each_other():
    # one prompt twice in a batch: the second row decides with the first row's visit appended
    s = Scheduler(Pool(["m"]), "olr", start_step=0)
    fb = Feedback([0, 0], np.zeros((2, 4)), answers=[["1", "1", "2", "3"], ["1"] * 4], step=0)   # P = .5, then 1
    assert s.targets(fb) == [None, "1"]              # visit 0 (no slope), visit 1: slope .5, M = 1, 1
    s.observe(fb)
    assert s.state_dict()["policy/target/visits"][0] == 2


# ---- TraPO -------------------------------------------------------------------------------------------------
# Prompts 0, 1 labelled (pass rates from rewards), 2, 3, 4 unlabelled (pass rate of the majority).
TRAPO_LAB = {0: [0.0, 0.25, 0.5, 0.75], 1: [0.25, 0.5, 0.5, 1.0]}
TRAPO_UNL = {2: [["a", "a", "b", "c"], ["a", "a", "a", "b"], ["a"] * 4, ["a"] * 4],            # .5 .75 1 1
             3: [["x"] * 4, ["x", "x", "x", "y"], ["x", "x", "y", "z"], ["x", "x", "y", "z"]],  # 1 .75 .5 .5
             4: [["p", "p", "q", "q"]] * 4}                                                      # ties: 0


def _trapo_feedback(t):
    rewards, answers = [], []
    for q in range(5):
        if q in TRAPO_LAB:
            k = int(round(TRAPO_LAB[q][t] * 4))
            rewards.append([1.0] * k + [0.0] * (4 - k))
            answers.append(["?"] * 4)
        else:
            rewards.append([0.0] * 4)
            answers.append(TRAPO_UNL[q][t])
    return Feedback(np.arange(5), rewards, answers=answers, step=t)


def _ref_score(db, query):
    """TraPO's mean cosine of z-normalised prefixes, written as a plain loop."""
    length = min(len(d) for d in db)

    def z(v):
        v = v[:length]
        mu, sd = statistics.mean(v), statistics.stdev(v)
        return [(x - mu) / (sd + 1e-8) for x in v]

    def cos(a, b):
        na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
        return sum(x * y for x, y in zip(a, b)) / (max(na, 1e-8) * max(nb, 1e-8))

    return sum(cos(z(d), z(query)) for d in db) / len(db)


def test_trapo_warm_up_then_trajectory_selection():
    pool = Pool(["m"] * 5, labeled=[True, True, False, False, False])
    s = Scheduler(pool, "trapo", warm_up=2, topk=0.34, thres=0.9, update_db=False)
    assert s.targets(_trapo_feedback(0)) == [None, None, "a", "x", None]
    keeps = []
    for t in range(4):
        fb = _trapo_feedback(t)
        s.observe(fb)
        keeps.append(s.admit(fb)[:, 0].tolist())
        assert s.admit(fb).all(axis=1).tolist() == s.admit(fb).any(axis=1).tolist()   # whole groups
    assert keeps[0] == keeps[1] == [True, True, False, False, False]                  # warm-up
    # step 2: DB = the labelled prefixes of length 3; scores by the reference loop
    unl = {2: [0.5, 0.75, 1.0], 3: [1.0, 0.75, 0.5], 4: [0.0, 0.0, 0.0]}
    db = [TRAPO_LAB[0][:3], TRAPO_LAB[1][:3]]
    scores = {q: _ref_score(db, v) for q, v in unl.items() if statistics.pstdev(v) > 0}
    assert scores[2] == pytest.approx((1 + math.sqrt(3) / 2) / 2, abs=1e-6)            # .933
    assert scores[3] == pytest.approx(-(1 + math.sqrt(3) / 2) / 2, abs=1e-6)
    # k = max(1, ⌊.34·3⌋) = 1 → prompt 2 (top score, also ≥ .9); 3 (−.933) and 4 (0) dropped
    assert keeps[2] == [True, True, True, False, False]
    assert keeps[3] == [True, True, True, False, False]
    m = s.metrics()
    assert m["supervision/kept_unlabeled"] == 2.0 and m["supervision/dropped_unlabeled"] == 10.0


def test_trapo_logs_every_keep_and_drop_with_its_evidence():
    pool = Pool(["m"] * 5, labeled=[True, True, False, False, False])
    s = Scheduler(pool, "trapo", warm_up=2, topk=0.34, thres=0.9, update_db=False)
    for t in range(4):
        s.observe(_trapo_feedback(t))
    log = [e for e in s.supervision_log() if e["rule"] in ("trapo_warm_up", "trapo_trajectory")]
    warm = [(e["step"], e["prompt_id"], e["decision"]) for e in log if e["rule"] == "trapo_warm_up"]
    assert warm == [(t, q, "drop") for t in (0, 1) for q in (2, 3, 4)]
    traj = [(e["step"], e["prompt_id"], e["decision"], e["evidence"]) for e in log if e["rule"] == "trapo_trajectory"]
    assert [(t, q, d) for t, q, d, _ in traj] == [(t, q, d) for t in (2, 3)
                                                  for q, d in ((2, "keep"), (3, "drop"), (4, "drop"))]
    for t, q, _, ev in traj:
        length = t + 1                                     # the labelled prefixes: every visit so far
        assert (ev["length"], ev["database"], ev["thres"], ev["topk"]) == (length, 2, 0.9, 0.34)
        traj_q = [float(Counter(a).most_common(1)[0][1] / 4) if q != 4 else 0.0
                  for a in TRAPO_UNL[q][:length]]
        want = 0.0 if statistics.pstdev(traj_q) == 0 else _ref_score(
            [TRAPO_LAB[0][:length], TRAPO_LAB[1][:length]], traj_q)
        assert ev["score"] == pytest.approx(want, abs=1e-6), (t, q)


def test_trapo_scores_mean_versus_max_and_prefix_cut_by_hand():
    from rlpace.policies._trapo import trapo_scores
    # z-scores: db rows ∝ (−1, 0, 1) and (−2, 1, 1); queries cut to L = 3 (the 4th value is ignored)
    db = np.array([[0.0, 0.25, 0.5], [0.25, 0.5, 0.5]])
    q = np.array([[0.5, 0.75, 1.0, 0.0], [1.0, 0.75, 0.5, 9.0]])
    c = math.sqrt(3) / 2                                          # cos((−1, 0, 1), (−2, 1, 1))
    np.testing.assert_allclose(trapo_scores(db, q, "mean"), [(1 + c) / 2, -(1 + c) / 2], atol=1e-9)
    np.testing.assert_allclose(trapo_scores(db, q, "max"), [1.0, -c], atol=1e-9)


@pytest.mark.parametrize("topk,kept", [(0.1, [True, False, False]),     # k = max(1, ⌊.3⌋) = 1
                                       (0.67, [True, False, True]),     # k = ⌊2.01⌋ = 2: 2, then 4 (0)
                                       (1.0, [True, True, True])])      # k = 3
def test_trapo_top_k_is_floor_of_share_at_least_one(topk, kept):
    # scores at step 2 (see above): prompt 2 .933, prompt 3 −.933, prompt 4 0; thres .99 adds none
    s = Scheduler(Pool(["m"] * 5, labeled=[True, True, False, False, False]), "trapo", warm_up=2,
                  topk=topk, thres=0.99, update_db=False)
    for t in range(3):
        fb = _trapo_feedback(t)
        s.observe(fb)
    assert s.admit(fb)[2:, 0].tolist() == kept


def test_trapo_threshold_adds_to_top_k_and_update_db_grows_the_database():
    pool = Pool(["m"] * 5, labeled=[True, True, False, False, False])
    s = Scheduler(pool, "trapo", warm_up=2, topk=0.1, thres=-0.95, update_db=True)
    for t in range(3):
        fb = _trapo_feedback(t)
        s.observe(fb)
    # top-1 = prompt 2; threshold −.95 adds prompt 3 (−.933); prompt 4 (constant: score 0) too
    assert s.admit(fb)[:, 0].tolist() == [True, True, True, True, True]
    assert s.metrics()["supervision/db_size"] == 3.0
    sd = s.state_dict()
    np.testing.assert_array_equal(sd["policy/admission/db_len"][2:], [3, 3, 3])


def test_trapo_promotion_option_and_exact_resume_through_npz(tmp_path):
    pool = Pool(["m"] * 5, labeled=[True, True, False, False, False])
    long = "x = \\frac{1}{3} + a rather long final answer"
    answers_2 = [[long, long, "b", "c"], [long, long, long, "b"], [long] * 4, [long] * 4, [long] * 4]

    def fb_at(t):
        fb = _trapo_feedback(min(t, 3))
        ans = [list(r) for r in fb.answers]
        ans[2] = answers_2[t]
        return Feedback(fb.prompt_ids, fb.rewards, answers=ans, step=t)

    kw = dict(warm_up=1, promote=True, promote_pass_rate=0.8, promote_window=3)
    ref = Scheduler(pool, "trapo", **kw)
    for t in range(3):
        ref.observe(fb_at(t))
    # visit 2 of prompt 2: P = .5, .75, 1 (≥ .8, rising) and three equal majorities → promoted
    assert ref.metrics()["supervision/promotions"] == 1.0
    promo = [d for d in ref.supervision_log() if d["decision"] == "promote"]
    assert [(d["step"], d["prompt_id"], d["target"]) for d in promo] == [(2, 2, long)]
    assert promo[0]["evidence"] == {"pass_rate": 1.0, "visit": 2, "slope": 0.25}
    sd = ref.state_dict()
    assert sd["policy/admission/label"][2] == long and sd["policy/admission/label"].dtype.kind == "U"
    fresh = Scheduler(pool, "trapo", seed=99, **kw)
    fresh.load_state_dict(_roundtrip_npz(sd, tmp_path))
    assert_state_equal(fresh.state_dict(), ref.state_dict())
    for t in (3, 4):
        fb = fb_at(t)
        assert fresh.targets(fb) == ref.targets(fb)
        assert fresh.targets(fb)[2] == long                       # the persisted label
        fresh.observe(fb)
        ref.observe(fb)
        np.testing.assert_array_equal(fresh.admit(fb), ref.admit(fb))
    assert_state_equal(fresh.state_dict(), ref.state_dict())


def test_olr_exact_resume_through_npz(tmp_path):
    pool = Pool(["m"] * 3, ids=[100, 101, 102])
    ref = Scheduler(pool, "olr", start_step=2)
    for v in range(2):
        ref.observe(_olr_feedback(v))
    fresh = Scheduler(pool, "olr", start_step=2)
    fresh.load_state_dict(_roundtrip_npz(ref.state_dict(), tmp_path))
    for v in range(2, 6):
        assert fresh.targets(_olr_feedback(v)) == ref.targets(_olr_feedback(v)) == OLR_EXPECTED[v]
        fresh.observe(_olr_feedback(v))
        ref.observe(_olr_feedback(v))
        assert fresh.metrics() == ref.metrics()
    assert_state_equal(fresh.state_dict(), ref.state_dict())


# ---- bad input, neutral places, composition --------------------------------------------------------------
@pytest.mark.parametrize("name", ["ttrl", "olr", "trapo", "ttrl+self_certainty"])
def test_bad_input_leaves_state_unchanged(name):
    # Every bad input here is a valid Feedback that the Scheduler (or a policy) must reject:
    # errors raised while building the Feedback never reach the Scheduler (see
    # test_feedback_supervision_fields_validated), so they cannot test its state.
    pool = Pool(["m"] * 5, labeled=[True, True, False, False, False])
    s = Scheduler(pool, name)
    for t in range(3):
        s.observe(_trapo_feedback(t))
    before, metrics, log = s.state_dict(), s.metrics(), s.supervision_log()
    out_of_pool = Feedback([0, 7], np.zeros((2, 4)), answers=[["1"] * 4] * 2, step=3)
    for call in (s.targets, s.observe, s.rewards, s.admission, s.advantage_weights, s.loss_weights):
        with pytest.raises(ValueError, match=r"Feedback\.prompt_ids"):
            call(out_of_pool)
    no_answers = Feedback([2], np.zeros((1, 4)), step=3)
    with pytest.raises(ValueError, match=r"Feedback\.answers"):
        s.targets(no_answers)                                     # the target place needs answers
    if "self_certainty" in name:
        with pytest.raises(ValueError, match=r"Feedback\.self_certainty"):
            s.rewards(no_answers)                                 # an unlabelled prompt without it
    assert_state_equal(s.state_dict(), before)
    assert s.metrics() == metrics and s.supervision_log() == log


def test_ttrl_vote_rollouts_above_g_is_rejected_before_anything_changes():
    # vote_rollouts = 5 with G = 4 answers: silently voting with 4 would misreport TTRL's N.
    pool = Pool(["m"] * 2, labeled=[False, False])
    s = Scheduler(pool, "ttrl", vote_rollouts=5)
    s.observe(Feedback([0, 1], np.zeros((2, 5)), answers=[["1"] * 5, ["2"] * 5], step=0))   # G = 5: fine
    before, log = s.state_dict(), s.supervision_log()
    fb = Feedback([0, 1], [[1.0, 0, 0, 0], [0, 0, 0, 0]], answers=[["1", "1", "2", "3"]] * 2, step=1)
    for call in (s.targets, s.observe):
        with pytest.raises(ValueError, match="vote_rollouts=5"):
            call(fb)
    assert_state_equal(s.state_dict(), before)                     # history included
    assert s.supervision_log() == log and len(log) == 2
    assert Scheduler(pool, "ttrl", vote_rollouts=4).targets(fb) == ["1", "1"]


def test_existing_methods_get_neutral_places_and_unchanged_state_keys():
    pool = Pool(["a", "b"] * 4)
    s = Scheduler(pool, "dump+dapo_dynamic_sampling")
    m = s.method
    assert (m.target.name, m.reward.name, m.advantage.name) == ("dataset_labels", "identity_reward",
                                                                "unit_advantage")
    fb = Feedback([0, 3], [[1.0, 0.25], [0.0, 1.0]], answers=[["1", "2"], ["3", "3"]], step=0)
    assert s.targets(fb) == [None, None]
    np.testing.assert_array_equal(s.rewards(fb), fb.rewards)
    np.testing.assert_array_equal(s.advantage_weights(fb), np.ones((2, 2)))
    keys = set(s.state_dict())
    assert not any(k.startswith(("policy/target", "policy/reward", "policy/advantage")) for k in keys)
    s.observe(fb)
    assert s.supervision_log() == [] and not any(k.startswith("supervision/") for k in s.metrics())


def test_methods_combine_by_plus_and_one_target_per_method():
    s = Scheduler(Pool(["a", "b"] * 4, labeled=[False] * 8), "ttrl+dump+self_certainty")
    assert (s.method.target.name, s.method.mixture.name, s.method.reward.name) == (
        "ttrl", "dump", "self_certainty")
    with pytest.raises(ValueError, match="one target policy"):
        compose(make_policy("ttrl"), make_policy("olr"))
    assert isinstance(make_policy("trapo"), policies.Method)
    assert make_policy("trapo").admission.name == "trapo"


def test_advantage_place_weights_and_reward_chain_order():
    from rlpace.policies import ADVANTAGE, REWARD, DataPolicy, EmptyState, chain

    def const(kind, name, fn):
        return DataPolicy(kind, lambda pool: EmptyState(), lambda s, pool, b: s, fn, name=name)

    half = const(ADVANTAGE, "half", lambda s, pool, b: np.full(b.rewards.shape, 0.5))
    mask = const(ADVANTAGE, "first_only", lambda s, pool, b: np.r_[[1.0], np.zeros(b.rewards.shape[1] - 1)]
                 * np.ones(b.rewards.shape))
    plus1 = const(REWARD, "plus1", lambda s, pool, b: b.rewards + 1.0)
    times3 = const(REWARD, "times3", lambda s, pool, b: b.rewards * 3.0)
    s = Scheduler(Pool(["a"] * 2), compose(half, mask, plus1, times3, name="m"))
    fb = Feedback([0, 1], [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], step=0)
    np.testing.assert_array_equal(s.advantage_weights(fb), [[0.5, 0, 0], [0.5, 0, 0]])   # weights multiply
    np.testing.assert_array_equal(s.rewards(fb), [[6.0, 3.0, 3.0], [3.0, 3.0, 6.0]])    # (r + 1) · 3, in order
    assert chain(plus1, times3).kind == REWARD
    too_big = const(ADVANTAGE, "two", lambda s, pool, b: np.full(b.rewards.shape, 2.0))
    with pytest.raises(RuntimeError, match=r"in \[0, 1\]"):
        Scheduler(Pool(["a"] * 2), compose(too_big, name="bad")).advantage_weights(fb)


def test_pool_from_parquet_reads_labeled(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa
    rows = [{"data_source": "m", "extra_info": {"index": i, "labeled": i % 2 == 0}} for i in range(4)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    assert Pool.from_parquet(tmp_path / "train.parquet").labeled.tolist() == [True, False, True, False]


def test_trapo_db_min_visits_keeps_short_labelled_trajectories_out():
    # prompt 5 (labelled) is seen once, at step 2: by default it joins the database and cuts
    # L to 1, where every z-score and so every score is 0 (≥ thres −.5: all kept); with
    # db_min_visits=2 it stays out, L = 3, and the scores are .933 / −.933 / 0 as above
    pool = Pool(["m"] * 6, labeled=[True, True, False, False, False, True])

    def run(**kw):
        s = Scheduler(pool, "trapo", warm_up=2, topk=0.34, thres=-0.5, update_db=False, **kw)
        for t in range(3):
            fb = _trapo_feedback(t)
            if t == 2:
                fb = Feedback(np.arange(6), np.vstack([fb.rewards, [[1.0, 0.0, 0.0, 0.0]]]),
                              answers=[list(r) for r in fb.answers] + [["?"] * 4], step=t)
            s.observe(fb)
        return s.admit(fb)[:, 0].tolist()

    assert run() == [True, True, True, True, True, True]
    assert run(db_min_visits=2) == [True, True, True, False, True, True]       # 3 (−.933) dropped
