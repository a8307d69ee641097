"""``--dry-run``: the parsed collector definitions, printed back as a collector file."""

from __future__ import annotations

import yaml

from exporter.config.definitions import Collector, Column, Definitions


class _Dumper(yaml.SafeDumper):
    """Writes multi-line SQL as literal blocks, so queries read as they were written."""


def _represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_text)


def render_definitions(definitions: Definitions) -> str:
    """Every collector as a YAML collector file, in planned order, each after its source."""
    chunks = [f"# {len(definitions.collectors)} collector(s), planned order, read from:\n"]
    chunks.extend(f"#   {source}\n" for source in definitions.sources)
    for collector in definitions.collectors:
        body = yaml.dump(
            {collector.key: _collector_fields(collector)},
            Dumper=_Dumper,
            sort_keys=False,
            allow_unicode=True,
            width=100,
        )
        chunks.append(f"\n# from {collector.source or 'unknown file'}\n{body}")
    return "".join(chunks)


def _collector_fields(collector: Collector) -> dict[str, object]:
    """A branch in the collector-file layout, so the output loads again as a config."""
    fields: dict[str, object] = {
        "name": collector.name,
        "desc": collector.desc,
        "query": collector.query,
        "ttl": collector.ttl,
        "timeout": -1 if collector.timeout is None else collector.timeout,
        "priority": collector.priority,
        "min_version": collector.min_version,
        "max_version": collector.max_version,
        "fatal": collector.fatal,
        "skip": collector.skip,
        "tags": list(collector.tags),
    }
    if collector.max_series is not None:
        fields["max_series"] = collector.max_series
    if collector.backoff_ceiling is not None:
        fields["backoff_ceiling"] = collector.backoff_ceiling
    if (top := collector.top) is not None:
        ranked: dict[str, object] = {"by": top.by, "limit": top.limit, "band": top.band}
        ranked |= {"hold": top.hold, "churn": top.churn, "keep": list(top.keep), "other": top.other}
        ranked |= {"sum": list(top.sum), "max": list(top.max)}
        if top.probe is not None:
            ranked |= {"id": top.id, "probe": top.probe}
        fields["top"] = ranked
    if collector.predicates:
        fields["predicate_queries"] = [
            {"name": p.name, "predicate_query": p.sql, "ttl": p.ttl} for p in collector.predicates
        ]
    fields["metrics"] = [{c.name: _column_fields(c)} for c in collector.columns]
    return fields


def _column_fields(column: Column) -> dict[str, object]:
    fields: dict[str, object] = {"usage": column.usage.value}
    optional = {"rename": column.rename, "default": column.default, "scale": column.scale}
    fields.update((key, value) for key, value in optional.items() if value is not None)
    if column.buckets:
        fields["bucket"] = list(column.buckets)
    fields["description"] = column.description
    return fields
