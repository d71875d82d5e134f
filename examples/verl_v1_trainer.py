"""verl's default (V1) trainer with every rlpace place: admission, loss weights, the advantage
place, targets and rewards (token statistics included). Needs verl's GPU stack.

    python examples/verl_v1_trainer.py trainer.use_v1=True trainer.v1.trainer_mode=rlpace_sync \
        data.custom_cls.path=pkg://rlpace.adapters.verl data.custom_cls.name=RlpaceDataset \
        data.shuffle=False data.dataloader_num_workers=0 +data.rlpace.policy=dump+per_advantage \
        <every other override you pass to python -m verl.trainer.main_ppo>

`trainer.v1.trainer_mode` is `rlpace_sync`, `rlpace_colocate_async` or `rlpace_separate_async`
(verl's three modes; their `trainer.v1.<mode>.*` settings keep verl's names). The trainer
selects `RlpaceReplayBuffer` itself and sets `data.gen_batch_size=1`.

How: verl's TaskRunnerV1 (a Ray actor) looks the trainer up by `trainer.v1.trainer_mode` in
verl's trainer registry. This entry runs verl's own `run_ppo` with a TaskRunnerV1 subclass that,
inside the actor process, imports `rlpace.adapters._verl_v1_trainer` (whose classes register
themselves with `@register_trainer`) and then runs verl's unchanged `run`.
"""

import os

import hydra
import ray
import verl.trainer
from verl.trainer.main_ppo import TaskRunnerV1, run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from rlpace.adapters._verl_v1_trainer import MODES


@ray.remote(num_cpus=1)
class RlpaceTaskRunnerV1(TaskRunnerV1.__ray_actor_class__):
    def run(self, config):
        import rlpace.adapters._verl_v1_trainer  # noqa: F401 - registers the rlpace_* trainer modes here
        return super().run(config)


@hydra.main(config_path=os.path.join(os.path.dirname(verl.trainer.__file__), "config"),
            config_name="ppo_trainer", version_base=None)
def main(config):
    if not config.trainer.get("use_v1", False) or config.trainer.v1.trainer_mode not in MODES:
        raise SystemExit(f"this entry runs rlpace's V1 trainer: pass trainer.use_v1=True and "
                         f"trainer.v1.trainer_mode=one of {sorted(MODES)} (the legacy trainer: "
                         f"examples/verl_legacy_trainer.py).")
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    run_ppo(config, task_runner_class=RlpaceTaskRunnerV1)


if __name__ == "__main__":
    main()
