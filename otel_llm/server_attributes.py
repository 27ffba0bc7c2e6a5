"""The GenAI conventions' server attributes, from what a server integration knows for certain.

``server.address``, ``server.port`` and ``gen_ai.response.model`` go on every span and metric point of a
tracker (``RequestTracker(attributes=...)``). Each is left out where it would be a guess: no address for a
server listening on every interface (it says nothing of the address clients use), no port when one is
picked at start-up and not read back, no model where answers do not name one.
"""

from __future__ import annotations

from otel_llm import semconv as sc

# Listening on every interface: no address clients could be said to use.
ANY_ADDRESS = ("", "0.0.0.0", "::", "[::]")


def server_attributes(
    host: str | None, port: int | None, model: str | None = None, *, unix_socket: str | None = None
) -> dict[str, str | int]:
    """``gen_ai.response.model`` (the model every answer names), ``server.port`` unless ``port`` is 0 or
    None, ``server.address`` unless ``host`` is None or listens on all addresses. A server on a Unix
    socket has that socket's path as its address and no port."""
    attributes: dict[str, str | int] = {}
    if model:
        attributes[sc.GEN_AI_RESPONSE_MODEL] = model
    if unix_socket:
        attributes[sc.SERVER_ADDRESS] = unix_socket
        return attributes
    if port:
        attributes[sc.SERVER_PORT] = int(port)
    if host is not None and host not in ANY_ADDRESS:
        attributes[sc.SERVER_ADDRESS] = host
    return attributes
