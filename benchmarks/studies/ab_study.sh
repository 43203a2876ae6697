#!/usr/bin/env bash
# The A/B replays behind the README's results: both shared traces and the synthetic paper-prod
# workload, G=8 (and 4, 8, 16 at B=32 saturated), B=32 and 64, saturated and at 1.1x capacity,
# 5 repeats, every router and estimator. Writes runs/ab/<workload>-b<B>-<mode>/.
#   benchmarks/studies/ab_study.sh [workload ...]    (default: azure mooncake paper-prod)
# Environment: ARMS (the arms), AB_DIR (instead of runs/ab), SCALING=0 (G = 8 only), AB_FLAGS
# (more flags for every run, e.g. --no-mlflow).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BR=.venv/bin/balanceroute
ARMS="${ARMS:-count-jsq,token-jsq,br0,brh-paper:oracle,brh:none,brh:survival,brh:exactmatch,brh:gbdt,brh:hazard,brh:oracle}"
AB_DIR="${AB_DIR:-runs/ab}"
declare -A SOURCE=(
    [azure]="--trace ../shared/data/azure_llm_2023_conv.csv"
    [mooncake]="--trace ../shared/data/mooncake_conversation.jsonl"
    [paper-prod]="--preset paper-prod --requests 20000"
)
WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -eq 0 ] && WORKLOADS=(azure mooncake paper-prod)
mkdir -p "$AB_DIR"
for wl in "${WORKLOADS[@]}"; do
    for b in 32 64; do
        for mode in saturate load; do
            out="$AB_DIR/$wl-b$b-$mode"
            [ -f "$out/summary.json" ] && continue
            workers=8
            [ "$b" = 32 ] && [ "$mode" = saturate ] && [ "${SCALING:-1}" != 0 ] && workers=4,8,16
            flag="--saturate"
            [ "$mode" = load ] && flag="--load 1.1"
            echo "== $out" >&2
            # shellcheck disable=SC2086
            $BR ab ${SOURCE[$wl]} --arms "$ARMS" --workers "$workers" --slots "$b" \
                --repeats 5 $flag --jobs 2 ${AB_FLAGS:-} --out "$out" > "$out.log" 2>&1 || {
                echo "failed: see $out.log" >&2; exit 1; }
        done
    done
done
