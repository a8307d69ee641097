"""Talking to PostgreSQL: connections, what a server is, and the SQL that bounds our
statements there. Knows nothing of collectors' caches, passes or HTTP.

- ``postgres``: one connection and the statements run on it.
- ``libpqfiles``: the files libpq opens, examined off the event loop first.
- ``addresses``: which server a connection reaches, as resolved.
- ``loginrate``: a server's failed logins, bounded, and the wait after a refusal.
- ``bulkheads``: what every target holds at one server.
- ``connections``: the ceiling on connections to one target, and its logins.
- ``preflight``: what a server is (:class:`preflight.ServerFacts`), read in one
  round trip before the collectors.
- ``guards``: the table of what every session of ours runs under, and what is not
  pinned; the login options and the reading derived from it.
- ``limits``: a collector's server-side limits and the guards, as SQL text.
- ``searchpath``: the ``search_path`` our sessions run under.
- ``prepared``: collector queries prepared once per connection.
- ``casting``: a column's cells as sample values or label text, as Go casts them.
- ``loaders``: how a collector's cells are read from the wire.

May import: :mod:`exporter.config`, :mod:`exporter.errors`.
"""
