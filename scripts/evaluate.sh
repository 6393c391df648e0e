#!/usr/bin/env bash
# Evaluate one experiment the papers' way: average its last checkpoints, beam search, score.
#
#   scripts/evaluate.sh EXPERIMENT [--subset test|valid] [--data-dir DIR] [--config NAME]
#                       [--num-checkpoints N] [--checkpoint-kind epoch|update|last] [--checkpoint FILE]
#                       [--out FILE] [--cpu]
#
# 1. checkpoints: those of checkpoints/EXPERIMENT/ (SAVE_DIR overrides), averaged by
#    scripts/average_checkpoints.py as the experiment's config (the WMT14 cell EXPERIMENT, configs/EXPERIMENT.yaml,
#    or --config NAME)
#    keeps them: checkpoint.keep_last_epochs N -> the last N epoch checkpoints; else keep_interval_updates N
#    (with save_interval_updates) -> the last N update checkpoints; N = 1 -> checkpoint_last.pt alone.
#    --num-checkpoints / --checkpoint-kind override that; --checkpoint FILE evaluates one file as it is.
# 2. fairseq-generate on the subset (test = newstest2014, valid = newstest2013) with the config's beam and
#    length penalty (4 and 0.6: both papers), on a GPU when there is one (--cpu forces CPU).
# 3. scripts/score.py: sentencepiece decoding, sacreBLEU against the raw reference (with its signature) and
#    the papers' tokenized, compound-split BLEU (scripts/tokenized_bleu.py).
# Writes results/EXPERIMENT.json for test, results/EXPERIMENT.newstest2013.json for valid (--out overrides;
# RESULTS_DIR moves results/), with both scores, the signature, the checkpoints averaged, the config and the
# git commit; the generation log and the hypotheses go to checkpoints/EXPERIMENT/eval/.
# The data directory is the one above the config's task.data (a scripts/prepare_wmt14.sh output:
# bin/, spm.model, raw/); --data-dir overrides it.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "evaluate.sh: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || { echo "usage: $0 EXPERIMENT [--subset test|valid] [--data-dir DIR] [--config NAME] [--num-checkpoints N] [--checkpoint-kind epoch|update|last] [--checkpoint FILE] [--out FILE] [--cpu]" >&2; exit 2; }
EXP=$1
shift
SUBSET=test DATA="" CONFIG=$EXP NUM="" KIND="" CKPT="" OUT="" CPU=${CPU:-0}
while [ $# -gt 0 ]; do
  case "$1" in
    --subset) SUBSET=${2:?}; shift 2 ;;
    --data-dir) DATA=${2:?}; shift 2 ;;
    --config) CONFIG=${2:?}; shift 2 ;;
    --num-checkpoints) NUM=${2:?}; shift 2 ;;
    --checkpoint-kind) KIND=${2:?}; shift 2 ;;
    --checkpoint) CKPT=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --cpu) CPU=1; shift ;;
    *) die "unknown option $1" ;;
  esac
done
case "$SUBSET" in test) TESTSET=newstest2014 ;; valid) TESTSET=newstest2013 ;; *) die "--subset must be test or valid" ;; esac
case "$KIND" in ""|epoch|update|last) ;; *) die "--checkpoint-kind must be epoch, update or last" ;; esac
cd "$ROOT"
export PWD=$ROOT PATH="$ROOT/.venv/bin:$PATH"
PY=${PY:-python}
# a config file's name, or a WMT14 cell's (wmt14_en_de_big_rope: configs/wmt14.yaml pair=en_de size=big scheme=rope)
resolved=$("$PY" scripts/hydra_config.py name "$CONFIG" 2>&1) || die "${resolved#hydra_config.py: } (pass --config NAME)"
read -r -a words <<< "$resolved"
CONFIG_DESC="configs/${words[0]}.yaml${words[1]:+ ${words[*]:1}}"
SAVE=${SAVE_DIR:-$ROOT/checkpoints/$EXP}
RESULTS=${RESULTS_DIR:-$ROOT/results}
if [ -z "$OUT" ]; then
  OUT=$RESULTS/$EXP.json
  [ "$SUBSET" = test ] || OUT=$RESULTS/$EXP.$TESTSET.json
fi

