#!/usr/bin/env bash
# The A/B replays behind the README's results: both shared traces, the synthetic paper-prod
# workload and the short-output code-completion preset, G=8 (and 4, 8, 16 at B=32 saturated),
# B=32 and 64, saturated and at 1.1x capacity, 30 paired windows (4 G B requests each) with the
# noise floor, every router and estimator. Writes runs/ab/<workload>-b<B>-<mode>/.
#   benchmarks/studies/ab_study.sh [workload ...]    (default: azure mooncake paper-prod code-completion)
# Smaller studies (environment): AB_OUT (folder, default runs/ab), AB_ARMS (comma-separated
# arms), AB_WINDOWS (default 30), AB_WINDOW_REQUESTS (default 4 G B), AB_REFERENCE (ratios and
# noise floor; default count-jsq), AB_REPEATS (the older scheme: windows of half the trace), AB_SLOTS (default "32 64"), AB_MODES (default "saturate load"),
# AB_SCALING=0 (G = 8 only), AB_NO_MLFLOW=1 (no MLflow runs), AB_COST (a cost preset or file; default
# paper-dsv3).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BR=.venv/bin/balanceroute
ARMS="${AB_ARMS:-count-jsq,token-jsq,br0,brh-paper:oracle,brh:none,brh:survival,brh:exactmatch,brh:gbdt,brh:hazard,brh:oracle}"
OUT="${AB_OUT:-runs/ab}"
WINDOWING=(--windows "${AB_WINDOWS:-30}")
[ -n "${AB_WINDOW_REQUESTS:-}" ] && WINDOWING+=(--window-requests "$AB_WINDOW_REQUESTS")
[ -n "${AB_REPEATS:-}" ] && WINDOWING=(--repeats "$AB_REPEATS")
[ -n "${AB_REFERENCE:-}" ] && WINDOWING+=(--reference "$AB_REFERENCE")
declare -A SOURCE=(
    [azure]="--trace ../shared/data/azure_llm_2023_conv.csv"
    [mooncake]="--trace ../shared/data/mooncake_conversation.jsonl"
    [paper-prod]="--preset paper-prod --requests 20000"
    [code-completion]="--preset code-completion --requests 20000"
)
WORKLOADS=("$@")
[ ${#WORKLOADS[@]} -eq 0 ] && WORKLOADS=(azure mooncake paper-prod code-completion)
mkdir -p "$OUT"
for wl in "${WORKLOADS[@]}"; do
    for b in ${AB_SLOTS:-32 64}; do
        for mode in ${AB_MODES:-saturate load}; do
            out="$OUT/$wl-b$b-$mode"
            [ -f "$out/summary.json" ] && continue
            workers=8
            [ "$b" = 32 ] && [ "$mode" = saturate ] && [ "${AB_SCALING:-1}" != 0 ] && workers=4,8,16
            flag="--saturate"
            [ "$mode" = load ] && flag="--load 1.1"
            echo "== $out" >&2
            # shellcheck disable=SC2086
            $BR ab ${SOURCE[$wl]} ${AB_COST:+--cost "$AB_COST"} --arms "$ARMS" --workers "$workers" --slots "$b" \
                "${WINDOWING[@]}" $flag --jobs 2 ${AB_NO_MLFLOW:+--no-mlflow} --out "$out" > "$out.log" 2>&1 || {
                echo "failed: see $out.log" >&2; exit 1; }
        done
    done
done
