"""verl's legacy trainer with `RlpaceTrainerMixin`: exact resume, loss weights, and
`rlpace/*` metrics in verl's logger. Needs verl's GPU stack (rollout server, FSDP workers).

    python examples/verl_legacy_trainer.py trainer.use_v1=False \
        data.custom_cls.path=pkg://rlpace.adapters.verl data.custom_cls.name=RlpaceDataset \
        data.shuffle=False data.dataloader_num_workers=0 +data.rlpace.policy=dump \
        <every other override you pass to python -m verl.trainer.main_ppo>

verl 0.7 users keep the same entry and swap the data lines for
`data.sampler.class_path=pkg://rlpace.adapters.verl data.sampler.class_name=RlpaceSampler`.

How: verl's TaskRunner (a Ray actor) builds `RayPPOTrainer` by name. This entry runs
verl's own `run_ppo` with a TaskRunner subclass that, inside the actor process, swaps that
name for `RlpaceTrainerMixin + RayPPOTrainer` and then runs verl's unchanged `run`.
"""

import os

import hydra
import ray
import verl.trainer
from verl.trainer.main_ppo import run_ppo
from verl.trainer.ppo.utils import need_critic, need_reference_policy
from verl.utils.config import validate_config

from rlpace.adapters.verl import RlpaceTrainerMixin

try:                                    # verl 0.8-0.9: the legacy runner lives in main_ppo_v0
    from verl.trainer import main_ppo_v0 as runner_module
except ImportError:                     # verl 0.5-0.7
    from verl.trainer import main_ppo as runner_module


# verl 0.9 decorates TaskRunner with @ray.remote; verl 0.7 keeps the plain class
_TaskRunner = getattr(runner_module.TaskRunner, "__ray_actor_class__", runner_module.TaskRunner)


@ray.remote(num_cpus=1)
class RlpaceTaskRunner(_TaskRunner):
    def run(self, config):
        base = runner_module.RayPPOTrainer
        runner_module.RayPPOTrainer = type("RlpaceRayPPOTrainer", (RlpaceTrainerMixin, base), {})
        return super().run(config)


@hydra.main(config_path=os.path.join(os.path.dirname(verl.trainer.__file__), "config"),
            config_name="ppo_trainer", version_base=None)
def main(config):
    if config.trainer.get("use_v1", False):
        raise ValueError("this entry runs the legacy trainer: pass trainer.use_v1=False (for the V1 "
                         "trainer use verl.trainer.main_ppo with the lines in examples/verl_grpo.sh).")
    validate_config(config=config, use_reference_policy=need_reference_policy(config),
                    use_critic=need_critic(config))
    run_ppo(config, task_runner_class=RlpaceTaskRunner)


if __name__ == "__main__":
    main()
