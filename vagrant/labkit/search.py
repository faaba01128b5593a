"""The best static delay: the smallest class of the ladder a pinned delay holds T at. Pure.

What it owns
    The search closed_loop.py's static phases run (docs/lab.md, "The best static
    delay"): from a starting class (the controller's median while the writers
    wrote), `step` classes up while the probe says the reader's p95 is over T (down
    while it holds), the step doubling each probe (galloping), until a class that
    holds and one that does not are bracketed; then bisection between the highest
    class over T and the lowest that holds; at most `probes` probes.  A probe is the
    caller's: a static phase at that class, judged against T.

Worked example
    T held from class 57 up, start 30, step 5, 4 probes: 30 over, 35 over (step 10),
    45 over (step 20), 65 holds -> bracketed (45, 65); the probes end.  The best is
    the lowest class that held: 65 (with 8 probes: 55 over, 60 holds, 57 holds,
    56 over: 57).
"""

from __future__ import annotations

from collections.abc import Callable


def smallest_holding(
    holds: Callable[[int], bool], start: int, max_class: int, step: int, probes: int
) -> list[tuple[int, bool]]:
    """The probes made, in order: (class, held)."""
    k = max(1, min(max_class, start))
    over, held = 0, max_class + 1  # highest class over T, lowest that holds
    made: list[tuple[int, bool]] = []
    jump = step
    for _ in range(probes):
        ok = holds(k)
        made.append((k, ok))
        if ok:
            held = min(held, k)
        else:
            over = max(over, k)
        if held <= max_class and over > 0:  # bracketed: bisect
            if held - over <= 1:
                break
            k = (held + over) // 2
        elif held <= max_class:  # all held so far: lower
            k = max(1, held - jump)
            if k == held:
                break
        else:  # none held yet: higher
            k = min(max_class, over + jump)
            if k == over:
                break
        jump *= 2  # galloping until bracketed
    return made
