#!/usr/bin/env bash
# One lane of the Multi30k study (scripts/study/multi30k_study.sh), run in the background from a snapshot of one
# commit, so that the code cannot change under runs that span several sessions:
#
#   MODELS="rope t5" SEEDS="1 2 3" scripts/study/study_lane.sh epochs20        # prints the lane's log and returns
#   MODELS=fire scripts/study/study_lane.sh tok32_joined 4dee205                 # another commit's code
#
# CONDITION: main (8 epochs, results/multi30k_study/), epochs20 (20 epochs, results/multi30k_study/epochs20/) or
# tok32_joined (train short for the length probe, results/multi30k_study/tok32_joined/); data, checkpoints and
# results in this checkout's folders of that condition. COMMIT (default HEAD) is archived once into
# checkpoints/multi30k_study/code_<commit>/ and reused; its recipe trains MODELS x SEEDS (the recipe's variables
# pass through; JOBS defaults to 1) and records the commit in each result. A lane that fails is started again
# (RETRIES times, default 20, RETRY_SECONDS apart, default 300: e.g. the environment was being reinstalled); a refused
# input (the recipe exits 2) is not. Finished runs are skipped and each run is locked, so a second lane with the same
# command takes the next free run. The lane runs at the lowest priority (nice 19) and appends its output to the
# condition's checkpoints/.../study.log; FOREGROUND=1 runs it here instead.
set -euo pipefail
refuse() { echo "study_lane.sh: $*" >&2; exit 2; }
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CONDITION=${1:-} COMMIT=${2:-HEAD}
case $CONDITION in
  main) ckpt=multi30k_study out=multi30k_study data=multi30k_study_ende extra=() ;;
  epochs20) ckpt=multi30k_study_epochs20 out=multi30k_study/epochs20 data=multi30k_study_ende extra=(EPOCHS=20) ;;
  tok32_joined) ckpt=multi30k_study_tok32_joined out=multi30k_study/tok32_joined
                data=multi30k_study_ende_tok32_joined extra=(MAX_TRAIN_TOKENS=32 JOIN_TRAIN=1) ;;
  *) refuse "CONDITION '$CONDITION': expected main, epochs20 or tok32_joined (scripts/study/study_lane.sh CONDITION [COMMIT])"
     ;;
esac
SHA=$(git -C "$REPO" rev-parse --short --verify -q "$COMMIT^{commit}") ||
  refuse "COMMIT '$COMMIT': not a commit of $REPO"
multi30k=${MULTI30K_DIR:-$REPO/../shared/data/multi30k}
MULTI30K_DIR=$(cd "$multi30k" 2> /dev/null && pwd) ||
  refuse "MULTI30K_DIR=$multi30k: no such folder (expected Multi30k's train, val, test_2016_flickr)"
RETRIES=${RETRIES:-20} RETRY_SECONDS=${RETRY_SECONDS:-300}
for v in RETRIES RETRY_SECONDS; do
  [[ ${!v} =~ ^[0-9]+$ ]] || refuse "$v=${!v}: expected a whole number"
done
LOG=$REPO/checkpoints/$ckpt/study.log
mkdir -p "$REPO/checkpoints/$ckpt"

if [ -z "${FOREGROUND:-}" ]; then
  # nice 19 for the lane's own processes and for its session's scheduling group: where the kernel groups processes
  # by session (autogroup), a process's nice counts only inside its group, and the new session would otherwise take
  # an equal share of the CPU beside the user's (a test suite beside a lane ran at half speed)
  FOREGROUND=1 setsid nohup nice -n 19 bash -c 'echo 19 > /proc/self/autogroup 2> /dev/null; exec bash "$@"' lane \
    "${BASH_SOURCE[0]}" "$CONDITION" "$SHA" >> "$LOG" 2>&1 < /dev/null &
  echo "study_lane.sh: $CONDITION from code $SHA, in the background (pid $!): $LOG"
  exit 0
fi

SNAP=$REPO/checkpoints/multi30k_study/code_$SHA
if [ ! -d "$SNAP/scripts" ]; then  # a temporary name, then renamed: a snapshot is whole or absent
  rm -rf "$SNAP.tmp.$$" && mkdir -p "$SNAP.tmp.$$"
  git -C "$REPO" archive "$SHA" | tar -x -C "$SNAP.tmp.$$"
  mv -T "$SNAP.tmp.$$" "$SNAP" 2> /dev/null || rm -rf "$SNAP.tmp.$$"  # another lane made it meanwhile
fi
# PATH: this checkout's environment where it has one; PYTHONPATH: the snapshot's code before the checkout's
venv=$REPO/.venv/bin
[ -d "$venv" ] && export PATH=$venv:$PATH
export PYTHONPATH=$SNAP:$SNAP/scripts${PYTHONPATH:+:$PYTHONPATH} CODE_VERSION=$SHA JOBS=${JOBS:-1} MULTI30K_DIR
export DATA_DIR=$REPO/data/$data CKPT_ROOT=$REPO/checkpoints/$ckpt OUT_DIR=$REPO/results/$out
(( ${#extra[@]} == 0 )) || export "${extra[@]}"
cd "$SNAP"
for attempt in $(seq 0 "$RETRIES"); do
  echo "== study_lane.sh: $CONDITION, code $SHA, attempt $((attempt + 1)), $(date -u '+%F %T') UTC"
  status=0
  bash scripts/study/multi30k_study.sh || status=$?
  (( status == 0 )) && exit 0
  (( status == 2 )) && refuse "the recipe refused its input (above): not retried"
  (( attempt < RETRIES )) && sleep "$RETRY_SECONDS"
done
echo "study_lane.sh: $CONDITION: $((RETRIES + 1)) attempt(s), each failed: see the log above" >&2
exit 1
