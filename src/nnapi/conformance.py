"""Conformance: run Android's CTS vectors against a device through the public API and judge
the outputs with the CTS accuracy criteria.

The vectors ship inside the package (``nnapi/data/cts/*.jsonl.gz``), so a plain
``pip install nnapi`` can check any device, including a plug-in's or a remote one::

    import nnapi
    from nnapi.conformance import run_conformance

    device = next(d for d in nnapi.get_devices() if d.name == "my-npu")
    report = run_conformance(device, operations={"CONV_2D", "ADD"})
    print(report.passed, report.failed, report.not_implemented)
    for outcome in report.failures:
        print(outcome.test, outcome.message)

``run_conformance`` is the whole run; ``load_records`` / ``run_record`` run one vector at
a time; ``VARIANTS`` derives Android's generated variations of a vector. A vector file is
JSON lines (gzipped), one record per test: the model's operands (type, dimensions,
quantization, lifetime, data), operations, inputs and expected outputs.
"""

from __future__ import annotations

import gzip
import json
import math
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import nnapi
from nnapi.codes import OperandCode, OperationCode
from nnapi.errors import NnapiError
from nnapi.operand import DTYPES, OperandType, SymmPerChannelQuantParams

T = OperandCode
_FLOAT32_TOLERANCE = (1e-5, 5 * 1.1920928955078125e-7)
_FLOAT16_TOLERANCE = (5 * 0.0009765625, 5 * 0.0009765625)


@dataclass
class Outcome:
    """The result of one vector: ``passed``, or why not in ``message``. ``implemented`` is
    False for vectors using operations nnapi does not implement (not run); ``declined`` is
    True when the device under test declines one of its operations (not a failure)."""

    test: str
    operations: tuple[str, ...]
    passed: bool
    message: str = ""
    implemented: bool = True
    declined: bool = False


class VectorFileError(ValueError):
    """A vector file that is not one: its message names the file, the line and the rule."""


