"""What a run needs from this machine, found before the model loads: a folder it can write its telemetry
files into, and the port it is to listen on.

Both are tried for real (a probe file written and removed, the port bound) rather than guessed from
permissions: root passes every permission check and still cannot write under /proc, and only a bind
says whether another server holds a port. Nothing is left behind: folders made for the probe are removed
again, and the bound socket is handed to the server, which starts listening on it once the model is up
(until then a client is refused, as before, rather than left waiting).
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import tempfile
from pathlib import Path

from otel_llm.kit.commands._common import sdk_disabled


def files_written() -> bool:
    """Whether this run writes OTLP JSON files: some signal goes to files under the current OTEL_*
    environment (not when telemetry is off, nor when a configuration file decides)."""
    from otel_llm.export import otlp
    from otel_llm.setup import declarative_config_file

    if sdk_disabled() or declarative_config_file() is not None:
        return False
    return "file" in (otlp.destination("traces"), otlp.destination("metrics"))


def output_folder_problem(output_dir: str | None) -> str | None:
    """Why this run could not write its files under ``output_dir`` (the ``--output-dir`` flag, else
    ``OTEL_LLM_OUTPUT_DIR``, else ./otel-llm-output), naming where the folder came from; None when it can,
    or when the run writes no files."""
    from otel_llm.setup import DEFAULT_OUTPUT_DIR, ENV_OUTPUT_DIR

    if not files_written():
        return None
    from_env = os.environ.get(ENV_OUTPUT_DIR, "").strip()
    if output_dir is not None:
        folder, named = output_dir, f"--output-dir {output_dir}"
    elif from_env:
        folder, named = from_env, f"{ENV_OUTPUT_DIR}={from_env!r}"
    else:
        folder, named = DEFAULT_OUTPUT_DIR, f"the output folder ./{DEFAULT_OUTPUT_DIR} (the default)"
    why = unwritable(Path(folder).expanduser().absolute())
    if why is None:
        return None
    return f"{named}: cannot write there ({why}): pass --output-dir with a folder you can write to"


def unwritable(folder: Path) -> str | None:
    """Why no file can be written in ``folder`` (made if missing, then unmade), or None when one can."""
    made: list[Path] = []
    try:
        missing = [p for p in (folder, *folder.parents) if not p.exists()]
        for path in reversed(missing):
            path.mkdir()
            made.append(path)
        if not folder.is_dir():
            return f"{folder} is not a folder"
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    finally:
        for path in reversed(made):
            with contextlib.suppress(OSError):  # something else wrote there meanwhile: keep it
                path.rmdir()
    return None


def bind_port(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (0: a free port), not yet listening, for the server to
    listen on; ``PortUnusable`` with what to do when it cannot be had.

    Bound as uvicorn binds its own (IPv6 for an address with a colon, SO_REUSEADDR so a port still in
    TIME_WAIT from the last run can be taken again); Linux still refuses a port another socket listens on.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortUnusable(_bind_problem(host, port, exc)) from None
    return sock


class PortUnusable(Exception):
    """The server's address cannot be listened on; the message says what to do."""


def _bind_problem(host: str, port: int, exc: OSError) -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"--port {port}: {where} is already in use (another server listens there): stop it, or pass "
            "another port (--port 0 picks a free one)"
        )
    if exc.errno == errno.EACCES:
        return (
            f"--port {port}: not allowed to listen on {where} (ports below 1024 need privileges): pass "
            "1024 or more"
        )
    return (
        f"--host {host}: cannot listen on {where} ({exc.strerror or exc}): pass an address of this "
        "machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
    )
