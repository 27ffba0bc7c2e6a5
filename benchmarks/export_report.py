"""The Markdown section for ``benchmarks.export_cost``: a table of CPU per span and a conclusion.

Everything here reads the ``measure()`` result (µs of CPU per span, medians over interleaved rounds); the
conclusion's comparisons are computed from it, so it follows the numbers of the run it reports.
"""

from __future__ import annotations

from typing import Any

TITLE = "## Exporting spans in-process"
PROTOCOL_NAMES = {"grpc": "gRPC", "http": "HTTP/protobuf", "-": ""}


def _row(
    result: dict[str, Any], what: str, protocol: str = "-", batch: int = 512, compression: str = "none"
) -> Any:
    """The row measured for this variant (KeyError when the run has none)."""
    key = (what, protocol, batch, compression)
    for row in result["rows"]:
        if (row["what"], row["protocol"], row["batch"], row["compression"]) == key:
            return row
    raise KeyError(key)


def _us(value: float) -> str:
    return f"{value:.1f}"


def _label(result: dict[str, Any], row: dict[str, Any]) -> str:
    what = row["what"]
    if what == "encode":
        return "OTLP encoding only"
    if what == "export":
        return f"`export()`, {PROTOCOL_NAMES[row['protocol']]}"
    if what == "encode-kind":
        attrs, events, event_attrs = result["attributes"][row["protocol"]]
        return (
            f"encoding only, all `{row['protocol']}` ({attrs} attributes, {events} events with "
            f"{event_attrs} attributes)"
        )
    return "reference: making them (the five hooks, `finished()` included; metrics off)"


HEADER = (
    "| what | batch | compression | exporting thread, µs/span | process, µs/span | added to encoding |",
    "|---|---|---|---|---|---|",
)
_ORDER = {"encode": 0, "export": 1, "encode-kind": 2, "build": 3}


def _sort_key(row: dict[str, Any]) -> tuple[int, str, bool, int]:
    return _ORDER[row["what"]], row["protocol"], row["compression"] == "gzip", row["batch"]


def _table(result: dict[str, Any]) -> list[str]:
    out = list(HEADER)
    for row in sorted(result["rows"], key=_sort_key):
        beyond = ""
        if "beyond_us" in row:
            q1, q3 = row["beyond_q_us"]
            beyond = f"{_us(row['beyond_us'])} ({_us(q1)} to {_us(q3)})"
        batch = str(row["batch"]) if row["what"] != "build" else "-"
        out.append(
            f"| {_label(result, row)} | {batch} | {row['compression']} | {_us(row['thread_us'])} | "
            f"{_us(row['process_us'])} | {beyond} |"
        )
    return out