def load_records(path: str | Path) -> Iterator[dict]:
    """Every record of a ``.jsonl.gz`` (or plain ``.jsonl``) vector file, each checked by
    ``check_record``; VectorFileError ("FILE:LINE: rule") for a line that is not a record
    (its vector would otherwise fail as if the device had, or stop the run with a raw
    exception), OSError for an unreadable file."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    number = 0
    try:
        with opener(path, "rt", encoding="utf-8") as handle:  # type: ignore[operator]
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError) as error:  # (arrays nested past the parser's depth)
                    raise VectorFileError(f"{path}:{number}: not a JSON record ({error})") from None
                try:
                    check_record(record)
                except ValueError as error:
                    raise VectorFileError(f"{path}:{number}: {error}") from None
                yield record
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise VectorFileError(f"{path}:{number + 1}: unreadable ({error})") from None


_LIFETIMES = frozenset({"TEMPORARY_VARIABLE", "SUBGRAPH_INPUT", "SUBGRAPH_OUTPUT", "CONSTANT_COPY",
                        "CONSTANT_REFERENCE", "NO_VALUE", "SUBGRAPH"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_record(record: Any) -> None:
    """Raise ValueError naming the rule a vector record breaks: its structure (fields and
    their kinds, operand types and lifetimes, indexes in range, referenced subgraphs) and
    its data (values of the operand's type, as many as its dimensions hold). What the
    model means is not checked: a vector may expect its model refused (expectFailure)."""
    if not isinstance(record, dict):
        raise ValueError(f"a record is a JSON object, not {type(record).__name__}")
    if not isinstance(record.get("test"), str):
        raise ValueError("the record has no test name (a string)")
    for key in ("isRelaxed", "expectFailure"):
        if not isinstance(record.get(key, False), bool):
            raise ValueError(f"{key} must be true or false")
    tolerance = record.get("multinomialTolerance", 0.0)
    if not _is_number(tolerance) or not 0 <= tolerance < float("inf"):
        raise ValueError("multinomialTolerance must be a non-negative number")
    referenced = record.get("referenced", [])
    if not isinstance(referenced, list):
        raise ValueError("referenced must be a list of subgraphs")
    for name, subgraph in [("main", record.get("main")), *((f"referenced[{i}]", s) for i, s in enumerate(referenced))]:
        _check_subgraph(name, subgraph, len(referenced))
    _check_references(record)
    if tolerance > 0:  # what _multinomial_check reads
        main = record["main"]
        if not main["inputIndexes"] or not main["outputIndexes"]:
            raise ValueError("a multinomial record needs an input (the logits) and an output (the samples)")
        logits = main["operands"][main["inputIndexes"][0]]
        samples = main["operands"][main["outputIndexes"][0]]
        if (logits["type"] not in ("TENSOR_FLOAT32", "TENSOR_FLOAT16") or len(logits["dimensions"]) != 2
                or not all(logits["dimensions"]) or not logits["data"]):
            raise ValueError("a multinomial record's first input is float logits [batches, classes] with data")
        if (samples["type"] != "TENSOR_INT32" or len(samples["dimensions"]) != 2 or not all(samples["dimensions"])
                or samples["dimensions"][0] != logits["dimensions"][0]):
            raise ValueError("a multinomial record's first output is TENSOR_INT32 samples [batches, count]")


_MAX_NESTING = 64


def _data_kind(dtype: np.dtype) -> tuple[str, tuple[float, float]]:
    if dtype.kind in "iu":
        return dtype.kind, (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
    if dtype.kind == "f":
        return "f", (-float(np.finfo(dtype).max), float(np.finfo(dtype).max))
    return dtype.kind, (0, 0)


# per operand type: its numpy kind and the range of its values (np.iinfo built per operand
# was 32,636 calls loading the shipped vectors)
_DATA_KINDS = {code: _data_kind(np.dtype(dtype)) for code, dtype in DTYPES.items()}


def _check_references(record: dict) -> None:
    """No referenced subgraph reaches itself through SUBGRAPH operands (build_model would
    recurse without end)."""
    subgraphs = [record["main"], *record.get("referenced", [])]
    targets = [{o["data"][0] for o in s["operands"] if o["lifetime"] == "SUBGRAPH"} for s in subgraphs]
    done: set[int] = set()

    def visit(number: int, path: tuple[int, ...]) -> None:
        if number in path:
            raise ValueError(f"referenced[{number}] refers to itself through its SUBGRAPH operands")
        if len(path) >= _MAX_NESTING:  # (build_model recurses once per level)
            raise ValueError(f"referenced subgraphs nest more than {_MAX_NESTING} deep")
        if number not in done:
            for target in targets[number + 1]:
                visit(target, (*path, number))
            done.add(number)

    for number in range(len(subgraphs) - 1):
        visit(number, ())


def _check_subgraph(name: str, subgraph: Any, referenced: int) -> None:
    if not isinstance(subgraph, dict):
        raise ValueError(f"{name}: a subgraph is a JSON object")
    operands = subgraph.get("operands")
    if not isinstance(operands, list):
        raise ValueError(f"{name}: operands must be a list")
    for index, operand in enumerate(operands):
        _check_operand(f"{name} operand {index}", operand, referenced)

    def indexes(value: Any, what: str) -> None:
        if not isinstance(value, list) or not all(_is_int(i) and 0 <= i < len(operands) for i in value):
            raise ValueError(f"{name}: {what} must be a list of operand indexes (0 to {len(operands) - 1})")

    for key, lifetime in (("inputIndexes", "SUBGRAPH_INPUT"), ("outputIndexes", "SUBGRAPH_OUTPUT")):
        indexes(subgraph.get(key), key)
        listed = set(subgraph[key])
        # (the data of an input or output is read by its position in the list)
        for index, operand in enumerate(operands):
            if (index in listed) != (operand["lifetime"] == lifetime):
                raise ValueError(f"{name} operand {index}: lifetime {operand['lifetime']}, "
                                 f"{'' if index in listed else 'not '}in {key}")
        if len(listed) != len(subgraph[key]):
            raise ValueError(f"{name}: {key} lists an operand twice")
    operations = subgraph.get("operations")
    if not isinstance(operations, list):
        raise ValueError(f"{name}: operations must be a list")
    for number, operation in enumerate(operations):
        where = f"{name} operation {number}"
        if not isinstance(operation, dict) or not isinstance(operation.get("type"), str):
            raise ValueError(f"{where}: an operation is an object with a type name")
        if operation["type"] not in OperationCode.__members__:  # (build_model looks the name up)
            raise ValueError(f"{where}: unknown operation type {operation['type']!r}"[:200])
        indexes(operation.get("inputs"), f"operation {number} inputs")
        indexes(operation.get("outputs"), f"operation {number} outputs")


def _check_operand(where: str, operand: Any, referenced: int) -> None:
    if not isinstance(operand, dict):
        raise ValueError(f"{where}: an operand is a JSON object")
    type_name = operand.get("type")
    if not isinstance(type_name, str) or type_name not in T.__members__:
        raise ValueError(f"{where}: unknown operand type {type_name!r}"[:200])
    code = T[type_name]
    dims = operand.get("dimensions")
    if not isinstance(dims, list) or not all(_is_int(d) and 0 <= d <= 0xFFFFFFFF for d in dims):
        raise ValueError(f"{where}: dimensions must be a list of unsigned 32-bit integers")
    if not _is_number(operand.get("scale", 0.0)) or not _is_int(operand.get("zeroPoint", 0)):
        raise ValueError(f"{where}: scale must be a number and zeroPoint an integer")
    quant = operand.get("channelQuant")
    if quant is not None and not (isinstance(quant, dict) and _is_int(quant.get("channelDim"))
                                  and isinstance(quant.get("scales"), list)
                                  and all(_is_number(v) for v in quant["scales"])):
        raise ValueError(f"{where}: channelQuant must be null or {{channelDim: integer, scales: [numbers]}}")
    lifetime = operand.get("lifetime")
    if not isinstance(lifetime, str) or lifetime not in _LIFETIMES:
        raise ValueError(f"{where}: unknown lifetime {lifetime!r}"[:200])
    data = operand.get("data")
    if lifetime == "SUBGRAPH":
        if not (isinstance(data, list) and len(data) == 1 and _is_int(data[0]) and 0 <= data[0] < referenced):
            raise ValueError(f"{where}: a SUBGRAPH operand's data is [index of a referenced subgraph] "
                             + (f"(0 to {referenced - 1})" if referenced else "(the record references none)"))
        return
    if lifetime in ("TEMPORARY_VARIABLE", "NO_VALUE") and data is None:
        return
    if not isinstance(data, list):
        raise ValueError(f"{where}: data must be a list of values")
    if code not in DTYPES:
        if data:
            raise ValueError(f"{where}: a {type_name} operand holds no data")
        return
    kinds = set(map(type, data))  # (per value isinstance checks would triple the load time)
    kind, limits = _DATA_KINDS[code]
    if kind == "b" and not kinds <= {bool}:
        raise ValueError(f"{where}: {type_name} data must be true / false values")
    if kind in "iu":
        if not kinds <= {int}:  # (numpy would truncate a fraction)
            raise ValueError(f"{where}: {type_name} data must be integers")
        if data and not limits[0] <= min(data) <= max(data) <= limits[1]:
            raise ValueError(f"{where}: {type_name} data must lie in [{limits[0]}, {limits[1]}]")
    if kind == "f" and data:
        if not kinds <= {int, float}:
            numbers = []
            for value in data:
                number = value
                if isinstance(value, str):  # "nan", "inf": as _array reads them
                    try:
                        number = float(value)
                    except ValueError:
                        pass
                if not _is_number(number):
                    raise ValueError(f"{where}: {type_name} data must be numbers, got {value!r}"[:200])
                numbers.append(number)
            data = numbers
        # Converted first: a string ("1e39") or a NaN (whose comparisons are all false) hid
        # a value beyond the range from max(), and an integer past float64 raised a raw
        # OverflowError.
        try:
            values = np.array(data, np.float64)
        except OverflowError:
            raise ValueError(f"{where}: {type_name} data holds an integer beyond the type's largest finite value") \
                from None
        finite = np.abs(values[np.isfinite(values)])
        largest = float(finite.max()) if finite.size else 0.0
        if largest > limits[1]:
            with np.errstate(over="ignore"):
                if np.isinf(DTYPES[code].type(largest)):  # (numpy would make it an infinity: 65510 is float16 65504)
                    raise ValueError(f"{where}: {type_name} data holds {largest!r}, which {type_name} rounds to "
                                     "an infinity")
    if all(d > 0 for d in dims):
        count = math.prod(dims)
        # no data: an input the request omits, an output with no expected values (a model
        # the tools read: dump, placement, bisect)
        unvalued = lifetime in ("SUBGRAPH_INPUT", "SUBGRAPH_OUTPUT") and not data
        if len(data) != count and not unvalued and lifetime != "TEMPORARY_VARIABLE":
            raise ValueError(f"{where}: {len(data)} values for dimensions {dims} ({count} values)")


def operations_of(record: dict) -> set[str]:
    names = {op["type"] for op in record["main"]["operations"]}
    for subgraph in record.get("referenced", []):
        names |= {op["type"] for op in subgraph["operations"]}
    return names


def is_supported(record: dict) -> bool:
    """True when every operation the record uses is implemented."""
    from nnapi.operations import implemented_operations

    implemented = {code.name for code in implemented_operations()}
    return operations_of(record) <= implemented


def _array(data: list, code: OperandCode) -> np.ndarray:
    values = [float(v) if isinstance(v, str) else v for v in data]
    return np.array(values, dtype=DTYPES[code])


def _operand_type(operand: dict) -> OperandType:
    quant = operand.get("channelQuant")
    params = SymmPerChannelQuantParams(quant["channelDim"], quant["scales"]) if quant else None
    return OperandType(T[operand["type"]], operand["dimensions"], operand.get("scale", 0.0),
                       operand.get("zeroPoint", 0), params)


def build_model(record: dict, subgraph: dict | None = None, keep: list | None = None,
                cache: dict | None = None) -> nnapi.Model:
    """The public-API Model for a record's subgraph (the main one by default)."""
    subgraph = subgraph or record["main"]
    keep = keep if keep is not None else []
    cache = cache if cache is not None else {}
    model = nnapi.Model()
    for index, operand in enumerate(subgraph["operands"]):
        op_type = _operand_type(operand)
        model.add_operand(op_type.with_channel_quant(None))
        if op_type.channel_quant is not None:
            model.set_operand_symm_per_channel_quant_params(index, op_type.channel_quant)
        lifetime = operand["lifetime"]
        if lifetime in ("CONSTANT_COPY", "CONSTANT_REFERENCE"):
            value = _array(operand["data"], op_type.type)
            if lifetime == "CONSTANT_REFERENCE" and value.nbytes:
                # Constants by reference travel through shared memory, as on Android.
                memory = nnapi.Memory.create_shared(value.nbytes)
                np.frombuffer(memory.buffer, dtype=value.dtype)[:] = value.reshape(-1)
                keep.append(memory)
                model.set_operand_value_from_memory(index, memory, 0, value.nbytes)
            else:
                keep.append(value)
                model.set_operand_value(index, value)
        elif lifetime == "NO_VALUE":
            model.set_operand_value(index, None)
        elif lifetime == "SUBGRAPH":
            target = operand["data"][0]
            if target not in cache:
                cache[target] = build_model(record, record["referenced"][target], keep, cache)
            model.set_operand_value_from_model(index, cache[target])
    for operation in subgraph["operations"]:
        model.add_operation(OperationCode[operation["type"]], operation["inputs"], operation["outputs"])
    model.identify_inputs_and_outputs(subgraph["inputIndexes"], subgraph["outputIndexes"])
    if record.get("isRelaxed"):
        model.relax_computation_float32_to_float16(True)
    model.finish()
    return model


def _tolerance(record: dict, code: OperandCode) -> tuple[float, float]:
    uses_float16 = any(o["type"] in ("TENSOR_FLOAT16", "FLOAT16") for o in record["main"]["operands"])
    if code == T.TENSOR_FLOAT16 or record.get("isRelaxed") or uses_float16:
        return _FLOAT16_TOLERANCE
    return _FLOAT32_TOLERANCE


def float_tolerance(code: OperandCode, relaxed: bool = False) -> tuple[float, float]:
    """The CTS (absolute, relative) tolerance for a float operand type: float16 and
    relaxed computations get float16's."""
    return _FLOAT16_TOLERANCE if relaxed or code == T.TENSOR_FLOAT16 else _FLOAT32_TOLERANCE


def within_tolerance(code: OperandCode, expected: np.ndarray, actual: np.ndarray,
                     tolerance: tuple[float, float] = _FLOAT32_TOLERANCE, quant_limit: int = 1) -> np.ndarray:
    """Per element, whether ``actual`` meets the CTS criterion for ``expected``: floats
    within ``atol + rtol * |expected|`` (NaN matching NaN, infinities matching), booleans
    equal, integers and quantized values within ``quant_limit``."""
    if code in (T.TENSOR_FLOAT32, T.TENSOR_FLOAT16, T.FLOAT32, T.FLOAT16):
        atol, rtol = tolerance
        exp64, act64 = expected.astype(np.float64), actual.astype(np.float64)
        both_nan = np.isnan(exp64) & np.isnan(act64)
        same_inf = np.isinf(exp64) & (exp64 == act64)
        with np.errstate(invalid="ignore"):
            return (np.abs(act64 - exp64) <= atol + rtol * np.abs(exp64)) | both_nan | same_inf
    if code in (T.TENSOR_BOOL8, T.BOOL):
        return expected == actual
    return np.abs(actual.astype(np.int64) - expected.astype(np.int64)) <= quant_limit


def compare(record: dict, operand: dict, actual: np.ndarray) -> str | None:
    """None if ``actual`` meets the CTS criterion for ``operand``; else what differs."""
    code = T[operand["type"]]
    expected = _array(operand["data"], code).reshape(-1)
    actual = actual.reshape(-1)
    if expected.size != actual.size:
        return f"{operand['name']}: {actual.size} values, expected {expected.size}"
    limit = 3 if "mobilenet" in record["test"] and code in (T.TENSOR_QUANT8_ASYMM,
                                                             T.TENSOR_QUANT8_ASYMM_SIGNED) else 1
    ok = within_tolerance(code, expected, actual, _tolerance(record, code), limit)
    if np.all(ok):
        return None
    bad = np.flatnonzero(~ok)
    first = int(bad[0])
    return (f"{operand['name']}: {bad.size}/{expected.size} values differ; first at {first}: "
            f"got {actual[first]!r}, expected {expected[first]!r}")


def _multinomial_check(record: dict, outputs: dict[int, np.ndarray]) -> str | None:
    main = record["main"]
    logits_operand = main["operands"][main["inputIndexes"][0]]
    logits = _array(logits_operand["data"], T[logits_operand["type"]]).astype(np.float64)
    batches = logits_operand["dimensions"][0] if logits_operand["dimensions"] else 1
    logits = logits.reshape(batches, -1)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    samples = next(iter(outputs.values())).reshape(batches, -1)
    tolerance = record["multinomialTolerance"]
    if samples.size and (samples.min() < 0 or samples.max() >= probabilities.shape[1]):
        return f"samples outside [0, {probabilities.shape[1]}): {samples.min()} to {samples.max()}"
    for batch in range(batches):
        frequency = np.bincount(samples[batch], minlength=probabilities.shape[1]) / samples.shape[1]
        if np.any(np.abs(frequency[: probabilities.shape[1]] - probabilities[batch]) > tolerance):
            return f"batch {batch}: frequencies {frequency} vs probabilities {probabilities[batch]}"
    return None


def run_record(record: dict, device: nnapi.Device | list[nnapi.Device] | None = None) -> Outcome:
    """Build, compile and execute one record (for ``device``, or a list of devices the
    runtime partitions it across), and judge its outputs."""
    operations = tuple(sorted(operations_of(record)))
    keep: list[Any] = []
    try:
        model = build_model(record, keep=keep)
        devices = None if device is None else list(device) if isinstance(device, list) else [device]
        compilation = nnapi.Compilation(model, devices)
        compilation.finish()
        execution = nnapi.Execution(compilation)
        main = record["main"]
        for position, index in enumerate(main["inputIndexes"]):
            operand = main["operands"][index]
            data = operand["data"]
            if not data:
                execution.set_input(position, None)
                continue
            value = _array(data, T[operand["type"]])
            dims = operand["dimensions"]
            if dims and 0 in dims:
                if len(dims) != 1:
                    return Outcome(record["test"], operations, False, "input with unknown shape")
                dims = [value.size]
            value = value.reshape(dims)
            keep.append(value)
            execution.set_input(position, value)
        outputs: dict[int, np.ndarray] = {}
        for position, index in enumerate(main["outputIndexes"]):
            operand = main["operands"][index]
            code = T[operand["type"]]
            declared = _operand_type(operand)
            count = len(operand["data"] or []) if not declared.is_fully_specified else declared.element_count()
            buffer = np.zeros(max(count, 0), dtype=DTYPES[code])
            outputs[position] = buffer
            execution.set_output(position, buffer)
        execution.compute()
    except NnapiError as error:
        if record.get("expectFailure"):
            return Outcome(record["test"], operations, True, f"failed as expected: {error.code.name}")
        return Outcome(record["test"], operations, False, f"{type(error).__name__}: {error}")
    except Exception as error:  # a raw exception escaping the public API is a bug
        return Outcome(record["test"], operations, False, f"RAW {type(error).__name__}: {error}")
    if record.get("expectFailure"):
        return Outcome(record["test"], operations, False, "expected a failure, but it succeeded")
    if record.get("multinomialTolerance", 0) > 0:
        problem = _multinomial_check(record, outputs)
        return Outcome(record["test"], operations, problem is None, problem or "")
    problems = []
    for position, index in enumerate(main["outputIndexes"]):
        operand = main["operands"][index]
        if operand.get("isIgnored"):
            continue
        problem = compare(record, operand, outputs[position])
        if problem:
            problems.append(problem)
    return Outcome(record["test"], operations, not problems, "; ".join(problems))


def declined_by(record: dict, device: nnapi.Device) -> list[str]:
    """Why ``device`` declines operations of the record's main subgraph: one reason per
    declined operation (empty when it claims them all, when the model cannot be built, or
    when the device is dead: running it judges it)."""
    from nnapi.runtime.model_builder import build_hal_model

    if getattr(device._hal, "is_dead", False):
        # a dead device (a driver service that crashed or stopped) supports nothing: its
        # vectors failed, they were not declined
        return []
    keep: list[Any] = []
    try:
        hal_model, _ = build_hal_model(build_model(record, keep=keep))
    except NnapiError:
        return []
    try:
        reasons = device._hal.get_unsupported_reasons(hal_model)
    except Exception:  # a driver that cannot answer: run the vector and let it be judged
        return []
    return [f"{operation.type.name}: {reason}" for operation, reason in zip(hal_model.main.operations, reasons)
            if reason is not None]


def default_vector_files() -> list[Path]:
    """The CTS vector files shipped in the package (``nnapi/data/cts``)."""
    return sorted((Path(__file__).resolve().parent / "data" / "cts").glob("*.jsonl.gz"))


def tested_operations(record: dict) -> list[str]:
    """The operations a record tests; the ADD Android's generator inserts to make a model
    input internal (``..._as_internal`` tests) does not count."""
    names = sorted(operations_of(record))
    if len(names) > 1 and "ADD" in names and "as_internal" in record["test"]:
        names.remove("ADD")
    return names


@dataclass
class ConformanceReport:
    """Every outcome of a ``run_conformance`` call, with counts."""

    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(1 for o in self.outcomes if o.implemented and o.passed)

    @property
    def failed(self) -> int:
        return sum(1 for o in self.outcomes if o.implemented and not o.passed and not o.declined)

    @property
    def declined(self) -> int:
        return sum(1 for o in self.outcomes if o.declined)

    @property
    def not_implemented(self) -> int:
        return sum(1 for o in self.outcomes if not o.implemented)

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.implemented and not o.passed and not o.declined]

    def by_operation(self, only: Iterable[str] | None = None) -> dict[str, dict[str, int]]:
        """Per tested operation (those of ``only`` alone, when given: a vector selected for
        one operation may test others with it): counts of ``passed`` / ``failed`` /
        ``declined`` / ``not implemented``."""
        table: dict[str, dict[str, int]] = {}
        listed = None if only is None else set(only)
        for outcome in self.outcomes:
            verdict = ("not implemented" if not outcome.implemented else "passed" if outcome.passed
                       else "declined" if outcome.declined else "failed")
            for name in outcome.operations:
                if listed is not None and name not in listed:
                    continue
                row = table.setdefault(name, {"passed": 0, "failed": 0, "declined": 0, "not implemented": 0})
                row[verdict] += 1
        return dict(sorted(table.items()))


