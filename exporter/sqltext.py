"""SQL text read as PostgreSQL's lexer reads it: where statements end, their first word,
and whether a collector may run it.

A semicolon ends a statement only outside the places that may hold one as text:
string constants (``'it''s'``, ``E'\\''``, ``U&'…'``, ``B'…'``, and their continuation
on a following line), quoted identifiers (``"a;b"``), dollar quotes (``$$…$$``,
``$fn$…$fn$``), line comments (``-- …``) and block comments, which nest
(``/* /* */ */``). So ``string_agg(x, ';')`` is one statement and ``SELECT 1; SELECT 2``
two. Statements holding nothing but blanks and comments (an empty one, what follows
a trailing semicolon) are not counted.

Whether a backslash escapes a quote in a plain ``'…'`` string depends on the server's
``standard_conforming_strings``, unknown while a config is loaded (on by default since
PostgreSQL 9.1). :func:`statement_count` reads the text both ways and keeps the larger
count, so a text is taken for one statement only when it is one on every server.

A collector runs one statement, and none that can leave its read-only transaction or
change the session the next collectors run in (:func:`collector_sql_problem`, D2).

Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# What PostgreSQL's lexer (scan.l) calls ident_start and ident_cont: any character
# outside ASCII counts as a letter, since the lexer reads UTF-8 bytes >= 0x80 so.
_NAME = re.compile(r"[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_$\x80-\U0010ffff]*")
# A number as PostgreSQL before 15 reads one, which stops before a letter, '_' or '$'
# (`1$a$` is a number and a dollar quote; `0x1f` is 0 and a name). Later versions read
# 0x1f, 1_000 as numbers, with the next token where it is here, and refuse a letter
# right after a number (`1e'…'`) where older ones start a new token.
_NUMBER = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
# A dollar-quote delimiter: $$ or $tag$, the tag a name without '$' (so not $1).
_DOLLAR = re.compile(r"\$(?:[A-Za-z_\x80-\U0010ffff][A-Za-z0-9_\x80-\U0010ffff]*)?\$")
_PARAMETER = re.compile(r"\$[0-9]+")
# After a closing quote: blanks or `--` comments, a newline, then blanks, newlines or
# `--` comments, then a quote, continue the constant (`'a'` newline `'b'` is 'ab').
_CONTINUATION = re.compile(r"(?:[ \t\f]|--[^\n\r]*)*[\n\r](?:[ \t\n\r\f\v]|--[^\n\r]*[\n\r])*'")
# B'…' and X'…' never read backslashes; N'…' and U&'…' end as plain strings do (the
# server refuses U&'…' when standard_conforming_strings is off).
_BIT_PREFIXES = frozenset("bBxX")
_LINE_END = re.compile(r"[\n\r]|$")
_BLANKS = frozenset(" \t\n\r\f\v")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a text: its source (trimmed, without the semicolon), its first word."""

    text: str
    keyword: str  # upper-cased; "" when it starts with no name (a string, a quoted name)


def split_statements(sql: str, *, backslash_quotes: bool = False) -> tuple[Statement, ...]:
    """The statements of ``sql`` in order, leaving out those of blanks and comments alone.

    ``backslash_quotes`` reads plain strings as a server with
    ``standard_conforming_strings = off`` does (``\\'`` does not end them). An
    unterminated string, quote or comment runs to the end of the text, as the server
    would read it before refusing it.
    """
    return tuple(_Lexer(sql, backslash_quotes).statements())


def statement_count(sql: str) -> int:
    """How many statements ``sql`` holds on a server reading backslashes either way."""
    return max(len(split_statements(sql, backslash_quotes=mode)) for mode in (False, True))


