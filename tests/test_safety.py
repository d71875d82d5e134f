"""Safety and validation at the boundaries: configuration
strings never run code, Feedback validates (and copies) what it is given, a restored state
is checked value by value before it replaces anything, and a checkpoint is checked as a
whole before the model, optimizer or Scheduler changes."""

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import rlpace
from rlpace import Feedback, Pool, Scheduler
from rlpace.policies import DataPolicy, chain, make_policy

POOL = Pool(["a"] * 20 + ["b"] * 20 + ["c"] * 20, clusters=np.arange(60) % 6,
            difficulty=np.linspace(0.0, 1.0, 60))


def drive(s, steps=4, n=8, g=4, seed=0):
    rng = np.random.default_rng(seed)
    for t in range(steps):
        ids = s.propose(n)
        s.observe(Feedback(ids, (rng.random((n, g)) < 0.5).astype(float), step=t))
    return s


def assert_same_state(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


# ---- 10. a configuration string only ever reaches a policy factory -------------------------
@pytest.fixture
def marker(tmp_path):
    """A command that creates a file: if any entry point ran it, the file exists."""
    path = tmp_path / "ran"
    return path, f"touch {path}"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """An importable user module with one marked factory, one unmarked one, and an alias of
    os.system (what `from os import system` leaves in a module)."""
    name = f"rlpace_user_policies_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        from os import system
        import rlpace
        from rlpace.policies import uniform_pool

        @rlpace.policy_factory
        def marked(tag: str = "x"):
            return uniform_pool()._replace(name="marked_" + tag)

        def unmarked():
            return uniform_pool()
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


@pytest.mark.parametrize("spec", ["os:system", "os.system", "subprocess:getoutput", "builtins:exec",
                                  "uniform+os:system"])
def test_scheduler_refuses_non_factories_and_runs_nothing(spec, marker):
    path, cmd = marker
    with pytest.raises(ValueError, match="policy_factory"):
        Scheduler(POOL, spec, command=cmd)
    assert not path.exists()


def test_stdlib_module_is_refused_before_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "antigravity", raising=False)   # importing it opens a browser
    with pytest.raises(ValueError, match="standard-library module 'antigravity'"):
        Scheduler(POOL, "antigravity:fly")
    assert "antigravity" not in sys.modules


def test_only_marked_or_registered_factories_resolve(user_module, marker):
    path, cmd = marker
    s = Scheduler(POOL, f"{user_module}:marked", tag="y")
    assert s.method.selection.name == "marked_y"
    assert Scheduler(POOL, f"{user_module}.marked").method.selection.name == "marked_x"
    with pytest.raises(ValueError, match="is not a policy factory"):
        Scheduler(POOL, f"{user_module}:unmarked")
    with pytest.raises(ValueError, match="is not a policy factory"):   # os.system under another name
        Scheduler(POOL, f"{user_module}:system", command=cmd)
    with pytest.raises(ValueError, match="is not a policy factory"):   # a non-stdlib callable
        Scheduler(POOL, "numpy:zeros", shape=3)
    # a registered factory may be named by its path too
    assert Scheduler(POOL, "rlpace.policies:dump_ucb", c=0.5).hyperparameters[0][1]["c"] == 0.5
    assert not path.exists()


def test_python_objects_need_no_mark():
    def my_factory(c=1.0):          # code the user wrote, passed from Python
        return make_policy("dump", c=c)
    s = Scheduler(POOL, my_factory, c=2.0)
    assert s.method.mixture.name == "dump"
    assert s.hyperparameters == [["my_factory", {"c": 2.0}]]
    assert Scheduler(POOL, make_policy("sec")).hyperparameters is None
    with pytest.raises(ValueError, match="empty name"):
        Scheduler(POOL, "dump+")


def _cli(argv):
    from rlpace.cli import main
    try:
        return main(argv)
    except (ValueError, SystemExit) as e:       # the CLI may report it as exit code 2 instead
        return e


def test_cli_simulate_refuses_os_system(marker):
    path, cmd = marker
    out = _cli(["simulate", "--policy", "os:system", f"command={cmd}", "--steps", "2",
                "--no-baseline", "--no-progress"])
    assert out not in (0, None)
    assert not path.exists()