def select_records(files: Iterable[str | Path] | None = None, operations: Iterable[str] | None = None,
                   variant: str | None = None) -> list[dict]:
    """The records of ``files`` (default: the shipped vectors) testing any of
    ``operations`` (names such as ``"CONV_2D"``; default all), derived as ``variant`` (a key
    of ``VARIANTS``) when given. Raises ValueError for an unknown variant, OSError for an
    unreadable file."""
    if variant is not None and variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} (variants: {', '.join(VARIANTS)})")
    wanted = {name.strip().upper() for name in operations} if operations is not None else None
    records = []
    for path in (default_vector_files() if files is None else [Path(f) for f in files]):
        for record in load_records(path):
            if variant is not None:
                record = VARIANTS[variant](record)
                if record is None:
                    continue
            if wanted is None or wanted & set(tested_operations(record)):
                records.append(record)
    return records


def run_conformance(device: nnapi.Device | None = None, *, files: Iterable[str | Path] | None = None,
                    operations: Iterable[str] | None = None, variant: str | None = None,
                    records: Iterable[dict] | None = None,
                    on_outcome: Callable[[int, int, Outcome], None] | None = None) -> ConformanceReport:
    """Run CTS vectors on ``device`` (None: let the runtime choose, as an app would) and
    return every outcome. Vectors come from ``records`` or else ``select_records(files,
    operations, variant)``; ``on_outcome(done, total, outcome)`` is called after each one
    (progress; ``total`` is -1 for an iterable without a length). Vectors using operations
    nnapi does not implement are reported, not run."""
    chosen = records if records is not None else select_records(files, operations, variant)
    total = len(chosen) if hasattr(chosen, "__len__") else -1  # a progress-bar wrapper keeps its length
    report = ConformanceReport()
    for done, record in enumerate(chosen, 1):
        if is_supported(record):
            outcome = run_record(record, device)
            outcome.operations = tuple(tested_operations(record))
            if not outcome.passed and device is not None:
                # a device that declines an operation did not fail it: the vector is not its to run
                reasons = declined_by(record, device)
                if reasons:
                    outcome.declined, outcome.message = True, "declined: " + "; ".join(reasons)
        else:
            outcome = Outcome(record["test"], tuple(tested_operations(record)), False,
                              "uses an operation nnapi does not implement", implemented=False)
        report.outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(done, total, outcome)
    return report