class _Lexer:
    """One pass over a text, token by token, skipping what may hold a semicolon as text."""

    def __init__(self, sql: str, backslash_quotes: bool) -> None:
        self.sql = sql
        self.backslash_quotes = backslash_quotes
        self.pos = 0

    def statements(self) -> list[Statement]:
        found: list[Statement] = []
        start, begun, keyword = 0, False, None  # keyword None: no name or other token yet
        while self.pos < len(self.sql):
            at = self.pos
            if self.sql[at] == ";":
                self.pos += 1
                if begun:
                    found.append(Statement(self.sql[start:at].strip(), keyword or ""))
                start, begun, keyword = self.pos, False, None
                continue
            name = self._token()
            if self._is_blank(at):
                continue
            begun = True
            if keyword is None and self.sql[at] != "(":  # `(SELECT 1)` is a SELECT
                keyword = name.upper()
        if begun:
            found.append(Statement(self.sql[start:].strip(), keyword or ""))
        return found

    def _is_blank(self, at: int) -> bool:
        return self.sql[at] in _BLANKS or self.sql.startswith(("--", "/*"), at)

    def _token(self) -> str:
        """Move past one token; return it when it is a name (a keyword), else ""."""
        sql, pos = self.sql, self.pos
        char = sql[pos]
        if sql.startswith("--", pos):  # to the end of the line, which \r ends too
            end = _LINE_END.search(sql, pos)
            self.pos = len(sql) if end is None else end.end()
        elif sql.startswith("/*", pos):
            self._skip_block_comment()
        elif char == "'":
            self._skip_string(pos, escapes=self.backslash_quotes)
        elif char in "eE" and sql.startswith("'", pos + 1):
            self._skip_string(pos + 1, escapes=True)
        elif char == '"':
            self._skip_quoted_name()
        elif char == "$":
            self._skip_dollar()
        elif (number := _NUMBER.match(sql, pos)) is not None:
            self.pos = number.end()
        elif (name := _NAME.match(sql, pos)) is not None:
            self.pos = name.end()
            if name.group() in _BIT_PREFIXES and sql.startswith("'", self.pos):
                self._skip_string(self.pos, escapes=False)
            return name.group()
        else:
            self.pos += 1
        return ""

    def _skip_string(self, quote: int, *, escapes: bool) -> None:
        """A '…' constant from ``quote``, with the segments that continue it."""
        pos = self._string_end(quote + 1, escapes)
        while (more := _CONTINUATION.match(self.sql, pos)) is not None:
            pos = self._string_end(more.end(), escapes)
        self.pos = pos

    def _string_end(self, pos: int, escapes: bool) -> int:
        """Just after the quote that ends a segment whose text starts at ``pos``:
        '' is a quote; with ``escapes`` a backslash hides the next character."""
        sql = self.sql
        while pos < len(sql):
            char = sql[pos]
            if escapes and char == "\\":
                pos += 2
            elif char != "'":
                pos += 1
            elif sql.startswith("''", pos):
                pos += 2
            else:
                return pos + 1
        return len(sql)

    def _skip_quoted_name(self) -> None:
        """A quoted identifier: a doubled quote stands for one."""
        sql, pos = self.sql, self.pos + 1
        while (end := sql.find('"', pos)) >= 0:
            if not sql.startswith('""', end):
                self.pos = end + 1
                return
            pos = end + 2
        self.pos = len(sql)

    def _skip_dollar(self) -> None:
        """A dollar quote up to its own delimiter, a parameter ($1), or a lone '$'."""
        sql, pos = self.sql, self.pos
        if (delimiter := _DOLLAR.match(sql, pos)) is not None:
            end = sql.find(delimiter.group(), delimiter.end())
            self.pos = len(sql) if end < 0 else end + len(delimiter.group())
        elif (parameter := _PARAMETER.match(sql, pos)) is not None:
            self.pos = parameter.end()
        else:
            self.pos += 1

    def _skip_block_comment(self) -> None:
        """A /* … */ comment, which may hold others."""
        sql, pos, depth = self.sql, self.pos + 2, 1
        while depth and pos < len(sql):
            if sql.startswith("/*", pos):
                depth, pos = depth + 1, pos + 2
            elif sql.startswith("*/", pos):
                depth, pos = depth - 1, pos + 2
            else:
                pos += 1
        self.pos = min(pos, len(sql))


# First words of statements a collector may not be: they return no row to publish, and
# each could leave the read-only transaction, change what the next collectors run
# under, load the server, or change the pooler. Writes are left to the read-only
# transaction itself, which refuses them (D2).
REFUSED = dict.fromkeys(
    ("BEGIN", "START", "COMMIT", "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE"),
    "it controls the transaction, and could end the read-only one",
)
_SESSION = ("SET", "RESET", "DISCARD", "LOAD", "PREPARE", "DEALLOCATE", "DECLARE", "CLOSE")
REFUSED |= dict.fromkeys(
    (*_SESSION, "LISTEN", "UNLISTEN"), "it changes the session for the collectors that follow"
)
REFUSED |= dict.fromkeys(
    ("DO", "CALL"), "a procedure or DO block may commit, and write in the transaction after"
)
REFUSED |= dict.fromkeys(
    ("VACUUM", "ANALYZE", "CLUSTER", "REINDEX", "CHECKPOINT", "LOCK", "COPY"),
    "it is maintenance or bulk work, which a read-only transaction may still allow",
)
_POOLER = ("PAUSE", "RESUME", "DISABLE", "ENABLE", "RECONNECT", "KILL", "KILL_CLIENT")
REFUSED |= dict.fromkeys(
    (*_POOLER, "SUSPEND", "SHUTDOWN", "RELOAD", "WAIT_CLOSE"),
    "it is a pgBouncer console command that changes the pooler",
)
QUERIES = "SELECT, WITH, VALUES, TABLE, SHOW or EXPLAIN"


def collector_sql_problem(sql: str) -> str | None:
    """Why a collector may not run ``sql`` as its query or predicate, or None: more than
    one statement, or a statement that is a command rather than a query."""
    count = statement_count(sql)
    if count > 1:
        return (
            f"{count} statements, where a collector runs one: a statement after the first "
            "could commit and write outside the read-only transaction; keep one query"
        )
    statements = split_statements(sql)
    keyword = statements[0].keyword if statements else ""
    if (risk := REFUSED.get(keyword)) is None:
        return None
    return (
        f"not a query: it starts with {keyword!r}, and {risk}; a collector runs one "
        f"statement that returns rows ({QUERIES})"
    )
