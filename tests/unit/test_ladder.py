"""The delay ladder (controller/ladder.py): one definition for every user."""

import itertools

import pytest

from santhrottle.controller.ladder import Ladder, LadderError

pytestmark = pytest.mark.unit


def test_the_default_ladder_is_fine_near_0_and_geometric_above():
    lad = Ladder()
    assert lad.max_class == 88 and lad.max_delay_us == 250_000
    assert lad.delays_us[:21] == tuple(range(0, 10_001, 500))  # 0.5 ms steps to 10 ms
    assert lad.delay_us(30) == 15_000 and lad.delay_us(31) == 16_000  # the docstring's example
    steps = [b / a for a, b in itertools.pairwise(lad.delays_us[20:-1])]
    assert all(1.02 < r < 1.075 for r in steps)  # ~5 % (rounded to whole 0.5 ms steps)
    assert list(lad.delays_us) == sorted(set(lad.delays_us))  # strictly increasing


def test_a_linear_ladder_is_the_papers():
    lad = Ladder.linear(500, 100)
    assert lad.delays_us == tuple(range(0, 50_001, 500)) and lad.max_class == 100


def test_lookups():
    lad = Ladder()
    assert lad.class_at_least(0.0) == 0 and lad.class_at_least(0.0001) == 1
    assert lad.class_at_least(0.0103) == 21 and lad.class_at_most(0.0103) == 20
    assert lad.class_at_least(0.010) == 20 == lad.class_at_most(0.010)
    assert lad.class_at_least(5.0) == lad.max_class and lad.class_at_most(0.0001) == 0
    assert lad.class_of_us(29_000) == 43 and lad.class_of_us(30_000) is None


@pytest.mark.parametrize(
    "lad", [Ladder(), Ladder.linear(500, 100), Ladder(250, 300_000, 1.1), Ladder(100, 5_000)]
)
def test_a_tree_read_back_gives_its_ladder(lad):
    assert Ladder.matching(lad.delays_us) == lad
    assert Ladder.matching((0, 500, 1200, 1300)) is None
    assert Ladder.matching(()) is None


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"step_us": 0}, "step must be a whole number"),
        ({"step_us": 1.5}, "step must be a whole number"),
        ({"max_delay_us": 100}, "maximum must be a whole number of us >= the step"),
        ({"ratio": 0.9}, "ratio must be within 1.0-2.0"),
        ({"ratio": 1.0, "max_delay_us": 1_250}, "whole multiple of its step"),
        ({"step_us": 10, "max_delay_us": 1_000_000, "ratio": 1.0}, "more than 5000 classes"),
    ],
)
def test_bad_ladders_name_the_parameter(kw, message):
    with pytest.raises(LadderError, match=message):
        Ladder(**kw)
