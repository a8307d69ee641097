"""Exposition: metric families as bytes, in the text format 0.0.4 or OpenMetrics 1.0.

A :class:`Family` holds one source's samples already rendered, so a cached
collector result costs one byte join per scrape, never per-series work.
The text format keeps every name as formed (counters get no ``_total``);
OpenMetrics adds the ``_total`` sample suffix that format requires.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


class Format(enum.Enum):
    """A wire format the telemetry endpoint can answer in."""

    TEXT = "text"
    OPENMETRICS = "openmetrics"


TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
KINDS = frozenset({"gauge", "counter", "untyped"})
_OM_KIND = {"gauge": "gauge", "counter": "counter", "untyped": "unknown"}
_OPENMETRICS_MEDIA = "application/openmetrics-text"
_TEXT_MEDIA = ("text/plain", "text/*", "*/*")  # most specific first
_EOF = b"# EOF\n"


def negotiate(accept: str | None) -> Format:
    """OpenMetrics only when the Accept header asks for it at least as much as for text.

    Consulted only with ``--web.enable-openmetrics``; otherwise the answer is text.
    """
    if not accept:
        return Format.TEXT
    q_by_media: dict[str, float] = {}
    for entry in accept.split(","):
        parsed = _media_range(entry)
        if parsed is not None:
            media, q = parsed
            q_by_media[media] = max(q, q_by_media.get(media, 0.0))
    q_open = q_by_media.get(_OPENMETRICS_MEDIA, 0.0)
    # Per RFC 9110 the most specific matching range decides the text quality.
    q_text = next((q_by_media[m] for m in _TEXT_MEDIA if m in q_by_media), 0.0)
    return Format.OPENMETRICS if q_open > 0 and q_open >= q_text else Format.TEXT


def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when ``Accept-Encoding`` allows gzip: named (or ``*``) with a q above 0."""
    if not accept_encoding:
        return False
    q_by_coding: dict[str, float] = {}
    for entry in accept_encoding.split(","):
        coding, *params = entry.split(";")
        q = _quality(params)
        if q is not None:
            q_by_coding[coding.strip().lower()] = q
    q = q_by_coding.get("gzip", q_by_coding.get("x-gzip", q_by_coding.get("*", 0.0)))
    return q > 0


def _quality(params: list[str]) -> float | None:
    """The ``q`` of one Accept entry's parameters (1 when absent), None when malformed."""
    q = 1.0
    for param in params:
        key, sep, value = param.partition("=")
        if sep and key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return None
            if not 0.0 <= q <= 1.0:  # also rejects NaN
                return None
    return q


def _media_range(entry: str) -> tuple[str, float] | None:
    """(media type, q) of one Accept entry, or None when it is malformed."""
    media, *params = entry.split(";")
    media = media.strip().lower()
    q = _quality(params)
    if media.count("/") != 1 or q is None:
        return None
    return media, q


def content_type(fmt: Format) -> str:
    """The Content-Type header of a response in this format."""
    return OPENMETRICS_CONTENT_TYPE if fmt is Format.OPENMETRICS else TEXT_CONTENT_TYPE


def format_value(v: float | int) -> str:
    """A sample value: ints as ints, floats as their shortest repr, NaN, +Inf, -Inf."""
    if type(v) is float and math.isfinite(v):  # the common case first: one call per sample
        return repr(v)
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(int(v))
    v = float(v)
    if math.isfinite(v):
        return repr(v)
    if math.isnan(v):
        return "NaN"
    return "+Inf" if v > 0 else "-Inf"


def escape_label_value(value: str) -> str:
    """Escape backslash, double quote and newline, as both formats require."""
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def label_block(labels: Sequence[tuple[str, str]]) -> str:
    """``{a="x",b="y"}`` for these (name, raw value) pairs; ``""`` when there are none."""
    if not labels:
        return ""
    return "{" + ",".join(f'{n}="{escape_label_value(v)}"' for n, v in labels) + "}"


def _escape_help(text: str, fmt: Format) -> str:
    text = text.replace("\\", "\\\\").replace("\n", "\\n")
    # OpenMetrics forbids a bare double quote in HELP; the text format keeps it.
    return text.replace('"', '\\"') if fmt is Format.OPENMETRICS else text


