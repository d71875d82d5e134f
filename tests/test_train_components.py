"""The built-in recipe's optional signals as components: each built only for a policy that reads
it, each doing its arithmetic at its own point, and the points running in the documented order
(rlpace.train.recipes.grpo's module docstring). Torch runs one thread."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from _tiny_train import read_log, tiny_config  # noqa: E402
from rlpace.scheduler import Scheduler  # noqa: E402
from rlpace.train import TrainConfig, train  # noqa: E402
from rlpace.train import lossprobe, oracle  # noqa: E402
from rlpace.train.generated import FreshItems  # noqa: E402
from rlpace.train.gradsignal import GradSignal  # noqa: E402
from rlpace.train.lossprobe import LossCurves  # noqa: E402
from rlpace.train.oracle import OracleMeasurement  # noqa: E402
from rlpace.train.supervision import Supervision  # noqa: E402
from rlpace.types import Feedback, Pool  # noqa: E402

torch.set_num_threads(1)


class _Recorder:
    """A Scheduler stand-in that keeps what it is given."""

    def __init__(self):
        self.observed, self.losses = [], []

    def observe(self, fb):
        self.observed.append(fb)

    def observe_losses(self, measured, step):
        self.losses.append((measured, step))


def test_components_are_built_only_when_the_policy_reads_their_signal():
    pool = Pool(["a"] * 4 + ["b"] * 4)
    cfg = TrainConfig()
    plain = Scheduler(pool, "dump")
    # nothing is touched (model, tokenizer, tasks are None) when the policy reads nothing
    assert OracleMeasurement.build(plain, None, None, None, None, cfg) is None
    assert LossCurves.build(plain, None, None, None, pool, cfg) is None
    assert GradSignal.build(plain, None, None, None, pool, cfg, supervised=False) is None
    assert FreshItems.build(None, pool, cfg) is None                      # tasks=embedded
    assert OracleMeasurement.build(Scheduler(pool, "oracle_boundary"), None, None, None, None, cfg) is not None
    # grad_features=off wins over a policy that reads the features
    assert GradSignal.build(Scheduler(pool, "diem"), None, None, None, pool,
                            TrainConfig(grad_features="off"), supervised=False) is None


def test_oracle_measures_at_step_zero_and_every_k_steps(monkeypatch):
    calls = []
    monkeypatch.setattr(oracle, "oracle_measure", lambda sched, *a: calls.append(a[-1]) or 32 * 3)
    comp = OracleMeasurement(None, None, None, None, None, TrainConfig(oracle_every=3))
    assert [comp.measure(s) for s in range(7)] == [96, 0, 0, 96, 0, 0, 96]
    assert calls == [0, 3, 6]


def test_loss_curves_pair_each_domain_nll_with_its_trained_tokens(monkeypatch):
    # probe NLL 0.5 for domain a, none for b (NaN: no probe rows) → only a is observed
    monkeypatch.setattr(lossprobe, "probe_losses", lambda model, probe: np.array([0.5, np.nan]))
    sched, evals = _Recorder(), []
    model = SimpleNamespace(eval=lambda: evals.append(1))
    comp = LossCurves(sched, model, None, Pool(["a", "b"]), every=2)
    assert comp.measure(1, np.array([10.0, 20.0])) == {} and sched.losses == []
    assert comp.measure(4, np.array([12.0, 20.0])) == {"probe_loss/a": 0.5}
    assert sched.losses == [({"a": (12.0, 0.5)}, 4)] and evals == [1]


def test_grad_signal_gives_the_trained_groups_their_features_and_the_next_reference():
    # round 0: groups of prompts [5, 6], round 1: [7]; trained: round 1 row 0, then round 0 row 1
    rounds = [Feedback([5, 6], [[1, 0], [0, 1]], step=3), Feedback([7], [[1, 1]], step=3)]
    src = [(1, 0), (0, 1)]
    trained = Feedback([7, 6], [[1, 1], [0, 1]], step=3)
    feats = torch.arange(8, dtype=torch.float32).reshape(4, 2)          # [N=Bt·G, d=2]
    comp = GradSignal(None, SimpleNamespace(dim=2), None, TrainConfig(grad_reference="previous"))
    sched = _Recorder()
    out = comp.observe(sched, rounds, src, trained, feats)
    np.testing.assert_array_equal(out.grads, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])
    by_ids = {tuple(fb.prompt_ids.tolist()): fb for fb in sched.observed}
    assert set(by_ids) == {(6,), (5,), (7,)}                         # every group once
    np.testing.assert_array_equal(by_ids[(6,)].grads, [[[4, 5], [6, 7]]])
    np.testing.assert_array_equal(by_ids[(7,)].grads, [[[0, 1], [2, 3]]])
    assert by_ids[(5,)].grads is None                                # not trained: no features
    np.testing.assert_array_equal(comp.ref, [0 + 2 + 4 + 6, 1 + 3 + 5 + 7])   # Σ over the batch
    # nothing trained: the rounds as they are, the reference kept
    sched = _Recorder()
    assert comp.observe(sched, rounds) is None
    assert [fb.grads for fb in sched.observed] == [None, None] and comp.ref.tolist() == [12, 16]


def test_supervision_off_round_feedback_is_the_truth_with_group_advantages():
    sup = Supervision.__new__(Supervision)
    sup.active = False
    grp = SimpleNamespace(ids=np.array([3, 1]), rewards=np.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
                          lengths=np.array([[2, 3, 1, 1], [1, 1, 1, 1]]))
    same, fb = sup.round_feedback(None, grp, step=9)
    assert same is grp and fb.step == 9 and fb.prompt_ids.tolist() == [3, 1]
    # (r − 0.25) / (sqrt(0.1875) + 1e-6); an all-equal group: 0
    s = np.sqrt(0.1875) + 1e-6
    np.testing.assert_allclose(fb.advantages, [[0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s], [0, 0, 0, 0]],
                               rtol=1e-12)
    assert sup.trained_feedback(None, fb, [fb], [(0, 0)]) == (fb, None)


def _spy(monkeypatch, calls, cls, name, label):
    real = getattr(cls, name)

    def wrapped(self, *a, **k):
        calls.append(label)
        return real(self, *a, **k)
    monkeypatch.setattr(cls, name, wrapped)


def _spy_all(monkeypatch):
    calls = []
    for cls, names in [(LossCurves, ["measure"]), (GradSignal, ["update_reference", "forward", "observe"]),
                       (OracleMeasurement, ["measure"]),
                       (FreshItems, ["propose", "sample", "before_update", "after_update"]),
                       (Supervision, ["round_feedback", "trained_feedback", "step_metrics"])]:
        for n in names:
            _spy(monkeypatch, calls, cls, n, f"{cls.__name__}.{n}")
    return calls


def test_the_signals_run_at_their_points_in_the_documented_order(tmp_path, cache, monkeypatch):
    calls = _spy_all(monkeypatch)
    # loss curves + gradient features (no admission policy: one round, every group trained)
    cfg = tiny_config(tmp_path / "a", cache, steps=2, policy="epiplexity+diem", loss_probe_every=2,
                      loss_probe_per_domain=2, grad_reference="none")
    train(cfg)
    step = ["LossCurves.measure", "GradSignal.update_reference", "Supervision.round_feedback",
            "Supervision.trained_feedback", "GradSignal.forward", "GradSignal.observe", "Supervision.step_metrics"]
    assert calls == step * 2
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    assert ["probe_loss/max2" in r for r in recs] == [True, False]
    # the oracle measurement + noisy labels (supervision active)
    calls.clear()
    cfg = tiny_config(tmp_path / "b", cache, steps=2, policy="oracle_boundary", oracle_every=2, oracle_rollouts=2,
                      label_noise=0.25)
    train(cfg)
    assert calls == ["OracleMeasurement.measure", "Supervision.round_feedback", "Supervision.trained_feedback",
                     "Supervision.step_metrics"] * 2
    # 16 training prompts per domain × 2 domains × 2 rollouts at step 0, nothing at step 1
    assert [r["oracle_rollouts"] for r in read_log(cfg.out) if not r.get("final")] == [64, 0]
    # fresh items of the generator's cells
    calls.clear()
    cfg = tiny_config(tmp_path / "c", cache, steps=2, tasks="generated:max")
    train(cfg)
    assert calls == ["FreshItems.propose", "FreshItems.sample", "Supervision.round_feedback",
                     "FreshItems.before_update", "Supervision.trained_feedback", "FreshItems.after_update",
                     "Supervision.step_metrics"] * 2
    recs = [r for r in read_log(cfg.out) if not r.get("final")]
    assert "gen/reward" not in recs[0] and "gen/reward" in recs[1]      # the buffer is empty at step 0
    assert sum(v for k, v in recs[0].items() if k.startswith("gen/prob/")) == pytest.approx(1.0)
