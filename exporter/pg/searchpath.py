"""The ``search_path`` our sessions run under, chosen so that no object a non-superuser
creates can stand in for what a statement calls (issue 29).

A database's owner controls its default ``search_path`` (``ALTER DATABASE … SET``) and,
since PostgreSQL 15, its ``public`` schema. A function of theirs named like a catalog
one (``set_config``, ``current_setting``), or an overload that matches a call's
argument types better than the catalog's (``pg_sleep(integer)`` beats
``pg_sleep(double precision)`` for ``pg_sleep(0)``), would run instead of it, as our
role, whenever an unqualified name is resolved through a schema of theirs. So:

- every statement of the exporter's own (preflight, limits, health probe) names
  what it calls with ``pg_catalog.`` and compares with ``OPERATOR(pg_catalog.=)``:
  it resolves the same under any path, the database's hostile one included;
- the collectors run under a path we set: ``pg_catalog`` first, then the schemas of
  the session's own path (role, database, URL) that hold no *impostor*, then
  ``pg_temp`` last. An impostor is a function, operator, relation or type owned by
  a role that is neither a superuser nor the exporter's own, whose name is also the
  name of one a superuser or the exporter's role owns in ``pg_catalog``, in another
  schema of the path, or in an installed extension. A schema holding one is left out
  of our path, said once in the log and on ``/explain``; a collector that needs an
  object there names it with its schema.

User collectors that read the tenant's tables, qualified (``app.queue``) or through
the path (``jobs`` in ``public``), keep working: owning objects is fine, only names
that shadow trusted ones are not.
"""

from __future__ import annotations

from dataclasses import dataclass

# Functions (aggregates included) and operators: any in a schema of the session's path
# owned by a role we do not trust (neither a superuser nor ours) whose name a trusted one
# in pg_catalog or the path also has. The scan starts from the untrusted side, which is
# small in practice (a schema's own functions), and finds twins through the catalogs'
# name indexes.
_CALLABLE_IMPOSTORS = """
SELECT u.{ns} AS ns, u.{name}::pg_catalog.text || '{suffix}' AS what
  FROM pg_catalog.{table} u
 WHERE u.{ns} OPERATOR(pg_catalog.=) ANY (p.own_oids)
   AND NOT u.{owner} OPERATOR(pg_catalog.=) ANY (p.trusted)
   AND EXISTS (SELECT FROM pg_catalog.{table} t
                WHERE t.{name} OPERATOR(pg_catalog.=) u.{name}
                  AND t.{ns} OPERATOR(pg_catalog.=) ANY (p.all_oids)
                  AND t.{owner} OPERATOR(pg_catalog.=) ANY (p.trusted))"""
_CALLABLES = (
    ("pg_proc", "proname", "pronamespace", "proowner", "()"),
    ("pg_operator", "oprname", "oprnamespace", "oprowner", " (an operator)"),
)

# Relations and types: pg_catalog's come first on our path whatever else is on it, so
# only an extension's can be shadowed (pg_stat_statements, hstore): by an untrusted one
# of the same name in a schema of the path. Starting from the extensions' members keeps
# the scan off pg_class and pg_type, which are large in big databases.
_SHADOW_IMPOSTORS = """
SELECT u.{ns} AS ns, u.{name}::pg_catalog.text AS what
  FROM pg_catalog.pg_depend d
  JOIN pg_catalog.{table} t ON t.oid OPERATOR(pg_catalog.=) d.objid
  JOIN pg_catalog.{table} u ON u.{name} OPERATOR(pg_catalog.=) t.{name}
 WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
   AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.{table}'::pg_catalog.regclass
   AND d.deptype OPERATOR(pg_catalog.=) 'e'
   AND u.{ns} OPERATOR(pg_catalog.=) ANY (p.own_oids)
   AND NOT u.{owner} OPERATOR(pg_catalog.=) ANY (p.trusted)"""