def test_compare_grid_file_refuses_os_system(marker, tmp_path):
    path, cmd = marker
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"suite": "sim:ladder", "seeds": 1, "steps": 2,
                                "policies": [{"name": "os:system", "kwargs": {"command": cmd}, "label": "x"}]}))
    out = _cli(["compare", "--grid", str(grid), "--out", str(tmp_path / "out"), "--no-report",
                "--workers", "1", "--quiet"])
    assert out not in (0, None)
    assert not path.exists()
    # the library entry point behind it refuses too, before any run
    from rlpace.experiments import load_grid, run_grid
    res = None
    try:
        res = run_grid(load_grid(grid), tmp_path / "out2", workers=1, progress=False)
    except ValueError as e:
        assert "policy_factory" in str(e)
    if res is not None:
        assert res.failed                       # every run refused
    assert not path.exists()


def test_verl_config_policy_refuses_os_system(marker):
    pytest.importorskip("verl")
    from rlpace.adapters.verl import feedback_from_config
    path, cmd = marker
    with pytest.raises(ValueError, match="policy_factory"):
        feedback_from_config(POOL, {"rlpace": {"policy": "os:system", "kwargs": {"command": cmd}}})
    assert not path.exists()
    assert feedback_from_config(POOL, {"rlpace": {"policy": "dump"}}).scheduler.name == "dump"


# ---- 11. Feedback.step ---------------------------------------------------------------------
@pytest.mark.parametrize("step", [2**70, 2**63, 2**62, float("inf"), 1.7, 3.0, "5", True, np.True_, -1,
                                  None, np.float64(2.0)])
def test_feedback_step_must_be_an_int_in_range(step):
    s = drive(Scheduler(POOL, "dump", seed=1))
    before = s.state_dict()
    with pytest.raises(ValueError, match=r"Feedback\.step"):
        s.observe(Feedback([0, 1], [[1.0, 0.0], [0.0, 0.0]], step=step))
    assert_same_state(s.state_dict(), before)


def test_feedback_step_accepts_integers_up_to_the_bound():
    assert Feedback([0], [[1.0]], step=2**62 - 1).step == 2**62 - 1
    fb = Feedback([0], [[1.0]], step=np.int64(7))
    assert fb.step == 7 and type(fb.step) is int
    assert Feedback([0], [[1.0]], step=np.array(3, np.int32)).step == 3
    s = Scheduler(POOL, "uniform")
    s.observe(Feedback([5], [[1.0, 0.0]], step=2**62 - 1))
    assert s.history.last_step[5] == 2**62 - 1


# ---- 12. ids and rewards: the field and the fix -------------------------------------------
@pytest.mark.parametrize("ids, message", [
    ([1e20, 1.0], "beyond the int64 range"),
    (np.array([2**63, 1], dtype=np.uint64), "beyond the int64 range"),
    (np.array([2.0**63, 0.0]), "beyond the int64 range"),
    ([-3.0, 1.0], "negative values"),
    ([True, False], "integer pool positions"),
    ([0.5, 1.0], "non-integer"),
])
def test_feedback_ids_out_of_int64_named(ids, message):
    with pytest.raises(ValueError, match=r"Feedback\.prompt_ids .*" + message):
        Feedback(ids, [[1.0], [0.0]], step=0)


@pytest.mark.parametrize("field", ["rewards", "advantages"])
@pytest.mark.parametrize("values, message", [
    ([["1", "0"], ["0", "0"]], "strings"),
    ([[1.0, 0.0], [1.0]], "rows of different lengths|ragged"),
    ([[1 + 2j, 0.0], [0.0, 0.0]], "complex"),
    ([[1.0, None], [0.0, 0.0]], "non-numbers"),
])
def test_feedback_non_numeric_rewards_named(field, values, message):
    kw = {"rewards": values} if field == "rewards" else {"rewards": [[1.0, 0.0], [0.0, 0.0]],
                                                          "advantages": values}
    with pytest.raises(ValueError, match=rf"Feedback\.{field} (holds|could not).*({message})"):
        Feedback([0, 1], step=0, **kw)


