"""The try-out kit: the reference torch engine, its OpenAI-compatible server, the ``otel-llm`` commands
and the terminal viewer.

The kit uses the instrumentation as any engine would, through the hook (``RequestTracker``) and
``configure()``. The instrumentation (every other package of ``otel_llm``) never imports the kit: a
test over every folder checks it. The kit needs the ``torch`` extra, and ``serve`` the ``serve`` extra.
"""

__all__: list[str] = []
