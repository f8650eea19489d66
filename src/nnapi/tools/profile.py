"""Per-operation profile: where an execution's time goes, from the trace events that
nnapi-reference records for each operation it runs (category ``operation``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nnapi import tracing

#: The trace category of one operation run by a driver.
OPERATION = "operation"


def profile(run: Callable[[], Any], iterations: int) -> list[dict[str, Any]]:
    """Run ``run`` ``iterations`` times with tracing on and summarize the operation events:
    one row per (subgraph, operation position), slowest first, with the mean time per
    execution and its share of all operation time."""
    was_on = tracing.state.enabled
    if was_on:
        raise RuntimeError("profile: tracing is already on (NNAPI_TRACE or --trace); profile without it")
    tracing.start()
    try:
        for _ in range(iterations):
            run()
    finally:
        events = tracing.stop()
    return summarize([event for event in events if event["cat"] == OPERATION], iterations)


def summarize(events: list[dict], iterations: int) -> list[dict[str, Any]]:
    rows: dict[tuple, dict[str, Any]] = {}
    for event in events:
        args = event.get("args", {})
        key = (args.get("subgraph", 0), args.get("position", -1), event["name"])
        row = rows.setdefault(key, {"subgraph": key[0], "position": key[1], "operation": key[2], "calls": 0,
                                    "total_us": 0.0})
        row["calls"] += 1
        row["total_us"] += event["dur"]
    total = sum(row["total_us"] for row in rows.values()) or 1.0
    result = sorted(rows.values(), key=lambda row: -row["total_us"])
    for row in result:
        row["mean_us_per_execution"] = row["total_us"] / max(iterations, 1)
        row["share"] = row["total_us"] / total
    return result


def format_profile(rows: list[dict[str, Any]], limit: int = 25) -> str:
    if not rows:
        return "per operation: no operation events (the device records none; nnapi-reference does)"
    lines = [f"per operation (slowest {min(limit, len(rows))} of {len(rows)}):",
             f"  {'where':<14} {'operation':<28} {'us/exec':>10} {'share':>7}"]
    for row in rows[:limit]:
        where = f"#{row['position']}" if not row["subgraph"] else f"sub{row['subgraph']} #{row['position']}"
        lines.append(f"  {where:<14} {row['operation']:<28} {row['mean_us_per_execution']:>10.1f} "
                     f"{row['share'] * 100:>6.1f}%")
    return "\n".join(lines)