def test_bool_and_int_rewards_still_accepted():
    fb = Feedback([0, 1], np.array([[True, False], [False, False]]), step=0)
    assert fb.rewards.tolist() == [[1.0, 0.0], [0.0, 0.0]] and fb.rewards.dtype == np.float64


# ---- 13. Feedback owns its arrays -----------------------------------------------------------
def test_feedback_copies_and_is_read_only():
    ids, r, a = np.array([0, 1]), np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[1.0, -1.0], [-1.0, 1.0]])
    fb = Feedback(ids, r, a, step=1)
    assert fb.prompt_ids is not ids and fb.rewards is not r and fb.advantages is not a
    ids[0], r[0, 0], a[0, 0] = 59, np.nan, np.inf
    assert fb.prompt_ids.tolist() == [0, 1]
    assert fb.rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert fb.advantages.tolist() == [[1.0, -1.0], [-1.0, 1.0]]
    for arr in (fb.prompt_ids, fb.rewards, fb.advantages):
        with pytest.raises(ValueError, match="read-only"):
            arr[0] = 0
    s = Scheduler(POOL, "reward_gap")
    s.observe(fb)                                        # the mutation never reaches a policy
    assert np.isfinite(s.state_dict()["policy/mixture/window/values"]).all()
    assert s.history.attempts[0] == 2 and s.history.successes[0] == 1


# ---- 14. restored values are checked before anything is replaced ---------------------------
def _edit(sd, key, fn):
    out = {k: np.array(v, copy=True) for k, v in sd.items()}
    out[key] = fn(out[key])
    return out


def _set(index, value):
    def f(a):
        a[index] = value
        return a
    return f


def _sum_tree_with_padding_weight(tree):
    """A consistent sum tree (inner nodes = sums) with weight on the last padding leaf."""
    cap = tree.shape[0] // 2
    tree[-1] = 1.0
    level = cap
    while level > 1:
        half = level // 2
        tree[half:level] = tree[level:2 * level:2] + tree[level + 1:2 * level:2]
        level = half
    return tree


CORRUPT = [
    ("dump", "policy/mixture/window/values", _set((0, 0), np.nan), "NaN or inf"),
    ("dump", "policy/mixture/window/values", _set((1, 3), np.inf), "NaN or inf"),
    ("dump", "policy/mixture/window/cursor", _set(0, 300), r"outside \[0, 300\)"),
    ("dump", "policy/mixture/window/filled", _set(2, 301), r"outside \[0, 300\]"),
    ("dump", "policy/mixture/count", _set(1, -1), "outside"),
    ("mopps", "policy/selection/alpha", _set(3, -0.5), r"outside \(0, inf\)"),
    ("mopps", "policy/selection/beta", _set(3, 0.0), r"outside \(0, inf\)"),
    ("learnability_buffer", "policy/selection/buffer", _set(0, 60), r"outside \[0, 60\)"),
    ("learnability_buffer", "policy/selection/pending", _set(0, 1000), r"outside \[-1, 60\)"),
    ("learnability_buffer", "policy/selection/buffer_len", lambda a: np.array(1001), "outside"),
    ("exp3", "policy/mixture/prob", lambda a: a * 2.0, "outside|probability distribution"),
    ("exp3", "policy/mixture/prob", lambda a: np.full_like(a, 0.2), "not a probability distribution"),
    ("prioritized_learnability", "policy/selection/tree/tree", _set(1, 1e6), "not a sum tree"),
    ("prioritized_learnability", "policy/selection/tree/size", lambda a: np.array(59), "pool has 60"),
    ("prioritized_learnability", "policy/selection/tree/tree", _sum_tree_with_padding_weight,
     "padding leaves"),
    ("ads", "policy/selection/positions", _set((0, 0), 10), "outside their cluster"),
    ("tscl", "policy/mixture/cursor", _set(0, -1), "outside"),
    ("uniform", "history/attempts", _set(0, -4), "outside"),
    ("uniform", "history/successes", _set(0, 10**6), "exceeds history/attempts"),
    ("uniform", "history/last_step", _set(0, -2), "outside"),
    ("uniform", "domain_window/values", _set((0, 0), -np.inf), "NaN or inf"),
    ("uniform", "counters/proposals", lambda a: np.array(-1), "outside"),
    ("uniform", "counters/last_informative", lambda a: np.array(1.5), "outside"),
    ("uniform", "meta/seed", lambda a: np.array(-1), r"meta/seed.*\[0, 2\*\*63\)"),
    ("uniform", "meta/seed", lambda a: np.array(1.9), r"meta/seed.*one integer"),
    ("uniform", "meta/success_threshold", lambda a: np.array("0.5"), "one float"),
    ("uniform", "meta/hyperparameters", lambda a: np.array("{not json"), "not the JSON"),
]


