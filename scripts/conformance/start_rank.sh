#!/usr/bin/env bash
# Starts one CPU vLLM server in a process group of its own, niced; prints its process id.
# Usage: start_rank.sh VENV MODEL_DIR PORT LOG [extra vLLM flags...]
# OMP_BIND is VLLM_CPU_OMP_THREADS_BIND: one CPU list per engine, '|'-separated ("0|1" for
# --data-parallel-size 2: a single "0" leaves the second engine without CPUs and it fails).
set -euo pipefail
VENV="$1"; MODEL="$2"; PORT="$3"; LOG="$4"; shift 4
VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND="${OMP_BIND:-0}" VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 \
    setsid nice -n 10 "$VENV/bin/python" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL" --served-model-name tiny --load-format dummy --dtype bfloat16 \
    --max-num-seqs 8 --max-model-len 8192 --enforce-eager --host 127.0.0.1 --port "$PORT" \
    "$@" >"$LOG" 2>&1 </dev/null &
echo $!
