"""Figures shared by the peer scripts (standard library only).

The scripts import it after putting this folder on their path:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
"""


def quantile(sorted_values, q):
    """Nearest-rank quantile of an already sorted list; NaN when it is empty."""
    if not sorted_values:
        return float("nan")
    rank = -(-round(q * 1000) * len(sorted_values) // 1000)
    return sorted_values[max(1, min(rank, len(sorted_values))) - 1]


def ms(seconds):
    """Seconds as milliseconds with three decimals."""
    return f"{seconds * 1000:.3f}"


def latency_ms(sorted_seconds):
    """`p50_ms=.. p99_ms=.. max_ms=..` of sorted latencies in seconds (nan when there are none)."""
    top = sorted_seconds[-1] if sorted_seconds else float("nan")
    return (f"p50_ms={ms(quantile(sorted_seconds, .5))} p99_ms={ms(quantile(sorted_seconds, .99))} "
            f"max_ms={ms(top)}")
