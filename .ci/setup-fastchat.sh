#!/usr/bin/env bash
# Idempotent: make sure a working FastChat (fschat 0.2.36, CPU) venv and a tiny random Llama
# exist for the real-FastChat test tier (tests/real_fastchat/).
#
#   .ci/setup-fastchat.sh
#     venv:  ${HANGWATCH_FASTCHAT_VENV:-${HANGWATCH_CACHE:-/var/cache/hangwatch}/fastchat-venv}
#     model: ${HANGWATCH_FASTCHAT_MODEL:-${HANGWATCH_CACHE:-/var/cache/hangwatch}/fastchat-model/tiny-vicuna}
#
# Prints what it did. Exit 0 when the venv imports FastChat's controller, model worker and
# OpenAI API server and the model directory is complete. Only PyPI is needed: torch
# 2.13.0+cpu comes from the wheel in /opt/wheels. pip runs under `nice -n 10`: other
# developers run timing-sensitive tests on these 2-core machines.
#
# Pins (measured, docs in shared REAL-PARTS.md): transformers 5.x crashes workers
# (KeyError: 'factor'); with pydantic 2, streamed replies come back empty.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${HANGWATCH_CACHE:-/var/cache/hangwatch}"
VENV="${HANGWATCH_FASTCHAT_VENV:-$CACHE/fastchat-venv}"
MODEL="${HANGWATCH_FASTCHAT_MODEL:-$CACHE/fastchat-model/tiny-vicuna}"
PYTHON="${PYTHON:-python3}"
PINS=(torch==2.13.0 "fschat[model_worker]==0.2.36" transformers==4.57.6 "pydantic==1.10.*" fastapi==0.110.3)

log() { echo "setup-fastchat: $*"; }
# pip warns once per package that the local simple indexes lack it: noise, dropped.
quiet_pip() { nice -n 10 "$VENV/bin/pip" "$@" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }; }

venv_ok() {
    [ -x "$VENV/bin/python" ] || return 1
    # LOGDIR empty: importing FastChat's servers would write their log files into the cwd.
    LOGDIR= "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.metadata as md
assert md.version("fschat") == "0.2.36", md.version("fschat")
assert md.version("transformers") == "4.57.6"
assert md.version("pydantic").startswith("1.10.")
assert md.version("fastapi") == "0.110.3"
assert md.version("torch").startswith("2.13.0")
import fastchat.serve.controller, fastchat.serve.model_worker, fastchat.serve.openai_api_server  # noqa: F401
import tokenizers  # noqa: F401
PY
}

if venv_ok; then
    log "venv $VENV already works (fschat 0.2.36); nothing to install"
else
    if [ -e "$VENV" ]; then
        log "venv $VENV exists but is incomplete: removing it"
        rm -rf "$VENV"
    fi
    mkdir -p "$(dirname "$VENV")"
    log "creating venv $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
    pip_args=(--disable-pip-version-check -q)
    if [ -d /opt/wheels ]; then
        pip_args+=(--find-links /opt/wheels)
    fi
    # The environment, not an option: setuptools' own `pip wheel` for wavedrom's setup_requires
    # reads it too. A machine-wide constraints file (pip.conf's) still applies beside ours.
    constraints="$PWD/.ci/fastchat-constraints.txt"
    if [ -f /etc/xdg/pip/constraints.txt ]; then
        constraints="$constraints /etc/xdg/pip/constraints.txt"
    fi
    export PIP_CONSTRAINT="$constraints"
    start=$(date +%s)
    # torch first, so fschat's dependencies settle on the CPU wheel already on disk.
    log "pip install ${PINS[0]}"
    quiet_pip install "${pip_args[@]}" "${PINS[0]}"
    log "pip install ${PINS[1]}"
    quiet_pip install "${pip_args[@]}" "${PINS[0]}" "${PINS[1]}"
    # pip then warns that typer (left from fschat's unpinned fastapi) wants pydantic 2:
    # nothing here imports typer.
    log "pip install ${PINS[*]:2}"
    quiet_pip install "${pip_args[@]}" "${PINS[@]}"
    if ! venv_ok; then
        log "FAILED: $VENV does not import FastChat with the pinned versions" >&2
        "$VENV/bin/python" -c 'import fastchat.serve.model_worker, fastchat.serve.openai_api_server' >&2 || true
        exit 1
    fi
    log "installed fschat 0.2.36 into $VENV in $(( $(date +%s) - start )) s"
fi

# The tiny random Llama (seconds; the directory name contains "vicuna" so FastChat picks
# the vicuna conversation template).
if nice -n 10 "$VENV/bin/python" tests/real_fastchat/tinyvicuna.py --check "$MODEL" >/dev/null 2>&1; then
    log "model $MODEL already built"
else
    log "building tiny random Llama in $MODEL"
    nice -n 10 "$VENV/bin/python" tests/real_fastchat/tinyvicuna.py "$MODEL"
fi
log "ok: venv $VENV, model $MODEL"
