"""Subcommands of the ``otel-llm`` console script, one module each.

Each module has ``register(subparsers)``, which adds its parser and sets ``func`` to a callable taking
the parsed arguments and returning the exit status. Heavy imports (torch) happen inside ``func``.
"""
