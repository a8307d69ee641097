"""The targets file of a fleet: each declared target as the settings that watch it.

A fleet exporter serves ``/probe?target=NAME`` for every target its targets file
declares, and nothing else: a request names a target, it never supplies a URL,
host or credentials. Each target is the process's settings with its own URL and
options; its password may come from the URL, an environment variable or a file,
and is shown and logged only masked, as the one target of ``--url`` is.

The file (see docs/fleet.md)::

    defaults:                 # optional: options every target starts from
      password_file: /etc/pg_exporter/password
    targets:
      - name: orders-primary  # [A-Za-z0-9][A-Za-z0-9_.-]*, at most 64 characters
        url: postgresql://exporter@10.0.0.5:5432/postgres
        labels: {cluster: orders}
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from exporter.config import rules
from exporter.config.files import FileRefused, read_regular
from exporter.config.problems import Notes, kind_name
from exporter.config.settings import Settings
from exporter.config.target import checked
from exporter.config.yamlfiles import Bounds, parse_yaml, read_text
from exporter.errors import ConfigError, TargetError, excerpt

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_TARGETS = 10_000
MAX_SECRET_BYTES = 64 * 1024  # a password or URL file holds one line, not megabytes
# A targets file may declare MAX_TARGETS targets, each with every option and six labels
# (44 YAML values, ~460 bytes): a collector file's bounds (100 000 values) refused 9 000
# targets with six labels. Reading such a file peaks at ~400 MiB and a few ten seconds
# on one core; the bounds allow twice its size. Aliases may add ~1 KB a target (a shared
# label map on each): an alias bomb still stops at 10 M characters.
TARGETS_BOUNDS = Bounds(
    chars=MAX_TARGETS * 1024, values=MAX_TARGETS * 48, alias_expansion=MAX_TARGETS * 1000
)

# Where a target's URL and password may come from: exactly one URL source, at most
# one password source.
URL_SOURCES = ("url", "url_env", "url_file")
PASSWORD_SOURCES = ("password_env", "password_file")
# Options a target (or the defaults) may set; each replaces the process-wide setting.
OPTIONS = frozenset(
    {
        "labels",
        "tags",
        "auto_discovery",
        "include_databases",
        "exclude_databases",
        "max_connections",
        "parallel_databases",
        "namespace",
        "server_time_budget",
        *PASSWORD_SOURCES,
    }
)
TARGET_FIELDS = frozenset({"name", *URL_SOURCES, *OPTIONS})
TOP_LEVEL = frozenset({"targets", "defaults"})


@dataclass(frozen=True, slots=True)
class DeclaredTarget:
    """One target of the fleet: its name and the settings that watch it."""

    name: str
    settings: Settings  # the process's settings with this target's URL and options


@dataclass(frozen=True, slots=True)
class Declared:
    """Every target of a targets file, in the file's order, and what to warn about."""

    path: str
    targets: tuple[DeclaredTarget, ...]
    secret_files: tuple[str, ...] = ()  # URL and password files read: a reload re-reads them
    warnings: tuple[str, ...] = ()

    def names(self) -> list[str]:
        """The declared names, in the file's order."""
        return [target.name for target in self.targets]


def load_targets(path: str, base: Settings, environ: Mapping[str, str] | None = None) -> Declared:
    """Every target ``path`` declares, each as ``base`` with its own URL and options.

    ConfigError lists every problem, each located as ``file:targets[i](name).field``;
    no message ever quotes a URL, password or the content of a secret file.
    """
    env = os.environ if environ is None else environ
    notes = Notes(path)
    hint = "check --targets.file or PG_EXPORTER_TARGETS_FILE"
    text = read_text(path, notes, hint, TARGETS_BOUNDS.chars)
    data = parse_yaml(text, notes, TARGETS_BOUNDS) if text is not None else None
    reader = _Reader(notes, base, env)
    targets = reader.document(data) if not notes.problems else []
    if notes.problems:
        raise ConfigError(notes.problems, f"{path}: the targets file has problems")
    return Declared(path, tuple(targets), tuple(reader.secret_files), tuple(notes.warnings))


