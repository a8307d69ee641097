"""The ``search_path`` our sessions run under: names resolve only where no tenant
writes (issue 36).

A database's owner controls its default ``search_path`` and, since PostgreSQL 15, its
``public`` schema. A function of theirs named like a catalog one, or an overload that
matches a call's argument types better than the catalog's (``pg_wal_lsn_diff(pg_lsn,
text)`` beats the catalog's for an untyped ``'0/0'``), would run instead of it, as our
role, wherever a schema of theirs is on the path. So our path is built, not searched:

- ``pg_catalog`` first, then of PostgreSQL's default path (our role's own schema,
  ``public``) and the schemas of the database's extensions those that only a superuser
  or our own role can write (owned by one, ``CREATE`` granted to no one else), then
  ``pg_temp`` (ours alone) last. Nothing else, whatever the role, the database or
  the URL set: it goes in at login with the other guards (``guards``);
- an extension in a schema others may write (``public`` owned by the database's owner)
  stays off the path: our library names its objects by schema (``@extschema:name@``,
  ``planning``), where an owner cannot add a same-named object of the same signature
  nor drop the extension's;
- every statement of the exporter's own (preflight, limits, health probe) also names
  what it calls with ``pg_catalog.`` and compares with ``OPERATOR(pg_catalog.=)``.

A user's collector that reads a tenant's objects names them with their schema
(``app.jobs``); such a collector runs in a transaction of its own that is rolled back
(``planning.fenced``), so nothing the tenant's code sets outlives it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Roles we trust to own what our statements resolve: superusers, our own role, and
#: pg_database_owner (PostgreSQL 14+) in a database one of those owns.
_TRUSTING = "rolsuper OR rolname OPERATOR(pg_catalog.=) CURRENT_USER"
_TRUSTED_ROLES = f"""ARRAY(SELECT oid FROM pg_catalog.pg_roles WHERE {_TRUSTING}
  OR (oid OPERATOR(pg_catalog.=) pg_catalog.to_regrole('pg_database_owner')
      AND (SELECT datdba FROM pg_catalog.pg_database
            WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
          IN (SELECT oid FROM pg_catalog.pg_roles WHERE {_TRUSTING})))"""
# A schema only trusted roles can write: owned by one, CREATE granted to no one else.
_TRUSTED_SCHEMA = f"""
n.nspowner OPERATOR(pg_catalog.=) ANY ({_TRUSTED_ROLES})
AND NOT EXISTS (SELECT FROM pg_catalog.aclexplode(n.nspacl) AS a
                 WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
                   AND NOT a.grantee OPERATOR(pg_catalog.=) ANY ({_TRUSTED_ROLES}))"""

#: Two columns for the preflight: each extension as "name<TAB>schema", and the schemas
#: only trusted roles can write.
PATH_COLUMNS = f"""
       ARRAY(SELECT e.extname::pg_catalog.text || E'\\t' || n.nspname::pg_catalog.text
               FROM pg_catalog.pg_extension e
               JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace),
       ARRAY(SELECT n.nspname::pg_catalog.text FROM pg_catalog.pg_namespace n
              WHERE {_TRUSTED_SCHEMA})"""


@dataclass(frozen=True, slots=True)
class SearchPath:
    """The path our collectors run under, and the extensions' schemas left off it."""

    schemas: tuple[str, ...] = ()  # between pg_catalog and pg_temp
    left_out: tuple[tuple[str, str], ...] = ()  # (schema, the extensions it holds)
    extensions: tuple[tuple[str, str], ...] = ()  # (extension, its schema), every one
    trusted: frozenset[str] = frozenset()  # schemas only trusted roles can write

    @classmethod
    def of(cls, extensions: object, trusted: object, user: str = "") -> SearchPath:
        """From the preflight's two columns (text arrays) and our role's name."""
        pairs = tuple(sorted(_split(item) for item in _texts(extensions)))
        safe = frozenset(_texts(trusted))
        # PostgreSQL's default path ("$user", public) where only trusted roles write
        # there, then the extensions' schemas: a user's collector reading its own tables
        # unqualified keeps working where no tenant can plant a name beside them.
        wanted = [user, "public", *sorted({s for _, s in pairs})]
        schemas = list(dict.fromkeys(s for s in wanted if s in safe and s != "pg_catalog"))
        held: dict[str, list[str]] = {}
        for name, schema in pairs:
            if schema not in safe:
                held.setdefault(schema, []).append(name)
        left = tuple((schema, ", ".join(names)) for schema, names in sorted(held.items()))
        return cls(tuple(schemas), left, pairs, safe)

    def schema_of(self, extension: str) -> str | None:
        """The schema an extension is installed in, or None."""
        return dict(self.extensions).get(extension)

    @property
    def setting(self) -> str:
        """The value for ``search_path``: quoted identifiers, pg_catalog first."""
        return ", ".join(quote_ident(s) for s in ("pg_catalog", *self.schemas, "pg_temp"))

    def describe(self) -> str:
        """One line for /explain and the log."""
        text = f"search_path: {self.setting}"
        if self.left_out:
            text += "; extensions whose schema others may write, named by schema instead: " + (
                "; ".join(f"{what} in {schema}" for schema, what in self.left_out)
            )
        return text


NO_PATH = SearchPath()  # a server not read yet, or pgBouncer's console


def _texts(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _split(item: str) -> tuple[str, str]:
    """ "extension<TAB>schema" as (extension, schema)."""
    extension, _, schema = item.partition("\t")
    return extension, schema


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier, whatever it holds."""
    return '"' + name.replace('"', '""') + '"'


def quote_literal(text: str) -> str:
    """``text`` as an escape string constant, read the same whatever
    ``standard_conforming_strings`` the database's owner chose."""
    return "E'" + text.replace("\\", "\\\\").replace("'", "''") + "'"
