"""Registry-wide checks of what every policy factory promises:
hyperparameters validated at construction, state finite under any finite feedback, a
complete one-line summary for `rlpace policies`, and no citation a user cannot open."""

import inspect
import io
import math
import re
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest

import rlpace
from rlpace import Feedback, Pool, Scheduler, policies
from rlpace.cli import policies as cli_policies
from rlpace.policies._checks import SIGNAL_MAX, check_int, check_real, clip_signal
from rlpace.policies._registry import _resolve
from rlpace.types import group_advantages

NAMES = policies.names()
SRC = Path(rlpace.__file__).resolve().parent
POOL = Pool(np.repeat(["a", "b", "c"], 12), clusters=np.repeat(np.arange(6), 6),
            difficulty=np.linspace(0.0, 1.0, 36))


def _params(name):
    return [p for p in inspect.signature(_resolve(name)).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _kind(p):
    """'float', 'int', 'bool', 'str' or None, from the default (or the annotation)."""
    d, ann = p.default, str(p.annotation)
    if isinstance(d, bool) or ann == "bool":
        return "bool"
    if isinstance(d, float) or ann.startswith("float"):
        return "float"
    if isinstance(d, int) or ann.startswith("int"):
        return "int"
    if isinstance(d, str):
        return "str"
    return None


CASES = [(n, p.name, _kind(p)) for n in NAMES for p in _params(n) if _kind(p)]


# ---- every hyperparameter validated at construction --------------------------------------
def test_the_checks_name_parameter_and_range():
    with pytest.raises(ValueError, match=r"^dump temperature must be a finite number in \(0, inf\)"
                                         r" \(DUMP: 0\.1\); got nan\.$"):
        check_real("dump", "temperature", math.nan, low=0, low_open=True, hint=" (DUMP: 0.1)")
    with pytest.raises(ValueError, match=r"sec alpha must be a finite number in \(0, 1\]; got True"):
        check_real("sec", "alpha", True, low=0, high=1, low_open=True)
    assert check_real("x", "y", 1, low=0, high=1) == 1.0
    with pytest.raises(ValueError, match=r"window must be an int in \[1, inf\); got 2\.0"):
        check_int("dump", "window", 2.0)
    np.testing.assert_array_equal(clip_signal([1e308, -1e308, 3.0]), [SIGNAL_MAX, -SIGNAL_MAX, 3.0])


def test_every_registered_name_has_checked_parameters():
    # guards against CASES silently shrinking: these are the ones we know of
    have = {(n, q) for n, q, _ in CASES}
    for need in [("dump", "temperature"), ("dump", "c"), ("dump", "floor"), ("exp3", "scale"),
                 ("sec", "alpha"), ("mopps", "target"), ("learnability_buffer", "decay"),
                 ("prioritized_learnability", "decay"), ("success_band", "low"),
                 ("difficulty_band", "inside"), ("softmax_advantage", "temperature"), ("topk", "fraction")]:
        assert need in have


@pytest.mark.parametrize("name, param, kind", [c for c in CASES if c[2] == "float"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.5", True])
def test_float_hyperparameter_refuses_non_finite(name, param, kind, bad):
    with pytest.raises(ValueError, match=re.escape(param)):
        policies.make_policy(name, **{param: bad})


@pytest.mark.parametrize("name, param, kind", [c for c in CASES if c[2] == "int"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, 1.5, -1, "3", True])
def test_int_hyperparameter_refuses_non_integers(name, param, kind, bad):
    with pytest.raises(ValueError, match=re.escape(param)):
        policies.make_policy(name, **{param: bad})


@pytest.mark.parametrize("name, param, kind", [c for c in CASES if c[2] in ("str", "bool")])
def test_choice_hyperparameter_refuses_unknown_values(name, param, kind):
    with pytest.raises(ValueError, match=re.escape(param)):
        policies.make_policy(name, **{param: "no-such-option" if kind == "str" else "yes"})


def test_dump_nan_hyperparameters_no_longer_fall_back_silently():
    # the example: NaN temperature, c and floor used to give size-proportional sampling
    for kw in ({"temperature": math.nan}, {"c": math.nan}, {"floor": math.nan}):
        with pytest.raises(ValueError, match=f"dump {next(iter(kw))} must be a finite number"):
            policies.make_policy("dump", **kw)


# ---- state stays finite for any finite feedback -------------------------------------------
HUGE = 1e308


def _huge_feedback(kind, ids, step):
    b, g = ids.size, 4
    signs = np.tile([1.0, -1.0, 1.0, 1.0], (b, 1))
    if kind == "advantages":                                   # |A| = 1e308, binary rewards
        return Feedback(ids, (signs > 0).astype(float), advantages=HUGE * signs, step=step)
    if kind == "rewards_mixed":                                # ±1e308, GRPO advantages
        return Feedback(ids, HUGE * signs, step=step)
    if kind == "rewards_pos":                                  # all +1e308: sums overflow
        return Feedback(ids, np.full((b, g), HUGE), step=step)
    return Feedback(ids, np.full((b, g), -HUGE), step=step)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("kind", ["advantages", "rewards_mixed", "rewards_pos", "rewards_neg"])
def test_state_stays_finite_under_extreme_finite_feedback(name, kind):
    if kind != "advantages" and not np.isfinite(group_advantages(np.full((1, 4), HUGE))).all():
        # The GRPO advantages that Batch derives from rewards overflow (the group mean of
        # 1e308s is inf) before any policy sees them: a fix in rlpace/types.py, not here.
        pytest.xfail("types.group_advantages overflows on rewards of 1e308")
    s = Scheduler(POOL, name, seed=0)
    # A NaN that the fresh state already holds is a documented "not measured yet" sentinel
    # (the oracles); anything else must stay finite.
    fresh = {k: np.asarray(v) for k, v in s.state_dict().items()}
    for t in range(6):
        ids = s.propose(6)
        fb = _huge_feedback(kind, ids, t)
        s.observe(fb)
        for key, v in s.state_dict().items():
            v = np.asarray(v)
            if v.dtype.kind == "f":
                sentinel = np.isnan(fresh[key]) if fresh[key].shape == v.shape else False
                assert (np.isfinite(v) | (np.isnan(v) & sentinel)).all(), (key, t)
        w = s.loss_weights(fb)
        assert np.isfinite(w).all() and (w >= 0).all()
        assert s.admission(fb).keep.shape == fb.rewards.shape
        p = s.domain_probs()
        if p is not None:
            assert np.isfinite(p).all() and (p >= 0).all() and p.sum() == pytest.approx(1.0)
        assert all(np.isfinite(v) for k, v in s.metrics().items() if k != "prompts_seen"), s.metrics()
    ids = s.propose(6)
    assert ((ids >= 0) & (ids < len(POOL))).all()


def test_dump_huge_advantages_rank_like_clipped_ones():
    # 1e308 is clipped to 1e100: arm a (|A| = 1e308) must dominate arm b (|A| = 1), not NaN.
    pool = Pool(["a", "b"])
    p = policies.dump_ucb()
    s = p.init(pool)
    b = Feedback([0, 1], [[1, 0], [1, 0]], advantages=[[HUGE, -HUGE], [1.0, -1.0]], step=0)
    from rlpace.types import Batch
    s = p.update(s, pool, Batch.from_feedback(b, pool, 0.5))
    assert s.window.values[0, :2].tolist() == [SIGNAL_MAX, SIGNAL_MAX]
    assert p.apply(s, pool).tolist() == [1.0, 0.0]


# ---- `rlpace policies` prints one complete, correct sentence per name ---------------------
_BACKTICKED = re.compile(r"`([A-Za-z_][A-Za-z0-9_]*)`")
# snake_case words outside backticks (`q_low`), but not one-letter subscripts (`w_t`)
_SNAKE = re.compile(r"(?<![`\w])([a-z][a-z0-9]*_[a-z0-9][a-z0-9_]+)(?![`\w])")


@pytest.mark.parametrize("name", NAMES)
def test_first_docstring_line_is_a_complete_correct_sentence(name):
    factory = _resolve(name)
    doc = inspect.getdoc(factory) or ""
    first = doc.split("\n")[0].strip()
    assert first, f"{name}: no docstring"
    assert first.endswith("."), f"{name}: first line does not end a sentence: {first!r}"
    assert first[0].isupper(), f"{name}: first line does not start a sentence: {first!r}"
    assert first.count("(") == first.count(")") and first.count("`") % 2 == 0, first
    assert "card" not in first.lower(), f"{name}: cites a research card: {first!r}"
    params = set(inspect.signature(factory).parameters)
    mentioned = set(_BACKTICKED.findall(first)) | set(_SNAKE.findall(first))
    unknown = mentioned - params - set(NAMES)
    assert not unknown, f"{name}: first line names {sorted(unknown)}, not parameters of {params}"


def test_cli_policies_prints_every_summary_and_page():
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli_policies.run(None) == 0
    text = out.getvalue()
    for name in NAMES:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{name} "))
        assert line.rstrip().endswith("."), line
        assert cli_policies.doc_page(name) in text          # the oracles share oracle.md
    assert "shared/research" not in text and "card " not in text


def test_difficulty_band_summary_names_its_real_parameters():
    first = inspect.getdoc(policies.difficulty_band).split("\n")[0]
    assert "`low_q`" in first and "`high_q`" in first and "q_low" not in first


# ---- method pages, and no citation a user cannot open -------------------------------------
def test_no_source_file_cites_the_private_research_notes():
    offenders = [str(p.relative_to(SRC)) for p in SRC.rglob("*")
                 if p.is_file() and p.suffix in (".py", ".md", ".txt", ".toml", ".cfg", ".json")
                 and "shared/research" in p.read_text(encoding="utf-8", errors="replace")]
    assert offenders == []


DOCS = SRC.parents[1] / "docs" / "methods"


@pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not shipped with an installed package")
def test_method_index_lists_every_registered_name():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    for name in NAMES:
        assert f"`{name}`" in index, name
    assert "shared/research" not in index


@pytest.mark.skipif(not DOCS.is_dir(), reason="docs/ is not shipped with an installed package")
def test_method_pages_cite_papers_not_private_notes():
    pages = [p for p in DOCS.glob("*.md") if p.name != "README.md"]
    assert len(pages) >= 19
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "shared/research" not in text and not re.search(r"\bcard [0-9A]", text), page.name
        if page.stem in NAMES:                               # a method page names its deviations
            assert re.search(r"deviation", text, re.I) and re.search(r"arXiv|no paper|none", text), page.name
