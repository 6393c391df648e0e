#!/usr/bin/env bash
# Evidence on real text: Multi30k En-De (test_2016_flickr), several seeds per model, one budget for all, paired
# bootstrap against the Transformer over seeds and test sentences, FLOATER by the paper's warm-start protocol.
#
#   MULTI30K_DIR=../shared/data/multi30k scripts/study/multi30k_study.sh  # train/val/test_2016_flickr.{en,de}
#   JOBS=2 ... scripts/study/multi30k_study.sh                             # two single-threaded runs side by side
#
# Recipe: the tiny Transformer of the Multi30k literature (Wu, Kong & Kao 2021: 4+4 layers, d=128, FFN 256,
# 4 heads, shared embeddings, dropout 0.3, Adam, lr 0.005, inverse-sqrt, label smoothing 0.1, 4,096 tokens per
# batch, checkpoint averaging, beam 5), on a CPU budget: EPOCHS epochs of the full training data (~130 updates
# each; the literature trains 8,000 updates ≈ 62 epochs), warm-up scaled to match. Joint sentencepiece BPE
# (VOCAB, default 10,000, ~ the literature's 10k merges) on cased text, so that both metrics below are meaningful.
#
# Models (MODELS; each trained for every seed in SEEDS):
#   transformer     sinusoidal absolute positions (fairseq transformer)
#   relative        Shaw et al. 2018 relative positions, k = 16 (relative_transformer)
#   floater         FLOATER trained from scratch (floater_transformer)
#   floater_warm    FLOATER by its paper's protocol: the same seed's trained transformer converted exactly
#                   (scripts/transformer_to_floater.py), fine-tuned FT_EPOCHS epochs at half the peak lr
#   transformer_ft  control: the same seed's transformer fine-tuned exactly like floater_warm, without FLOATER
#   floater_authors FLOATER from scratch as its authors' code trains it (not in the default MODELS): floater with
#                   FLOATER_AUTHORS below, the flags of configs/scheme/floater_all_authors.yaml at update_freq 1
#                   (docs/wmt14.md: what still differs from their code)
#   any other model name of the table of schemes (python -m fairseq_plugins models: learned, every_layer, shape,
#                   cape, randomized, t5, alibi, kerple, fire, rope, xpos, nope, alibi_sync), its _tiny architecture with the dimensions of MODEL_ARGS;
#                   shape with --shape-max-shift SHAPE_K (default 50: at least Multi30k's longest training sentence,
#                   48 source / 50 target pieces; the architecture's default, 100, is for WMT)
# Every run is evaluated on the average of its last AVG (fine-tunes: FT_AVG) epoch checkpoints, beam 5, length
# penalty 1: sacreBLEU (cased, detokenized, with signature) and the literature's tokenized lowercased BLEU.
#
# Every (model, seed) is its own resumable run: fairseq resumes from checkpoint_last.pt, and a run whose result
# JSON exists is skipped, so the study can span several sessions. Checkpoints are not kept with the results: a
# finished transformer whose checkpoints are gone is trained again (same command) when a fine-tune of its seed
# is still to run; its recorded result stays, the fine-tune records how the retrained run compares with it, and
# the retrained run's result (runs/transformer.seedS.retrained.json) is what the fine-tunes are compared with.
# Each run has THREADS (default 1) threads; JOBS (default 1) runs go side by side. Warm starts and their
# control run after all other runs.
#
# Train-short / test-long protocol (FLOATER Fig. 2): MAX_TRAIN_LEN=14 trains on pairs whose source has <= 14
# words, into its own data, checkpoint and result directories, and adds BLEU by source length (EDGES), beside
# which it puts the same model and seed trained on all lengths (ALL_LENGTHS_RUNS, default: OUT_DIR's parent's
# runs/, i.e. the study without MAX_TRAIN_LEN) when that run used the same recipe. MAX_TRAIN_TOKENS=18 caps
# training pairs in tokens instead: source and target each at most 18 sentencepiece pieces of the run's own model
# (the full training set's, trained first: the cap is exact), into data/checkpoint/result dirs of its own (_tok18).
# JOIN_TRAIN=1 (with MAX_TRAIN_TOKENS) adds consecutive training pairs joined up to the same cap
# (filter_by_length.py --join; dirs _tokN_joined): the train-short condition of the length probe, where inputs of
# several sentences are in the training distribution and only the positions past the cap are new.
#   MAX_TRAIN_TOKENS=32 JOIN_TRAIN=1 MODELS=transformer SEEDS=1 scripts/study/multi30k_study.sh
#
# Length probe (scripts/study/length_probe.py): right after its test decoding, every run translates test sentences
# joined k at a time (k = 1, 2, ... until beyond 3x its longest training source in tokens) and scores them by
# source length relative to that longest training source: runs/MODEL.seedS.probe.json (+ .probe.hyp), and
# probe_table.md (mean +- std over seeds). A finished run without its probe is probed when its checkpoint is here;
# PROBE_RETRAIN=1 trains one whose checkpoints are not here again with the same command (resumable) and probes that:
# its recorded result stays, and the probe (and the probe table's note) records how the retrained run's test
# hypotheses compare with the recorded run's. Without it such a run is skipped and says so; a fine-tune is not
# trained again for its probe (it would continue a transformer trained again, not the one it continued).
# It reads extrapolation only for JOIN_TRAIN runs: a model trained on single captions stops after one sentence
# at every length (results/multi30k_study/README.md).
#
# The runs take hours: to keep them on one fixed version of the code, run the script from a snapshot of a commit
# (git archive HEAD | tar -x -C SNAP; CODE_VERSION=<commit> DATA_DIR=... CKPT_ROOT=... OUT_DIR=... absolute), as
# scripts/study/study_lane.sh does: MODELS=rope scripts/study/study_lane.sh epochs20 (or main, tok32_joined).
#
# PROBE=0 leaves the probe out (a dry run that reads only each run's BLEU: untrained models' outputs run to the
# length cap). PROBE_PER_K (20) is the probe's --per-k: probes per k, from that
# many starting points; the probe table refuses runs probed with different values.
#
# Variables: PAIR (en-de), MODELS, SEEDS (1 2 3), EPOCHS (8), WARMUP (500 updates: with 250 the transformer failed
# on seed 3, results/multi30k_study/probe.md), LR (0.005), FT_EPOCHS (3), FT_WARMUP (50), AVG (3), FT_AVG (2),
# VOCAB, MODEL_ARGS (every encoder/decoder dimension), MAX_TOKENS (4096), BEAM (5), LENPEN (1), JOBS, THREADS,
# DEVICE (cpu, the default; cuda: training and decoding on the GPU, JOBS runs sharing it; not part of the recipe),
# MAX_TRAIN_LEN, MAX_TRAIN_TOKENS, JOIN_TRAIN, EDGES, ALL_LENGTHS_RUNS, SHAPE_K, TABLES_ONLY, PROBE (1),
# PROBE_PER_K (20), PROBE_RETRAIN (0), TABULATE (1; 0: no tables, e.g. runs side by side whose tables are made
# elsewhere), PREPARE_ONLY (1: the data, then exit), MULTI30K_DIR (../shared/data/multi30k); DATA_DIR, CKPT_ROOT, OUT_DIR (default
# data/multi30k_study_SRCTGT[_lenN|_tokN[_joined]], checkpoints/multi30k_study[_lenN|_tokN[_joined]],
# results/multi30k_study[/lenN|/tokN[_joined]]). A finished run records the recipe; asking for another recipe is an
# error.
set -euo pipefail

