"""A figure's value written to the precision a reader compares by: the table's and bench_ab.py's one
format (this module imports nothing, so bench_ab.py uses it without the bench's harness)."""

from __future__ import annotations


def number(value: float) -> str:
    """`5,432`, `153.2`, `2.92`: a figure's value to the precision a reader compares by."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.1f}"
    return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
