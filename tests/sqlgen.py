"""Hypothesis strategies for SQL texts of a known number of statements.

Each text is a few ``SELECT`` statements whose constants, quoted names and comments
hold what a naive split would trip on (semicolons, quotes, backslashes, dollar signs,
comment marks, newlines), each written the way PostgreSQL reads it, so the server
returns one result per statement. Used by the unit tests of :mod:`exporter.sqltext`
and by the integration test that runs the same texts on real servers.
"""

from __future__ import annotations

from hypothesis import strategies as st

# Characters that matter to a lexer, and a few that do not.
TRICKY = st.sampled_from(list(";'\"$\\-*/\n\r\t eEuUbBxXa01&"))
CONTENT = st.text(TRICKY, max_size=12)


def plain_string(content: str, *, backslashes: bool) -> str:
    """'…' as either server setting reads it when ``backslashes`` doubles them too."""
    text = content.replace("\\", "\\\\") if backslashes else content
    return "'" + text.replace("'", "''") + "'"


def escape_string(content: str) -> str:
    """E'…', read with backslash escapes whatever the setting."""
    return "E'" + content.replace("\\", "\\\\").replace("'", "\\'") + "'"


def dollar_string(content: str, tag: str) -> str:
    """$tag$…$tag$ around content that cannot hold the delimiter."""
    delimiter = f"${tag}$"
    return delimiter + content.replace("$", "") + delimiter


def line_comment(content: str) -> str:
    return "-- " + content.replace("\n", " ").replace("\r", " ") + "\n"


def block_comment(content: str, depth: int) -> str:
    """/* … */, nested ``depth`` times, its text free of comment marks."""
    inner = content.replace("*", "").replace("/", "")
    for _ in range(depth):
        inner = f"/* {inner} */"
    return inner


@st.composite
def expression(draw: st.DrawFn, *, backslashes: bool) -> str:
    """One select-list item: a constant of some kind, maybe commented, maybe aliased."""
    content = draw(CONTENT)
    kind = draw(st.sampled_from(["plain", "escape", "dollar", "continued", "number"]))
    if kind == "plain":
        item = plain_string(content, backslashes=backslashes)
    elif kind == "escape":
        item = escape_string(content)
    elif kind == "dollar":
        item = dollar_string(content, draw(st.sampled_from(["", "a", "fn_1", "é"])))
    elif kind == "continued":  # 'a' newline 'b' is one constant 'ab', E'…' continued so too
        second = draw(CONTENT)
        if draw(st.booleans()):
            item = (
                escape_string(content)
                + "\n"
                + "'"
                + second.replace("\\", "\\\\").replace("'", "\\'")
                + "'"
            )
        else:
            item = (
                plain_string(content, backslashes=backslashes)
                + " -- c\n  "
                + (plain_string(second, backslashes=backslashes))
            )
    else:
        item = draw(st.sampled_from(["1", "1.5", "1e3", ".5", "(1)"]))
    if draw(st.booleans()):
        item += ' AS "' + (content.replace('"', '""') or "x") + '"'
    return item


@st.composite
def statement(draw: st.DrawFn, *, backslashes: bool) -> str:
    """``SELECT`` of one to three items, with comments where blanks may go."""
    items = draw(st.lists(expression(backslashes=backslashes), min_size=1, max_size=3))
    comment = draw(
        st.sampled_from(["", line_comment(draw(CONTENT)), block_comment(draw(CONTENT), 2)])
    )
    return f"SELECT {comment}" + ", ".join(items)


@st.composite
def script(draw: st.DrawFn, *, backslashes: bool = False) -> tuple[str, int]:
    """A text of 1 to 4 statements and how many it holds; ``backslashes`` doubles every
    backslash in plain strings, so a server reads it the same way whatever its setting."""
    statements = draw(st.lists(statement(backslashes=backslashes), min_size=1, max_size=4))
    separator = draw(st.sampled_from([";", "; ", ";\n", ";;", "; -- ;\n", "; /* ; */ "]))
    end = draw(st.sampled_from(["", ";", "; ", ";\n-- end", " /* ; */"]))
    return separator.join(statements) + end, len(statements)