@pytest.mark.parametrize("name, key, corrupt, message", CORRUPT)
def test_corrupt_values_rejected_and_state_unchanged(name, key, corrupt, message):
    src = drive(Scheduler(POOL, name, seed=3), steps=6)
    good = src.state_dict()
    dst = drive(Scheduler(POOL, name, seed=5), steps=2, seed=9)
    before = dst.state_dict()
    with pytest.raises(ValueError, match=message) as e:
        dst.load_state_dict(_edit(good, key, corrupt))
    assert key in str(e.value) or key.startswith("history/successes")
    assert_same_state(dst.state_dict(), before)
    with pytest.raises(ValueError):
        dst.check_state_dict(_edit(good, key, corrupt))
    dst.load_state_dict(good)                   # the uncorrupted state loads
    assert_same_state(dst.state_dict(), good)


@pytest.mark.parametrize("name", rlpace.policies.names())
def test_every_registered_policy_rejects_inf_in_any_float_state(name):
    s = drive(Scheduler(POOL, name, seed=2))
    sd = s.state_dict()
    dst = Scheduler(POOL, name, seed=2)
    before = dst.state_dict()
    floats = [k for k, v in sd.items() if not k.startswith("meta/") and v.dtype.kind == "f" and v.size]
    assert floats                                   # at least the Scheduler's own window
    for key in floats:
        with pytest.raises(ValueError, match=key.replace("/", "/")):
            dst.load_state_dict(_edit(sd, key, lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0,
                                                                   np.inf, a)))
        assert_same_state(dst.state_dict(), before)
    dst.load_state_dict(sd)
    assert_same_state(dst.state_dict(), sd)


def test_policy_check_state_hook_runs_before_replacing(monkeypatch):
    calls = []

    def check(state, pool):
        calls.append(len(pool))
        raise ValueError("custom: my constraint is broken")

    base = make_policy("per_advantage")
    hooked = base._replace(check_state=check)
    s = drive(Scheduler(POOL, rlpace.compose(make_policy("dump"), chain(hooked, make_policy("difficulty_band")),
                                             name="m")))
    sd = s.state_dict()
    before = {k: np.array(v, copy=True) for k, v in sd.items()}
    drive(s, steps=1, seed=4)
    after = s.state_dict()
    with pytest.raises(ValueError, match="custom: my constraint"):
        s.load_state_dict(before)
    assert calls == [60]                        # chain forwards to its member's hook
    assert_same_state(s.state_dict(), after)


def test_nan_allowed_only_where_the_policy_marks_unknown_with_nan():
    # oracle_boundary keeps NaN for "not measured": restoring its state must work
    if "oracle_boundary" not in rlpace.policies.names():
        pytest.skip("oracle policies not registered")
    s = drive(Scheduler(POOL, "oracle_boundary"))
    fresh = Scheduler(POOL, "oracle_boundary")
    fresh.load_state_dict(s.state_dict())
    key = [k for k in s.state_dict() if k.startswith("policy/") and s.state_dict()[k].dtype.kind == "f"][0]
    with pytest.raises(ValueError, match="inf"):
        fresh.load_state_dict(_edit(s.state_dict(), key, _set(0, np.inf)))


