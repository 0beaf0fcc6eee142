"""The package's version, in a module of its own so that the modules that report it (the CLI, the
DynamoDB user agent, OpenTelemetry's scope) need not import the package face. pyproject.toml's
``version`` is the same string (tests/test_cli.py checks the two)."""

__version__ = "0.1.0"
