"""Structured JSON logs on stdout (structlog).

Every line is one JSON object: ``{"ts": "...Z", "level": "info", "event": "part_committed", "part": ...}``.
Event names are short snake_case words; details go into fields::

    log = get_logger(__name__)
    log.info("part_committed", table="db.t", part="202611_3_3_0")

Records from the standard library ``logging`` (kazoo, aiohttp) are rendered the same way, with their
text in ``event`` and the library's logger name in ``logger``.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
_state = {"level": logging.INFO, "generation": 0}  # generation: bumped by configure/reset (cached loggers)


def _level_filter(_logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if LEVELS.get(method, logging.CRITICAL if method == "critical" else logging.INFO) < _state["level"]:
        raise structlog.DropEvent
    return event


def _dumps(obj: Any, **kw: Any) -> str:
    return json.dumps(obj, default=_default, ensure_ascii=False, separators=(",", ":"))


def _default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=str)
    return str(obj)


def _ordered(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    head = {k: event.pop(k) for k in ("ts", "level", "event", "logger") if k in event}
    head.update(event)
    return head


def _shared_processors() -> list[Any]:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
    ]


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Send structlog and stdlib logging to ``stream`` (default stdout) as JSON lines."""
    out = stream if stream is not None else sys.stdout
    _state["generation"] += 1
    set_level(level)
    renderer = structlog.processors.JSONRenderer(serializer=_dumps)
    structlog.configure(
        processors=[
            _level_filter,
            *_shared_processors(),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            _ordered,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_shared_processors(), structlog.stdlib.add_logger_name],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info, _ordered, renderer],
    ))
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_replicad", False):
            root.removeHandler(h)
    handler._replicad = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(max(_state["level"], logging.INFO))  # keep chatty libraries at info unless asked
    logging.captureWarnings(True)  # Python warnings become JSON lines too (logger "py.warnings")


def reset() -> None:
    """Undo :func:`configure` (tests): structlog defaults, our stdlib handler removed, warnings uncaptured."""
    structlog.reset_defaults()
    _state["generation"] += 1
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_replicad", False):
            root.removeHandler(h)
    logging.captureWarnings(False)


def set_level(level: str) -> None:
    """Change the level at run time (SIGHUP reload)."""
    _state["level"] = LEVELS[level]
    logging.getLogger().setLevel(max(_state["level"], logging.DEBUG if level == "debug" else logging.INFO))


def get_logger(name: str | None = None, **fields: Any) -> Any:
    """A bound structlog logger; ``name`` becomes the ``logger`` field."""
    if name:
        fields = {"logger": name, **fields}
    return _LazyLogger(fields)


class _LazyLogger:
    """Resolves the structlog logger when first used after each :func:`configure` / :func:`reset`, so
    module-level loggers follow them (binding it again for every call cost 5 % of a fetching replica's CPU;
    the level is a processor, so :func:`set_level` needs no new binding)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields
        self._bound: Any = None
        self._generation = -1

    def bind(self, **fields: Any) -> _LazyLogger:
        return _LazyLogger({**self._fields, **fields})

    def __getattr__(self, method: str) -> Any:
        if self._generation != _state["generation"]:
            self._bound = structlog.get_logger().bind(**self._fields)
            self._generation = _state["generation"]
        return getattr(self._bound, method)


def is_event_name(name: str) -> bool:
    """True for a valid event name: snake_case, starting with a letter."""
    return bool(_SNAKE.match(name))