class _Reader:
    """Reads a parsed targets file, noting every problem it finds."""

    def __init__(self, notes: Notes, base: Settings, environ: Mapping[str, str]) -> None:
        self.notes = notes
        self.base = base
        self.environ = environ
        self.secret_files: list[str] = []

    def document(self, data: object) -> list[DeclaredTarget]:
        notes = self.notes
        if not isinstance(data, dict) or not isinstance(data.get("targets"), list):
            got = kind_name(data.get("targets") if isinstance(data, dict) else data)
            notes.error(
                "targets",
                f"the file needs a list of targets under 'targets', got {got}; check "
                "--targets.file or PG_EXPORTER_TARGETS_FILE (the format: docs/fleet.md)",
            )
            return []
        for key in data:
            if key not in TOP_LEVEL:
                notes.error(str(key), f"unknown top-level key{_suggest(key, TOP_LEVEL)}")
        defaults = data.get("defaults") or {}
        if not isinstance(defaults, dict):
            notes.error(
                "defaults", f"must be a mapping of target options, got {kind_name(defaults)}"
            )
            defaults = {}
        for key in defaults:
            if key not in OPTIONS:
                notes.error(
                    f"defaults.{key}",
                    f"not an option every target can share{_suggest(key, OPTIONS)}",
                )
        raw: list[Any] = data["targets"]
        if len(raw) > MAX_TARGETS:
            notes.error("targets", f"{len(raw)} targets; at most {MAX_TARGETS} may be declared")
            return []
        if not raw:
            notes.warn("targets", "no target is declared: /probe answers 404 for every name")
        found: list[DeclaredTarget] = []
        seen: dict[str, int] = {}
        for index, entry in enumerate(raw):
            target = self.target(index, entry, defaults)
            if target is None:
                continue
            if target.name in seen:
                notes.error(f"targets[{index}].name", f"{target.name!r} is already the name of "
                            f"targets[{seen[target.name]}]; names must be unique")  # fmt: skip
                continue
            seen[target.name] = index
            found.append(target)
        return found

    def target(self, index: int, entry: object, defaults: dict[Any, Any]) -> DeclaredTarget | None:
        notes = self.notes
        where = f"targets[{index}]"
        if not isinstance(entry, dict):
            notes.error(
                where, f"a target must be a mapping with name and url, got {kind_name(entry)}"
            )
            return None
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            rule = "a name of 1-64 letters, digits, '_', '.' or '-' is required"
            notes.error(f"{where}.name", f"{rule} (what ?target= asks for), got {excerpt(name)}")
            return None
        where = f"{where}({name})"
        before = len(notes.problems)
        for key in entry:
            if key not in TARGET_FIELDS:
                notes.error(f"{where}.{key}", f"unknown field{_suggest(key, TARGET_FIELDS)}")
        merged = {**defaults, **entry}
        if isinstance(defaults.get("labels"), dict) and isinstance(entry.get("labels"), dict):
            merged["labels"] = {**defaults["labels"], **entry["labels"]}  # labels add up
        # A password source of the target's own replaces the defaults' (never both).
        own_password = any(entry.get(key) is not None for key in PASSWORD_SOURCES)
        for key in PASSWORD_SOURCES:
            merged[key] = entry.get(key) if own_password else defaults.get(key)
        url = self.url(where, entry)
        password = self.password(where, merged)
        settings = self.options(where, merged)
        if len(notes.problems) > before or url is None or settings is None:
            return None
        if password is not None and _has_password(url):
            if own_password:  # two passwords of its own: which one was meant?
                notes.error(where, "the URL holds a password and password_env or "
                            "password_file gives another; give it in one place")  # fmt: skip
                return None
            password = None  # the target's URL wins over the defaults' password
        if password is not None:
            url = make_conninfo(url, password=password)
        try:
            settings = replace(settings, url=url)
        except TargetError as exc:  # the message never quotes the URL
            notes.error(f"{where}.{_url_field(entry)}", str(exc))
            return None
        return DeclaredTarget(name, settings)

    def url(self, where: str, entry: dict[Any, Any]) -> str | None:
        given = [key for key in URL_SOURCES if entry.get(key) is not None]
        if len(given) != 1:
            why = "none is given" if not given else f"{' and '.join(given)} are given"
            self.notes.error(
                where, f"exactly one of {', '.join(URL_SOURCES)} names the target; {why}"
            )
            return None
        url = self.source(where, given[0], entry[given[0]], "the target URL")
        if url is None:
            return None
        try:  # checked as given: a password added from a file later would hide a misread URL
            checked(url)
        except TargetError as exc:  # the message never quotes the URL
            self.notes.error(f"{where}.{given[0]}", str(exc))
            return None
        return url

    def password(self, where: str, merged: dict[Any, Any]) -> str | None:
        given = [key for key in PASSWORD_SOURCES if merged.get(key) is not None]
        if len(given) > 1:
            self.notes.error(where, "give password_env or password_file, not both")
            return None
        if not given:
            return None
        return self.source(where, given[0], merged[given[0]], "the password")

    def source(self, where: str, key: str, value: object, what: str) -> str | None:
        """``what`` given by field ``key``: the text itself (``url``), or read from the
        environment variable or file it names; None after noting a problem."""
        if not isinstance(value, str) or not value.strip():
            self.notes.error(
                f"{where}.{key}", f"must be a non-empty string, got {kind_name(value)}"
            )
            return None
        return value if key == "url" else self.secret(f"{where}.{key}", key, value, what)

    def secret(self, where: str, key: str, source: str, what: str) -> str | None:
        """The value of an environment variable or the first line of a file: never quoted."""
        if key.endswith("_env"):
            value = self.environ.get(source, "")
            if not value:
                self.notes.error(
                    where, f"environment variable {source!r} ({what}) is unset or empty"
                )
                return None
            return value
        self.secret_files.append(source)
        try:
            text = read_regular(source, MAX_SECRET_BYTES)
        except FileRefused as exc:
            self.notes.error(where, f"cannot read {source!r} ({what}): {exc}")
            return None
        value = text.strip("\r\n")
        if not value or "\n" in value:
            self.notes.error(where, f"{source!r} must hold {what} on one line")
            return None
        return value

    def options(self, where: str, merged: dict[Any, Any]) -> Settings | None:
        """The base settings with the target's options; None after noting a problem."""
        before = len(self.notes.problems)
        changes: dict[str, Any] = {}
        for key, read in _OPTION_READERS.items():
            if merged.get(key) is not None:
                value = read(self, f"{where}.{key}", merged[key])
                if value is not None:
                    changes[_SETTING_OF.get(key, key)] = value
        if len(self.notes.problems) > before:
            return None
        return replace(self.base, **changes)

    def labels(self, where: str, value: object) -> tuple[tuple[str, str], ...] | None:
        if not isinstance(value, dict):
            self.notes.error(
                where, f"must be a mapping of label names to values, got {kind_name(value)}"
            )
            return None
        pairs = dict(self.base.const_labels)  # the target's labels add to --label's
        for key, text in value.items():
            if not rules.is_label_name(key):
                self.notes.error(f"{where}.{key}", f"not a valid label name ({rules.LABEL_RULE})")
            elif not isinstance(text, (str, int, float)) or isinstance(text, bool):
                self.notes.error(
                    f"{where}.{key}", f"a label value must be text, got {kind_name(text)}"
                )
            else:
                pairs[key] = str(text)
        return tuple(pairs.items())

    def names(self, where: str, value: object) -> tuple[str, ...] | None:
        """A list of names, or one comma-separated string of them (as the flag takes)."""
        if isinstance(value, str):
            return rules.comma_list(value)
        if not isinstance(value, list) or not all(isinstance(i, str) for i in value):
            self.notes.error(where, f"must be a list of names, got {kind_name(value)}")
            return None
        return rules.names(value)

    def switch(self, where: str, value: object) -> bool | None:
        if not isinstance(value, bool):
            self.notes.error(where, f"must be true or false, got {kind_name(value)}")
            return None
        return value

    def count(self, where: str, value: object, rule: rules.Whole) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int) or not rule.holds(value):
            self.notes.error(where, f"must be {rule}, got {excerpt(value)}")
            return None
        return value

    def amount(self, where: str, value: object, rule: rules.Amount) -> float | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not rule.holds(value):
            self.notes.error(where, f"must be {rule}, got {excerpt(value)}")
            return None
        return float(value)

    def namespace(self, where: str, value: object) -> str | None:
        if not rules.is_namespace(value):
            self.notes.error(where, f"must be {rules.NAMESPACE_RULE}, got {excerpt(value)}")
            return None
        return value