@dataclass(frozen=True, slots=True, eq=False)
class Family:
    """One metric family's samples from one source, rendered once and reused."""

    name: str  # exactly as formed; the TYPE name and the sample name in the text format
    kind: str  # "gauge" | "counter" | "untyped"
    help: str
    series: int
    # Sample lines in the text format, each starting with ``name``, "\n"-terminated.
    text_samples: bytes = field(default=b"", repr=False)
    # (label, escaped value) pairs every sample carries from its source's rows, such as a
    # per-database collector's datname: they tell two sources' families apart without
    # reading their samples (``uniqueness``). Const labels are not among them.
    fixed: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # Headers, and OpenMetrics bodies, by format name (a str: an enum member hashes in Python).
    _memo: dict[str, bytes] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"family {self.name}: kind {self.kind!r} is not one of {sorted(KINDS)}"
            )
        if self.series < 0:
            raise ValueError(f"family {self.name}: negative series count {self.series}")

    def family_name(self, fmt: Format) -> str:
        """Name on the TYPE line: OpenMetrics counters lose a ``_total`` suffix."""
        if fmt is Format.OPENMETRICS and self.kind == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name

    def header(self, fmt: Format) -> bytes:
        """The ``# HELP`` and ``# TYPE`` lines."""
        key = fmt.name
        cached = self._memo.get(key)
        if cached is None:
            name = self.family_name(fmt)
            kind = _OM_KIND[self.kind] if fmt is Format.OPENMETRICS else self.kind
            text = f"# HELP {name} {_escape_help(self.help, fmt)}\n# TYPE {name} {kind}\n"
            cached = self._memo[key] = text.encode("utf-8", "replace")
        return cached

    def body(self, fmt: Format) -> bytes:
        """The sample lines, computed once per format."""
        if fmt is Format.TEXT or self.kind != "counter":
            return self.text_samples
        key = fmt.name + " body"
        cached = self._memo.get(key)
        if cached is None:
            cached = self._memo[key] = _openmetrics_counter(self.name, self.text_samples)
        return cached


def _openmetrics_counter(name: str, samples: bytes) -> bytes:
    """A counter's text-format samples as OpenMetrics wants them: named ``_total``, and
    none NaN or negative, which a strict parser rejects with the whole exposition (a
    replica's LSN on a primary is NaN). The text format keeps them, as Go's does."""
    if b" NaN\n" in samples or b" -" in samples:
        lines = samples.splitlines(keepends=True)  # escaped label values hold no newline
        samples = b"".join(line for line in lines if _counts(line.rsplit(b" ", 1)[-1]))
    if name.endswith("_total"):
        return samples
    # Escaped label values hold no raw newline, so every "\n" starts a sample name.
    old, new = b"\n" + name.encode(), b"\n" + name.encode() + b"_total"
    return (b"\n" + samples).replace(old, new)[1:]


def _counts(value: bytes) -> bool:
    """False for a sample value no counter may have: NaN or below zero."""
    number = float(value)  # every value here was written by format_value or str()
    return number >= 0  # False for NaN too; -0 is zero


#: Label blocks of self-metric samples, by their pairs: the same (database, collector)
#: pairs recur in every per-collector family of every scrape. Emptied when full.
_LABEL_BLOCKS: dict[tuple[tuple[str, str], ...], str] = {}
LABEL_BLOCKS_MAX = 50_000


def cached_label_block(labels: Sequence[tuple[str, str]]) -> str:
    """:func:`label_block`, remembered for a tuple of pairs (the self-metrics' hot path)."""
    if type(labels) is not tuple:
        return label_block(labels)
    block = _LABEL_BLOCKS.get(labels)
    if block is None:
        if len(_LABEL_BLOCKS) >= LABEL_BLOCKS_MAX:
            _LABEL_BLOCKS.clear()  # databases or collectors come and go: start afresh
        block = _LABEL_BLOCKS[labels] = label_block(labels)
    return block


def make_family(
    name: str,
    kind: str,
    help: str,
    samples: Iterable[tuple[Sequence[tuple[str, str]], float]],
) -> Family:
    """A family from (label pairs, value) samples, e.g. for self-metrics."""
    lines = [f"{cached_label_block(labels)} {format_value(value)}" for labels, value in samples]
    text = name + ("\n" + name).join(lines) + "\n" if lines else ""
    return Family(name, kind, help, len(lines), text.encode("utf-8", "replace"))


def encode(
    families: Iterable[Family],
    fmt: Format,
    on_conflict: Callable[[str], None] | None = None,
) -> bytes:
    """One exposition: same-name families merged under the first one's HELP and TYPE.

    A later family whose kind differs from the first of its name is dropped and
    ``on_conflict`` receives a message saying so. Empty families are omitted.
    """
    return b"".join(encode_chunks(families, fmt, on_conflict))


def encode_chunks(
    families: Iterable[Family],
    fmt: Format,
    on_conflict: Callable[[str], None] | None = None,
) -> list[bytes]:
    """:func:`encode`'s exposition as the pieces it joins, in order. A cached family
    gives the same bytes objects every time, so a caller can tell by identity which
    leading pieces did not change since the last exposition (see ``PrefixGzip``)."""
    groups: dict[str, list[bytes]] = {}
    kinds: dict[str, str] = {}
    text = fmt is Format.TEXT  # names and bodies as formed: no call per family
    for family in families:
        if not family.series:
            continue
        key = family.name if text else family.family_name(fmt)
        parts = groups.get(key)
        if parts is None:
            groups[key] = [family.header(fmt), family.body(fmt)]
            kinds[key] = family.kind
        elif kinds[key] == family.kind:
            parts.append(family.text_samples if text else family.body(fmt))
        elif on_conflict is not None:
            on_conflict(
                f"metric family {key}: a {family.kind} family {family.name} conflicts with "
                f"the {kinds[key]} of the same name; the {family.kind} is dropped"
            )
    chunks = [chunk for parts in groups.values() for chunk in parts]
    if fmt is Format.OPENMETRICS:
        chunks.append(_EOF)
    return chunks
