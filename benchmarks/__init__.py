"""otel_llm's performance harness: the hook, finishing a request, end to end, memory and the engine,
each measured side by side with what users would do instead. ``python -m benchmarks`` writes
BENCHMARKS.md; ``python -m benchmarks --quick`` is the seconds-long smoke run CI uses."""
