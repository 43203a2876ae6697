#!/usr/bin/env bash
# Starts one CPU vLLM server in a session of its own at low priority; prints its process id.
# Usage: start_rank.sh VENV MODEL_DIR PORT LOG [extra vLLM flags...]
# OMP_BIND is VLLM_CPU_OMP_THREADS_BIND: one CPU list per engine, '|'-separated ("0|1" for
# --data-parallel-size 2: a single "0" leaves the second engine without CPUs and it fails).
#
# Low priority means the session's autogroup, not only the processes' nice: with autogroup
# scheduling on (/proc/sys/kernel/sched_autogroup_enabled), a new session is a scheduling group of
# its own and a process's nice weighs only inside it. vLLM's engine and worker spin on
# sched_yield between steps, and at group nice 0 a generating rank starved other sessions (the
# test client, the other rank's API server) for the whole generation (docs/results.md,
# "Conformance against vLLM").
set -euo pipefail
VENV="$1"; MODEL="$2"; PORT="$3"; LOG="$4"; shift 4
NICE="${CONFORMANCE_RANK_NICE:-10}"
# shellcheck disable=SC2016  # $0, $1 and $@ expand in the child shell
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="${OMP_BIND:-0}" VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
    setsid sh -c 'echo "$1" 2>/dev/null >/proc/self/autogroup; shift; exec nice -n "$0" "$@"' \
    "$NICE" "$NICE" "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny --load-format dummy --dtype bfloat16 \
    --max-num-seqs 8 --max-model-len 8192 --enforce-eager --host 127.0.0.1 --port "$PORT" \
    "$@" >"$LOG" 2>&1 </dev/null &
echo $!