# what the config says
mapfile -t V < <("$PY" scripts/hydra_config.py get "$CONFIG" task.data task.source_lang task.target_lang \
  generation.beam generation.lenpen checkpoint.keep_last_epochs checkpoint.no_epoch_checkpoints \
  checkpoint.save_interval_updates checkpoint.keep_interval_updates)
[ ${#V[@]} -eq 9 ] || die "could not read $CONFIG_DESC"
BIN=${V[0]} SRC=${V[1]} TGT=${V[2]} BEAM=${V[3]} LENPEN=${V[4]}
[ -n "$DATA" ] || DATA=$(dirname "$BIN")
for f in "$DATA/bin/dict.$SRC.txt" "$DATA/spm.model" "$DATA/raw/$SUBSET.$TGT"; do
  [ -f "$f" ] || die "$f not found (expected a scripts/prepare_wmt14.sh output in $DATA; pass --data-dir)"
done

# 1. the checkpoint to evaluate
if [ -z "$CKPT" ]; then
  # the config's protocol, then the flags
  if [ "${V[5]}" -gt 0 ] && [ "${V[6]}" = false ]; then CKIND=epoch CN=${V[5]}
  elif [ "${V[7]}" -gt 0 ] && [ "${V[8]}" -gt 1 ]; then CKIND=update CN=${V[8]}
  else CKIND=last CN=1; fi
  KIND=${KIND:-$CKIND} N=${NUM:-$CN}
  [[ "$N" =~ ^[1-9][0-9]*$ ]] || die "--num-checkpoints must be a positive number"
  if [ "$KIND" = last ] || { [ "$N" = 1 ] && [ -z "$NUM" ]; }; then
    CKPT=$SAVE/checkpoint_last.pt
    [ -f "$CKPT" ] || die "$CKPT not found (train first: scripts/train.sh $CONFIG)"
    AVERAGED=$CKPT N=1
  else
    CKPT=$SAVE/checkpoint_avg_last${N}_${KIND}s.pt
    flag=--num-epoch-checkpoints; [ "$KIND" = update ] && flag=--num-update-checkpoints
    log=$("$PY" scripts/average_checkpoints.py --inputs "$SAVE" "$flag" "$N" --output "$CKPT" 2>&1) || die "${log##*average_checkpoints.py: }"
    echo "$log" >&2
    AVERAGED=$(sed -n 's/^averaged [0-9]* checkpoints (\(.*\)) -> .*/\1/p' <<< "$log" | tr -d ' ')
  fi
else
  [ -f "$CKPT" ] || die "$CKPT not found"
  AVERAGED=$CKPT N=1
fi

# 2. beam search
mkdir -p "$SAVE/eval"
base=$SAVE/eval/$TESTSET
device=()
if [ "$CPU" = 1 ] || ! "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then device=(--cpu); fi
echo "evaluate.sh: $EXP on $TESTSET with $CKPT (beam $BEAM, lenpen $LENPEN)" >&2
fairseq-generate "$DATA/bin" --user-dir fairseq_plugins --path "$CKPT" --gen-subset "$SUBSET" \
  --source-lang "$SRC" --target-lang "$TGT" --beam "$BEAM" --lenpen "$LENPEN" \
  --max-tokens "${MAX_TOKENS:-8000}" --num-workers 0 "${device[@]}" > "$base.gen.tmp" 2> "$base.gen.err" ||
  { tail -3 "$base.gen.err" >&2; die "fairseq-generate failed (log: $base.gen.err)"; }
mv "$base.gen.tmp" "$base.gen"

# 3. scores
commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
[ -z "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] || commit="$commit+uncommitted-changes"
"$PY" scripts/score.py --generate-log "$base.gen" --spm "$DATA/spm.model" --ref "$DATA/raw/$SUBSET.$TGT" \
  --out "$OUT" --hyp-out "$base.hyp" --tokenized-bleu \
  --meta "experiment=$EXP" "config=$CONFIG_DESC" "testset=$TESTSET" "subset=$SUBSET" \
  "checkpoint=$CKPT" "checkpoints_averaged=$AVERAGED" "num_checkpoints_averaged=$N" \
  "beam=$BEAM" "lenpen=$LENPEN" "data=$DATA" "git_commit=$commit"
