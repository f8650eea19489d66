"""nnapi-ort-cpu's GrowingIndex (drivers/ort/builder.py): the producer and initializer maps
the chain QUANTIZEs query, kept up to date incrementally, must always equal a dict built
afresh over the list, whatever a lowering does to the list between two queries (append,
extend, remove from the middle, move to the end, slice-assign a filtered list, replace)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("onnx")

from onnx import helper  # noqa: E402

from nnapi.drivers.ort.builder import GrowingIndex  # noqa: E402


def _afresh(nodes: list) -> tuple[dict, dict]:
    """What the index must hold: the dict lowering used to build at every query, and each
    node's position."""
    return ({output: node for node in nodes for output in node.output},
            {id(node): position for position, node in enumerate(nodes)})


def test_the_index_equals_a_fresh_dict_after_every_kind_of_change():
    rng = random.Random(7)
    nodes: list = []
    index = GrowingIndex(lambda node: node.output)
    count = 0

    def make(outputs: int = 1):
        nonlocal count
        count += 1
        return helper.make_node("Relu", [f"x{count}"], [f"y{count}_{i}" for i in range(outputs)])

    changes = 0
    for _ in range(400):
        choice = rng.randrange(6)
        if choice == 0 or not nodes:
            nodes.append(make(rng.randrange(1, 3)))
        elif choice == 1:
            nodes.extend(make() for _ in range(rng.randrange(1, 4)))
        elif choice == 2:
            nodes.remove(nodes[rng.randrange(len(nodes))])
            changes += 1
        elif choice == 3:  # moved to the end (elementwise._clamp_into_conv)
            moved = nodes[rng.randrange(len(nodes))]
            nodes.remove(moved)
            nodes.append(moved)
            changes += 1
        elif choice == 4:  # a filtered list assigned in place (requantizing_quantize._swish)
            dropped = set(rng.sample(range(len(nodes)), min(2, len(nodes))))
            nodes[:] = [node for position, node in enumerate(nodes) if position not in dropped]
            changes += 1
        else:  # replaced by another node writing the same name
            position = rng.randrange(len(nodes))
            nodes[position] = helper.make_node("Sigmoid", ["z"], list(nodes[position].output))
            changes += 1
        if rng.random() < 0.6:  # queried after some changes, not all
            current = index.of(nodes)
            assert (current.by_key, current.position) == _afresh(nodes)
    assert changes > 100
    current = index.of(nodes)
    assert (current.by_key, current.position) == _afresh(nodes)


def test_a_name_written_twice_maps_to_the_last_writer_and_survives_a_removal():
    first = helper.make_node("Relu", ["a"], ["y"])
    second = helper.make_node("Sigmoid", ["a"], ["y"])
    nodes = [first, second]
    index = GrowingIndex(lambda node: node.output)
    assert index.of(nodes).by_key["y"] is second
    nodes.remove(second)  # the earlier writer's entry comes back
    assert index.of(nodes).by_key == {"y": first}
    assert index.of(nodes).position == {id(first): 0}