def conclusion(result: dict[str, Any]) -> str:
    """One paragraph, every comparison computed from the result.

    Exporters are compared by what ``export()`` adds to the encoding of the same batches, measured in
    adjacent pairs: on a shared machine that difference is steadier than either median alone.
    """
    encode = {size: _row(result, "encode", batch=size)["process_us"] for size in (64, 512, 2048)}
    add = {
        (r["protocol"], r["batch"], r["compression"]): r["beyond_us"]
        for r in result["rows"]
        if r["what"] == "export"
    }
    best = min(add, key=lambda k: add[k])
    default = add[("http", 512, "none")]  # otel_llm's default: http/protobuf, no compression, the SDK's 512
    total = encode[512] + default
    large = {k: v for k, v in add.items() if k[1] >= 512}
    low, high = min(large, key=lambda k: large[k]), max(large, key=lambda k: large[k])
    quartiles = {
        (r["protocol"], r["batch"], r["compression"]): r["beyond_q_us"]
        for r in result["rows"]
        if r["what"] == "export"
    }
    # The cheapest and dearest of them are told apart only if their quartile ranges do not overlap.
    apart = quartiles[low][1] < quartiles[high][0]
    spread = (
        "more than the spread between rounds" if apart else "differences within the spread between rounds"
    )
    kinds = {r["protocol"]: r["process_us"] for r in result["rows"] if r["what"] == "encode-kind"}
    root = kinds.pop("llm.request", float("nan"))
    child = min(kinds.values()) if kinds else float("nan")
    nbytes = result["bytes"]

    def pair(batch: int, compression: str = "none") -> str:
        return f"{_us(add[('grpc', batch, compression)])} and {_us(add[('http', batch, compression)])} µs"

    # Sending cannot cost less than nothing: a negative median is noise, counted as zero in the saving.
    saved = max(default - max(add[best], 0.0), 0.0)
    # At 64 spans a batch the per-span part of sending is small next to the per-request part.
    per_request = {p: add[(p, 64, "none")] * 64 / 1e3 for p in ("grpc", "http")}
    return (
        f"Encoding is the bill: the OTLP encoder alone takes {_us(encode[512])} µs of CPU a span in batches "
        f"of 512 ({_us(encode[64])} at 64, {_us(encode[2048])} at 2048). What a whole `export()` adds to it "
        f"(gRPC and HTTP/protobuf, no compression): {pair(512)} a span at the batch span processor's default "
        f"batch of 512; {pair(2048)} at 2048, a size that needs `OTEL_BSP_MAX_QUEUE_SIZE` raised with it; "
        f"{pair(64)} at 64, where a cost per request (about {per_request['grpc']:.1f} and "
        f"{per_request['http']:.1f} ms of CPU) is shared by fewer spans. With gzip, at 512: "
        f"{pair(512, 'gzip')}, for {nbytes['none'] / nbytes['gzip']:.0f}× fewer bytes "
        f"({nbytes['none']:.0f} → {nbytes['gzip']:.0f} B a span): worth it where the network is short, not "
        "where the exporting process's CPU is. So at 512 spans a batch or more, every standard setting adds "
        f"{_us(large[low])} to {_us(large[high])} µs to the encoder's {_us(encode[512])}, {spread} "
        "(quartiles in the table). Small batches, where the protocol weighs more, are sent only when fewer "
        "than 512 spans come in `OTEL_BSP_SCHEDULE_DELAY` (5 s): then sending costs at most "
        f"{max(per_request.values()):.1f} ms of CPU per 5 s. The cheapest setting "
        f"measured, {PROTOCOL_NAMES[best[0]]} with batches of {best[1]} and compression {best[2]} "
        f"({add[best]:+.1f} µs), would save {saved / total * 100:.0f} % of the "
        f"exporting CPU against otel_llm's default (HTTP/protobuf, none, 512: {default:+.1f} µs, "
        f"{_us(total)} µs a span in all). What no exporter setting changes is the encoder's own cost: "
        f"{_us(child)} µs for a child span without attributes, {_us(root)} µs for an `llm.request` with its "
        "attributes and events. In-process export cost goes down with fewer spans (trace detail `request`, "
        "tail sampling) or fewer attributes and events, hardly with the transport."
    )


def lines(result: dict[str, Any]) -> list[str]:
    """The Markdown section (title, how it was measured, the table, the conclusion)."""
    names = ", ".join(f"{n} {c}" for n, c in sorted(result["names"].items()))
    received = ", ".join(
        f"{PROTOCOL_NAMES[p]} {result['received'][p]} of {result['sent'][p]}" for p in sorted(result["sent"])
    )
    out = [
        TITLE,
        "",
        f"The spans otel_llm makes with detail `phases` for {result['requests']} requests driven through a "
        f"`RequestTracker`'s hooks ({result['preempted']} preempted once; spans: {names}), "
        f"{result['pool']} of them exported per variant and round, cut into batches: by the OTLP trace "
        "encoder alone (`encode_spans(batch).SerializeToString()`), and by the standard "
        "`OTLPSpanExporter` (gRPC, HTTP/protobuf) to a real OTLP receiver in another process, "
        "each `export()` waiting for its answer as the batch span processor's worker does. "
        "CPU time (`time.thread_time` of the exporting thread, "
        "`time.process_time` of the whole process, which holds gRPC's own threads; the receiver's is not "
        f"counted), µs per span, medians of {result['rounds']} interleaved rounds, garbage collector off "
        "while timed. Each `export()` runs next to an encoding of the same batches; its last column is the "
        "median (and quartiles) of those pairs' differences (process CPU), steadier on a shared machine "
        "than two medians. "
        f"Protobuf runtime: `{result['protobuf']}`. Spans received: {received}; failed "
        f"exports: {result['failures']}. `finished()` alone, which builds the SDK spans: "
        f"{_us(result['finish_us'])} µs a span.",
        "",
        *_table(result),
        "",
        conclusion(result),
    ]
    if result["quick"]:
        out += ["", "(`--quick`: a few rounds only; these numbers mean little.)"]
    return out