# ---- 15. the pool and the hyperparameters must match ---------------------------------------
def test_fingerprint_covers_ranks_and_difficulty():
    base = Pool(["a", "a", "b"], clusters=[0, 0, 1], difficulty=[0.1, 0.9, 0.5])
    assert base.fingerprint() == Pool(["a", "a", "b"], clusters=[0, 0, 1], difficulty=[0.1, 0.9, 0.5]).fingerprint()
    reranked = Pool(["a", "a", "b"], clusters=[0, 0, 1], difficulty=[0.1, 0.9, 0.5], ranks=[1, 0, 0])
    rescored = Pool(["a", "a", "b"], clusters=[0, 0, 1], difficulty=[0.1, 0.8, 0.5])
    unknown = Pool(["a", "a", "b"], clusters=[0, 0, 1])
    relabelled = Pool(["a", "a", "b"], clusters=["x", "x", "y"], difficulty=[0.1, 0.9, 0.5])
    fps = {p.fingerprint() for p in (base, reranked, rescored, unknown, relabelled)}
    assert len(fps) == 5
    parts, re_parts = base.fingerprint_parts(), reranked.fingerprint_parts()
    assert [k for k in parts if parts[k] != re_parts[k]] == ["ranks"]
    assert unknown.fingerprint() == Pool(["a", "a", "b"], clusters=[0, 0, 1]).fingerprint()


def test_state_onto_a_reranked_pool_names_the_ranks():
    ranks = POOL.ranks.copy()
    ranks[[0, 6]] = ranks[[6, 0]]                    # two prompts of cluster 0 swap ranks
    assert ranks.tolist() != POOL.ranks.tolist()
    reranked = Pool(["a"] * 20 + ["b"] * 20 + ["c"] * 20, clusters=np.arange(60) % 6,
                    difficulty=np.linspace(0.0, 1.0, 60), ranks=ranks)
    src = drive(Scheduler(POOL, "ads", active_clusters=2, mini_cluster_size=4))
    dst = Scheduler(reranked, "ads", active_clusters=2, mini_cluster_size=4)
    before = dst.state_dict()
    with pytest.raises(ValueError, match=r"different pool \(its ranks differ"):
        dst.load_state_dict(src.state_dict())
    assert_same_state(dst.state_dict(), before)


def test_other_hyperparameters_or_threshold_rejected_naming_the_difference():
    src = drive(Scheduler(POOL, "dump", c=5))
    dst = Scheduler(POOL, "dump")
    before = dst.state_dict()
    with pytest.raises(ValueError, match=r"dump\.c: saved 5, now 1\.0"):
        dst.load_state_dict(src.state_dict())
    with pytest.raises(ValueError, match=r"success_threshold"):
        dst.load_state_dict(drive(Scheduler(POOL, "dump", success_threshold=0.7)).state_dict())
    combo = drive(Scheduler(POOL, "dump+topk", fraction=0.25)).state_dict()
    with pytest.raises(ValueError, match=r"topk\.fraction: saved 0\.25, now 0\.5"):
        Scheduler(POOL, "dump+topk").load_state_dict(combo)
    assert_same_state(dst.state_dict(), before)
    # the same values written differently (1 vs the default 1.0) are the same hyperparameters
    Scheduler(POOL, "dump", c=1).load_state_dict(drive(Scheduler(POOL, "dump")).state_dict())
    # states of an older format are refused by version, not misread
    old = dict(src.state_dict(), **{"meta/version": np.array(1)})
    with pytest.raises(ValueError, match="state version 1"):
        dst.load_state_dict(old)


# ---- 16. a checkpoint is checked as a whole before anything is restored --------------------
torch = pytest.importorskip("torch")


def _trio(seed):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return model, opt, drive(Scheduler(POOL, "dump", seed=seed), seed=seed)


@pytest.mark.parametrize("damage", ["corrupt_npz", "nan_in_npz", "other_policy", "bad_counters",
                                    "model_shape"])
