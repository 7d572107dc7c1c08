"""Stand-in for ``vllm.logger`` (tests only). As vLLM's does, importing it configures the ``vllm`` logger
(a stdout handler at ``VLLM_LOGGING_LEVEL``, default INFO, and no propagation to the root logger) unless
``VLLM_CONFIGURE_LOGGING=0``; :func:`init_logger` returns a logger with vLLM's ``*_once`` methods."""

from __future__ import annotations

import logging
import logging.config
import os

_LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"vllm": {"format": "%(levelname)s %(name)s] %(message)s"}},
    "handlers": {
        "vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "stream": "ext://sys.stdout"}
    },
    "loggers": {
        "vllm": {
            "handlers": ["vllm"],
            "level": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
            "propagate": False,
        }
    },
}
if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "1":
    logging.config.dictConfig(_LOGGING_CONFIG)

_SEEN: set[tuple] = set()


class _Logger(logging.LoggerAdapter):
    """A logger (its records carry the wrapped logger's name) with ``debug_once``, ``info_once`` and
    ``warning_once``: a message with the same arguments is logged once per process."""

    def _once(self, level: int, msg: str, args: tuple) -> None:
        key = (self.logger.name, level, msg, args)
        if key not in _SEEN:
            _SEEN.add(key)
            self.log(level, msg, *args)

    def debug_once(self, msg: str, *args: object, **_: object) -> None:
        self._once(logging.DEBUG, msg, args)

    def info_once(self, msg: str, *args: object, **_: object) -> None:
        self._once(logging.INFO, msg, args)

    def warning_once(self, msg: str, *args: object, **_: object) -> None:
        self._once(logging.WARNING, msg, args)


def init_logger(name: str) -> _Logger:
    return _Logger(logging.getLogger(name), {})