_SHADOWED = (
    ("pg_class", "relname", "relnamespace", "relowner"),
    ("pg_type", "typname", "typnamespace", "typowner"),
)

# The path's schemas (with pg_catalog, and without), and the roles we trust to own what
# our statements call: the superusers and the exporter's own role.
_GROUNDS = """
WITH p AS MATERIALIZED (SELECT
  ARRAY(SELECT oid FROM pg_catalog.pg_namespace
         WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(true))) AS all_oids,
  ARRAY(SELECT oid FROM pg_catalog.pg_namespace
         WHERE nspname OPERATOR(pg_catalog.=) ANY (pg_catalog.current_schemas(false))
           AND nspname OPERATOR(pg_catalog.<>) 'pg_catalog') AS own_oids,
  ARRAY(SELECT oid FROM pg_catalog.pg_roles
         WHERE rolsuper OR rolname OPERATOR(pg_catalog.=) CURRENT_USER) AS trusted)"""


def _impostors() -> str:
    parts = [
        _CALLABLE_IMPOSTORS.format(table=t, name=n, ns=s, owner=o, suffix=x)
        for t, n, s, o, x in _CALLABLES
    ] + [_SHADOW_IMPOSTORS.format(table=t, name=n, ns=s, owner=o) for t, n, s, o in _SHADOWED]
    return "\nUNION ALL".join(parts)


#: Two columns for the preflight: the session's own path (its schemas that exist, in
#: order, pg_catalog and pg_temp aside), and for each schema of it holding an impostor
#: "schema<TAB>impostor" (one example each).
PATH_COLUMNS = f"""
       ARRAY(SELECT s::pg_catalog.text FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) s
              WHERE s OPERATOR(pg_catalog.<>) 'pg_catalog'),
       ARRAY({_GROUNDS}
             SELECT DISTINCT ON (found.ns) n.nspname::pg_catalog.text || E'\\t' || found.what
               FROM p, LATERAL ({_impostors()}) AS found
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) found.ns)"""


@dataclass(frozen=True, slots=True)
class SearchPath:
    """The path our collectors run under, and the schemas left out of it, with why."""

    schemas: tuple[str, ...] = ()  # between pg_catalog and pg_temp, in the session's order
    left_out: tuple[tuple[str, str], ...] = ()  # (schema, an impostor it holds)

    @classmethod
    def of(cls, session_path: object, impostors: object) -> SearchPath:
        """From the preflight's two columns (text arrays)."""
        found = dict(_split(item) for item in _texts(impostors))
        schemas = tuple(s for s in _texts(session_path) if s not in found)
        return cls(schemas, tuple(found.items()))

    def keeping(self, before: SearchPath) -> SearchPath:
        """This path, read again on a session whose path we had set to ``before``: the
        schemas left out then are still out (they are no longer on the path to see)."""
        left = dict(before.left_out) | dict(self.left_out)
        return SearchPath(tuple(s for s in self.schemas if s not in left), tuple(left.items()))

    @property
    def setting(self) -> str:
        """The value for ``search_path``: quoted identifiers, pg_catalog first."""
        return ", ".join(quote_ident(s) for s in ("pg_catalog", *self.schemas, "pg_temp"))

    def describe(self) -> str:
        """One line for /explain and the log."""
        text = f"search_path: {self.setting}"
        if self.left_out:
            text += "; left out of the search_path: " + "; ".join(
                f"{schema} (it holds {what}, owned by an ordinary role, whose name a "
                "catalog or extension object has)"
                for schema, what in self.left_out
            )
        return text


NO_PATH = SearchPath()  # a server not read yet, or pgBouncer's console


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _split(item: str) -> tuple[str, str]:
    schema, _, what = item.partition("\t")
    return schema, what


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier, whatever it holds."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as an escape string constant, read the same whatever
    ``standard_conforming_strings`` the database's owner chose."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
