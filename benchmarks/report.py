"""The benchmarks' one Markdown writer: tables, and the cells their figures take."""

from typing import List, Optional, Sequence


def table(columns: Sequence[str], rows: Sequence[Sequence]) -> List[str]:
    """A Markdown table: the header, its rule, then a line per row."""
    lines = ["| " + " | ".join(map(str, columns)) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows]


def number(value: Optional[float], spec: str = ".2f", unit: str = "") -> str:
    """`value` formatted, or '-' where there is none."""
    return "-" if value is None else f"{value:{spec}}{unit}"


def interval(figure: Optional[dict], spec: str = ".2f", unit: str = "") -> str:
    """A median and its 95% interval (stats.median_interval) as 'median [lo, hi]unit', or '-'."""
    if figure is None:
        return "-"
    return f"{figure['median']:{spec}} [{figure['lo']:{spec}}, {figure['hi']:{spec}}]{unit}"

