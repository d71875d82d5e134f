"""What RlpaceGRPOTrainer relies on in TRL is checked when it is built, not skipped later.

The version gate refuses pre-releases of the next release (`1.17.0.dev0` sorts below 1.17);
every private method the adapter overrides or calls must exist with the parameters it passes,
and every attribute it reads or saves and restores must exist on the built trainer (before,
a renamed attribute was skipped silently by `hasattr`). `state_digest` is what the ranks
all-gather to check that their Scheduler copies agree.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("trl")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

import rlpace.adapters.trl as rtrl  # noqa: E402
from _trl_common import dataset, lm  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler  # noqa: E402
from rlpace.adapters.trl import (RlpaceGRPOTrainer, check_trl_version, missing_trl_methods,  # noqa: E402
                                 pool_from_dataset, state_digest)
from rlpace.errors import InputError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.mark.parametrize("version", ["1.16.0", "1.16.3", "1.16.1.dev0", "1.16.2.post1"])
def test_tested_releases_are_accepted(version):
    check_trl_version(version)


@pytest.mark.parametrize("version", ["1.17.0.dev0", "1.17.0rc1", "1.17.0", "1.16.0rc1", "1.16.0.dev0",
                                     "1.15.9", "1.10.0", "2.0.0"])
def test_untested_releases_and_prereleases_are_refused(version):
    with pytest.raises(InputError, match=rf"supports trl >=1\.16,<1\.17 .*trl {version} is installed"):
        check_trl_version(version)


def test_the_installed_grpo_trainer_has_every_private_method():
    assert missing_trl_methods(GRPOTrainer) == []


def test_a_renamed_method_or_parameter_is_named():
    class Renamed(GRPOTrainer):
        _compute_loss = None                                   # e.g. renamed to _compute_policy_loss

        def _calculate_rewards(self, inputs, prompts, completions):  # a parameter dropped
            return None

    assert missing_trl_methods(Renamed) == ["parameter 'completion_ids_list' of _calculate_rewards",
                                            "method _compute_loss"]


def _build(lm, dataset, tmp_path):
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
                     per_device_train_batch_size=4, max_completion_length=4, dataloader_num_workers=0)
    return RlpaceGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(lm), args=cfg, train_dataset=dataset,
                             reward_funcs=lambda completions, **k: [0.0] * len(completions),
                             processing_class=AutoTokenizer.from_pretrained(lm),
                             scheduler=Scheduler(pool_from_dataset(dataset), "uniform"))


def test_the_trainer_fails_loudly_naming_what_is_missing(lm, dataset, tmp_path, monkeypatch):
    _build(lm, dataset, tmp_path)                              # the installed trl has everything
    monkeypatch.delattr(GRPOTrainer, "_generate")
    with pytest.raises(InputError, match=r"GRPOTrainer has no method _generate: RlpaceGRPOTrainer relies on it"):
        _build(lm, dataset, tmp_path)
    monkeypatch.undo()
    monkeypatch.setattr(rtrl, "TRL_PRIVATE_ATTRIBUTES", rtrl.TRL_PRIVATE_ATTRIBUTES + ("_entropy_ctrl",))
    with pytest.raises(InputError, match=r"has no attribute _entropy_ctrl: RlpaceGRPOTrainer relies on it"):
        _build(lm, dataset, tmp_path)
    monkeypatch.setattr(rtrl.trl, "__version__", "1.17.0.dev0")
    with pytest.raises(InputError, match=r"trl 1\.17\.0\.dev0 is installed"):
        _build(lm, dataset, tmp_path)


def test_state_digest_sees_every_key_dtype_shape_and_value():
    state = {"a": np.arange(6, dtype=np.int64), "b": np.array("dump"), "c": np.zeros((2, 3))}
    d = state_digest(state)
    assert d == state_digest({k: state[k].copy() for k in reversed(list(state))})   # order-free, by value
    changed = [{**state, "a": state["a"] + np.eye(1, 6, 5, dtype=np.int64)[0]},
               {**state, "a": state["a"].astype(np.int32)},
               {**state, "c": state["c"].reshape(3, 2)},
               {"z": state["a"], "b": state["b"], "c": state["c"]},
               {**state, "b": np.array("dumq")}]
    assert len({d, *(state_digest(s) for s in changed)}) == 6
    assert -2 ** 63 <= d < 2 ** 63

