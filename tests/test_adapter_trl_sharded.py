"""Gradient features through TRL need the full lm_head weight on each rank: a model sharded by
FSDP or DeepSpeed ZeRO-3 is detected at start-up and a method that reads gradient features is
refused, naming the setting and the fix.

No real FSDP or ZeRO-3 run is made here (DeepSpeed is not installed in the test environment;
FSDP would need an `accelerate launch` with an FSDP config and a process group), so the
accelerator state is faked: the detection on stand-in accelerators, and the real trainer's
start-up with accelerate's `Accelerator.distributed_type` patched to FSDP."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("trl")

from accelerate import Accelerator  # noqa: E402
from accelerate.utils import DistributedType  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from _trl_common import dataset, lm  # noqa: E402,F401 (fixtures)
from rlpace import Scheduler  # noqa: E402
from rlpace.adapters.trl import RlpaceGRPOTrainer, pool_from_dataset, sharded_model_setting  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore")]


def fake(kind, zero_stage=None):
    plugin = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
    return SimpleNamespace(distributed_type=kind, state=SimpleNamespace(deepspeed_plugin=plugin))


@pytest.mark.parametrize("acc, want", [
    (fake(DistributedType.FSDP), "FSDP"),
    (fake(DistributedType.DEEPSPEED, 3), "DeepSpeed ZeRO-3"),
    (fake(DistributedType.DEEPSPEED, 2), None),
    (fake(DistributedType.DEEPSPEED, 1), None),
    (fake(DistributedType.MULTI_GPU), None),
    (fake(DistributedType.MULTI_CPU), None),
    (fake(DistributedType.NO), None),
])
def test_the_sharding_settings_are_detected(acc, want):
    assert sharded_model_setting(acc) == want


def test_a_real_single_process_accelerator_is_not_sharded():
    assert sharded_model_setting(Accelerator(cpu=True)) is None


def test_the_trainer_refuses_gradient_features_on_a_sharded_model(lm, dataset, tmp_path, monkeypatch):
    monkeypatch.setattr(Accelerator, "distributed_type", property(lambda self: DistributedType.FSDP))
    cfg = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", dataloader_num_workers=0,
                     per_device_train_batch_size=4, num_generations=2, max_completion_length=3)
    kw = dict(model=AutoModelForCausalLM.from_pretrained(lm), args=cfg, train_dataset=dataset,
              reward_funcs=lambda completions, **k: [0.0] * len(completions))
    pool = pool_from_dataset(dataset)
    with pytest.raises(ValueError, match=r"shards the model with FSDP.*DDP.*grad_features='off'"):
        RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "diem"))
    with pytest.raises(ValueError, match="FSDP"):
        RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "uniform"), grad_features="on")
    # no policy reads the features: nothing to refuse
    t = RlpaceGRPOTrainer(**kw, scheduler=Scheduler(pool, "uniform"))
    assert t.rlpace_gf is None and sharded_model_setting(t.accelerator) == "FSDP"