_Read = Callable[[_Reader, str, Any], Any]
_OPTION_READERS: dict[str, _Read] = {
    "labels": _Reader.labels,
    "tags": _Reader.names,
    "auto_discovery": _Reader.switch,
    "include_databases": _Reader.names,
    "exclude_databases": _Reader.names,
    "max_connections": lambda r, w, v: r.count(w, v, rules.MAX_CONNECTIONS),
    "parallel_databases": lambda r, w, v: r.count(w, v, rules.PARALLEL_DATABASES),
    "namespace": _Reader.namespace,
    "server_time_budget": lambda r, w, v: r.amount(w, v, rules.SERVER_TIME_BUDGET_MS),
}
_SETTING_OF = {"labels": "const_labels"}


def _url_field(entry: dict[Any, Any]) -> str:
    """The field the target's URL came from (url, url_env or url_file)."""
    return next((key for key in URL_SOURCES if entry.get(key) is not None), "url")


def _has_password(url: str) -> bool:
    """True when libpq reads a password in ``url`` (False for one it cannot read)."""
    try:
        return bool(conninfo_to_dict(url).get("password"))
    except psycopg.Error:
        return False


def _suggest(key: object, known: frozenset[str]) -> str:
    import difflib  # only for a mistyped key: 0.2 MiB when imported (issue 31)

    close = difflib.get_close_matches(str(key), sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (known: {', '.join(sorted(known))})"
