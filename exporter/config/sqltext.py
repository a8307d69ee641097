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

The text is read a run of code at a time by regular expressions, which take in each
token (a name, a constant, a quoted name, a line or simple comment) whole, so that a
file's worth of hostile SQL costs about what reading its YAML does; only block
comments that nest and dollar quotes are walked here.

A collector runs one statement, and none that can leave its read-only transaction or
change the session the next collectors run in (:func:`collector_sql_problem`, D2).

Pure functions, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# PostgreSQL's lexer (scan.l) reads UTF-8 bytes >= 0x80 as letters, so any character
# outside ASCII is one here; its blanks are ASCII alone (U+00A0 is a letter to it).
_LETTER = r"A-Za-z_\x80-\U0010ffff"
_BLANK = r" \t\n\r\f\v"
_BLANKS = " \t\n\r\f\v"  # what str.strip should take off, and no more
# After a closing quote: blanks or `--` comments, a newline, then blanks, newlines or
# `--` comments, then a quote, continue the constant (`'a'` newline `'b'` is 'ab').
# Possessive, so that no text makes the expression backtrack.
_CONTINUE = rf"(?:[ \t\f]|--[^\n\r]*+)*+[\n\r](?:[{_BLANK}]|--[^\n\r]*+[\n\r])*+'"
_PLAIN = r"[^']*+(?:''[^']*+)*+"  # '' is a quote
_ESCAPED = r"[^'\\]*+(?:(?:''|\\[\s\S]|\\\Z)[^'\\]*+)*+"  # and a backslash hides a character


def _constant(segment: str) -> str:
    """A '…' constant with the segments that continue it; unterminated, to the end."""
    return rf"'{segment}(?:'(?:{_CONTINUE}{segment}(?:'|\Z))*+|\Z)"


_NAME_PATTERN = rf"[{_LETTER}][{_LETTER}0-9$]*+"  # a name takes in its '$' signs: x$a$
# A block comment that holds no other: the common case, read at once. (Comments nest,
# which no regular expression follows: one that holds another is walked.)
_SIMPLE_COMMENT = r"/\*[^*/]*+(?:(?:\*(?!/)|/(?!\*))[^*/]*+)*+\*/"
_LINE_COMMENT = r"--[^\n\r]*+"  # a line ends at \n or \r
_QUOTED_NAME = r'"[^"]*+(?:""[^"]*+)*+(?:"|\Z)'


def _code(plain: str) -> str:
    """A run of code up to a ';', a block comment or a dollar quote: names, numbers,
    blanks, operators, line comments, constants and quoted names, read token by token
    (by the regular expression engine) so that each constant ends where the server's
    does. ``plain`` reads the body of a '…' constant without a prefix letter."""
    return (
        "(?:"
        rf"[eE]{_constant(_ESCAPED)}|[bBxX]{_constant(_PLAIN)}|{_constant(plain)}"
        rf"|{_QUOTED_NAME}"
        rf"|(?![eEbBxX]'){_NAME_PATTERN}"  # a name, unless it is the letter before a '
        r"|\$[0-9]++"  # a parameter
        rf"|\$(?!(?:[{_LETTER}][{_LETTER}0-9]*+)?\$)"  # a '$' that opens no dollar quote
        rf"|{_LINE_COMMENT}|{_SIMPLE_COMMENT}"
        rf"|[^;'\"$/\-{_LETTER}]|-(?!-)|/(?!\*)"
        ")++"
    )


def _tokens(plain: str) -> re.Pattern[str]:
    """What may follow in a text: a statement's end, a block comment, a dollar quote's
    opening delimiter, or a run of code."""
    return re.compile(
        # a ';' and what follows it up to the next statement: blanks, comments, ';'
        rf"(?P<end>;(?:[;{_BLANK}]|{_LINE_COMMENT}|{_SIMPLE_COMMENT})*+)"
        r"|(?P<comment>/\*)"
        rf"|(?P<dollar>\$(?:[{_LETTER}][{_LETTER}0-9]*+)?\$)"  # $$ or $tag$, not $1
        rf"|(?P<code>{_code(plain)})"
    )


