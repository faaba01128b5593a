"""Maestro's model, requirement and arbiter (controller/maestro.py)."""

from __future__ import annotations

import random

import pytest

from santhrottle.controller.maestro import (
    DEFAULT_BETA,
    U_MIN_FRACTION,
    Claim,
    Model,
    arbitrate,
    box,
    fit_beta,
    normalised,
    pwfte,
    requirement,
    spread,
    water_fill,
)


def test_worked_example_of_the_header() -> None:
    claims = [Claim(1.0, 0.8, 0.5, 1.0), Claim(2.0, 0.8, 0.5, 1.0)]
    assert requirement(claims[0], 0.05) == pytest.approx(0.55)
    shares, over = arbitrate(claims, 0.05)
    assert over
    assert shares == pytest.approx([0.45, 0.55])
    assert [pwfte(c, u) for c, u in zip(claims, shares, strict=True)] == pytest.approx([0.25, 0.3])
    assert spread(claims, shares) == pytest.approx(0.05)
    # a wider limit: equal PWFTEs, the predicted shortfalls 2 : 1
    shares, _ = arbitrate([Claim(1.0, 0.8, 0.5, 1.0), Claim(2.0, 0.8, 0.5, 1.0)], limit_max=0.2)
    assert shares == pytest.approx([0.4333333, 0.5666667])
    assert spread(claims, shares) == pytest.approx(0.0, abs=1e-9)
    short = [1 - (0.8 + (u - 0.5)) for u in shares]
    assert short[0] / short[1] == pytest.approx(2.0)


def test_underload_grants_requests_and_spreads_the_excess_by_priority() -> None:
    # both over target: requests fall by the limit; the excess 0.1 goes 1 : 3
    claims = [Claim(1.0, 1.5, 0.5, 1.0), Claim(3.0, 1.5, 0.5, 1.0)]
    shares, over = arbitrate(claims, limit_max=0.05)
    assert not over
    assert shares == pytest.approx([0.45 + 0.025, 0.45 + 0.075])
    assert sum(shares) == pytest.approx(1.0)


def test_underload_excess_respects_the_change_limit() -> None:
    # requests 0.45 each; the excess 0.1 goes 1 : 100, but the second may reach 0.55 only
    claims = [Claim(1.0, 2.0, 0.5, 1.0), Claim(100.0, 2.0, 0.5, 1.0)]
    shares, _ = arbitrate(claims, limit_max=0.05)
    assert shares == pytest.approx([0.45 + 0.1 / 101, 0.45 + 0.1 * 100 / 101])
    assert sum(shares) == pytest.approx(1.0)


def _lp(claims: list[Claim], limit_max: float) -> float:
    """Maestro's LP solved by HiGHS: the optimal eps."""
    linprog = pytest.importorskip("scipy.optimize").linprog
    n = len(claims)
    # variables u_1..u_n, eps; minimise eps
    cost = [0.0] * n + [1.0]
    a_ub, b_ub = [], []
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            ci, cj = claims[i], claims[j]
            # p_i(1-y_i-beta_i(u_i-c_i)) - p_j(1-y_j-beta_j(u_j-c_j)) <= eps
            row = [0.0] * (n + 1)
            row[i] -= ci.priority * ci.beta
            row[j] += cj.priority * cj.beta
            row[n] = -1.0
            const = ci.priority * (1 - ci.y + ci.beta * ci.share) - cj.priority * (
                1 - cj.y + cj.beta * cj.share
            )
            a_ub.append(row)
            b_ub.append(-const)
    bounds = [box(c.share, limit_max) for c in claims] + [(None, None)]
    res = linprog(
        cost, A_ub=a_ub, b_ub=b_ub, A_eq=[[1.0] * n + [0.0]], b_eq=[1.0], bounds=bounds,
        method="highs",
    )  # fmt: skip
    assert res.status == 0, res.message
    return float(res.fun)


def _random_claims(rng: random.Random, n: int) -> list[Claim]:
    raw = [rng.uniform(0.01, 1.0) for _ in range(n)]
    tot = sum(raw)
    return [
        Claim(rng.choice([0.5, 1.0, 2.0, 5.0]), rng.uniform(0.2, 1.2), r / tot, rng.uniform(0.1, 5))
        for r in raw
    ]


@pytest.mark.fuzz  # a corpus: 60 random claim sets against the LP
@pytest.mark.parametrize("seed", range(60))
def test_water_filling_attains_the_lp_optimum(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 12)
    limit_max = rng.choice([0.01, 0.05, 0.2, 1.0])
    claims = _random_claims(rng, n)
    boxes = [box(c.share, limit_max) for c in claims]
    a = [c.priority * (1.0 - c.y + c.beta * c.share) for c in claims]
    b = [c.priority * c.beta for c in claims]
    u = water_fill(a, b, boxes)
    assert sum(u) == pytest.approx(1.0, abs=1e-9)
    for ui, (lo, hi) in zip(u, boxes, strict=True):
        assert lo - 1e-12 <= ui <= hi + 1e-12
    assert spread(claims, u) == pytest.approx(_lp(claims, limit_max), abs=1e-7)


def test_water_fill_with_boxes_that_cannot_sum_to_one() -> None:
    assert water_fill([1.0, 1.0], [1.0, 1.0], [(0.0, 0.3), (0.0, 0.3)]) == [0.3, 0.3]
    assert water_fill([1.0, 1.0], [1.0, 1.0], [(0.6, 0.9), (0.6, 0.9)]) == [0.6, 0.6]


def test_shares_never_leave_their_bounds() -> None:
    claims = [Claim(1.0, 0.1, U_MIN_FRACTION, 1.0), Claim(50.0, 0.1, 1 - U_MIN_FRACTION, 1.0)]
    shares, _ = arbitrate(claims)
    assert shares[0] >= U_MIN_FRACTION
    assert sum(shares) == pytest.approx(1.0)


def test_fit_beta_defaults_and_fits() -> None:
    assert fit_beta([]) == (DEFAULT_BETA, True)
    assert fit_beta([(0.05, 0.1), (0.05, 0.1)]) == (DEFAULT_BETA, True)  # too few
    assert fit_beta([(0.001, 0.1)] * 5) == (DEFAULT_BETA, True)  # too little movement
    beta, default = fit_beta([(0.05, 0.1), (-0.05, -0.1), (0.05, 0.11), (0.02, 0.04)])
    assert not default and beta == pytest.approx(2.0, rel=0.05)
    assert fit_beta([(0.05, -0.1), (-0.05, 0.1), (0.05, -0.1)]) == (DEFAULT_BETA, True)  # < 0
    noisy = [(0.05, 0.3), (-0.05, 0.3), (0.05, -0.3), (-0.05, -0.3)]
    assert fit_beta(noisy) == (DEFAULT_BETA, True)  # R^2 = 0


def test_model_refits_on_a_sliding_window() -> None:
    m = Model(window=4)
    for u, y in [(0.5, 0.8), (0.55, 0.9), (0.5, 0.8), (0.55, 0.9), (0.6, 1.0)]:
        m.observe(u, y)
    assert not m.default and m.beta == pytest.approx(2.0)
    assert len(m.changes) == 4
    m.reset()
    assert m.default and m.last is None


def test_normalised_takes_the_worse_target() -> None:
    assert normalised(0.010, 0.020, None, None) == pytest.approx(0.5)
    assert normalised(None, None, 100.0, 80.0) == pytest.approx(0.8)
    assert normalised(0.010, 0.005, 100.0, 80.0) == pytest.approx(0.8)
    assert normalised(None, 0.01, None, 5.0) is None
    assert normalised(0.01, None, None, None) is None
