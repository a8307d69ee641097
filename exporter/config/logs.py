"""Logging to stderr as logfmt or JSON lines, with secrets scrubbed from every field.

Structured fields come from ``logger.info(msg, extra={...})``: every attribute
a record carries beyond the standard ones is rendered after ``msg``.
"""

from __future__ import annotations

import contextvars
import json
import logging
import math
import re
import sys
import traceback
from datetime import UTC, datetime
from typing import IO

from exporter.config.target import mask

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
}
FORMATS = ("logfmt", "json")

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}
_RESERVED = ("ts", "level", "msg", "exception", "stack")

#: The fleet target whose work is running (None in single-target mode): every log
#: line written meanwhile names it as ``target``.
TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)

_LOGFMT_KEY_JUNK = re.compile(r"[^A-Za-z0-9_.\-]")


def configure_logging(level: str, fmt: str, *, stream: IO[str] | None = None) -> None:
    """Send the root logger to stderr (or ``stream``) at ``level`` in format ``fmt``."""
    if level not in LEVELS:
        raise ValueError(f"unknown log level {level!r}; use one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; use one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(LEVELS[level])


def record_fields(record: logging.LogRecord) -> list[tuple[str, object]]:
    """The fields of a record in output order, secrets scrubbed from every text."""
    fields: list[tuple[str, object]] = [
        ("ts", _timestamp(record.created)),
        ("level", _level_name(record.levelno)),
        ("msg", record.getMessage()),
    ]
    if (target := TARGET.get()) is not None and "target" not in record.__dict__:
        fields.append(("target", target))
    for key, value in record.__dict__.items():
        if key not in _STANDARD:
            fields.append((f"extra_{key}" if key in _RESERVED else key, value))
    if record.exc_info and record.exc_info[1] is not None:
        fields.append(("exception", "".join(traceback.format_exception(record.exc_info[1]))))
    if record.stack_info:
        fields.append(("stack", record.stack_info))
    return [(key, _clean(value)) for key, value in fields]


def _timestamp(created: float) -> str:
    moment = datetime.fromtimestamp(created, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _level_name(levelno: int) -> str:
    if levelno >= logging.ERROR:
        return "error"
    if levelno >= logging.WARNING:
        return "warn"
    return "info" if levelno >= logging.INFO else "debug"


def _clean(value: object) -> object:
    """Keep plain scalars as they are; anything else becomes text with its secrets masked."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return mask(value.rstrip("\n") if isinstance(value, str) else str(value))


class LogfmtFormatter(logging.Formatter):
    """``key=value`` pairs on one line; values quoted when they need it."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a logfmt line."""
        return " ".join(
            f"{_logfmt_key(key)}={_logfmt_value(value)}" for key, value in record_fields(record)
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the same keys as logfmt."""

    def format(self, record: logging.LogRecord) -> str:
        """Render one record as a JSON object."""
        return json.dumps(dict(record_fields(record)), ensure_ascii=False)


def _logfmt_key(key: str) -> str:
    return _LOGFMT_KEY_JUNK.sub("_", key) or "_"


def _logfmt_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str):
        return repr(value)
    if value and not any(c in value for c in ' ="\\') and value.isprintable():
        return value
    return '"' + "".join(_escape(c) for c in value) + '"'


def _escape(char: str) -> str:
    named = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    if char in named:
        return named[char]
    return char if char.isprintable() else f"\\u{ord(char):04x}"
