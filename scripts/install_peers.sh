#!/usr/bin/env bash
# The peer routers (sglang-router, vllm-router) from the package index, in a cached virtual
# environment outside the clone: they are compared with the gateway, never a dependency.
#   scripts/install_peers.sh            # installs once, prints the venv's bin folder
# $BALANCEROUTE_PEERS_CACHE (default ~/.cache/balanceroute/peers) holds venv-<versions>/;
# PEERS_SGLANG_ROUTER / PEERS_VLLM_ROUTER pin other versions.
set -euo pipefail
CACHE="${BALANCEROUTE_PEERS_CACHE:-$HOME/.cache/balanceroute/peers}"
SG="${PEERS_SGLANG_ROUTER:-0.3.2}"
VL="${PEERS_VLLM_ROUTER:-0.1.17}"
VENV="$CACHE/venv-sglang-router-$SG-vllm-router-$VL"
PY="${PEERS_PYTHON:-python3}"
if [ ! -f "$VENV/.installed" ]; then  # written last: a broken install is redone
    mkdir -p "$CACHE"
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/pip" install -q "sglang-router==$SG" "vllm-router==$VL" >&2
    "$VENV/bin/sglang-router" launch --help >/dev/null
    "$VENV/bin/vllm-router" --help >/dev/null
    touch "$VENV/.installed"
fi
echo "$VENV/bin"
