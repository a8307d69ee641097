"""Text quoted in messages: excerpts of values, shortened names."""

from __future__ import annotations

from exporter.errors import (
    EXCERPT_CHARS,
    MAX_LISTED_PROBLEMS,
    ConfigError,
    Problem,
    excerpt,
    shorten,
)


def test_short_values_are_quoted_whole() -> None:
    """A value that fits is its plain repr."""
    assert excerpt("abc") == "'abc'"
    assert excerpt(["a", 1]) == "['a', 1]"
    assert excerpt(1.5) == "1.5"


def test_a_long_string_is_cut_and_its_length_given() -> None:
    """A long string shows its first characters, an ellipsis and its full length."""
    text = excerpt("x" * 100_000)
    assert text == f"{'x' * EXCERPT_CHARS!r}… (100000 characters)"


def test_a_huge_shared_structure_is_quoted_in_a_line() -> None:
    """Nine levels of nine-fold sharing (9**9 leaves once written out) stay one short line."""
    value: object = ["lol"] * 9
    for _ in range(8):
        value = [value] * 9
    text = excerpt(value)
    assert len(text) < 2 * EXCERPT_CHARS
    assert text.endswith("… (9 items)")


def test_a_value_that_contains_itself_is_quoted() -> None:
    """A cyclic list gives a short repr, not a recursion error."""
    cyclic: list[object] = []
    cyclic.append(cyclic)
    assert len(excerpt(cyclic)) < EXCERPT_CHARS


def test_shorten_keeps_both_ends_of_a_long_name() -> None:
    """A long location keeps its start (the file, the key) and its end (the field)."""
    where = "k" * 10_000 + ".metrics[2].usage"
    short = shorten(where)
    assert len(short) <= 2 * EXCERPT_CHARS + 1
    assert short.startswith("kkk")
    assert short.endswith(".metrics[2].usage")
    assert shorten("b.metrics[2].usage") == "b.metrics[2].usage"


def test_config_error_lists_a_bounded_number_of_problems() -> None:
    """A file with 100 000 mistakes gives a message of the first 1 000 and a count of the
    rest, not megabytes in the log and in /reload's answer."""
    problems = [Problem(f"c.yml:b{i}.ttl", "ttl must be >= 0") for i in range(100_000)]
    error = ConfigError(problems)
    lines = str(error).splitlines()
    assert lines[0] == "100000 problem(s) in collector definitions"
    assert len(lines) == 1 + MAX_LISTED_PROBLEMS + 1
    assert lines[-1] == f"  … and {100_000 - MAX_LISTED_PROBLEMS} more problem(s) not listed"
    assert error.problems == tuple(problems)  # every problem is still there to inspect
