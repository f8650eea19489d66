"""Graph dump (the driver guide's GraphDump): a model's operands and operations as JSON
or Graphviz DOT, with referenced IF / WHILE subgraphs as clusters and, after
compilation, the device of each operation as colour."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import numpy as np

from nnapi.errors import BadDataError, BadStateError
from nnapi.hal import Model as HalModel
from nnapi.hal import OperandLifeTime
from nnapi.hal.types import operand_type_name, operation_name
from nnapi.operand import DTYPES, TENSOR_TYPES

L = OperandLifeTime
#: Constants with at most this many elements are shown with their values.
SHOWN_VALUES = 16
#: Fill colours given to devices in order (the reference device is always grey).
DEVICE_COLOURS = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#ffffb3")
REFERENCE_COLOUR = "#d9d9d9"


def _model_of(model: Any):
    """A public Model, from a Model or anything carrying one as ``.model`` (an import)."""
    from nnapi.model import Model

    inner = getattr(model, "model", model)
    if not isinstance(inner, Model):
        raise BadDataError(f"graph_dump: expected a Model, got {type(model).__name__}")
    inner._check_alive("graph_dump")
    if not inner.is_finished:
        raise BadStateError("graph_dump: the model is not finished")
    return inner


def _constant(hal_model: HalModel, operand) -> np.ndarray | None:
    location = operand.location
    if operand.lifetime == L.CONSTANT_COPY:
        raw = memoryview(hal_model.operand_values)[location.offset:location.offset + location.length]
    elif operand.lifetime == L.CONSTANT_REFERENCE:
        pool = hal_model.pools[location.pool_index]
        raw = memoryview(getattr(pool, "buffer", pool)).cast("B")[location.offset:location.offset + location.length]
    else:
        return None
    dtype = DTYPES.get(operand.type)  # None for MODEL and extension types (opaque bytes)
    if dtype is None:
        return None
    return np.frombuffer(raw, dtype=dtype)


def _plain(value: np.ndarray) -> Any:
    return value.tolist() if value.size <= SHOWN_VALUES else f"<{value.size} values, {value.nbytes} bytes>"


def _describe_operand(hal_model: HalModel, index: int, operand) -> dict[str, Any]:
    described: dict[str, Any] = {
        "index": index,
        "type": operand_type_name(operand.type, hal_model),
        "dimensions": list(operand.dimensions),
        "lifetime": L(operand.lifetime).name,
    }
    if operand.scale or operand.zero_point:
        described["scale"] = operand.scale
        described["zero_point"] = operand.zero_point
    if operand.channel_quant is not None:
        described["channel_quant"] = {"channel_dim": operand.channel_quant.channel_dim,
                                      "scales": [float(s) for s in operand.channel_quant.scales]}
    value = _constant(hal_model, operand)
    if value is not None:
        described["value"] = _plain(value) if operand.type in TENSOR_TYPES else value.tolist()[0]
    if operand.lifetime == L.SUBGRAPH:
        described["subgraph"] = operand.location.offset + 1
    return described


def _devices_of(compilation) -> list[str] | None:
    """The device of each public operation of the main model, after finish."""
    if compilation is None:
        return None
    from nnapi.tools.placement import placement

    return [entry["device"] for entry in placement(compilation)["operations"]]


def graph_dump(model: Any, compilation: Any = None, *, format: str = "json",  # noqa: A002 (as json.dump)
               names: dict[int, str] | None = None) -> Any:
    """The graph of ``model`` as a dict (``format="json"``) or DOT text (``"dot"``).

    ``compilation`` (finished) adds each main-graph operation's device; ``names`` maps
    main-graph operand indexes to names (an import's tensor names). SVG is
    :func:`render_svg` of the DOT text."""
    if format not in ("json", "dot"):
        raise BadDataError(f"graph_dump: format must be 'json' or 'dot', got {format!r}")
    from nnapi.runtime.model_builder import build_hal_model

    public = _model_of(model)
    if names is None:
        names = _names_of(model)
    hal_model, order = build_hal_model(public)
    devices = _devices_of(compilation)
    subgraphs = []
    for number, subgraph in enumerate([hal_model.main, *hal_model.referenced]):
        operands = [_describe_operand(hal_model, i, operand) for i, operand in enumerate(subgraph.operands)]
        if number == 0 and names:
            for entry in operands:
                if entry["index"] in names:
                    entry["name"] = names[entry["index"]]
        operations = []
        for position, operation in enumerate(subgraph.operations):
            index = order[position] if number == 0 else position
            params = {str(slot): operands[i]["value"] for slot, i in enumerate(operation.inputs)
                      if subgraph.operands[i].type not in TENSOR_TYPES and "value" in operands[i]}
            entry = {"index": index, "type": operation_name(operation.type, hal_model),
                     "inputs": list(operation.inputs), "outputs": list(operation.outputs), "params": params}
            if number == 0 and devices is not None:
                entry["device"] = devices[index]
            operations.append(entry)
        subgraphs.append({"name": "main" if number == 0 else f"subgraph {number}", "operands": operands,
                          "operations": operations, "inputs": list(subgraph.input_indexes),
                          "outputs": list(subgraph.output_indexes)})
    graph = {"relaxed": hal_model.relax_computation_float32_to_float16, "subgraphs": subgraphs}
    return graph if format == "json" else to_dot(graph)


def _names_of(model: Any) -> dict[int, str] | None:
    """Operand names an importer recorded (``operand_names``: index -> name), if any."""
    names = getattr(model, "operand_names", None)
    return dict(names) if names else None


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _operand_label(entry: dict) -> str:
    shape = "x".join(str(d) for d in entry["dimensions"]) or "scalar"
    label = f"{entry.get('name', '#' + str(entry['index']))}\n{entry['type']} [{shape}]"
    if "scale" in entry:
        label += f"\nscale={entry['scale']:.6g} zp={entry['zero_point']}"
    if "channel_quant" in entry:
        label += f"\nper-channel (dim {entry['channel_quant']['channel_dim']})"
    return label


def to_dot(graph: dict) -> str:
    """Graphviz DOT text for a :func:`graph_dump` dict."""
    colours: dict[str, str] = {}
    lines = ["digraph nnapi {", "  rankdir=TB; compound=true;", '  node [fontname="Helvetica", fontsize=10];']
    for number, subgraph in enumerate(graph["subgraphs"]):
        prefix = f"s{number}_"
        indent = "  "
        if number:
            lines.append(f"  subgraph cluster_{number} {{")
            lines.append(f"    label={_quote(subgraph['name'])}; style=dashed;")
            indent = "    "
        scalar_params = {e["index"] for e in subgraph["operands"] if "value" in e and not e["dimensions"]
                         and e["lifetime"].startswith("CONSTANT")}
        for entry in subgraph["operands"]:
            if entry["index"] in scalar_params:
                continue  # shown in the operation's label
            style = {"SUBGRAPH_INPUT": "filled", "SUBGRAPH_OUTPUT": "filled"}.get(entry["lifetime"], "solid")
            fill = ', fillcolor="#e0f3f8"' if style == "filled" else ""
            shape = "note" if entry["lifetime"].startswith("CONSTANT") else "ellipse"
            lines.append(f"{indent}{prefix}v{entry['index']} [label={_quote(_operand_label(entry))}, "
                         f"shape={shape}, style={style}{fill}];")
        for position, operation in enumerate(subgraph["operations"]):
            node = f"{prefix}op{position}"
            label = f"{operation['type']} (#{operation['index']})"
            if operation["params"]:
                label += "\n" + ", ".join(f"in{slot}={value}" for slot, value in operation["params"].items())
            attributes = ["shape=box", "style=\"filled,rounded\""]
            device = operation.get("device")
            if device:
                label += f"\non {device}"
                if device not in colours:
                    colours[device] = REFERENCE_COLOUR if device == "nnapi-reference" else \
                        DEVICE_COLOURS[len(colours) % len(DEVICE_COLOURS)]
                attributes.append(f'fillcolor="{colours[device]}"')
            else:
                attributes.append('fillcolor="#ffffff"')
            lines.append(f"{indent}{node} [label={_quote(label)}, {', '.join(attributes)}];")
            for i in operation["inputs"]:
                if i not in scalar_params:
                    lines.append(f"{indent}{prefix}v{i} -> {node};")
            for i in operation["outputs"]:
                lines.append(f"{indent}{node} -> {prefix}v{i};")
        if number:
            lines.append("  }")
    # MODEL operands point at the cluster of the subgraph they name.
    for number, subgraph in enumerate(graph["subgraphs"]):
        for entry in subgraph["operands"]:
            if "subgraph" in entry and entry["subgraph"] < len(graph["subgraphs"]):
                target = graph["subgraphs"][entry["subgraph"]]
                first = f"s{entry['subgraph']}_v{target['inputs'][0]}" if target["inputs"] else None
                if first:
                    lines.append(f"  s{number}_v{entry['index']} -> {first} [style=dotted, "
                                 f"lhead=cluster_{entry['subgraph']}];")
    if colours:
        legend = "\\l".join(f"{name}" for name in colours) + "\\l"
        lines.append(f'  legend [shape=plaintext, label="devices:\\l{legend}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render_svg(dot_text: str) -> str:
    """SVG drawn by Graphviz's ``dot``; BadStateError-free: a missing Graphviz raises
    FileNotFoundError with what to install."""
    executable = shutil.which("dot")
    if executable is None:
        raise FileNotFoundError("SVG needs Graphviz's `dot` program (Debian/Ubuntu: apt-get install graphviz; "
                                "macOS: brew install graphviz); --format dot writes the graph without it")
    result = subprocess.run([executable, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"dot failed: {result.stderr.strip()}")
    return result.stdout