# --- variations of a record (as Android's test generator derives them) -----------------
def _copy(record: dict) -> dict:
    return json.loads(json.dumps(record))


def variant_dynamic_outputs(record: dict) -> dict | None:
    """Every model output and temporary declared with unknown dimensions (same rank), so
    shapes must be inferred at execution time. None for records expected to fail."""
    if record.get("expectFailure"):
        return None
    changed = _copy(record)
    for operand in changed["main"]["operands"]:
        if operand["lifetime"] in ("SUBGRAPH_OUTPUT", "TEMPORARY_VARIABLE") and operand["dimensions"]:
            operand["dimensions"] = [0] * len(operand["dimensions"])
    changed["test"] += "_dynamic_output_shape"
    return changed


def variant_shared_memory_constants(record: dict) -> dict | None:
    """Every tensor constant set from shared memory (CONSTANT_REFERENCE) instead of copied."""
    changed = _copy(record)
    moved = False
    for operand in changed["main"]["operands"]:
        if operand["lifetime"] == "CONSTANT_COPY" and operand["dimensions"] and operand["data"]:
            operand["lifetime"] = "CONSTANT_REFERENCE"
            moved = True
    if not moved:
        return None
    changed["test"] += "_shared_memory_constants"
    return changed


#: operations with no signed counterpart of their TENSOR_QUANT8_ASYMM form: the spec gives
#: QUANTIZED_16BIT_LSTM and HASHTABLE_LOOKUP no TENSOR_QUANT8_ASYMM_SIGNED, and CAST reads
#: raw integers (scale and zero point ignored), so shifting them changes the real result.
_UNSIGNED_ONLY = {"QUANTIZED_16BIT_LSTM", "HASHTABLE_LOOKUP", "CAST"}


