"""Module loggers that import :mod:`logging` only when something is logged or asked about.

``import fastlease`` must stay cheap (Lambda cold starts and every CLI call pay for it), and
``logging`` with what it pulls in is about 6 ms of it. The modules that ``import fastlease`` loads
take their logger from :func:`get_logger`; the stores, loaded when their client is first used,
use ``logging.getLogger`` as usual.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import logging
    from typing import Any

#: The real logger's methods that are bound onto the stand-in at first use.
_METHODS = ("debug", "info", "warning", "error", "exception", "log", "isEnabledFor")


class _LazyLogger:
    """Stands for ``logging.getLogger(name)``. The first attribute read imports logging and binds the
    real logger's methods onto this object, so later calls cost what a direct logger's do. Levels,
    handlers and pytest's caplog act on the real logger, found by its name as always."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        import logging

        logger = logging.getLogger(self.name)
        for method in _METHODS:  # two threads racing here bind the same methods: harmless
            setattr(self, method, getattr(logger, method))
        return getattr(logger, attribute)


def get_logger(name: str) -> logging.Logger:
    """The logger ``name``, imported on first use (see the module's docstring)."""
    return _LazyLogger(name)  # type: ignore[return-value]  # it forwards every Logger attribute
