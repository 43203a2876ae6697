#!/usr/bin/env bash
# Why knowing the future hurt BR-H on short outputs, and what the turnover-aware discount does
# (docs/design.md, "Short outputs"; figures in docs/results.md). Replays the code-completion
# preset (and Mooncake at B = 64) with the oracle and without prediction at several fixed
# discounts and horizons, then prints every arm's median paired ratio to brh:none:
#   benchmarks/studies/short_outputs.sh            (writes runs/short/<run>/)
#   .venv/bin/python benchmarks/studies/ab_tables.py runs/short --reference brh:none
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
BR=.venv/bin/balanceroute
OUT="${SHORT_OUT:-runs/short}"
REPEATS="${SHORT_REPEATS:-5}"
fixed() { echo "brh:$1{auto_gamma=None;gamma=$2}"; }
ARMS="brh:none,brh:oracle"
for g in 0.25 0.5 0.9; do ARMS="$ARMS,$(fixed oracle $g),$(fixed none $g)"; done
ARMS="$ARMS,brh:oracle{auto_gamma=None;gamma=0.5;refill=false},brh:oracle{horizon=2}"
mkdir -p "$OUT"
for b in 32 64; do
    out="$OUT/code-completion-b$b-saturate"
    [ -f "$out/summary.json" ] || $BR ab --preset code-completion --requests 20000 --arms "$ARMS" \
        --workers 8 --slots "$b" --repeats "$REPEATS" --saturate --jobs 2 --no-mlflow \
        --reference brh:none --out "$out" > "$out.log" 2>&1
done
# Mooncake at B = 64: release 0.1.0's discount there was 1 - 30 / 343 = 0.91
MC="brh:none,brh:oracle,$(fixed oracle 0.91),$(fixed none 0.91)"
out="$OUT/mooncake-b64-saturate"
[ -f "$out/summary.json" ] || $BR ab --trace ../shared/data/mooncake_conversation.jsonl \
    --arms "$MC" --workers 8 --slots 64 --repeats "$REPEATS" --saturate --jobs 2 --no-mlflow \
    --reference brh:none --out "$out" > "$out.log" 2>&1
echo "done: .venv/bin/python benchmarks/studies/ab_tables.py $OUT --reference brh:none" >&2
