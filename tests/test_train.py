"""The built-in GRPO recipe on a tiny model: data flow to and from the Scheduler, admission
and weights reaching the loss, exact resume, refills and LILO probes counted, the base
policy cache, and bad input rejected before any work. Torch runs one thread."""

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import read_log, tiny_config  # noqa: E402
from rlpace.scheduler import Scheduler  # noqa: E402
from rlpace.tasks import make_taskset  # noqa: E402
from rlpace.train import TrainConfig, check_config, from_overrides, train  # noqa: E402
from rlpace.train import recipes  # noqa: E402,F401
from rlpace.train.model import build_base_policy, check_model_dir, load_policy  # noqa: E402
from rlpace.train.recipes import grpo  # noqa: E402
from rlpace.train.rollout import decode_completions, Rollout  # noqa: E402

torch.set_num_threads(1)


def cfg_for(tmp_path, cache, **kw):
    return tiny_config(tmp_path / "run", cache, **kw)


def records(cfg):
    return read_log(cfg.out)


@pytest.fixture
def policy_module(tmp_path, monkeypatch):
    """User policies importable by dotted path (what `policy=pkg.module:factory` names)."""
    (tmp_path / "mypolicies.py").write_text(textwrap.dedent("""
        import numpy as np
        from rlpace.policies import DataPolicy, Admission, policy_factory
        from rlpace.policies._base import _empty_init, _no_update

        @policy_factory
        def zero_weights():
            return DataPolicy("reweighting", _empty_init, _no_update,
                              lambda s, pool, b: np.zeros(b.rewards.shape), name="zero_weights")

        @policy_factory
        def keep_last3_only():
            def apply(s, pool, b):
                keep = np.asarray(pool.domain_names)[b.domains] == "last3"
                return Admission(np.repeat(keep[:, None], b.rewards.shape[1], axis=1), 0)
            return DataPolicy("admission", _empty_init, _no_update, apply, name="keep_last3_only")
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "mypolicies"


def test_rewards_reach_the_scheduler_with_the_right_prompt_ids(tmp_path, cache, monkeypatch):
    proposed, observed, sampled = [], [], []
    real_propose, real_observe, real_sample = Scheduler.propose, Scheduler.observe, grpo.sample_groups
    monkeypatch.setattr(Scheduler, "propose", lambda self, n: proposed.append(real_propose(self, n)) or proposed[-1])
    monkeypatch.setattr(Scheduler, "observe", lambda self, fb: observed.append(fb) or real_observe(self, fb))
    monkeypatch.setattr(grpo, "sample_groups", lambda *a, **k: sampled.append(real_sample(*a, **k)) or sampled[-1])
    cfg = cfg_for(tmp_path, cache, steps=3)
    train(cfg)
    assert len(observed) == len(proposed) == len(sampled) == 3
    tasks = make_taskset(cfg.tasks, train_per_domain=cfg.train_per_domain,
                         heldout_per_domain=cfg.heldout_per_domain, seed=cfg.seed)
    _, tok = load_policy(Path(json.loads(Path(cfg.out, "summary.json").read_text())["model_dir"]))
    for step, (ids, fb, grp) in enumerate(zip(proposed, observed, sampled)):
        assert fb.prompt_ids.tolist() == ids.tolist() == grp.ids.tolist()
        assert fb.rewards.shape == (4, 4) and fb.step == step
        # re-grade every completion independently against the item of its prompt id
        texts = tok.batch_decode(grp.completions, skip_special_tokens=True)
        items = [tasks.train[i] for i in ids for _ in range(4)]
        expect = [1.0 if t.strip() == it.answer else 0.0 for t, it in zip(texts, items)]
        assert fb.rewards.ravel().tolist() == expect
        # and the prompt of each rollout is the prompt of its id
        assert all(tok.decode(p, skip_special_tokens=True) == it.prompt for p, it in zip(grp.prompts, items))
    rewards = np.concatenate([fb.rewards.ravel() for fb in observed])
    assert 0 < rewards.mean() < 1                        # right and wrong completions both checked
    recs = [r for r in records(cfg) if not r.get("final")]
    assert [r["prompt_ids"] for r in recs] == [p.tolist() for p in proposed]
    assert recs[-1]["sched/rollouts_observed"] == 3 * 16


def test_zero_loss_weights_leave_the_model_unchanged(tmp_path, cache, policy_module):
    cfg = cfg_for(tmp_path, cache, steps=2, policy=f"uniform+{policy_module}:zero_weights")
    summary = train(cfg)
    base, _ = load_policy(summary["model_dir"])
    trained = torch.load(Path(cfg.out, "checkpoint", "model.pt"))
    for k, v in base.state_dict().items():
        assert torch.equal(v, trained[k]), k
    # admission keeps every group (zero weights are not admission): they are trained, with loss 0
    assert all(r["groups_trained"] == 4 and r["pg_loss"] == 0.0 for r in records(cfg) if not r.get("final"))
    # the same run with weight 1 does change it
    cfg1 = cfg_for(tmp_path / "b", cache, steps=2)
    train(cfg1)
    trained1 = torch.load(Path(cfg1.out, "checkpoint", "model.pt"))
    assert any(not torch.equal(v, trained1[k]) for k, v in base.state_dict().items())


def test_admission_mask_reaches_the_loss(tmp_path, cache, policy_module, monkeypatch):
    seen = []
    real = grpo.policy_loss
    monkeypatch.setattr(grpo, "policy_loss", lambda *a, **k: seen.append((a[5].clone(), a[6].clone())) or real(*a, **k))
    cfg = cfg_for(tmp_path, cache, steps=3, policy=f"uniform+{policy_module}:keep_last3_only")
    train(cfg)
    tasks = make_taskset(cfg.tasks, train_per_domain=16, heldout_per_domain=8)
    recs = [r for r in records(cfg) if not r.get("final")]
    trained = [r for r in recs if r["groups_trained"]]
    for r in recs:
        n_last3 = sum(tasks.train[i].domain == "last3" for i in r["prompt_ids"])
        assert r["groups_trained"] == n_last3          # max2 groups never enter the loss
    assert len(seen) == len(trained)                    # one loss call per step with a batch
    for (keep, w), r in zip(seen, trained):
        assert keep.shape == (4 * r["groups_trained"],) and torch.all(keep == 1)
        assert torch.all(w[r_mask(w)] == 1)                     # unit loss weights on real tokens


def r_mask(w):
    return w != 0


def test_exact_resume(tmp_path, cache):
    full = cfg_for(tmp_path / "full", cache, steps=6, checkpoint_every=3, policy="dump")
    train(full)
    first = cfg_for(tmp_path / "part", cache, steps=3, checkpoint_every=3, policy="dump")
    train(first)
    train(dataclasses.replace(first, steps=6, resume=True))
    a = [r for r in records(full) if not r.get("final")]
    b = [r for r in records(first) if not r.get("final")]
    assert [r["step"] for r in b] == list(range(6))
    for ra, rb in zip(a[3:], b[3:]):
        assert ra["prompt_ids"] == rb["prompt_ids"]                      # same batches
        assert ra["loss"] == pytest.approx(rb["loss"], abs=1e-6)         # same losses
        assert ra["reward_mean"] == rb["reward_mean"]
        assert ra["sched/domain_prob/max2"] == pytest.approx(rb["sched/domain_prob/max2"], abs=1e-12)
    ma = torch.load(Path(full.out, "checkpoint", "model.pt"))
    mb = torch.load(Path(first.out, "checkpoint", "model.pt"))
    assert all(torch.allclose(ma[k], mb[k], atol=1e-6) for k in ma)
    with np.load(Path(full.out, "checkpoint", "scheduler.npz")) as za, \
            np.load(Path(first.out, "checkpoint", "scheduler.npz")) as zb:
        assert all(np.array_equal(za[k], zb[k]) for k in za.files)


def test_resume_errors(tmp_path, cache):
    cfg = cfg_for(tmp_path, cache, steps=2, checkpoint_every=1)
    with pytest.raises(ValueError, match="holds no checkpoint"):
        train(dataclasses.replace(cfg, resume=True))
    train(cfg)
    before = Path(cfg.out, "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"different config \(lr: saved 0.001, now 0.002"):
        train(dataclasses.replace(cfg, resume=True, steps=4, lr=2e-3))
    assert Path(cfg.out, "metrics.jsonl").read_text() == before


def test_dapo_refills_count_every_rollout(tmp_path, cache):
    cfg = cfg_for(tmp_path, cache, steps=3, policy="uniform+dapo_dynamic_sampling", objective="dapo",
                  max_refill_rounds=2)
    train(cfg)
    recs = [r for r in records(cfg) if not r.get("final")]
    total = 0
    for r in recs:
        assert r["rollouts"] == 4 * len(r["prompt_ids"])                 # every group of every round
        assert len(r["prompt_ids"]) >= 4 and r["refill_rounds"] <= 2
        assert r["groups_trained"] <= 4
        total += r["rollouts"]
        assert r["rollouts_total"] == total
    assert recs[-1]["sched/rollouts_observed"] == total
    assert any(r["refill_rounds"] > 0 for r in recs)                    # the tiny base has all-0/all-1 groups


def test_lilo_probes_are_counted_and_select_learnable_prompts(tmp_path, cache, monkeypatch):
    chosen = []
    real = grpo.lilo_select
    monkeypatch.setattr(grpo, "lilo_select", lambda *a, **k: chosen.append(real(*a, **k)) or chosen[-1])
    cfg = cfg_for(tmp_path, cache, steps=2, lilo_candidates=3, lilo_probes=2)
    train(cfg)
    for r, (ids, probes, probe_tokens) in zip([r for r in records(cfg) if not r.get("final")], chosen):
        assert probes == 3 * 4 * 2
        assert r["probe_rollouts"] == probes and r["rollouts"] == probes + 4 * 4
        assert r["prompt_ids"] == ids.tolist() and len(ids) == 4
        # probe generation is charged: ≥ 1 token per probe rollout, and the step's tokens include it
        assert probe_tokens >= probes and r["tokens"] >= probe_tokens + 4 * 4


def test_base_policy_cache_and_deterministic_rebuild(tmp_path):
    tasks = make_taskset("embedded:max2", train_per_domain=8, heldout_per_domain=4)
    spec = dict(hidden=16, layers=1, heads=2, warmup_steps=5, warmup_batch=8, corpus_per_domain=50)
    a = build_base_policy(tasks, cache_dir=tmp_path / "a", progress=False, **spec)
    stamp = (a / "rlpace_base.json").stat().st_mtime_ns
    assert build_base_policy(tasks, cache_dir=tmp_path / "a", progress=False, **spec) == a
    assert (a / "rlpace_base.json").stat().st_mtime_ns == stamp                  # not rebuilt
    b = build_base_policy(tasks, cache_dir=tmp_path / "b", progress=False, **spec)
    assert a.name == b.name
    ma, _ = load_policy(a)
    mb, _ = load_policy(b)
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    c = build_base_policy(tasks, cache_dir=tmp_path / "a", progress=False, **{**spec, "warmup_steps": 6})
    assert c != a                                                               # another config, another entry


def test_model_dir_runs_a_local_hf_model(tmp_path, cache):
    tiny = cfg_for(tmp_path / "tiny", cache, steps=2)
    summary = train(tiny)
    same = train(dataclasses.replace(tiny, out=str(tmp_path / "dir"), model=summary["model_dir"]))
    ra = [r for r in records(tiny) if not r.get("final")]
    rb = [r for r in records(dataclasses.replace(tiny, out=str(tmp_path / "dir")))]
    assert [r["loss"] for r in ra] == [r["loss"] for r in rb if not r.get("final")]
    assert same["final"]["mean"] == summary["final"]["mean"]


def test_bad_model_directories(tmp_path):
    with pytest.raises(ValueError, match="no such directory"):
        check_model_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        check_model_dir(tmp_path / "empty")
    from transformers import T5Config
    T5Config(d_model=8, num_layers=1, num_heads=1, d_kv=8, d_ff=8, vocab_size=10).save_pretrained(tmp_path / "t5")
    with pytest.raises(ValueError, match="not a causal LM"):
        check_model_dir(tmp_path / "t5")


@pytest.mark.parametrize("change, message", [
    (dict(tasks="embedded:max2,nope3"), "unknown embedded distribution"),
    (dict(tasks="gsm9k"), "unknown task set"),
    (dict(policy="no_such_policy"), "unknown policy"),
    (dict(policy="dump", policy_kwargs='{"cc": 1}'), "unknown keyword"),
    (dict(policy_kwargs="c=1"), "JSON object"),
    (dict(micro_batch=5), "micro_batch=5 must be a multiple of group_size=4"),
    (dict(micro_batch=2), "micro_batch=2 must be a multiple of group_size=4"),
    (dict(group_size=1), "group_size must be"),
    (dict(objective="ppo"), "objective must be one of"),
    (dict(model="/no/such/model"), "no such directory"),
    (dict(warmup_mistakes="max2=1.5"), "warmup_mistakes item 'max2=1.5'"),
    (dict(warmup_mistakes="maxx2=0.5"), "unknown embedded distribution 'maxx2'"),
])
def test_bad_input_fails_before_any_work(tmp_path, cache, change, message):
    cfg = cfg_for(tmp_path, cache, **change)
    with pytest.raises(ValueError, match=message):
        train(cfg)
    assert not Path(cfg.out).exists()


def test_config_overrides_and_help(capsys):
    cfg = from_overrides(["steps=7", "lr=0.01", "chat=true", "policy=dump"])
    assert (cfg.steps, cfg.lr, cfg.chat, cfg.policy) == (7, 0.01, True, "dump")
    with pytest.raises(ValueError, match="unknown config field 'stpes'"):
        from_overrides(["stpes=3"])
    with pytest.raises(ValueError, match="steps='many' is not a valid int"):
        from_overrides(["steps=many"])
    with pytest.raises(ValueError, match="not key=value"):
        from_overrides(["steps"])
    check_config(cfg)
    from rlpace.cli import main
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for f in dataclasses.fields(TrainConfig):
        assert f"  {f.name} (" in out
    assert "LILO probe" in out and "AdamW learning rate" in out


def test_decode_stops_at_eos():
    class Tok:
        def batch_decode(self, seqs, skip_special_tokens=True):
            return [" ".join(map(str, s)) for s in seqs]
    ro = Rollout(torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long),
                 torch.tensor([[5, 2, 0], [6, 7, 8]]), torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]))
    assert decode_completions(Tok(), ro) == ["5 2", "6 7 8"]


def test_chat_prompts_use_the_tokenizers_template():
    from rlpace.train.model import train_char_tokenizer
    from rlpace.train.rollout import encode_prompts
    tok = train_char_tokenizer(["abc=:|>user"])
    tok.chat_template = ("{% for m in messages %}|{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}|a>{% endif %}")
    [ids] = encode_prompts(tok, ["ab="], chat=True)
    assert tok.decode(ids) == "|user>ab=|a>"
    [raw] = encode_prompts(tok, ["ab="], chat=False)
    assert raw[0] == tok.bos_token_id and tok.decode(raw[1:]) == "ab="


def _tiny_lm(seed=0):
    from rlpace.train.model import tiny_causal_lm
    return tiny_causal_lm(12, hidden=16, layers=2, heads=2, seed=seed).eval()


def test_shared_prompt_logprobs_and_gradients_match_the_reference():
    from rlpace.train.rollout import completion_logprobs, completion_logprobs_reference, generate
    model = _tiny_lm()
    prompts = [[1, 5, 6, 7], [1, 8], [1, 9, 4, 4, 5, 6]]            # different lengths: left padding
    ro = generate(model, prompts, repeats=4, max_new_tokens=5, eos_id=2, pad_id=0,
                  generator=torch.Generator().manual_seed(3))
    assert ro.prompt_ids.shape[0] == 12 and torch.equal(ro.prompt_ids[4], ro.prompt_ids[7])
    fast = completion_logprobs(model, ro, 0.7, group_size=4)
    ref = completion_logprobs_reference(model, ro, 0.7)
    assert torch.allclose(fast, ref, atol=1e-5)
    g_fast = torch.autograd.grad(fast.sum(), list(model.parameters()))
    g_ref = torch.autograd.grad(ref.sum(), list(model.parameters()))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_fast, g_ref))
    # first_logits: the first completion token's logits, per row, before the temperature —
    # a per-row forward's logits at the last prompt position; the same log-probs
    lp, z0 = completion_logprobs(model, ro, 0.7, group_size=4, first_logits=True)
    assert torch.equal(lp, fast) and z0.shape == (12, 1, 12) and z0.requires_grad
    p = ro.prompt_ids.shape[1]
    per_row = model(input_ids=ro.prompt_ids, attention_mask=ro.prompt_mask,
                    position_ids=(ro.prompt_mask.cumsum(1) - 1).clamp(min=0)).logits[:, p - 1:p]
    assert torch.allclose(z0, per_row, atol=1e-5)
    assert completion_logprobs(model, ro, 0.7, group_size=1, first_logits=True)[1] is None
    # greedy generation: the shared prefill gives the same tokens as repeating the prompts
    a = generate(model, prompts, repeats=3, max_new_tokens=5, eos_id=2, pad_id=0, greedy=True)
    b = generate(model, [p for p in prompts for _ in range(3)], max_new_tokens=5, eos_id=2, pad_id=0, greedy=True)
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.prompt_ids, b.prompt_ids)
    shuffled = ro._replace(prompt_ids=ro.prompt_ids[torch.randperm(12, generator=torch.Generator().manual_seed(0))])
    with pytest.raises(ValueError, match="do not share their prompt"):
        completion_logprobs(model, shuffled, group_size=4)


def test_micro_batches_give_the_same_training(tmp_path, cache):
    whole = cfg_for(tmp_path / "a", cache, steps=3, objective="dapo")
    parts = cfg_for(tmp_path / "b", cache, steps=3, objective="dapo", micro_batch=8)
    train(whole)
    train(parts)
    ra = [r for r in records(whole) if not r.get("final")]
    rb = [r for r in records(parts) if not r.get("final")]
    assert [r["prompt_ids"] for r in ra] == [r["prompt_ids"] for r in rb]
    assert all(x["loss"] == pytest.approx(y["loss"], abs=1e-6) for x, y in zip(ra, rb))
    ma = torch.load(Path(whole.out, "checkpoint", "model.pt"))
    mb = torch.load(Path(parts.out, "checkpoint", "model.pt"))
    assert all(torch.allclose(ma[k], mb[k], atol=1e-5) for k in ma)


# ---- what reaches the Scheduler and the loss ----------------------------------------------------
def _loss_calls(monkeypatch):
    """Record (adv, mask, keep, weight, old_logp) of every policy_loss call."""
    seen = []
    real = grpo.policy_loss

    def spy(objective, logp, old, adv, mask, keep, weight=None, **k):
        seen.append(dict(adv=adv.clone(), mask=mask.clone(), keep=keep.clone(),
                         weight=None if weight is None else weight.clone(), old=old.detach().clone()))
        return real(objective, logp, old, adv, mask, keep, weight, **k)
    monkeypatch.setattr(grpo, "policy_loss", spy)
    return seen


def _spy_scheduler(monkeypatch):
    observed, admitted = [], []
    real_observe, real_admission = Scheduler.observe, Scheduler.admission
    monkeypatch.setattr(Scheduler, "observe", lambda self, fb: observed.append(fb) or real_observe(self, fb))
    monkeypatch.setattr(Scheduler, "admission",
                        lambda self, fb: admitted.append(real_admission(self, fb)) or admitted[-1])
    return observed, admitted


def _grpo_loop(rewards, eps=1e-6):
    """Independent GRPO advantages of one row: (r − mean) / (population std + eps), 0 if std = 0."""
    n = len(rewards)
    m = sum(rewards) / n
    sd = (sum((x - m) ** 2 for x in rewards) / n) ** 0.5
    return [0.0 if sd == 0 else (x - m) / (sd + eps) for x in rewards]


def test_scheduler_sees_normalised_advantages_under_dr_grpo(tmp_path, cache, monkeypatch):
    observed, _ = _spy_scheduler(monkeypatch)
    seen = _loss_calls(monkeypatch)
    cfg = cfg_for(tmp_path, cache, steps=2, objective="dr_grpo")
    train(cfg)
    assert len(observed) == 2
    for fb in observed:
        for row_r, row_a in zip(fb.rewards.tolist(), fb.advantages.tolist()):
            assert row_a == pytest.approx(_grpo_loop(row_r), abs=1e-9)        # normalised, not r − mean
    # while the loss keeps Dr. GRPO's own advantages r − mean (no std)
    for fb, call in zip(observed, seen):
        want = [x - sum(row) / len(row) for row in fb.rewards.tolist() for x in row]
        assert call["adv"].tolist() == pytest.approx(want, abs=1e-6)
    assert any(np.ptp(fb.rewards, axis=1).any() for fb in observed)       # some group had a spread


def test_pods_advantages_are_recomputed_on_the_kept_rollouts(tmp_path, cache, monkeypatch):
    observed, admitted = _spy_scheduler(monkeypatch)
    seen = _loss_calls(monkeypatch)
    cfg = cfg_for(tmp_path, cache, steps=3, policy="uniform+pods_max_variance", group_size=4)
    train(cfg)
    differs = 0
    for fb, adm, call in zip(observed, admitted, seen):
        assert adm.keep.sum(axis=1).tolist() == [2] * 4                   # m = round(0.5·4) = 2 per group
        assert call["keep"].tolist() == adm.keep.ravel().astype(float).tolist()
        want = []
        for r, k in zip(fb.rewards.tolist(), adm.keep.tolist()):
            sub = _grpo_loop([x for x, kk in zip(r, k) if kk])
            it = iter(sub)
            row = [next(it) if kk else 0.0 for kk in k]
            want += row
            differs += row != [a if kk else 0.0 for a, kk in zip(_grpo_loop(r), k)]
        assert call["adv"].tolist() == pytest.approx(want, abs=1e-5)
    assert differs > 0                      # some group's subset advantages differ from the full group's


def test_loss_gets_admission_and_reweighter_weights_apart(tmp_path, cache, monkeypatch):
    observed, _ = _spy_scheduler(monkeypatch)
    seen = _loss_calls(monkeypatch)
    cfg = cfg_for(tmp_path, cache, steps=2, policy="uniform+per_advantage")
    train(cfg)
    for fb, call in zip(observed, seen):
        assert torch.all(call["keep"] == 1)                               # kept: admission only
        a = np.array([abs(x) for row in fb.rewards.tolist() for x in _grpo_loop(row)]) ** 0.5
        w_rollout = a / a.mean() if a.mean() > 0 else np.ones_like(a)    # mean 1 over the B·G rollouts
        want = torch.tensor(w_rollout, dtype=torch.float32)[:, None] * call["mask"]
        assert torch.allclose(call["weight"], want, atol=1e-5)


def test_ar_token_weights_reach_the_loss(tmp_path, cache, monkeypatch):
    seen = _loss_calls(monkeypatch)
    cfg = cfg_for(tmp_path, cache, steps=2, policy="ar")
    train(cfg)
    assert len(seen) == 2
    for call in seen:
        m = call["mask"]
        w_raw = (0.5 * torch.exp(call["old"].double()) + 0.5) * m          # α·π_old + (1 − α), α = 0.5
        want = w_raw * (m.sum() / w_raw.sum())                            # mean 1 over real tokens
        assert torch.allclose(call["weight"].double(), want, atol=1e-6)
        assert float((call["weight"] * m).sum() / m.sum()) == pytest.approx(1.0, abs=1e-6)
        assert call["weight"][m > 0].std() > 0                            # really per token
    # micro-batched: π_old comes from one no-grad pass before the update, same weights
    seen.clear()
    train(dataclasses.replace(cfg, out=str(tmp_path / "mb"), micro_batch=8))
    assert len(seen) == 4
    for a, b in zip(seen[0::2], seen[1::2]):
        m = torch.cat([a["mask"], b["mask"]])
        w_raw = (0.5 * torch.exp(torch.cat([a["old"], b["old"]]).double()) + 0.5) * m
        want = w_raw * (m.sum() / w_raw.sum())
        assert torch.allclose(torch.cat([a["weight"], b["weight"]]).double(), want, atol=1e-6)


def test_gfpo_keeps_the_top3_by_reward_per_token(tmp_path, cache, monkeypatch):
    observed, admitted = _spy_scheduler(monkeypatch)
    seen = _loss_calls(monkeypatch)
    sampled = []
    real_sample = grpo.sample_groups
    monkeypatch.setattr(grpo, "sample_groups", lambda *a, **k: sampled.append(real_sample(*a, **k)) or sampled[-1])
    cfg = cfg_for(tmp_path, cache, steps=2, policy="gfpo", group_size=5)
    train(cfg)
    for fb, adm, grp, call in zip(observed, admitted, sampled, seen):
        lens = [[len(c) for c in grp.completions[i * 5:(i + 1) * 5]] for i in range(4)]
        assert fb.lengths.tolist() == lens                                # lengths reach the Scheduler
        for r, ln, k in zip(fb.rewards.tolist(), lens, adm.keep.tolist()):
            score = [x / max(n, 1) for x, n in zip(r, ln)]
            top = sorted(range(5), key=lambda j: (-score[j], j))[:3]       # ties: earlier rollout
            assert [j for j in range(5) if k[j]] == sorted(top)
        assert call["keep"].tolist() == adm.keep.ravel().astype(float).tolist()


def test_topk_keeps_full_group_advantages(tmp_path, cache, monkeypatch):
    # DataFlex-RL's topk masks after computing advantages on the whole group (docs/methods/topk.md)
    observed, admitted = _spy_scheduler(monkeypatch)
    seen = _loss_calls(monkeypatch)
    train(cfg_for(tmp_path, cache, steps=4, policy="topk"))
    partial = 0
    for fb, adm, call in zip(observed, admitted, seen):
        rows = [i for i in range(4) if adm.keep[i].any()]
        want = [x for i in rows for x in _grpo_loop(fb.rewards[i].tolist())]
        assert call["adv"].tolist() == pytest.approx(want, abs=1e-5)
        assert call["keep"].tolist() == adm.keep[rows].ravel().astype(float).tolist()
        for i in rows:     # a kept subset whose own advantages differ from the group's
            r, k = fb.rewards[i].tolist(), adm.keep[i].tolist()
            sub = iter(_grpo_loop([x for x, kk in zip(r, k) if kk]))
            partial += [next(sub) if kk else 0.0 for kk in k] != [a if kk else 0.0 for a, kk in zip(_grpo_loop(r), k)]
    assert partial > 0


def test_resume_of_a_checkpoint_that_predates_a_config_field(tmp_path):
    """A field missing from the saved config means the run had its default: resuming with the
    default is allowed, with another value it is refused naming the field."""
    from rlpace.train.checkpoint import check_resumable
    cfg = TrainConfig(out=str(tmp_path / "run"))
    saved = cfg.to_dict()
    del saved["optimizer"]                           # written before `optimizer` existed
    (tmp_path / "state.json").write_text(json.dumps({"config": saved}))
    assert check_resumable(tmp_path, cfg)["config"] == saved
    with pytest.raises(ValueError, match="optimizer: saved 'adamw', now 'iso_adamw'"):
        check_resumable(tmp_path, dataclasses.replace(cfg, optimizer="iso_adamw"))