main() {
cd "$(dirname "$0")/../.."
PAIR=${PAIR:-en-de}
SRC=${PAIR%-*} TGT=${PAIR#*-}
MODELS=${MODELS:-"transformer relative floater floater_warm transformer_ft"}
# their Δ, adjoint, Xavier W2, and the whole bias re-solved every 400 forwards (= updates here) and reused detached
FLOATER_AUTHORS="--floater-dt 0.01 --floater-adjoint --floater-update-every 400 --floater-cache-whole-bias \
--floater-flow-init xavier"
SEEDS=${SEEDS:-"1 2 3"}
EPOCHS=${EPOCHS:-8} WARMUP=${WARMUP:-500} LR=${LR:-0.005}
FT_EPOCHS=${FT_EPOCHS:-3} FT_WARMUP=${FT_WARMUP:-50}
AVG=${AVG:-3} FT_AVG=${FT_AVG:-2}
VOCAB=${VOCAB:-10000} MAX_TOKENS=${MAX_TOKENS:-4096} BEAM=${BEAM:-5} LENPEN=${LENPEN:-1}
JOBS=${JOBS:-1} THREADS=${THREADS:-1}
DEVICE=${DEVICE:-cpu}
MAX_TRAIN_LEN=${MAX_TRAIN_LEN:-} MAX_TRAIN_TOKENS=${MAX_TRAIN_TOKENS:-} JOIN_TRAIN=${JOIN_TRAIN:-} SHAPE_K=${SHAPE_K:-50}
EDGES=${EDGES:-1,10,15,20,inf} PROBE_PER_K=${PROBE_PER_K:-20}
MODEL_ARGS=${MODEL_ARGS:-"--encoder-layers 4 --decoder-layers 4 --encoder-embed-dim 128 --decoder-embed-dim 128 \
--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 4 --decoder-attention-heads 4"}
MULTI30K_DIR=${MULTI30K_DIR:-../shared/data/multi30k}
suffix=${MAX_TRAIN_LEN:+_len$MAX_TRAIN_LEN}${MAX_TRAIN_TOKENS:+_tok$MAX_TRAIN_TOKENS}${JOIN_TRAIN:+_joined}
DATA=${DATA_DIR:-data/multi30k_study_$SRC$TGT$suffix}
CKPT_ROOT=${CKPT_ROOT:-checkpoints/multi30k_study$suffix}
OUT=${OUT_DIR:-results/multi30k_study${suffix:+/${suffix#_}}}

# --- check every input before anything is written
for v in EPOCHS WARMUP FT_EPOCHS FT_WARMUP AVG FT_AVG VOCAB MAX_TOKENS BEAM JOBS THREADS SHAPE_K PROBE_PER_K \
    ${MAX_TRAIN_LEN:+MAX_TRAIN_LEN} ${MAX_TRAIN_TOKENS:+MAX_TRAIN_TOKENS}; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || refuse "$v=${!v}: expected a positive integer"
done
[[ $DEVICE == cpu || $DEVICE == cuda ]] || refuse "DEVICE=$DEVICE: expected cpu or cuda"
export DEVICE  # train_small.sh and generate.sh: --cpu or not
[[ -z $MAX_TRAIN_LEN || -z $MAX_TRAIN_TOKENS ]] ||
  refuse "MAX_TRAIN_LEN=$MAX_TRAIN_LEN and MAX_TRAIN_TOKENS=$MAX_TRAIN_TOKENS: choose one cap (words or tokens)"
[[ $LR =~ ^[0-9]*\.?[0-9]+([eE]-?[0-9]+)?$ ]] || refuse "LR=$LR: expected a positive number"
[[ $LENPEN =~ ^[0-9]*\.?[0-9]+$ ]] || refuse "LENPEN=$LENPEN: expected a number"
[[ -z ${TABLES_ONLY:-} || $TABLES_ONLY == 1 ]] || refuse "TABLES_ONLY=$TABLES_ONLY: expected 1 (or unset)"
[[ -z $JOIN_TRAIN || $JOIN_TRAIN == 1 ]] || refuse "JOIN_TRAIN=$JOIN_TRAIN: expected 1 (or unset)"
PROBE=${PROBE:-1}
TABULATE=${TABULATE:-1}
[[ $TABULATE == 0 || $TABULATE == 1 ]] || refuse "TABULATE=$TABULATE: expected 1 (the tables after each run) or 0 (none)"
[[ $PROBE == 0 || $PROBE == 1 ]] || refuse "PROBE=$PROBE: expected 1 (the length probe after each run) or 0 (none)"
PROBE_RETRAIN=${PROBE_RETRAIN:-0}
[[ $PROBE_RETRAIN == 0 || $PROBE_RETRAIN == 1 ]] ||
  refuse "PROBE_RETRAIN=$PROBE_RETRAIN: expected 1 (train a finished run whose checkpoints are gone again to probe it) or 0"
[[ $PROBE_RETRAIN == 0 || $PROBE == 1 ]] || refuse "PROBE_RETRAIN=1 trains runs again for their probe: it needs PROBE=1"
[[ -z $JOIN_TRAIN || -n $MAX_TRAIN_TOKENS ]] ||
  refuse "JOIN_TRAIN=1 needs MAX_TRAIN_TOKENS (joins are capped in tokens), e.g. MAX_TRAIN_TOKENS=32 JOIN_TRAIN=1"
[ -n "${SEEDS// /}" ] || refuse "SEEDS is empty: expected positive integers, e.g. \"1 2 3\""
for s in $SEEDS; do [[ $s =~ ^[1-9][0-9]*$ ]] || refuse "SEEDS=\"$SEEDS\": expected positive integers, got '$s'"; done
[ -n "${MODELS// /}" ] || refuse "MODELS is empty: expected some of $(python -m fairseq_plugins models) floater_warm transformer_ft floater_authors"
TABLE=" $(python -m fairseq_plugins models) "  # the table of schemes: fairseq_plugins/schemes.py
for m in $MODELS; do
  case $m in
    floater_warm|transformer_ft) [[ " $MODELS " == *" transformer "* ]] ||
      refuse "MODELS=\"$MODELS\": $m starts from the transformer of the same seed, so MODELS must list transformer" ;;
    floater_authors) ;;
    *) [[ $TABLE == *" $m "* ]] ||
      refuse "MODELS=\"$MODELS\": unknown model '$m' (expected one of${TABLE}floater_warm transformer_ft floater_authors)" ;;
  esac
done
(( AVG <= EPOCHS )) || refuse "AVG=$AVG: expected at most EPOCHS=$EPOCHS checkpoints to average"
(( FT_AVG <= FT_EPOCHS )) || refuse "FT_AVG=$FT_AVG: expected at most FT_EPOCHS=$FT_EPOCHS checkpoints to average"
for split in train val test_2016_flickr; do
  for lang in "$SRC" "$TGT"; do
    [ -s "$MULTI30K_DIR/$split.$lang" ] ||
      refuse "MULTI30K_DIR=$MULTI30K_DIR lacks $split.$lang (expected train, val, test_2016_flickr .$SRC/.$TGT)"
  done
done
command -v flock > /dev/null || refuse "flock not found: expected util-linux's flock (it keeps two study processes off one run)"
export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS
# the code each run was trained with, recorded in its result (CODE_VERSION: e.g. the commit of a snapshot)
CODE=${CODE_VERSION:-"$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"}
[ -z "$(git status --porcelain -- fairseq_plugins 2>/dev/null)" ] || CODE="$CODE+uncommitted fairseq_plugins changes"

# --- data: full training set (or its short pairs), val for validation, test_2016_flickr for test
mkdir -p "$DATA/raw" "$OUT/runs" "$CKPT_ROOT"
if [ ! -s "$DATA/raw/test.$TGT" ]; then
  if [ -n "$MAX_TRAIN_LEN" ]; then
    python scripts/filter_by_length.py --max-words "$MAX_TRAIN_LEN" \
      --src "$MULTI30K_DIR/train.$SRC" --tgt "$MULTI30K_DIR/train.$TGT" --out-prefix "$DATA/raw/train"
  elif [ -n "$MAX_TRAIN_TOKENS" ]; then
    # the run's sentencepiece model is the full training set's (prepare_bitext.sh keeps an existing spm.model),
    # so that the cap holds exactly for the pieces the model is trained on
    if [ ! -s "$DATA/spm.model" ]; then
      rm -rf "$DATA/spm.tmp" && mkdir -p "$DATA/spm.tmp"
      python scripts/spm_train.py --input "$MULTI30K_DIR/train.$SRC" "$MULTI30K_DIR/train.$TGT" \
        --model-prefix "$DATA/spm.tmp/spm" --vocab-size "$VOCAB" --max-sentences "${SPM_TRAIN_SENTENCES:-2000000}"
      mv "$DATA/spm.tmp/spm.vocab" "$DATA/spm.vocab" && mv "$DATA/spm.tmp/spm.model" "$DATA/spm.model"
      rm -rf "$DATA/spm.tmp"
    fi
    python scripts/filter_by_length.py --max-tokens "$MAX_TRAIN_TOKENS" --spm "$DATA/spm.model" ${JOIN_TRAIN:+--join} \
      --src "$MULTI30K_DIR/train.$SRC" --tgt "$MULTI30K_DIR/train.$TGT" --out-prefix "$DATA/raw/train"
  else
    for lang in "$SRC" "$TGT"; do copy "$MULTI30K_DIR/train.$lang" "$DATA/raw/train.$lang"; done
  fi
  for lang in "$SRC" "$TGT"; do
    copy "$MULTI30K_DIR/val.$lang" "$DATA/raw/valid.$lang"
    copy "$MULTI30K_DIR/test_2016_flickr.$lang" "$DATA/raw/test.$lang"  # last: marks the step done
  done
fi
bash scripts/prepare_bitext.sh "$DATA/raw" "$DATA" "$SRC" "$TGT" "$VOCAB"
[ -z "${PREPARE_ONLY:-}" ] || exit 0  # the data alone (scripts/gpu/campaign.py, before its runs start side by side)
RECIPE="epochs=$EPOCHS warmup=$WARMUP lr=$LR ft_epochs=$FT_EPOCHS ft_warmup=$FT_WARMUP avg=$AVG ft_avg=$FT_AVG \
vocab=$VOCAB max_tokens=$MAX_TOKENS beam=$BEAM lenpen=$LENPEN max_train_len=${MAX_TRAIN_LEN:-none} \
${MAX_TRAIN_TOKENS:+max_train_tokens=$MAX_TRAIN_TOKENS }${JOIN_TRAIN:+join_train=1 }model_args=$MODEL_ARGS"

# --- the runs, in the order scripts/study/study.py plan gives: everything trained from scratch, then (once all of
# those have finished) what starts from a trained transformer; JOBS of them side by side
failed=0 phase= plan=
# TABLES_ONLY=1: no run, only the tables and plots again from every finished run in OUT_DIR (and MODELS and SEEDS:
# a model or seed asked for without a run is listed as missing)
[ -n "${TABLES_ONLY:-}" ] || plan=$(python scripts/study/study.py plan --models "$MODELS" --seeds "$SEEDS")
# the table's tiny architecture and flags of every model of the table in the plan, asked once (each call imports
# torch); run_one reads those it builds from the table
declare -A TABLE_ARCH=()
table_models=()
for m in $(awk '!seen[$2]++ { print $2 }' <<< "$plan"); do
  [[ $TABLE != *" $m "* ]] || table_models+=("$m")
done
if (( ${#table_models[@]} )); then
  mapfile -t lines < <(python -m fairseq_plugins arch "${table_models[@]}")
  (( ${#lines[@]} == ${#table_models[@]} )) || die "python -m fairseq_plugins arch ${table_models[*]}: failed"
  for i in "${!table_models[@]}"; do TABLE_ARCH[${table_models[$i]}]=${lines[$i]}; done
fi
while read -r next m s; do
  [ -n "$next" ] || continue
  if [ "$next" != "$phase" ]; then
    while (( $(jobs -rp | wc -l) > 0 )); do wait -n || failed=$((failed + 1)); done
    phase=$next
  fi
  while (( $(jobs -rp | wc -l) >= JOBS )); do wait -n || failed=$((failed + 1)); done
  run_one "$m" "$s" &
done <<< "$plan"
while (( $(jobs -rp | wc -l) > 0 )); do wait -n || failed=$((failed + 1)); done

# --- table (partial while runs are missing), validation curves, BLEU by length
echo
[ "$TABULATE" = 0 ] || tabulate
echo "results: $OUT/"
(( failed == 0 )) || die "$failed run(s) failed: see the logs above"
}

die() { echo "multi30k_study.sh: $*" >&2; exit 1; }
# a refused input exits 2, a failed run 1: a caller that retries failures (scripts/study/study_lane.sh) tells them apart
refuse() { echo "multi30k_study.sh: $*" >&2; exit 2; }

# The tables from every finished run (after each run too, so that they are current while the study goes on).
tabulate() {
  # every finished run in OUT/runs, not only MODELS and SEEDS: a run of a few models into a shared OUT_DIR must not
  # rewrite its tables from those alone; PARTIAL counts what is missing from all of them. One process (study.py
  # tabulate): the claims table, probe_table.md, portable paths, the validation curves
  # train-short runs: the table again on the test sentences within and beyond the training lengths
  local sentences split=() ft=
  [ -z "$MAX_TRAIN_LEN" ] || split=(--split-src "$DATA/raw/test.$SRC" --split-at "$MAX_TRAIN_LEN")
  sentences=$(awk 'END { print NR }' "$DATA/raw/test.$TGT")
  ! compgen -G "$OUT/runs/floater_warm.seed*.json" > /dev/null && ! compgen -G "$OUT/runs/transformer_ft.seed*.json" \
    > /dev/null || ft=" (fine-tunes: $FT_EPOCHS more)"
  python scripts/study/study.py tabulate --runs "$OUT/runs" --models "$MODELS" --seeds "$SEEDS" --pair "$PAIR" \
    --sentences "$sentences" --out "$OUT" --probe-data "$DATA" \
    --source-dependence "$OUT/source_dependence" "${split[@]}" \
    ${split:+--split-note "longer than any training sentence"} --plot-title "Multi30k $SRC-$TGT, $EPOCHS epochs$ft, \
warm-up $WARMUP${MAX_TRAIN_LEN:+, trained on <= $MAX_TRAIN_LEN words}: validation loss, one panel per model, one line \
per seed" || return 1
  [ -n "$MAX_TRAIN_LEN" ] || return 0
  local every models seeds
  every=$(python scripts/study/study.py every-run --runs "$OUT/runs" --models "$MODELS" --seeds "$SEEDS") || return 1
  models=${every%%$'\n'*} seeds=${every#*$'\n'}
  # BLEU by source length: every finished run, and the same model and seed trained on all lengths with this
  # recipe (ALL_LENGTHS_RUNS: the study's results without MAX_TRAIN_LEN), which saw the long buckets in training
  local all_lengths=${ALL_LENGTHS_RUNS:-$(dirname "$OUT")/runs} m s name other inputs=() compared=0 differ=0
  for m in $models; do
    for s in $seeds; do
      name=$m.seed$s
      [ -s "$OUT/runs/$name.json" ] || continue
      length_score "$OUT/runs/$name.hyp" "$m" "$name" "$OUT/runs/$name.length.json"
      inputs+=("$OUT/runs/$name.length.json")
      [ -s "$all_lengths/$name.json" ] || continue
      other=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["recipe"])' "$all_lengths/$name.json")
      if [ "$other" == "${RECIPE/max_train_len=$MAX_TRAIN_LEN /max_train_len=none }" ]; then
        length_score "$all_lengths/$name.hyp" "$m" "$name" "$OUT/all_lengths/$name.length.json" \
          --note "trained on all lengths"
        inputs+=("$OUT/all_lengths/$name.length.json")
        compared=$((compared + 1))
      else
        rm -f "$OUT/all_lengths/$name.length.json"
        differ=$((differ + 1))
        echo "== $name trained on all lengths: $all_lengths/$name.json has another recipe; not compared"
      fi
    done
  done
  (( ${#inputs[@]} )) || return 0
  if (( compared && !differ )); then  # the references' own table, split at the same length
    python scripts/study/study.py table --runs "$all_lengths" --models "$models" --seeds "$seeds" --pair "$PAIR" \
      --sentences "$sentences" --out "$OUT/all_lengths" \
      --source-dependence "$(dirname "$all_lengths")/source_dependence" \
      --ref "$DATA/raw/test.$TGT" "${split[@]}" --split-note "seen in training" > /dev/null
  else
    rm -f "$OUT/all_lengths/table.md" "$OUT/all_lengths/summary.json"
  fi
  python scripts/length_eval.py table "${inputs[@]}" --mean --out "$OUT/length_table.md" > /dev/null
  python scripts/length_eval.py table "${inputs[@]}" --out "$OUT/length_runs.md" > /dev/null
  python scripts/length_eval.py plot "${inputs[@]}" --mean --out "$OUT/length.png" --train-max-len "$MAX_TRAIN_LEN" \
    --title "Multi30k $SRC-$TGT: BLEU by source length (trained on <= $MAX_TRAIN_LEN words)" > /dev/null
}

length_score() {  # HYP MODEL NAME OUT [--note NOTE]: sacreBLEU per source-length bucket of test
  python scripts/length_eval.py score --hyp "$1" --model "$2" --name "$3" --out "$4" "${@:5}" --edges "$EDGES" \
    --src "$DATA/raw/test.$SRC" --ref "$DATA/raw/test.$TGT" > /dev/null
}

copy() { cp "$1" "$2.tmp" && mv "$2.tmp" "$2"; }

probe() {  # RUN_DIR MODEL NAME OUT [length_probe.py score options]: the length probe of the run's evaluated
  # checkpoint (its log: RUN_DIR/train.log)
  echo "== $3: length probe" >> "$1/train.log"
  python scripts/study/length_probe.py score --data "$DATA" --checkpoint "$1/average.pt" --model "$2" --name "$3" \
    --src "$SRC" --tgt "$TGT" --beam "$BEAM" --lenpen "$LENPEN" --per-k "$PROBE_PER_K" --out "$4" "${@:5}" \
    >> "$1/train.log" 2>&1 ||
    { echo "== $3: length probe failed; last lines of $1/train.log:" >&2; tail -3 "$1/train.log" >&2; return 1; }
}

# One (model, seed): train (resuming), average, translate test, score. Its own log: CKPT_ROOT/MODEL.seedS/train.log.
run_one() {
  local model=$1 seed=$2
  local name=$model.seed$seed
  local dir=$CKPT_ROOT/$name result=$OUT/runs/$name.json
  local again= probe_only= reprobe= decision
  # shellcheck disable=SC2046
  decision=$(python scripts/study/study.py decide --model "$model" --seed "$seed" --models "$MODELS" --out "$OUT" \
    --run-dir "$dir" --recipe "$RECIPE" $([ "$PROBE" = 0 ] || echo --probe) \
    $([ "$PROBE_RETRAIN" = 0 ] || echo --probe-retrain)) || return 1
  case $decision in
    skip) echo "== $name: skipped (done: $result)"; return 0 ;;
    unprobed) echo "== $name: skipped (done: $result); it has no length probe and its checkpoints are not here:" \
      "PROBE_RETRAIN=1 trains it again with the same command to probe it"; return 0 ;;
    unprobed-fine-tune) echo "== $name: skipped (done: $result); it has no length probe and its checkpoints are" \
      "not here (a fine-tune is not trained again for its probe)"; return 0 ;;
    probe) probe_only=1 ;;  # finished before the length probe existed; its evaluated checkpoint is here
    reprobe) reprobe=1  # trained again with the same command, then probed; the recorded result is kept
      echo "== $name: done ($result), without its length probe, and its checkpoints are not here: trained again" \
        "with the same command to probe it" ;;
    retrain) again=1  # trained again with the same command; the recorded result is kept
      echo "== $name: done ($result), but its checkpoints are not here and its fine-tunes need them" ;;
  esac
  mkdir -p "$dir"
  # two study processes must never train one run into the same directory (the lock goes with this subshell)
  local lock
  exec {lock}> "$dir/.lock"
  flock -n "$lock" || { echo "== $name: another study process is running it ($dir/.lock): left to that one"; return 0; }
  if [ -n "$probe_only" ]; then
    echo "== $name: done ($result); its length probe now"
    probe "$dir" "$model" "$name" "$OUT/runs/$name.probe.json" || return 1
    [ "$TABULATE" = 0 ] || tabulate > /dev/null
    return 0
  fi
  local arch flags epochs=$EPOCHS warmup=$WARMUP lr=$LR avg=$AVG extra=() offset=0 origin= shape_k=
  case $model in
    relative) arch=relative_transformer_tiny extra=(--max-relative-positions 16) ;;  # Shaw et al. base: k = 16
    # shellcheck disable=SC2206
    floater_authors) arch=floater_transformer_tiny extra=($FLOATER_AUTHORS) ;;
    floater_warm|transformer_ft)
      local source=$CKPT_ROOT/transformer.seed$seed/checkpoint_last.pt
      [ -s "$OUT/runs/transformer.seed$seed.json" ] ||
        { echo "== $name: its transformer (seed $seed) has not finished: $OUT/runs/transformer.seed$seed.json missing" >&2; return 1; }
      offset=$(python scripts/study/study.py updates "$OUT/runs/transformer.seed$seed.json")
      origin="the run recorded in runs/transformer.seed$seed.json"
      [ ! -s "$CKPT_ROOT/transformer.seed$seed/retrain.txt" ] || origin=$(cat "$CKPT_ROOT/transformer.seed$seed/retrain.txt")
      # the paper's protocol: continue from the trained transformer at half its peak lr, then average
      epochs=$FT_EPOCHS warmup=$FT_WARMUP avg=$FT_AVG lr=$(python -c "print($LR / 2)")
      if [ $model = floater_warm ]; then
        # the base floater arch: it takes IN's dimensions as they are (MODEL_ARGS sets every one of them)
        arch=floater_transformer
        [ -s "$dir/warm_start.pt" ] || python scripts/transformer_to_floater.py "$source" "$dir/warm_start.pt" \
          --arch $arch >> "$dir/train.log" 2>&1 || { tail -3 "$dir/train.log" >&2; return 1; }
        extra=(--finetune-from-model "$dir/warm_start.pt")
      else
        arch=transformer_tiny extra=(--finetune-from-model "$source")
      fi ;;
    *) read -r arch flags <<< "${TABLE_ARCH[$model]}"  # the table's tiny arch and flags
       # shellcheck disable=SC2206
       extra=($flags)
       [ "$model" != shape ] || { shape_k=$SHAPE_K; extra+=(--shape-max-shift "$shape_k"); } ;;
  esac
  echo "== $name: training $arch (log: $dir/train.log)"
  # shellcheck disable=SC2086
  LR=$lr WARMUP=$warmup DROPOUT=0.3 MAX_TOKENS=$MAX_TOKENS EPOCHS=$epochs SEED=$seed KEEP_LAST=$avg LOG_INTERVAL=50 \
    bash scripts/train_small.sh "$DATA/bin" "$dir" "$arch" $MODEL_ARGS "${extra[@]}" >> "$dir/train.log" 2>&1 ||
    { echo "== $name: training failed; last lines of $dir/train.log:" >&2; tail -5 "$dir/train.log" >&2; return 1; }
  python scripts/average_checkpoints.py --inputs "$dir" --num-epoch-checkpoints "$avg" --output "$dir/average.pt" \
    >> "$dir/train.log" 2>&1 || { tail -3 "$dir/train.log" >&2; return 1; }
  REUSE=1 SRC=$SRC TGT=$TGT BEAM=$BEAM LENPEN=$LENPEN bash scripts/generate.sh "$DATA" "$dir/average.pt" test \
    "$dir/test.json" >> "$dir/train.log" 2>&1 || { tail -3 "$dir/train.log" >&2; return 1; }
  if [ -n "$reprobe" ]; then
    # reprobe.txt, not retrain.txt: that one says a retraining's own result (runs/NAME.retrained.json) exists
    python scripts/study/study.py retrain-note --recorded "$result" --test-json "$dir/test.json" \
      --out "$dir/reprobe.txt" | sed "s/^/== $name: /"
    probe "$dir" "$model" "$name" "$OUT/runs/$name.probe.json" --trained-again "$(cat "$dir/reprobe.txt")" || return 1
    [ "$TABULATE" = 0 ] || tabulate > /dev/null
    return 0
  fi
  [ "$PROBE" = 0 ] || probe "$dir" "$model" "$name" "$OUT/runs/$name${again:+.retrained}.probe.json" || return 1
  local record=$result
  if [ -n "$again" ]; then
    # the fine-tunes are compared with the run they continue: on another machine it can differ from the record
    record=$OUT/runs/$name.retrained.json
  else
    # how much the model uses its source (a failed run can have a plausible loss and fluent, unrelated output)
    python scripts/source_dependence.py "$DATA/bin" "$dir/average.pt" --json "$OUT/source_dependence/$name.json" \
      >> "$dir/train.log" 2>&1 || { tail -3 "$dir/train.log" >&2; return 1; }
  fi
  python scripts/study/study.py run-result --model "$model" --seed "$seed" --test-json "$dir/test.json" \
    --ref "$DATA/raw/test.$TGT" --train-log "$dir/train.log" --out "$record" \
    --meta "recipe=$RECIPE" "arch=$arch" "epochs=$epochs" "lr=$lr" "averaged=$avg" "update_offset=$offset" \
    "code=$CODE" "threads=$THREADS" "jobs=$JOBS" "device=$DEVICE" ${origin:+"source=$origin"} \
    ${shape_k:+"shape_max_shift=$shape_k"} |
    sed "s/^/== /"
  if [ -n "$again" ]; then
    python scripts/study/study.py retrain-note --recorded "$result" --test-json "$dir/test.json" \
      --out "$dir/retrain.txt" | sed "s/^/== $name: /"
    return 0
  fi
  [ "$TABULATE" = 0 ] || tabulate > /dev/null
}

main "$@"; exit $?
