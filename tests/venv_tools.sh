# Sourced by the make_env scripts (bash, set -euo pipefail): what each of them needs.
#
# pip_install ARGS...  pip install into $VENV. pip's output is kept in a log and shown only when the
#                      install fails: these environments put packages in with --no-deps on purpose, so
#                      pip's resolver prints "ERROR: pip's dependency resolver ..." blocks about the
#                      requirements left out even when everything went in; those are not errors of ours.
# torch_tree           prints the folder holding torch==2.13.0 and what it needs, installed once by pip
#                      (--target) from a wheel folder that is itself filled once from PyPI. PyPI's default
#                      Linux build of torch is CUDA-enabled, with its nvidia-* and triton wheels: about
#                      3 GB of wheels that unpack to 4.7 GB.
# install_torch        torch into $VENV as hard links to torch_tree's files (a copy on another file
#                      system). Every torch virtualenv then shares one 4.7 GB unpacked torch instead of
#                      holding its own: four of them used to need some 20 GB of disk, which a shared CI
#                      machine does not always have.
# best_effort NAME SCRIPT PATH...
#                      runs SCRIPT (a make_env script); when it fails, removes the PATHs (what the build
#                      left half-made: its virtualenv) and keeps the build's output, with the disk's free
#                      space, in .venv-failed/NAME.log (another folder: $OTEL_LLM_FAILED_BUILDS). The test
#                      run prints the end of it (tests/skips.py), so a tier that could not be built says
#                      why where a run's output is read. Always returns 0: the other tiers still build.
#
# The wheel folder: $OTEL_LLM_WHEEL_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/wheels.

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

wheel_folder() {
    echo "${OTEL_LLM_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/wheels}"
}

torch_tree() {
    local wheels tag tree building log
    wheels="$(wheel_folder)"
    tag="$("$VENV/bin/python" -c 'import sys; print(sys.implementation.cache_tag)')"
    tree="$wheels/installed-${TORCH_PIN/==/-}-$tag"
    if [ -d "$tree" ]; then
        echo "$tree"
        return 0
    fi
    mkdir -p "$wheels"
    log="$(mktemp)"
    # Offline first: a folder filled by an earlier build needs no index at all.
    if ! "$VENV/bin/python" -m pip download --disable-pip-version-check --no-index --find-links "$wheels" \
        --dest "$wheels" "$TORCH_PIN" >"$log" 2>&1; then
        if ! "$VENV/bin/python" -m pip download --disable-pip-version-check --dest "$wheels" "$TORCH_PIN" \
            >"$log" 2>&1; then
            cat "$log" >&2
            rm -f "$log"
            echo "could not download $TORCH_PIN into $wheels (its output is above)" >&2
            return 1
        fi
    fi
    building="$tree.$$"
    rm -rf "$building"
    if ! "$VENV/bin/python" -m pip install --disable-pip-version-check --no-index --find-links "$wheels" \
        --target "$building" "$TORCH_PIN" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        rm -rf "$building"
        echo "could not install $TORCH_PIN into $building (its output is above)" >&2
        return 1
    fi
    rm -f "$log"
    # Console scripts name the interpreter that installed them; each virtualenv gets none (no test runs
    # torchrun). share/ holds man pages only.
    rm -rf "$building/bin" "$building/share"
    # All at once: a build that stops half-way leaves no half-installed torch behind.
    mv -T "$building" "$tree" 2>/dev/null || rm -rf "$building"
    echo "$tree"
}

install_torch() {
    local tree site info project
    tree="$(torch_tree)"
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # A distribution both have (the setuptools a virtualenv starts with) goes out first: two
    # dist-info folders of one project leave pip unable to tell which is installed.
    for info in "$tree"/*.dist-info; do
        project="$(basename "$info")"
        project="${project%%-*}"
        if compgen -G "$site/$project-*.dist-info" >/dev/null; then
            "$VENV/bin/python" -m pip uninstall --disable-pip-version-check -y -q "$project" >/dev/null
        fi
    done
    if ! cp -al "$tree/." "$site/" 2>/dev/null; then
        cp -a "$tree/." "$site/"  # another file system: hard links cannot cross it
    fi
    (cd / && "$VENV/bin/python" -c "import importlib.metadata as md, sys; \
sys.exit(md.version('torch') != '${TORCH_PIN#*==}')") || {
        echo "install_torch: $VENV does not see $TORCH_PIN after linking it from $tree" >&2
        return 1
    }
}

best_effort() {
    local name="$1" script="$2" root logs log
    shift 2
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    logs="${OTEL_LLM_FAILED_BUILDS:-$root/.venv-failed}"
    log="$logs/$name.log"
    mkdir -p "$logs"
    rm -f "$log"
    # Written as .part while the build runs: only a build that failed leaves a .log.
    if bash "$script" 2>&1 | tee "$log.part"; then
        rm -f "$log.part"
        rmdir "$logs" 2>/dev/null || true
        return 0
    fi
    {
        echo "--- free disk space when the build stopped:"
        df -h "$root" "$(wheel_folder)" 2>/dev/null || true
    } >>"$log.part"
    mv "$log.part" "$log"
    rm -rf "$@"
    echo "$name: the tier could not be built (its output: $log); its tests will be skipped" >&2
    return 0
}
