#!/usr/bin/env bash
# Build the OpenTelemetry Collector, Jaeger v2 and Prometheus that the tests in tests/collector run,
# from the pinned Go modules in this folder (no container, no downloaded binary):
#   - the Collector: the Collector project's builder (ocb, builder/go.mod) assembles manifest.yaml;
#   - Jaeger v2: cmd/jaeger of the module pinned in jaeger/go.mod;
#   - Prometheus: cmd/prometheus of the module pinned in prometheus/go.mod, with the `remove_all_sd`
#     build tag (Prometheus's own switch that leaves out the cloud service discoveries; the tests
#     scrape a static target) and without the built-in web UI (the tests use the HTTP API only).
#
# The binaries go to ${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/collector-tier/bin (override the folder
# with OTEL_LLM_COLLECTOR_TIER), outside the repository. Idempotent: exits at once when a stamp there
# says the binaries were built from these very files with this Go. Exits non-zero when a step fails,
# unless --best-effort is given: then the tier is removed and its tests are skipped with a reason.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TIER="${OTEL_LLM_COLLECTOR_TIER:-${XDG_CACHE_HOME:-$HOME/.cache}/otel-llm/collector-tier}"

if [ "${1:-}" = "--best-effort" ]; then
    # shellcheck source=../venv_tools.sh
    . "$HERE/../venv_tools.sh"  # best_effort
    best_effort collector "${BASH_SOURCE[0]}" "$TIER/bin" "$TIER/stamp"
    exit 0
fi

if ! command -v go >/dev/null 2>&1; then
    echo "make_env: no 'go' command on PATH (Go 1.26 or later builds the collector tier)" >&2
    exit 1
fi

# What the binaries are built from: this script, the manifest, every go.mod / go.sum here, and Go itself.
stamp_of() {
    (
        cd "$HERE"
        go version
        sha256sum make_env.sh manifest.yaml builder/go.mod builder/go.sum jaeger/go.mod jaeger/go.sum \
            prometheus/go.mod prometheus/go.sum
    ) | sha256sum | cut -d' ' -f1
}
STAMP="$(stamp_of)"
BIN="$TIER/bin"
if [ -f "$TIER/stamp" ] && [ "$(cat "$TIER/stamp")" = "$STAMP" ] \
    && [ -x "$BIN/otelcol-otel-llm" ] && [ -x "$BIN/jaeger" ] && [ -x "$BIN/prometheus" ]; then
    echo "make_env: $BIN already has the Collector, Jaeger and Prometheus built from these files; nothing to do"
    exit 0
fi

echo "make_env: building the Collector, Jaeger and Prometheus into $BIN (a cold build takes several minutes)"
rm -f "$TIER/stamp"
mkdir -p "$BIN"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# 1. The Collector: the builder writes the sources to a scratch folder and compiles them there.
sed "s#^\(\s*output_path:\).*#\1 $WORK/otelcol#" "$HERE/manifest.yaml" >"$WORK/manifest.yaml"
(cd "$HERE/builder" && go tool builder --config "$WORK/manifest.yaml")
install -m 0755 "$WORK/otelcol/otelcol-otel-llm" "$BIN/otelcol-otel-llm"

# 2. Jaeger v2 and 3. Prometheus, each from its own module (their dependency graphs pin different
#    Collector releases, so they cannot share one go.mod).
(cd "$HERE/jaeger" && go build -mod=readonly -trimpath -o "$BIN/jaeger" github.com/jaegertracing/jaeger/cmd/jaeger)
(cd "$HERE/prometheus" && go build -mod=readonly -trimpath -tags remove_all_sd -o "$BIN/prometheus" \
    github.com/prometheus/prometheus/cmd/prometheus)

"$BIN/otelcol-otel-llm" --version >/dev/null
"$BIN/jaeger" version >/dev/null 2>&1 || "$BIN/jaeger" --help >/dev/null
"$BIN/prometheus" --version >/dev/null
echo "$STAMP" >"$TIER/stamp"
echo "make_env: ready: $BIN"
