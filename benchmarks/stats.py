"""The benchmarks' one statistics module: a median with its 95% interval, and whether two overlap.

Note [The bench's intervals]
The interval is the distribution-free 95% confidence interval of the median from order statistics: with n
values sorted x(1) <= ... <= x(n), the median lies below x(j) with probability P(B <= j - 1) for B ~
Binomial(n, 1/2), whatever the distribution of the values, so [x(j), x(n + 1 - j)] covers it with probability
1 - 2 P(B <= j - 1). j is the largest rank that keeps that coverage at 95% or more: for 20 values the 6th and
15th, for 30 the 10th and 21st. It needs no assumption of normality (step times are skewed: a step can only
be late) and at least 6 values (with 5, even the smallest and largest cover the median with only 94%).
A comparison of two medians is a loss only when the two intervals do not overlap.
"""

import math
import statistics
from typing import Dict, Sequence

CONFIDENCE = 0.95


def interval_ranks(n: int, confidence: float = CONFIDENCE) -> int:
    """j, the 1-based rank of the interval's lower end (the upper end is rank n + 1 - j); see Note [The bench's
    intervals]. Raises ValueError when n values are too few for the confidence."""
    below = 0.0  # P(B <= j - 1), growing with j
    rank = 0
    for j in range(1, n // 2 + 1):
        below += math.comb(n, j - 1) / 2 ** n
        if 1 - 2 * below < confidence:
            break
        rank = j
    if rank == 0:
        raise ValueError(f"a {confidence:.0%} interval of the median needs more than {n} values")
    return rank


def median_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Dict[str, float]:
    """{'median', 'lo', 'hi', 'n'}: the median of `values` and its distribution-free confidence interval
    (Note [The bench's intervals])."""
    ordered = sorted(values)
    j = interval_ranks(len(ordered), confidence)
    return {"median": statistics.median(ordered), "lo": ordered[j - 1], "hi": ordered[len(ordered) - j],
            "n": len(ordered)}


def summary(values: Sequence[float]) -> Dict[str, float]:
    """median_interval, or where 95% needs more values, the median with the lowest and highest."""
    if len(values) >= 6:
        return median_interval(values)
    return {"median": statistics.median(values), "lo": min(values), "hi": max(values), "n": len(values)}


def intervals_overlap(a: Dict[str, float], b: Dict[str, float]) -> bool:
    """Whether the intervals of two median_interval results share a value."""
    return a["lo"] <= b["hi"] and b["lo"] <= a["hi"]

