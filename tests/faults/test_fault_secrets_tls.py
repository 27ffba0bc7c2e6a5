"""Credentials and TLS for OTLP come from the standard environment variables.

- A secret in ``OTEL_EXPORTER_OTLP_HEADERS`` never appears in any log record or on stdout/stderr (the
  gRPC core writes there), while exports fail against a refusing or silent collector.
- gRPC over TLS to a loopback collector with a self-signed certificate (made here with ``cryptography``)
  works when ``OTEL_EXPORTER_OTLP_CERTIFICATE`` names it, and is refused (counted as dropped) without it.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import traceback
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fault_tools import build, dropped_spans, on_thread, received_span_ids, serve, wait_for
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from otlp_receivers import GrpcReceiver, HttpReceiver, Mode, _MetricsServicer, _TraceServicer

SECRET = "s3cr3t-9f8e7d6c"

# Every test here in both export modes (OTEL_LLM_EXPORT_MODE): configure()'s export process, and none.
pytestmark = pytest.mark.both_modes


@pytest.fixture(autouse=True)
def _export_mode(env: pytest.MonkeyPatch, export_mode: str) -> None:
    env.setenv("OTEL_LLM_EXPORT_MODE", export_mode)


@pytest.mark.parametrize("mode", [Mode.REFUSE, Mode.BLACK_HOLE])
@pytest.mark.parametrize(
    ("receiver_type", "protocol"),
    [pytest.param(GrpcReceiver, "grpc", id="grpc"), pytest.param(HttpReceiver, "http/protobuf", id="http")],
)
def test_header_credentials_never_logged(
    env, started, caplog, capfd, receiver_type, protocol, mode, request
) -> None:
    receiver = receiver_type(mode=mode)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", protocol)
    env.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{SECRET},x-api-key={SECRET}")
    caplog.set_level(logging.DEBUG)
    # The SDK's gRPC exporter logs through a filter that drops a record equal to the one before it (same
    # module, level and message within 20 s), so the previous case's failure line would hide this one's
    # and leave nothing below to search for the secret. A record from elsewhere in between resets it.
    logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter").debug("%s starts", request.node.name)
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(20)))
    assert wait_for(lambda: 0 < produced.count == dropped_spans(telemetry))
    on_thread(lambda: telemetry.shutdown(timeout_s=1.0))

    logged = []
    for record in caplog.records:
        logged.append(record.getMessage())
        if record.exc_info:
            logged.append("".join(traceback.format_exception(*record.exc_info)))
    out, err = capfd.readouterr()  # the export process writes its log lines to the stderr it shares
    # The failure itself was logged: here, or by the export process.
    assert any(r.levelno >= logging.WARNING for r in caplog.records) or "xport" in err
    assert SECRET not in "\n".join(logged) + out + err


def self_signed(directory: Path) -> tuple[Path, bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "otel-llm test collector")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = directory / "collector.pem"
    path.write_bytes(cert_pem)
    return path, cert_pem, key_pem


class TlsGrpcReceiver(GrpcReceiver):
    """The test gRPC receiver behind TLS with the given certificate."""

    def __init__(self, cert_pem: bytes, key_pem: bytes) -> None:
        super().__init__()
        self._credentials = grpc.ssl_server_credentials([(key_pem, cert_pem)])

    @property
    def endpoint(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self), self._server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(self), self._server)
        self.port = self._server.add_secure_port("127.0.0.1:0", self._credentials)
        self._server.start()


@pytest.mark.parametrize("trusted", [True, False], ids=["certificate-set", "certificate-missing"])
def test_grpc_tls_with_a_self_signed_certificate(env, started, tmp_path, trusted) -> None:
    cert_path, cert_pem, key_pem = self_signed(tmp_path)
    receiver = TlsGrpcReceiver(cert_pem, key_pem)
    receiver.start()
    started.append(receiver)
    env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    if trusted:
        env.setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", str(cert_path))
    telemetry, tracker, produced = build(started)

    on_thread(lambda: serve(tracker, range(10)))

    if trusted:
        assert wait_for(lambda: len(received_span_ids(receiver.collected)) == produced.count)
        assert dropped_spans(telemetry) == 0
    else:  # the system trust store does not know this certificate: the handshake fails, loss is counted
        assert wait_for(lambda: dropped_spans(telemetry) == produced.count)
        assert received_span_ids(receiver.collected) == []
