#!/usr/bin/env bash
# GRPO in verl with rlpace choosing the prompts: the config lines for each verl version.
# These runs need verl's GPU stack (a vLLM/SGLang rollout server and FSDP workers); on a CPU
# machine run examples/verl_dataset.py, which builds the same data path without them.
#
#   bash examples/verl_grpo.sh legacy   # verl 0.9, legacy trainer + RlpaceTrainerMixin entry
#   bash examples/verl_grpo.sh v1       # verl 0.9, V1 trainer (default) + rlpace replay buffer
#   bash examples/verl_grpo.sh verl07   # verl 0.5-0.7, curriculum sampler
#
# The training data must be verl-schema parquet with a unique extra_info.index per prompt
# (verl's examples/data_preprocess scripts write it). Set MODEL, TRAIN, VAL below.
set -euo pipefail
MODE=${1:-legacy}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
TRAIN=${TRAIN:-$HOME/data/gsm8k/train.parquet}
VAL=${VAL:-$HOME/data/gsm8k/test.parquet}

COMMON=(
  algorithm.adv_estimator=grpo
  data.train_files="$TRAIN" data.val_files="$VAL"
  data.train_batch_size=256 data.max_prompt_length=512 data.max_response_length=1024
  actor_rollout_ref.model.path="$MODEL" actor_rollout_ref.rollout.n=8
  actor_rollout_ref.actor.ppo_mini_batch_size=64
  trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=20
  'trainer.logger=["console"]'
  # rlpace: the Scheduler's policy (v1 adds DAPO admission) and its hyperparameters
  +data.rlpace.policy="${POLICY:-$([ "$MODE" = v1 ] && echo dump+dapo_dynamic_sampling || echo dump)}"
  +data.rlpace.seed=0 '+data.rlpace.kwargs={temperature:0.1}'
)
DATASET=(  # verl >= 0.8: prompts drawn through the Scheduler by the dataset
  data.custom_cls.path=pkg://rlpace.adapters.verl data.custom_cls.name=RlpaceDataset
  data.shuffle=False data.dataloader_num_workers=0
)

case "$MODE" in
  legacy)
    python examples/verl_legacy_trainer.py trainer.use_v1=False "${COMMON[@]}" "${DATASET[@]}" ;;
  v1)
    python -m verl.trainer.main_ppo trainer.use_v1=True trainer.v1.trainer_mode=sync \
      "${COMMON[@]}" "${DATASET[@]}" data.gen_batch_size=1 \
      trainer.v1.sampler.custom_sampler.path=pkg://rlpace.adapters.verl \
      trainer.v1.sampler.custom_sampler.name=RlpaceReplayBuffer \
      '+trainer.v1.sampler.sampler_kwargs.train_batch_size=${data.train_batch_size}' \
      +trainer.v1.sampler.sampler_kwargs.gen_batch_size=1 ;;
  verl07)
    python examples/verl_legacy_trainer.py "${COMMON[@]}" \
      data.sampler.class_path=pkg://rlpace.adapters.verl data.sampler.class_name=RlpaceSampler \
      data.dataloader_num_workers=0 ;;
  *) echo "usage: $0 legacy|v1|verl07" >&2; exit 2 ;;
esac
