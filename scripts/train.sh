#!/usr/bin/env bash
# Train one Hydra config (a WMT14 cell, or configs/NAME.yaml) with fairseq-hydra-train on this node's GPUs, or on CPU.
#
#   scripts/train.sh CONFIG [hydra overrides ...]
#
# CONFIG is a WMT14 cell's experiment name (wmt14_en_de_base_relative: configs/wmt14.yaml with pair=en_de
# size=base scheme=relative), a config name (toy_recipe) or a path to one (configs/toy_recipe.yaml).
# The experiment is named after it (EXPERIMENT=... renames it); it writes
#   checkpoints/<experiment>/            checkpoints (checkpoint_last.pt, checkpoint<epoch>.pt, ...)
#   checkpoints/<experiment>/train.log   everything the run prints (appended by every run)
#   checkpoints/<experiment>/tb/         tensorboard logs
#   checkpoints/<experiment>/hydra/      Hydra's record of the composed config, per rank
# Rerunning the same command resumes from checkpoint_last.pt (fairseq's default --restore-file); a
# checkpoint_last.pt left truncated by a kill is replaced by the newest intact checkpoint first.
#
# Data parallel: distributed_world_size = the number of visible GPUs (CUDA_VISIBLE_DEVICES). The configs state
# their batch for distributed_world_size GPUs (8 for the papers); on N GPUs update_freq is scaled by 8/N so that
# the effective batch stays the paper's (an error if it does not divide; pass optimization.update_freq=[K]
# to choose yourself).
#
# Environment:
#   CPU=1            train on CPU (also implied by the override common.cpu=true): fp16 off, one process
#                    (or, under LAUNCHER=srun, one gloo process per Slurm task)
#   EXPERIMENT       experiment name (default: the config name); SAVE_DIR overrides checkpoints/<experiment>
#   LAUNCHER=srun    used by scripts/train.sbatch: fairseq-hydra-train in every Slurm task (srun), ranks from
#                    fairseq's Slurm detection: one task per GPU (world size = SLURM_NTASKS; SLURM_PROCID,
#                    SLURM_LOCALID), or one task per node that starts a process per GPU (world size = nodes x
#                    GPUs); PORT sets the rendezvous port (default 10000 + SLURM_JOB_ID mod 20000)
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 CONFIG [hydra overrides ...]" >&2; exit 2
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIG=$1
shift
case "$CONFIG" in
  */*|*.yaml) CONFIG_DIR=$(cd "$(dirname "$CONFIG")" && pwd); NAME=$(basename "$CONFIG" .yaml) ;;
  *) CONFIG_DIR=$ROOT/configs; NAME=$CONFIG ;;
esac
cd "$ROOT"
export PWD=$ROOT  # configs find data/ and fairseq_plugins/ through ${oc.env:PWD}
export PATH="$ROOT/.venv/bin:$PATH"
PY=${PY:-python}
# a config file's name, or a WMT14 cell's (wmt14_en_de_big_rope: --config-name wmt14 pair=en_de size=big scheme=rope)
if [ -f "$CONFIG_DIR/$NAME.yaml" ]; then
  HYDRA_ARGS=(--config-name "$NAME")
else
  resolved=$("$PY" "$ROOT/scripts/hydra_config.py" name "$NAME" --config-dir "$CONFIG_DIR" 2>&1) ||
    { echo "train.sh: ${resolved#hydra_config.py: }" >&2; exit 2; }
  read -r -a words <<< "$resolved"
  HYDRA_ARGS=(--config-name "${words[0]}" "${words[@]:1}")
fi

EXP=${EXPERIMENT:-$NAME}
SAVE=${SAVE_DIR:-$ROOT/checkpoints/$EXP}
case "$SAVE" in /*) ;; *) SAVE=$ROOT/$SAVE ;; esac

user_sets() {  # does an override given on the command line set KEY?
  local key=$1 arg
  for arg in "${USER_ARGS[@]}"; do case "$arg" in "$key="*|"+$key="*|"++$key="*) return 0 ;; esac; done
  return 1
}
USER_ARGS=("$@")
CPU=${CPU:-0}
for arg in "${USER_ARGS[@]}"; do
  case "$arg" in common.cpu=true|common.cpu=True|++common.cpu=true) CPU=1 ;; esac
done

# world size: Slurm tasks, local GPUs, or one CPU process
LAUNCH=()
EXTRA=()
gpus() { "$PY" -c 'import torch; print(torch.cuda.device_count())'; }
visible() {  # what CUDA_VISIBLE_DEVICES says: set empty hides every GPU, unset hides none
  if [ -z "${CUDA_VISIBLE_DEVICES+set}" ]; then echo "CUDA_VISIBLE_DEVICES=unset"
  elif [ -z "$CUDA_VISIBLE_DEVICES" ]; then echo "CUDA_VISIBLE_DEVICES is set empty, which hides every GPU"
  else echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; fi
}
if [ "${LAUNCHER:-local}" = srun ]; then
  : "${SLURM_JOB_ID:?LAUNCHER=srun needs a Slurm allocation (SLURM_JOB_ID unset)}"
  WORLD=${SLURM_NTASKS:-${SLURM_NNODES:-1}}  # no task count asked for: one task a node (Slurm's default)
  TASKS=$WORLD
  if [ "$CPU" != 1 ]; then
    # a job without GPUs would otherwise start a world of none and end "COMPLETED" untrained
    NODE_GPUS=$(gpus)
    if [ "$NODE_GPUS" -lt 1 ]; then
      echo "train.sh: job $SLURM_JOB_ID has no GPU ($(visible)); ask sbatch" \
        "for GPUs (e.g. --gpus-per-node=8) or set CPU=1 to train on CPU" >&2
      exit 1
    fi
    if [ "$WORLD" = "${SLURM_NNODES:-1}" ]; then
      # one task per node: fairseq's Slurm detection then starts one process per GPU of each node itself
      WORLD=$(( ${SLURM_NNODES:-1} * NODE_GPUS ))
    fi
  fi
  LAUNCH=(srun --kill-on-bad-exit=1 --ntasks="$TASKS")
  if [ "$CPU" != 1 ] || [ "$TASKS" -gt 1 ]; then
    # not for one CPU task: fairseq's Slurm detection would give it a process per GPU, none, and exit 0 untrained
    PORT=${PORT:-$((10000 + ${SLURM_JOB_ID:-0} % 20000))}
    EXTRA+=("distributed_training.distributed_port=$PORT")
    [ "$CPU" = 1 ] && EXTRA+=("distributed_training.distributed_backend=gloo")
  fi
elif [ "$CPU" = 1 ]; then
  WORLD=1
else
  WORLD=$(gpus)
  if [ "$WORLD" -lt 1 ]; then
    echo "train.sh: no GPU visible ($(visible)); set CPU=1 to train on CPU" >&2
    exit 1
  fi
fi
if [ "$CPU" = 1 ]; then
  EXTRA+=("common.cpu=true")
  user_sets common.fp16 || EXTRA+=("common.fp16=false")
fi

# keep the configured effective batch: update_freq × world size
if ! user_sets optimization.update_freq; then
  ref=$("$PY" "$ROOT/scripts/hydra_config.py" get "$NAME" --config-dir "$CONFIG_DIR" \
    distributed_training.distributed_world_size optimization.update_freq)
  REF_WORLD=${ref%%$'\n'*} REF_FREQ=${ref##*$'\n'}
  case "$REF_FREQ" in *,*) echo "train.sh: $NAME has a per-epoch update_freq ($REF_FREQ); pass optimization.update_freq=[...]" >&2; exit 2 ;; esac
  total=$((REF_WORLD * REF_FREQ))
  if [ $((total % WORLD)) -ne 0 ]; then
    echo "train.sh: $NAME's batch is stated for $REF_WORLD GPUs x update_freq $REF_FREQ; $WORLD processes cannot keep it" \
      "(pass optimization.update_freq=[K] to choose)" >&2
    exit 2
  fi
  EXTRA+=("optimization.update_freq=[$((total / WORLD))]")
fi

mkdir -p "$SAVE/tb"
# everything the run prints also goes to SAVE/train.log (appended: one log across restarts)
exec > >(tee -a "$SAVE/train.log") 2>&1
"$PY" "$ROOT/scripts/checkpoint_guard.py" "$SAVE"
echo "train.sh: $(date -Is) $EXP (${HYDRA_ARGS[*]:1} in $CONFIG_DIR) on $WORLD $([ "$CPU" = 1 ] && echo CPU process || echo GPU)(s) -> $SAVE"
# exec: under LAUNCHER=srun the caller's signals (scripts/train.sbatch) reach srun directly
exec "${LAUNCH[@]}" fairseq-hydra-train --config-dir "$CONFIG_DIR" "${HYDRA_ARGS[@]}" \
  "checkpoint.save_dir=$SAVE" "common.tensorboard_logdir=$SAVE/tb" \
  "distributed_training.distributed_world_size=$WORLD" \
  "hydra.run.dir=$SAVE/hydra/rank\${oc.env:SLURM_PROCID,0}" hydra.job.chdir=false \
  "${EXTRA[@]}" "$@"
