"""Write CTS vector files (.jsonl.gz) in the line format tests/capi/conformance_runner.c
reads, so that a C program (which would need a JSON and gzip parser otherwise) can build
and run every vector through the C API. Only the format changes; the values are the
records' own, converted to each operand's element type.

Format, one token stream per line:
  TEST <name> <expectFailure 0|1> <isRelaxed 0|1> <multinomialTolerance> <subgraph count>
  SUBGRAPH <operand count> <operation count>            (the main subgraph first)
  OPERAND <type> <rank> <dims...> <scale> <zeroPoint> <lifetime> <channelDim|-1> <scale count>
          <scales...> <isIgnored 0|1> <byte count|-1 for no data> <hex bytes|->
  OPERATION <type> <input count> <inputs...> <output count> <outputs...>
  IO <input count> <inputs...> <output count> <outputs...>
Lifetimes: 0 TEMPORARY_VARIABLE, 1 SUBGRAPH_INPUT, 2 SUBGRAPH_OUTPUT, 3 CONSTANT_COPY,
4 CONSTANT_REFERENCE, 5 NO_VALUE, 6 SUBGRAPH (its data: the index of the referenced
subgraph, 1-based in this file's order).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from nnapi.codes import OperandCode, OperationCode
from nnapi.conformance import VARIANTS, _array, load_records

LIFETIMES = {"TEMPORARY_VARIABLE": 0, "SUBGRAPH_INPUT": 1, "SUBGRAPH_OUTPUT": 2, "CONSTANT_COPY": 3,
             "CONSTANT_REFERENCE": 4, "NO_VALUE": 5, "SUBGRAPH": 6}


def _operand_line(operand: dict) -> str:
    code = OperandCode[operand["type"]]
    dims = operand["dimensions"] or []
    quant = operand.get("channelQuant")
    scales = quant["scales"] if quant else []
    data = operand.get("data")
    if operand["lifetime"] == "SUBGRAPH":
        payload = f"{4} {(int(data[0]) + 1).to_bytes(4, 'little').hex()}"
    elif not data:
        payload = "-1 -"
    else:
        raw = _array(data, code).tobytes()
        payload = f"{len(raw)} {raw.hex() or '-'}"
    return " ".join(str(x) for x in (
        "OPERAND", int(code), len(dims), *dims, repr(float(operand.get("scale", 0.0))),
        int(operand.get("zeroPoint", 0)), LIFETIMES[operand["lifetime"]], quant["channelDim"] if quant else -1,
        len(scales), *(repr(float(s)) for s in scales), int(bool(operand.get("isIgnored"))), payload))


def record_lines(record: dict) -> Iterator[str]:
    subgraphs = [record["main"], *record.get("referenced", [])]
    yield (f"TEST {record['test']} {int(bool(record.get('expectFailure')))} {int(bool(record.get('isRelaxed')))} "
           f"{float(record.get('multinomialTolerance', 0.0))!r} {len(subgraphs)}")
    for subgraph in subgraphs:
        yield f"SUBGRAPH {len(subgraph['operands'])} {len(subgraph['operations'])}"
        for operand in subgraph["operands"]:
            yield _operand_line(operand)
        for operation in subgraph["operations"]:
            yield " ".join(str(x) for x in ("OPERATION", int(OperationCode[operation["type"]]),
                                            len(operation["inputs"]), *operation["inputs"],
                                            len(operation["outputs"]), *operation["outputs"]))
        yield " ".join(str(x) for x in ("IO", len(subgraph["inputIndexes"]), *subgraph["inputIndexes"],
                                        len(subgraph["outputIndexes"]), *subgraph["outputIndexes"]))


def records(files: Iterable[Path], variant: str | None = None, every: int = 1) -> Iterator[dict]:
    for path in files:
        for position, record in enumerate(load_records(path)):
            if position % every:
                continue
            if variant is not None:
                record = VARIANTS[variant](record)
                if record is None:
                    continue
            yield record


def convert(files: Iterable[Path], out: Path, variant: str | None = None, every: int = 1) -> int:
    """Write the records of ``files`` to ``out``; returns how many."""
    count = 0
    with open(out, "w") as handle:
        for record in records(files, variant, every):
            for line in record_lines(record):
                handle.write(line + "\n")
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(VARIANTS))
    parser.add_argument("--every", type=int, default=1, help="keep every N-th record of each file")
    args = parser.parse_args(argv)
    print(convert(args.files, args.out, args.variant, args.every), "records", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