# Standard strings (standard_conforming_strings on) and backslash-escaped ones (off).
_STANDARD = _tokens(_PLAIN)
_BACKSLASHED = _tokens(_ESCAPED)
_NAME = re.compile(_NAME_PATTERN)
_LEADING = re.compile(rf"(?:[{_BLANK}(]|{_LINE_COMMENT}|{_SIMPLE_COMMENT})*+")
_COMMENT_MARK = re.compile(r"/\*|\*/")


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a text: its source (trimmed, without the semicolon), its first word."""

    text: str
    keyword: str  # upper-cased; "" when it starts with no name (a string, a quoted name)


def split_statements(
    sql: str, *, backslash_quotes: bool = False, limit: int | None = None
) -> tuple[Statement, ...]:
    """The statements of ``sql`` in order, leaving out those of blanks and comments alone
    (the first ``limit`` of them, when given).

    ``backslash_quotes`` reads plain strings as a server with
    ``standard_conforming_strings = off`` does (``\\'`` does not end them). An
    unterminated string, quote or comment runs to the end of the text, as the server
    would read it before refusing it.
    """
    return tuple(_Lexer(sql, backslash_quotes).statements(limit))


def statement_count(sql: str, limit: int | None = None) -> int:
    """How many statements ``sql`` holds on a server reading backslashes either way (at
    most ``limit``, when given: counting stops there)."""
    modes = (False, True) if "\\" in sql else (False,)  # no backslash: both read alike
    return max(len(split_statements(sql, backslash_quotes=m, limit=limit)) for m in modes)


class _Lexer:
    """One pass over a text, a run of code, a comment or a dollar quote at a time."""

    def __init__(self, sql: str, backslash_quotes: bool) -> None:
        self.sql = sql
        self.tokens = _BACKSLASHED if backslash_quotes else _STANDARD

    def statements(self, limit: int | None) -> list[Statement]:
        sql, found = self.sql, list[Statement]()
        start, pos, keyword = 0, 0, None  # keyword None: nothing but blanks and comments
        while pos < len(sql) and (limit is None or len(found) < limit):
            token = self.tokens.match(sql, pos)
            assert token is not None  # every character starts one of them
            kind, pos = token.lastgroup, token.end()
            if kind == "end":
                if keyword is not None:
                    found.append(_statement(sql[start : token.start()], keyword))
                start, keyword = pos, None
            elif kind == "code":
                keyword = _first_word(token.group(), keyword)
            elif kind == "comment":
                pos = _comment_end(sql, token.start())
            else:  # a dollar quote, to its own delimiter
                close = sql.find(token.group(), pos)
                pos = len(sql) if close < 0 else close + len(token.group())
                keyword = "" if keyword in (None, _OPENED) else keyword
        if keyword is not None and (limit is None or len(found) < limit):
            found.append(_statement(sql[start:], keyword))
        return found


def _statement(text: str, keyword: str) -> Statement:
    return Statement(text.strip(_BLANKS), "" if keyword == _OPENED else keyword)


_OPENED = "("  # a statement of opening parentheses so far: `(SELECT 1)` is a SELECT


def _first_word(code: str, keyword: str | None) -> str | None:
    """A statement's keyword after a run of code: unchanged once known; its first name
    (upper-cased), or "" when something else comes first (a constant, a quoted name)."""
    if keyword not in (None, _OPENED):
        return keyword
    lead = _LEADING.match(code)
    assert lead is not None  # it matches the empty string
    if lead.end() == len(code):  # blanks, line comments and '(' alone
        return _OPENED if "(" in code else keyword
    name = _NAME.match(code, lead.end())
    return "" if name is None or code.startswith("'", name.end()) else name.group().upper()


def _comment_end(sql: str, at: int) -> int:
    """Just after the /* … */ comment starting at ``at``, which may hold others."""
    depth = 1
    for mark in _COMMENT_MARK.finditer(sql, at + 2):
        depth += 1 if sql[mark.start()] == "/" else -1
        if depth == 0:
            return mark.end()
    return len(sql)


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


# Functions whose effect outlives the statement and the transaction that called them:
# behind a pooler, the next application on the server connection would inherit it
# (issue 36). Transaction-scoped forms (pg_advisory_xact_lock, set_config(…, true)) end
# with our transaction, which is rolled back.
SESSION_CALLS = {
    "pg_advisory_lock": "takes a session-level advisory lock, held after the collector",
    "pg_advisory_lock_shared": "takes a session-level advisory lock, held after the collector",
    "pg_try_advisory_lock": "takes a session-level advisory lock, held after the collector",
    "pg_try_advisory_lock_shared": "takes a session-level advisory lock, held after the collector",
    "dblink_connect": "opens a connection that outlives the collector",
    "dblink_connect_u": "opens a connection that outlives the collector",
}
_CALL = re.compile(r'(?<![\w$])"?(' + "|".join(SESSION_CALLS) + r')"?\s*\(', re.IGNORECASE)
# set_config whose third argument is not the literal true sets the session's value.
_SET_CONFIG = re.compile(r'(?<![\w$])"?set_config"?\s*\(', re.IGNORECASE)
_LOCAL_TAIL = re.compile(r",\s*true\s*$", re.IGNORECASE)


def session_call_problem(sql: str) -> str | None:
    """Why ``sql`` may leave something behind in the session, or None: a call of a
    function whose effect outlives our transaction, or ``set_config`` not local to it.
    Read over the whole text, strings included: a false alarm names the call, a miss
    would leave a lock or a setting to the next application on a pooled connection."""
    if (found := _CALL.search(sql)) is not None:
        name = found.group(1).lower()
        return f"it calls {name}(), which {SESSION_CALLS[name]}; use the _xact_ form"
    for found in _SET_CONFIG.finditer(sql):
        arguments = _arguments(sql, found.end())
        if arguments is None or not _LOCAL_TAIL.search(arguments):
            return (
                "it calls set_config() without true as its third argument, which changes "
                "the session's setting after the collector; pass true (local to our "
                "transaction)"
            )
    return None


def _arguments(sql: str, start: int) -> str | None:
    """The text between the parenthesis just before ``start`` and its match, or None."""
    depth = 1
    for at in range(start, len(sql)):
        depth += {"(": 1, ")": -1}.get(sql[at], 0)
        if depth == 0:
            return sql[start:at]
    return None


def collector_sql_problem(sql: str) -> str | None:
    """Why a collector may not run ``sql`` as its query or predicate, or None: more than
    one statement, a statement that is a command rather than a query, or a call whose
    effect outlives the collector (issue 36)."""
    if (problem := session_call_problem(sql)) is not None:
        return f"a session side effect: {problem}"
    if statement_count(sql, limit=2) > 1:  # no need to read on past the second one
        return (
            "several statements, where a collector runs one: a statement after the first "
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