def variant_quant8_signed(record: dict) -> dict | None:
    """TENSOR_QUANT8_ASYMM operands re-expressed as TENSOR_QUANT8_ASYMM_SIGNED with the same
    real values (q - 128, zero point - 128): the outputs must shift the same way."""
    if operations_of(record) & _UNSIGNED_ONLY:
        return None
    changed = _copy(record)
    converted = False
    for subgraph in [changed["main"], *changed.get("referenced", [])]:
        for operation in subgraph["operations"]:
            # PAD_V2's pad value for a quantized tensor is an INT32 scalar in quantized units.
            if operation["type"] == "PAD_V2" and len(operation["inputs"]) == 3 and \
                    subgraph["operands"][operation["inputs"][0]]["type"] == "TENSOR_QUANT8_ASYMM":
                pad_value = subgraph["operands"][operation["inputs"][2]]
                pad_value["data"] = [v - 128 for v in pad_value["data"]]
        for operand in subgraph["operands"]:
            if operand["type"] == "TENSOR_QUANT8_ASYMM":
                operand["type"] = "TENSOR_QUANT8_ASYMM_SIGNED"
                operand["zeroPoint"] = operand.get("zeroPoint", 0) - 128
                if operand["data"]:
                    operand["data"] = [v - 128 for v in operand["data"]]
                converted = True
    if not converted:
        return None
    changed["test"] += "_quant8_signed"
    return changed


VARIANTS = {
    "dynamic_outputs": variant_dynamic_outputs,
    "shared_memory_constants": variant_shared_memory_constants,
    "quant8_signed": variant_quant8_signed,
}
