#!/usr/bin/env bash
# The main job on the embedded default: a synthetic workload, estimators trained into the
# SQLite MLflow store in this folder, evaluated, and an A/B replay of every router and
# estimator on later requests none of the models saw.
#
#   scripts/demo.sh                      # synthetic paper-prod workload
#   scripts/demo.sh --trace FILE         # your own trace (Azure, Mooncake, BurstGPT, canonical)
#   scripts/demo.sh --requests 30000     # a bigger synthetic workload
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRACE=""
REQUESTS=16000
PRESET="paper-prod"
while [ $# -gt 0 ]; do
    case "$1" in
        --trace) TRACE="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"; shift 2 ;;
        --requests) REQUESTS="$2"; shift 2 ;;
        --preset) PRESET="$2"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "demo.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
WORK="${BALANCEROUTE_DEMO_DIR:-runs/demo}"
mkdir -p "$WORK"
export MLFLOW_TRACKING_URI="${MLFLOW_TRACKING_URI:-sqlite:///$ROOT/mlflow.db}"
started=$SECONDS
step() { printf '\n== %s (%ds)\n' "$1" "$((SECONDS - started))"; }

step "1/5 workload"
if [ -z "$TRACE" ]; then
    balanceroute trace synth --preset "$PRESET" --requests "$REQUESTS" --seed 0 --out "$WORK/trace.parquet"
    TRACE="$WORK/trace.parquet"
fi
# Earlier half trains and validates the estimators; the later half is replayed in the A/B.
balanceroute trace split "$TRACE" --at 0.5 --head "$WORK/history.parquet" --tail "$WORK/replay.parquet"

step "2/5 train survival, exactmatch and gbdt into $MLFLOW_TRACKING_URI"
# Each estimator is scored on the later half of the history by a copy fitted on the earlier half,
# and registered fitted on all of it; the twin's paired test (8 windows of 2,048 requests at
# G=8, B=32 over both halves, each replayed by a copy fitted on the other) measures the prior
# that is registered with the model: the A/B's default brh starts from it.
balanceroute train --trace "$WORK/history.parquet" --experiment balanceroute-demo \
    --train-fraction 0.5 --twin-group 8x32 --twin-windows 8 --out "$WORK/models"

step "3/5 evaluate them on the later requests"
balanceroute evaluate --trace "$WORK/replay.parquet" --estimator survival,exactmatch,gbdt \
    --out "$WORK/evaluate"

step "4/5 A/B replay of every router and estimator (saturated decode tier, G=8, B=32)"
M="models:/completion-predictor"
# The default brh lets its twin decide how much to trust each estimator, starting from the
# model's prior; the last learned arm is gbdt used as it is (no twin, no guard), so the table
# shows what the prediction is worth.
balanceroute ab --trace "$WORK/replay.parquet" \
    --arms "count-jsq,token-jsq,br0,brh:none,brh:survival@$M@survival,brh:exactmatch@$M@exactmatch,brh:gbdt@$M@gbdt,brh:gbdt@$M@gbdt{twin=false;guard=false},brh:oracle" \
    --workers 8 --slots 32 --repeats 3 --saturate --jobs 2 --out "$WORK/ab"

step "5/5 done"
cat <<TXT
Report:      $WORK/ab/report.md
Plots:       $WORK/ab/trajectories.png, $WORK/ab/imbalance_distribution.png
Evaluation:  $WORK/evaluate/metrics.json
MLflow UI:   .venv/bin/mlflow ui --backend-store-uri $MLFLOW_TRACKING_URI
TXT
