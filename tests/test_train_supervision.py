"""Supervision in the built-in trainer: labelled subsets and label noise drawn from
the seed, answers and token statistics per rollout, rewards against training labels and
targets, the `sup/*` measurements, TTRL end to end and exact resume. Torch runs one thread."""

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import read_log, tiny_config  # noqa: E402
from rlpace.scheduler import Scheduler  # noqa: E402
from rlpace.tasks import Item, make_taskset  # noqa: E402
from rlpace.train import TrainConfig, check_config, train  # noqa: E402
from rlpace.train.recipes import grpo  # noqa: E402
from rlpace.train.rollout import generate, token_statistics  # noqa: E402
from rlpace.train.supervision import (Supervision, extract_answer, make_labels, relabel,  # noqa: E402
                                      supervising_places)

torch.set_num_threads(1)


def _items(n_per=40):
    """Two domains; answers cycle through 4 values in 'a', 2 in 'b'."""
    a = [Item(f"a{i}=", str(i % 4), "a", 1.0, i) for i in range(n_per)]
    b = [Item(f"b{i}=", "xy"[i % 2], "b", 2.0, n_per + i) for i in range(n_per // 2)]
    return a + b


# ---- labels ---------------------------------------------------------------------------------
def test_labels_have_the_right_share_per_domain_and_replay_from_the_seed():
    items = _items()
    lab = make_labels(items, labeled_fraction=0.1, label_noise=0.0, seed=3)
    dom = np.array([it.domain for it in items])
    assert lab.labeled[dom == "a"].sum() == 4 and lab.labeled[dom == "b"].sum() == 2     # round(0.1·40), round(0.1·20)
    assert [a is None for a in lab.answers] == (~lab.labeled).tolist()
    assert all(a == it.answer for a, it, ok in zip(lab.answers, items, lab.labeled) if ok)   # clean
    again = make_labels(items, labeled_fraction=0.1, label_noise=0.0, seed=3)
    other = make_labels(items, labeled_fraction=0.1, label_noise=0.0, seed=4)
    assert np.array_equal(lab.labeled, again.labeled) and lab.answers == again.answers
    assert not np.array_equal(lab.labeled, other.labeled)
    # a tiny domain still keeps one labelled prompt
    assert make_labels(items[:3], labeled_fraction=0.1).labeled.sum() == 1


def test_label_noise_is_a_realisable_wrong_answer_of_the_same_domain():
    items = _items()
    lab = make_labels(items, labeled_fraction=1.0, label_noise=0.3, seed=0)
    dom = np.array([it.domain for it in items])
    assert lab.noisy[dom == "a"].sum() == 12 and lab.noisy[dom == "b"].sum() == 6        # round(0.3·40), round(0.3·20)
    for it, a, bad in zip(items, lab.answers, lab.noisy):
        if bad:
            assert a != it.answer and a in {x.answer for x in items if x.domain == it.domain}
        else:
            assert a == it.answer
    # the noise falls on labelled prompts only, 30 % of them
    part = make_labels(items, labeled_fraction=0.5, label_noise=0.3, seed=0)
    assert not (part.noisy & ~part.labeled).any()
    assert part.noisy[dom == "a"].sum() == 6 and part.noisy[dom == "b"].sum() == 3       # round(0.3·20), round(0.3·10)
    assert np.array_equal(part.noisy, make_labels(items, labeled_fraction=0.5, label_noise=0.3, seed=0).noisy)
    with pytest.raises(ValueError, match="label_noise=0.5 needs a wrong answer"):
        make_labels([Item("p=", "1", "d", 1.0, i) for i in range(4)], label_noise=0.5)


@pytest.mark.parametrize("change, message", [
    ({"labeled_fraction": 0.0}, r"labeled_fraction must be a number in \(0, 1\]"),
    ({"labeled_fraction": 1.5}, r"labeled_fraction must be a number in \(0, 1\]"),
    ({"labeled_fraction": math.nan}, r"labeled_fraction must be a number in \(0, 1\]"),
    ({"label_noise": 1.0}, r"label_noise must be a number in \[0, 1\)"),
    ({"label_noise": -0.1}, r"label_noise must be a number in \[0, 1\)"),
    ({"tasks": "generated:sort", "labeled_fraction": 0.5}, "set labeled_fraction=1 and label_noise=0"),
    ({"lilo_candidates": 4, "label_noise": 0.2}, "set lilo_candidates=0"),
])
def test_bad_fractions_are_rejected_naming_the_field(change, message):
    with pytest.raises(ValueError, match=message):
        check_config(dataclasses.replace(TrainConfig(), **change))


# ---- answers and token statistics ------------------------------------------------------------
def test_extract_answer_reads_what_the_verifier_reads():
    assert extract_answer(" 42\n") == "42"
    assert extract_answer("work <answer> 7 </answer> more <answer>8</answer>") == "8"
    assert extract_answer("") is None and extract_answer("   ") is None and extract_answer(None) is None
    assert extract_answer("so \\boxed{\\frac{1}{2}} done", "math") == "\\frac{1}{2}"
    assert extract_answer("\\boxed{1} then \\boxed{{2}+1}", "math") == "{2}+1"       # last, brace-matched
    assert extract_answer("no box 3", "math") is None
    assert extract_answer("<answer>x</answer>", "math") == "x"
    it = Item("q", "1", "d", 1.0, 0, ability="reasoning_gym", entry=json.dumps({"answer": "1", "metadata": {}}))
    moved = relabel(it, "5")
    assert moved.answer == "5" and json.loads(moved.entry)["answer"] == "5" and moved.prompt == "q"


def test_token_statistics_by_hand():
    # p = (3/4, 1/4): H = −(¾ ln ¾ + ¼ ln ¼) = 0.562335; KL(U‖p) = ½ ln(½/¾) + ½ ln(½/¼) = 0.143841
    h, sc = token_statistics(torch.tensor([[math.log(3.0), 0.0], [0.0, 0.0]]))
    assert h.tolist() == pytest.approx([0.562335, math.log(2)], abs=1e-6)
    assert sc.tolist() == pytest.approx([0.143841, 0.0], abs=1e-6)
    # temperature 2 on logits (2 ln 3, 0) is the same distribution
    h2, sc2 = token_statistics(torch.tensor([2 * math.log(3.0), 0.0]), temperature=2.0)
    assert float(h2) == pytest.approx(0.562335, abs=1e-6) and float(sc2) == pytest.approx(0.143841, abs=1e-6)


def _tiny_lm(seed=0, vocab=12):
    from rlpace.train.model import tiny_causal_lm
    return tiny_causal_lm(vocab, hidden=16, layers=2, heads=2, seed=seed).eval()


def test_generation_stats_of_a_uniform_policy():
    """All-zero weights (tied embeddings): logits 0, p = uniform over V = 12 ⇒ H = ln 12, KL(U‖p) = 0."""
    model = _tiny_lm()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    ro = generate(model, [[1, 5, 6], [1, 7]], repeats=3, max_new_tokens=5, eos_id=2, pad_id=0,
                  generator=torch.Generator().manual_seed(0), stats=True)
    m = ro.completion_mask.bool()
    assert torch.allclose(ro.token_entropy[m], torch.full((int(m.sum()),), math.log(12.0)), atol=1e-5)
    assert torch.allclose(ro.self_certainty[m], torch.zeros(int(m.sum())), atol=1e-5)
    assert torch.allclose(ro.token_logprob[m], torch.full((int(m.sum()),), -math.log(12.0)), atol=1e-5)
    assert (ro.token_entropy[~m] == 0).all() and (ro.self_certainty[~m] == 0).all() and (ro.token_logprob[~m] == 0).all()


def test_group_stats_match_an_independent_loop_over_a_full_forward():
    """Groups.token_entropy / self_certainty / mean_logprob (read off the sampling loop's logits) against numpy
    over one plain forward of [prompt | completion] per rollout, at temperature 0.7."""
    from rlpace.train.model import train_char_tokenizer
    tok = train_char_tokenizer(["0123456789=+"])
    model = _tiny_lm(seed=1, vocab=len(tok))
    tasks = make_taskset("embedded:max2", train_per_domain=4, heldout_per_domain=1)
    prompts = [[tok.bos_token_id] + tok.encode(it.prompt, add_special_tokens=False) for it in tasks.train]
    cfg = TrainConfig(max_new_tokens=4, temperature=0.7)
    grp = grpo.sample_groups(model, tok, tasks, prompts, np.array([0, 2]), 3, cfg, torch.Generator().manual_seed(1),
                             token_stats=True)
    assert grp.token_entropy.shape == grp.self_certainty.shape == (2, 3)
    for r, (pr, comp) in enumerate(zip(grp.prompts, grp.completions)):
        ids = torch.tensor([pr + comp])
        with torch.no_grad():
            z = model(input_ids=ids).logits[0, len(pr) - 1:len(pr) + len(comp) - 1].double().numpy() / 0.7
        hs, scs, lps = [], [], []
        for row, drawn in zip(z, comp):                # one token at a time
            lse = math.log(sum(math.exp(v) for v in row))
            p = [math.exp(v - lse) for v in row]
            hs.append(-sum(pi * math.log(pi) for pi in p))
            scs.append(lse - sum(row) / len(row) - math.log(len(row)))
            lps.append(row[drawn] - lse)
        assert grp.token_entropy.ravel()[r] == pytest.approx(sum(hs) / len(hs), abs=1e-4)
        assert grp.self_certainty.ravel()[r] == pytest.approx(sum(scs) / len(scs), abs=1e-4)
        assert grp.mean_logprob.ravel()[r] == pytest.approx(sum(lps) / len(lps), abs=1e-4)
    assert len(grp.texts) == 6


# ---- the trainer ---------------------------------------------------------------------------------
def _capture(monkeypatch):
    observed, sampled = [], []
    real_observe, real_sample = Scheduler.observe, grpo.sample_groups
    monkeypatch.setattr(Scheduler, "observe", lambda self, fb: observed.append(fb) or real_observe(self, fb))
    monkeypatch.setattr(grpo, "sample_groups", lambda *a, **k: sampled.append(real_sample(*a, **k)) or sampled[-1])
    return observed, sampled


def test_labelled_only_with_noise_trains_on_the_noisy_labels(tmp_path, cache, monkeypatch):
    """labeled_fraction=0.5, label_noise=0.5, policy=uniform: the pool holds the 16 labelled prompts
    only; the Scheduler's rewards are exact matches against the (noisy) training labels,
    re-graded here from the completions; sup/* metrics follow."""
    observed, sampled = _capture(monkeypatch)
    cfg = tiny_config(tmp_path / "run", cache, labeled_fraction=0.5, label_noise=0.5, steps=3)
    train(cfg)
    tasks = make_taskset(cfg.tasks, train_per_domain=16, heldout_per_domain=8, seed=0)
    lab = make_labels(tasks.train, 0.5, 0.5, 0)
    keep = np.flatnonzero(lab.labeled)
    assert keep.size == 16 and lab.noisy.sum() == 8
    labels = [lab.answers[i] for i in keep]                      # training label of pool position k
    truth = [tasks.train[i].answer for i in keep]
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    noisy_seen = 0
    for fb, grp, rec in zip(observed, sampled, recs):
        assert fb.prompt_ids.max() < 16
        expect = [[1.0 if grp.texts[i * 4 + j].strip() == labels[p] else 0.0 for j in range(4)]
                  for i, p in enumerate(fb.prompt_ids)]
        assert fb.rewards.tolist() == expect
        true = [[1.0 if grp.texts[i * 4 + j].strip() == truth[p] else 0.0 for j in range(4)]
                for i, p in enumerate(fb.prompt_ids)]
        assert rec["sup/true_reward_mean"] == pytest.approx(np.mean(true))
        n_noisy = sum(lab.noisy[keep[p]] for p in fb.prompt_ids)
        noisy_seen += n_noisy
        assert rec["sup/labeled_share"] == 1.0 and rec["sup/noisy_share"] == n_noisy / 4
        assert rec["sup/label_accuracy"] == 1 - n_noisy / 4 and rec["sup/targets"] == 0
    assert noisy_seen > 0


def test_supervision_places_refuse_fresh_item_task_sets(tmp_path, cache):
    with pytest.raises(ValueError, match="supervision places of policy='ttrl' \\(target\\)"):
        train(tiny_config(tmp_path / "run", cache, tasks="generated:sort", policy="ttrl"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()            # before any work


def test_existing_methods_keep_the_old_path():
    from rlpace.policies import make_method
    tasks = make_taskset("embedded:max2", train_per_domain=8, heldout_per_domain=2)
    for name in ("uniform", "dump", "dapo_dynamic_sampling"):
        sup = Supervision(tasks, TrainConfig(), make_method(name))
        assert not sup.active and not sup.token_stats and sup.places == frozenset()
    half = Supervision(tasks, TrainConfig(labeled_fraction=0.5), make_method("uniform"))
    assert half.active is False and len(half.tasks.train) == 4 and half.pool_labeled is None


def _majority(answers):
    """TTRL-v2's vote, written out: the most frequent non-None answer, ties to the one seen
    first; None when no rollout has an answer."""
    counts, first = {}, {}
    for k, a in enumerate(answers):
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
            first.setdefault(a, k)
    if not counts:
        return None
    return max(counts, key=lambda a: (counts[a], -first[a]))


def test_ttrl_through_the_trainer(tmp_path, cache, monkeypatch):
    """TTRL on a pool where half the prompts are unlabelled: the Scheduler sees answers; an
    unlabelled prompt is verified against its group's majority answer (0 without one), a
    labelled one against its label; pseudo-labels and their accuracy are logged."""
    from rlpace.policies import make_method
    assert "target" in supervising_places(make_method("ttrl"))
    observed, sampled = _capture(monkeypatch)
    cfg = tiny_config(tmp_path / "run", cache, labeled_fraction=0.5, policy="ttrl", steps=3)
    train(cfg)
    tasks = make_taskset(cfg.tasks, train_per_domain=16, heldout_per_domain=8, seed=0)
    lab = make_labels(tasks.train, 0.5, 0.0, 0)
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    assert len(observed) == 3
    assert any((~lab.labeled[fb.prompt_ids]).any() for fb in observed)      # full pool, unlabelled included
    targets_seen = 0
    for fb, grp, rec in zip(observed, sampled, recs):
        assert fb.answers.shape == (4, 4)
        n_targets = correct = 0
        for i, p in enumerate(fb.prompt_ids):
            texts = grp.texts[i * 4:(i + 1) * 4]
            ans = [t.strip() or None for t in texts]
            assert list(fb.answers[i]) == ans
            if lab.labeled[p]:
                assert fb.rewards[i].tolist() == [1.0 if a == tasks.train[p].answer else 0.0 for a in ans]
                continue
            maj = _majority(ans)
            assert fb.rewards[i].tolist() == [1.0 if maj is not None and a == maj else 0.0 for a in ans]
            if maj is not None:
                n_targets += 1
                correct += maj == tasks.train[p].answer
        targets_seen += n_targets
        assert rec["sup/targets"] == rec["sup/pseudo_labels"] == n_targets and rec["sup/relabels"] == 0
        assert rec["sup/labeled_share"] == pytest.approx(np.mean(lab.labeled[fb.prompt_ids]))
        if n_targets:
            assert rec["sup/target_accuracy"] == pytest.approx(correct / n_targets)
    assert targets_seen > 0


def test_self_certainty_rewards_unlabelled_rollouts_by_their_certainty(tmp_path, cache, monkeypatch):
    """Intuitor through the trainer: unlabelled rows get the rollout's self-certainty as reward
    (the generation-time value, re-derived in the stats test above), labelled rows their
    verified reward; the statistics are computed only because the method reads them."""
    observed, sampled = _capture(monkeypatch)
    cfg = tiny_config(tmp_path / "run", cache, labeled_fraction=0.5, policy="self_certainty", steps=2)
    train(cfg)
    tasks = make_taskset(cfg.tasks, train_per_domain=16, heldout_per_domain=8, seed=0)
    lab = make_labels(tasks.train, 0.5, 0.0, 0)
    seen = {True: 0, False: 0}
    assert len(observed) == 2
    for fb, grp in zip(observed, sampled):
        assert grp.self_certainty is not None and fb.self_certainty is not None
        for i, p in enumerate(fb.prompt_ids):
            seen[bool(lab.labeled[p])] += 1
            if lab.labeled[p]:
                texts = grp.texts[i * 4:(i + 1) * 4]
                assert fb.rewards[i].tolist() == [1.0 if t.strip() == tasks.train[p].answer else 0.0 for t in texts]
            else:
                assert fb.rewards[i].tolist() == pytest.approx(grp.self_certainty[i].tolist(), abs=1e-12)
                assert (grp.self_certainty[i] > 0).all()          # a reward, not the placeholder 0
    assert seen[True] > 0 and seen[False] > 0               # both branches ran


def test_ttrl_resume_is_exact(tmp_path, cache):
    kw = dict(labeled_fraction=0.5, label_noise=0.25, policy="ttrl", checkpoint_every=3)
    full = tiny_config(tmp_path / "full", cache, steps=6, **kw)
    train(full)
    first = tiny_config(tmp_path / "part", cache, steps=3, **kw)
    train(first)
    train(dataclasses.replace(first, steps=6, resume=True))
    a = [r for r in read_log(full.out) if not r.get("final")]
    b = [r for r in read_log(first.out) if not r.get("final")]
    assert [r["step"] for r in b] == list(range(6))
    for ra, rb in zip(a[3:], b[3:]):
        assert ra["prompt_ids"] == rb["prompt_ids"] and ra["reward_mean"] == rb["reward_mean"]
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-6)
        assert {k: v for k, v in ra.items() if k.startswith("sup/")} == {k: v for k, v in rb.items() if k.startswith("sup/")}
    ma = torch.load(Path(full.out, "checkpoint", "model.pt"))
    mb = torch.load(Path(first.out, "checkpoint", "model.pt"))
    assert all(torch.allclose(ma[k], mb[k], atol=1e-6) for k in ma)
    with np.load(Path(full.out, "checkpoint", "scheduler.npz"), allow_pickle=False) as za, \
            np.load(Path(first.out, "checkpoint", "scheduler.npz"), allow_pickle=False) as zb:
        assert sorted(za.files) == sorted(zb.files)
        assert all(np.array_equal(za[k], zb[k]) for k in za.files)
