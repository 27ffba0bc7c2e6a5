"""An OTLP receiver (gRPC or HTTP/protobuf) in its own process, for ``benchmarks.export_cost``.

Run as ``python -m benchmarks.export_receiver grpc|http``: it prints its port, then answers each line on
stdin: ``take`` -> the number of spans decoded since the last ``take`` (and forgets them, so a long run
does not hold every decoded request in memory); ``quit`` -> stops. The receivers are the project's test
receivers (official opentelemetry-proto messages); being another process, their CPU time is not charged
to the exporting process being measured.
"""

from __future__ import annotations

import http.server
import sys


def main() -> None:
    from tests.otlp_receivers import Collected, GrpcReceiver, HttpReceiver
    from tests.ports import free_port

    protocol = sys.argv[1] if len(sys.argv) > 1 else "grpc"
    if protocol == "http":
        # A collector keeps HTTP/1.1 connections open between exports; http.server answers HTTP/1.0 by
        # default, which would charge a new TCP connection to every export of the exporter measured.
        http.server.BaseHTTPRequestHandler.protocol_version = "HTTP/1.1"
        receiver: GrpcReceiver | HttpReceiver = HttpReceiver(port=free_port())
    elif protocol == "grpc":
        receiver = GrpcReceiver(port=free_port())
    else:
        raise SystemExit(f"unknown protocol {protocol!r}: grpc or http")
    with receiver:
        print(receiver.port, flush=True)
        for line in sys.stdin:
            command = line.strip()
            if command == "take":
                taken, receiver.collected = receiver.collected, Collected()
                print(len(taken.spans()), flush=True)
            elif command == "quit":
                break


if __name__ == "__main__":
    main()