def test_bad_checkpoint_leaves_model_optimizer_and_scheduler_untouched(tmp_path, damage):
    from rlpace.train.checkpoint import load_checkpoint, save_checkpoint
    from rlpace.train.config import TrainConfig
    model, opt, sched = _trio(0)
    save_checkpoint(tmp_path / "ck", model=model, optimizer=opt, scheduler=sched,
                    counters={"step": 4, "rollouts": 128, "seconds": 1.5}, config=TrainConfig())
    d = tmp_path / "ck"
    if damage == "corrupt_npz":
        raw = (d / "scheduler.npz").read_bytes()
        (d / "scheduler.npz").write_bytes(raw[: len(raw) // 2])
    elif damage == "nan_in_npz":
        with np.load(d / "scheduler.npz") as z:
            sd = {k: z[k] for k in z.files}
        sd["policy/mixture/window/values"][0, 0] = np.nan
        np.savez(d / "scheduler.npz", **sd)
    elif damage == "other_policy":
        np.savez(d / "scheduler.npz", **Scheduler(POOL, "sec").state_dict())
    elif damage == "bad_counters":
        st = json.loads((d / "state.json").read_text())
        st["counters"]["step"] = -3
        (d / "state.json").write_text(json.dumps(st))
    elif damage == "model_shape":
        torch.save({"weight": torch.zeros(2, 3), "bias": torch.zeros(3)}, d / "model.pt")
    m2, o2, s2 = _trio(1)
    w_before = {k: v.clone() for k, v in m2.state_dict().items()}
    o_before = json.dumps(o2.state_dict()["param_groups"])
    exp_avg = o2.state_dict()["state"][0]["exp_avg"].clone()
    s_before = s2.state_dict()
    with pytest.raises(ValueError):
        load_checkpoint(d, model=m2, optimizer=o2, scheduler=s2)
    for k, v in m2.state_dict().items():
        assert torch.equal(v, w_before[k]), k
    assert json.dumps(o2.state_dict()["param_groups"]) == o_before
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg"], exp_avg)
    assert_same_state(s2.state_dict(), s_before)


def test_good_checkpoint_restores_everything(tmp_path):
    from rlpace.train.checkpoint import load_checkpoint, save_checkpoint
    from rlpace.train.config import TrainConfig
    model, opt, sched = _trio(0)
    save_checkpoint(tmp_path / "ck", model=model, optimizer=opt, scheduler=sched,
                    counters={"step": 4, "rollouts": 128, "seconds": 1.5}, config=TrainConfig())
    m2, o2, s2 = _trio(1)
    counters = load_checkpoint(tmp_path / "ck", model=m2, optimizer=o2, scheduler=s2)
    assert counters == {"step": 4, "rollouts": 128, "seconds": 1.5}
    for k, v in model.state_dict().items():
        assert torch.equal(v, m2.state_dict()[k])
    assert torch.equal(o2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert_same_state(s2.state_dict(), sched.state_dict())


# ---- a state whose recorded pool parts were edited never loads (every policy) ---------------
@pytest.mark.parametrize("name", rlpace.policies.names())
def test_tampered_pool_parts_refused_with_intact_fingerprint(name):
    good = drive(Scheduler(POOL, name, seed=3), steps=2).state_dict()
    parts = json.loads(str(good["meta/pool_parts"]))
    parts["ranks"] = "0" * 16                        # meta/pool (their hash) left as it was
    dst = Scheduler(POOL, name, seed=5)
    before = dst.state_dict()
    with pytest.raises(ValueError, match=r"meta/pool_parts.*does not match"):
        dst.load_state_dict(_edit(good, "meta/pool_parts", lambda a: np.array(json.dumps(parts, sort_keys=True))))
    assert_same_state(dst.state_dict(), before)
    dst.load_state_dict(good)


# ---- messages name the argument -------------------------------------------------------------
@pytest.mark.parametrize("state, needle", [(None, "got NoneType"), ([1, 2], "got list"),
                                           ("x.npz", r"np\.load\('x\.npz'\)")])
def test_load_state_dict_names_a_non_mapping(state, needle):
    s = Scheduler(POOL, "dump")
    with pytest.raises(ValueError, match=rf"state must be the mapping Scheduler\.state_dict\(\).*{needle}"):
        s.load_state_dict(state)


def test_pool_and_scheduler_messages_name_the_argument():
    with pytest.raises(ValueError, match=r"Pool\.difficulty must hold float64 numbers"):
        Pool(["a"], difficulty=["x"])
    for bad_window in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match=r"metrics_window must be an int ≥ 1"):
            Scheduler(POOL, "dump", metrics_window=bad_window)
