"""Tools that answer the everyday questions about a model: what it is (graph dump),
where each operation runs and why (placement), where two devices disagree (bisect,
random-graph differential testing)."""

from nnapi.tools.graph_dump import graph_dump

__all__ = ["graph_dump"]
