# Sourced by the make_env scripts (bash, set -euo pipefail, with $VENV set): what each of them needs.
#
# pip_install ARGS...  pip install into $VENV. pip's output is kept in a log and shown only when the
#                      install fails: these environments put packages in with --no-deps on purpose, so
#                      pip's resolver prints "ERROR: pip's dependency resolver ..." blocks about the
#                      requirements left out even when everything went in; those are not errors of ours.
# install_torch        torch==2.13.0 into $VENV from a wheel folder shared by every virtualenv, filled
#                      once from PyPI (PyPI's default Linux build of torch is CUDA-enabled, with its
#                      nvidia-* and triton wheels: about 3 GB, fetched once instead of once a virtualenv).
#                      The folder: $OTEL_LLM_WHEEL_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/wheels.

TORCH_PIN="torch==2.13.0"

pip_install() {
    local log
    log="$(mktemp)"
    if "$VENV/bin/python" -m pip install --disable-pip-version-check "$@" >"$log" 2>&1; then
        rm -f "$log"
        return 0
    fi
    cat "$log" >&2
    rm -f "$log"
    echo "pip install $* failed in $VENV (its output is above)" >&2
    return 1
}

install_torch() {
    local wheels="${OTEL_LLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/wheels}"
    mkdir -p "$wheels"
    # Offline first: a folder filled by an earlier build needs no index at all.
    if pip_install --no-index --find-links "$wheels" "$TORCH_PIN"; then
        return 0
    fi 2>/dev/null
    local log
    log="$(mktemp)"
    if ! "$VENV/bin/python" -m pip download --disable-pip-version-check --dest "$wheels" "$TORCH_PIN" \
        >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "could not download $TORCH_PIN into $wheels (its output is above)" >&2
        return 1
    fi
    rm -f "$log"
    pip_install --no-index --find-links "$wheels" "$TORCH_PIN"
}
