"""The order the suite's tests go out to its xdist workers: slow tests of their own spread among
the integration ones, grouped tests in tier order, the unit tier last."""

from __future__ import annotations

import itertools

import pytest

from tests.conftest import SLOW_SPREAD, handout_order

pytestmark = pytest.mark.unit


def order(tests: list[str]) -> list[str]:
    """``tests`` as "<tier letter><name>", "g" ahead of a name for one in a group."""
    tiers = {"s": "slow", "i": "integration", "u": "unit"}
    return handout_order(
        tests, tier=lambda t: tiers[t.removeprefix("g")[0]], alone=lambda t: t[0] != "g"
    )


def test_slow_tests_of_their_own_are_spread_over_the_integration_ones_and_end_before_them():
    integration = [f"i{n}" for n in range(10)]
    slow = [f"s{n}" for n in range(4)]
    units = ["u0", "u1"]

    out = order(units + integration + slow)

    singles = [t for t in out if t[0] in "si"]
    assert [t for t in singles if t[0] == "s"] == slow  # file order kept
    assert [t for t in singles if t[0] == "i"] == integration
    positions = [singles.index(s) for s in slow]
    assert positions[0] <= 2 and all(b - a >= 2 for a, b in itertools.pairwise(positions))
    # Integration tests are left after the last slow one, to fill the other worker meanwhile.
    after_last_slow = len(singles) - positions[-1] - 1
    assert after_last_slow >= int((1 - SLOW_SPREAD) * len(integration))
    assert out[-2:] == units


def test_grouped_tests_keep_the_tier_order_ahead_of_the_singles():
    out = order(["i0", "gu1", "s0", "gi1", "gs1", "u0"])

    assert out == ["gs1", "gi1", "gu1", "s0", "i0", "u0"]
