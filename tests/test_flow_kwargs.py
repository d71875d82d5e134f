"""Policy keyword arguments: JSON and Hydra's flow style (what verl's docs write,
'{temperature:0.1}') through one parser, rlpace._flow, wherever rlpace reads them:
`rlpace train policy_kwargs=`, `rlpace simulate KEY=VALUE`, `rlpace compare --set`, and
verl's data.rlpace.kwargs given as a string."""

from __future__ import annotations

import json

import pytest

from rlpace._flow import parse_mapping, parse_value
from rlpace.train import TrainConfig
from rlpace.train.config import from_overrides


@pytest.mark.parametrize("text, expected", [
    ("{temperature:0.1}", {"temperature": 0.1}),
    ('{"temperature": 0.1}', {"temperature": 0.1}),
    ("{c: 2, base: pool, on: true, off: False, x: null}",
     {"c": 2, "base": "pool", "on": True, "off": False, "x": None}),
    ("{a: 'x,y', b: \"q}\", c: [1, [2, -3.5e-2]], d: {e: []}, f: hello world}",
     {"a": "x,y", "b": "q}", "c": [1, [2, -0.035]], "d": {"e": []}, "f": "hello world"}),
    ("{}", {}), ("", {}), ("  { k : 1e3 }  ", {"k": 1000.0}),
])
def test_parse_mapping(text, expected):
    got = parse_mapping(text)
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]   # 2 stays int, 1e3 float


@pytest.mark.parametrize("text, needle", [
    ("{a:1", "expected ',' or '}'"), ("{a:1, a:2}", "key 'a' appears twice"), ("{a:}", "a value is missing"),
    ("{a: [1, 2}", "expected ',' or ']'"), ("[1, 2]", "must be a mapping"), ("{a: 'x}", "not closed"),
    ("{a: 1} b", "unexpected text"),
])
def test_bad_mapping_names_the_field(text, needle):
    with pytest.raises(ValueError, match="policy_kwargs") as e:
        parse_mapping(text)
    assert needle in str(e.value)


def test_train_policy_kwargs_takes_both_forms_as_the_same_json():
    hydra = from_overrides(["policy=dump", "policy_kwargs={temperature:0.1, c: 2}"], TrainConfig())
    plain = from_overrides(["policy=dump", 'policy_kwargs={"temperature": 0.1, "c": 2}'], TrainConfig())
    assert json.loads(hydra.policy_kwargs) == json.loads(plain.policy_kwargs) == {"temperature": 0.1, "c": 2}
    assert hydra.policy_kwargs == plain.policy_kwargs


def test_values_in_simulate_and_compare():
    from rlpace.cli.compare import _parse_sets
    from rlpace.cli.simulate import _pairs
    assert _pairs(["temperature=0.5", "floors=[0.05, 0.1]", "base=pool", "x={a: 1}"], "arg") == \
        [("temperature", 0.5), ("floors", [0.05, 0.1]), ("base", "pool"), ("x", {"a": 1})]
    assert _parse_sets(["batch_size=32", "flag=true", "tag=abc"]) == {"batch_size": 32, "flag": True, "tag": "abc"}
    assert parse_value("[1, 'two', {a: 3}]") == [1, "two", {"a": 3}]


def test_verl_kwargs_string():
    from rlpace import Pool
    from rlpace.adapters._verl_core import feedback_from_config
    pool = Pool(["a", "b"] * 4)
    fb = feedback_from_config(pool, {"rlpace": {"policy": "dump", "kwargs": "{temperature:0.3}"}})
    assert "0.3" in json.dumps(fb.scheduler.hyperparameters)
    assert fb.scheduler.hyperparameters == feedback_from_config(
        pool, {"rlpace": {"policy": "dump", "kwargs": {"temperature": 0.3}}}).scheduler.hyperparameters
