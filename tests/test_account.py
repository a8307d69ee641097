"""A probed ``top`` collector's counters (issue 38): what each named key's series shows
and what the remainder holds, from the named keys' rows and the totals over every key.
The property that matters: the increases the named series show plus the remainder's
add up to the total's, and no series ever falls."""

from __future__ import annotations

import math

import pytest

from exporter.collect.account import Account, Listing
from exporter.collect.ranking import Key

A, B, C = ("a",), ("b",), ("c",)


def test_named_series_and_remainder_add_up_to_the_total() -> None:
    """Run after run, with a key named, then demoted, then named again: the shown
    increases plus the remainder's are the total's increase, exactly."""
    account = Account("sig", 1)
    values = {A: 10.0, B: 20.0, C: 30.0}
    named = [(A, B), (A, B), (A, C), (A, B), (A, B)]
    shown_before: dict[Key, float] = {}
    remainder_before, total_before = 0.0, sum(values.values())
    for run, keys in enumerate(named):
        if run:
            values = {A: values[A] + 1, B: values[B] + 2, C: values[C] + 4}
        total = sum(values.values())
        shown = account.run({k: [values[k]] for k in keys}, values, [total])
        if run:
            increase = sum(
                shown[k][0] - shown_before[k]
                for k in keys
                if k in shown_before and k in named[run - 1]
            )
            gained = account.remainder[0] - remainder_before
            assert math.isclose(increase + gained, total - total_before), run
        shown_before = {k: v[0] for k, v in shown.items()}
        remainder_before, total_before = account.remainder[0], total
    assert account.remainder[0] > 0


def test_a_key_named_anew_shows_its_value_then_its_increases() -> None:
    """First named: its real value; named in the next run too: its own increase, which
    the remainder does not get."""
    account = Account("sig", 1)
    assert account.run({A: [5.0]}, {A, B}, [12.0]) == {A: [5.0]}
    assert account.run({A: [8.0]}, {A, B}, [16.0]) == {A: [8.0]}
    assert account.remainder == [1.0]  # B's 7 → 8
    assert account.published


def test_a_key_named_again_continues_flat_from_what_it_showed() -> None:
    """Away for a run and back: its series resumes at what it showed, never above, so
    Prometheus, whose increase() spans the gap, counts what the remainder held once."""
    account = Account("sig", 1)
    account.run({A: [5.0]}, {A, B}, [10.0])
    account.run({B: [6.0]}, {A, B}, [13.0])  # A 5 → 7 unnamed: the remainder's
    shown = account.run({A: [9.0]}, {A, B}, [15.0])  # A 7 → 9 as it comes back: too
    assert shown == {A: [5.0]}
    assert account.remainder == [3.0 + 2.0]  # A's 5 → 9 and B's 5 → 6
    shown = account.run({A: [10.0]}, {A, B}, [16.0])
    assert shown == {A: [6.0]}
    assert account.remainder == [5.0]


def test_a_reset_leaves_the_series_flat_and_gives_the_remainder_the_new_count() -> None:
    """A named key's counter fell: its series shows no increase and does not fall; what
    it counted since the reset goes to the remainder."""
    account = Account("sig", 1)
    account.run({A: [100.0]}, {A, B}, [110.0])
    shown = account.run({A: [3.0]}, {A, B}, [13.0])  # A reset, counted 3 since
    assert shown == {A: [100.0]}
    assert account.remainder == [3.0]


def test_a_named_key_dropped_takes_its_count_out_of_the_total_unseen() -> None:
    """A named table dropped: the total falls by its count, which is no increase of the
    others; the remainder still gets theirs."""
    account = Account("sig", 1)
    account.run({A: [50.0]}, {A, B}, [60.0])
    account.run({}, {B}, [12.0])  # A gone; B 10 → 12
    assert account.remainder == [2.0]


def test_the_remainder_never_falls_and_counts_nothing_without_a_total() -> None:
    """An unnamed key reset: the total falls, the remainder stays. A counter the probe
    gives no total for (NaN) never moves."""
    account = Account("sig", 2)
    account.run({A: [1.0, 1.0]}, {A, B}, [101.0, math.nan])
    account.run({A: [1.0, 2.0]}, {A, B}, [4.0, math.nan])
    assert account.remainder == [0.0, 0.0]
    account.run({A: [1.0, 3.0]}, {A, B}, [9.0, math.nan])
    assert account.remainder == [5.0, 0.0]


def test_a_listing_like_the_last_finds_the_moved_keys_by_comparing_arrays() -> None:
    """The same keys: only those whose value moved; new keys or a new order: every key
    that is new or moved; a key listed twice is told."""
    listing = Listing()
    assert listing.update([1, 2, 3], [10, 20, 30], ()) == [
        ((1,), (10,)), ((2,), (20,)), ((3,), (30,)),
    ]  # fmt: skip
    assert listing.update([1, 2, 3], [10, 25, 30], ()) == [((2,), (25,))]
    assert listing.update([3, 1, 4], [30, 11, 0], ()) == [((1,), (11,)), ((4,), (0,))]
    assert listing.present == {(3,): (), (1,): (), (4,): ()}
    assert not listing.repeated
    listing.update([5, 5], [1, 1], ())
    assert listing.repeated
    grouped = Listing()  # a key is its text and its group's labels
    assert grouped.update([7], [1], ("db",)) == [((7, "db"), (1,))]
    assert grouped.present == {(7, "db"): ("db",)}


def test_a_row_that_did_not_move_is_passed_as_unchanged() -> None:
    """A key named in the last run whose row reads the same is passed as None: its series
    stands, and the total's increase is the other keys', all the remainder's."""
    account = Account("sig", 1)
    account.run({A: [5.0]}, {A, B}, [10.0])
    assert account.run({A: None}, {A, B}, [13.0]) == {A: [5.0]}
    assert account.remainder == [3.0]
    assert account.run({A: [6.0]}, {A, B}, [14.0]) == {A: [6.0]}
    assert account.remainder == [3.0]


def test_a_listing_in_text_is_read_only_when_it_changed() -> None:
    """The probe's arrays as PostgreSQL writes them: the same texts as the last run's
    cost two comparisons; a moved value is read as a number; keys stay their text."""
    listing = Listing()
    assert listing.update("{16384,16390}", "{7,0}", ("db",)) == [
        (("16384", "db"), (7,)), (("16390", "db"), (0,)),
    ]  # fmt: skip
    assert listing.update("{16384,16390}", "{7,0}", ("db",)) == []
    assert listing.update("{16384,16390}", "{7,2.5}", ("db",)) == [(("16390", "db"), (2.5,))]
    assert listing.update("{16390,16400}", "{2.5,NULL}", ("db",)) == [(("16400", "db"), (None,))]
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        listing.update("{1,2}", "{1}", ("db",))
