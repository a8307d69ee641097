"""Log lines on stderr: logfmt and JSON rendering, levels, exceptions and secret masking."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from exporter.config.logs import configure_logging

log = logging.getLogger("exporter.test")
TS = re.compile(r"^ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    """Put the root logger back as pytest had it, whatever a test configured."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _capture(level: str = "debug", fmt: str = "logfmt") -> io.StringIO:
    stream = io.StringIO()
    configure_logging(level, fmt, stream=stream)
    return stream


def _lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_logfmt_line_has_ts_level_msg_then_extras() -> None:
    """A logfmt line starts with an ISO UTC millisecond ts, then level, msg and extra fields."""
    stream = _capture()
    log.info("collector done", extra={"collector": "pg_db", "datname": "app", "duration": 0.012})
    (line,) = _lines(stream)
    assert TS.match(line)
    assert line.endswith(
        ' level=info msg="collector done" collector=pg_db datname=app duration=0.012'
    )


@pytest.mark.parametrize(
    ("value", "rendered"),
    [
        ("plain", "plain"),
        ("two words", '"two words"'),
        ('say "hi"', r'"say \"hi\""'),
        ("a=b", '"a=b"'),
        ("line1\nline2", r'"line1\nline2"'),
        ("back\\slash", r'"back\\slash"'),
        ("tab\there", r'"tab\there"'),
        ("bell\x07", r'"bell\u0007"'),
        ("", '""'),
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (float("nan"), "nan"),
    ],
)
def test_logfmt_quotes_and_escapes_values(value: object, rendered: str) -> None:
    """Values with spaces, quotes, '=', backslashes or control characters are quoted and escaped."""
    stream = _capture()
    log.info("m", extra={"field": value})
    (line,) = _lines(stream)
    assert line.endswith(f" field={rendered}")


def test_logfmt_keys_are_sanitised_and_reserved_keys_renamed() -> None:
    """An extra key with spaces cannot break the line, and an extra 'ts' cannot shadow ts."""
    stream = _capture()
    log.info("m", extra={"bad key": 1, "ts": "fake"})
    (line,) = _lines(stream)
    assert line.count("ts=") == 2  # the real ts and extra_ts
    assert line.endswith(" bad_key=1 extra_ts=fake")


def test_json_has_the_same_keys_one_object_per_line() -> None:
    """JSON output is one object per line with ts, level, msg and the extras, typed."""
    stream = _capture(fmt="json")
    log.warning("slow", extra={"collector": "pg_db", "duration": 1.5, "rows": 3, "ok": False})
    log.error("second")
    first, second = (json.loads(line) for line in _lines(stream))
    assert list(first) == ["ts", "level", "msg", "collector", "duration", "rows", "ok"]
    assert first["level"] == "warn"
    assert first["msg"] == "slow"
    assert (first["duration"], first["rows"], first["ok"]) == (1.5, 3, False)
    assert TS.match(f"ts={first['ts']} ")
    assert second["level"] == "error"


def test_json_turns_non_finite_floats_and_objects_into_text() -> None:
    """NaN (not valid JSON) and arbitrary objects are rendered as strings."""
    stream = _capture(fmt="json")
    log.info("m", extra={"value": float("inf"), "thing": ("a", 1)})
    (record,) = (json.loads(line) for line in _lines(stream))
    assert record["value"] == "inf"
    assert record["thing"] == "('a', 1)"


@pytest.mark.parametrize(
    ("level", "shown"),
    [
        ("debug", ["debug", "info", "warn", "error"]),
        ("info", ["info", "warn", "error"]),
        ("warn", ["warn", "error"]),
        ("error", ["error"]),
    ],
)
def test_level_filters_and_names(level: str, shown: list[str]) -> None:
    """Each --log.level lets through its level and above; 'warn' is logging.WARNING."""
    stream = _capture(level=level, fmt="json")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    assert [json.loads(line)["level"] for line in _lines(stream)] == shown


def test_critical_is_reported_as_error() -> None:
    """CRITICAL has no level name of its own in our vocabulary: it reads as error."""
    stream = _capture(fmt="json")
    log.critical("c")
    assert json.loads(stream.getvalue())["level"] == "error"


def test_exception_is_one_logfmt_line() -> None:
    """An exception with its traceback stays on one logfmt line, in an 'exception' field."""
    stream = _capture()
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    (line,) = _lines(stream)
    assert ' msg=failed exception="Traceback' in line
    assert line.endswith('ValueError: boom"')
    assert r"\n" in line  # the traceback's line breaks, escaped


def test_exception_is_a_json_field() -> None:
    """In JSON the traceback is the 'exception' field."""
    stream = _capture(fmt="json")
    try:
        raise KeyError("k")
    except KeyError:
        log.error("failed", exc_info=True)
    record = json.loads(stream.getvalue())
    assert record["exception"].startswith("Traceback")
    assert record["exception"].endswith("KeyError: 'k'")


def test_configure_twice_keeps_one_handler() -> None:
    """Reconfiguring replaces the handler instead of duplicating every line."""
    configure_logging("info", "logfmt", stream=io.StringIO())
    stream = _capture()
    log.info("once")
    assert len(_lines(stream)) == 1
    assert len(logging.getLogger().handlers) == 1


@pytest.mark.parametrize(("level", "fmt"), [("verbose", "logfmt"), ("info", "xml")])
def test_unknown_level_or_format_is_refused(level: str, fmt: str) -> None:
    """configure_logging refuses values the command line would not accept."""
    with pytest.raises(ValueError, match="unknown log"):
        configure_logging(level, fmt, stream=io.StringIO())


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_password_in_url_never_printed(fmt: str) -> None:
    """A PostgreSQL URL with a password in the message is masked in both formats (D14)."""
    stream = _capture(fmt=fmt)
    log.error("cannot connect to postgresql://u:secret@h/db")
    output = stream.getvalue()
    assert "secret" not in output
    assert "postgresql://u:xxxxx@h/db" in output


def test_secrets_scrubbed_from_extra_fields_and_exceptions() -> None:
    """Field values and exception text go through the same scrubber as the message (D14)."""
    stream = _capture()
    try:
        raise RuntimeError("dsn was host=h password=hunter2 dbname=x")
    except RuntimeError:
        log.exception("m", extra={"url": "postgres://a:topsecret@h:5432/db?sslmode=require"})
    output = stream.getvalue()
    assert "topsecret" not in output
    assert "hunter2" not in output
    assert "postgres://a:xxxxx@h:5432/db?sslmode=require" in output


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_password_with_url_delimiters_and_sslpassword_never_printed(fmt: str) -> None:
    """A password holding ? # @ and an sslpassword are masked where libpq finds them (D14)."""
    stream = _capture(fmt=fmt)
    log.warning("target postgresql://u:pw?Zq9#1@h/db?sslpassword=Zq8&sslmode=require down")
    log.warning("dsn host=h sslpassword='Zq7 Zq5' password=Zq6\\ Zq4")
    output = stream.getvalue()
    for secret in ("Zq9", "Zq8", "Zq7", "Zq6", "Zq5", "Zq4"):
        assert secret not in output
    assert "postgresql://u:xxxxx@h/db?sslpassword=xxxxx&sslmode=require" in output
