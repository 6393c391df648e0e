#!/usr/bin/env bash
# A call of the converged Multi30k campaign on a machine with one GPU (scripts/gpu/campaign.py run): set up offline from
# the carried bundle where the image is bare, then the manifest's next runs side by side, within --budget seconds
# of this script's start (default 560: a call of at most 9.5 minutes, set-up included).
#
#   CODE_VERSION=$(git rev-parse --short HEAD) bash scripts/gpu/campaign.sh --out-dir "$OUT"
#   bash scripts/gpu/campaign.sh --dry-run --out-dir DIR --manifest M --results R    # on CPU, tiny: checks the call
#
# Carry .gpu_bundle (make gpu-bundle: fairseq, its pins and Multi30k) and, to skip the data's preparation there,
# data/multi30k_study_ende (made here by scripts/study/multi30k_study.sh with PREPARE_ONLY=1). Then, here:
# python scripts/gpu/campaign.py ingest DIR --lease NAME.
set -euo pipefail
cd "$(dirname "$0")/../.."
export CAMPAIGN_STARTED=${CAMPAIGN_STARTED:-$(date +%s.%N)}
source scripts/gpu/offline_setup.sh CAMPAIGN_SETUP_SECONDS  # a bare GPU image: set up from the bundle
global=() rest=()
while (( $# )); do  # the campaign's own options go before the subcommand
  case $1 in
    --manifest|--results|--multi30k) global+=("$1" "$2"); shift 2 ;;
    *) rest+=("$1"); shift ;;
  esac
done
exec python scripts/gpu/campaign.py ${global[@]+"${global[@]}"} run ${rest[@]+"${rest[@]}"}
