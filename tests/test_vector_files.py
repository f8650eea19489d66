"""Vector files are read as untrusted data: a record that breaks a rule of the format is
refused with one line naming the file, the line and the rule (conformance.check_record),
never run as if the device had failed it, and never a traceback."""

from __future__ import annotations

import copy
import gzip
import json

import numpy as np
import pytest

from nnapi.cli import main
from nnapi.conformance import VectorFileError, default_vector_files, load_records, variant_quant8_signed

GOOD = next(r for r in load_records(default_vector_files()[0]) if r["test"] == "add")
MULTINOMIAL = next(r for r in load_records(default_vector_files()[2]) if r["test"] == "random_multinomial")


def _changed(change, record=GOOD):
    record = copy.deepcopy(record)
    change(record)
    return record


def _operand(index, **fields):
    return lambda r: r["main"]["operands"][index].update(fields)


def _self_reference(r):
    r["referenced"] = [copy.deepcopy(r["main"])]
    r["referenced"][0]["operands"][2].update(lifetime="SUBGRAPH", type="MODEL", dimensions=[], data=[0])


# (change, the rule named): before, the first five failed as if the device had (RAW KeyError
# 'FOO', RAW ValueError 'cannot reshape', RAW ValueError 'could not convert string to
# float', RAW IndexError, RAW OverflowError), the sixth too (BadDataError 'operand index 9
# out of range'), the next two stopped `nnapi conformance` with a traceback (KeyError
# 'main', TypeError), a self-reference recursed without end (RAW RecursionError once
# reached), 1e39 became an infinity and 1.5 an INT32 1 silently, and an input listed with
# another lifetime ran as one
BROKEN = [
    (_operand(0, type="FOO"), "main operand 0: unknown operand type 'FOO'"),
    (_operand(0, data=[1.0]), r"main operand 0: 1 values for dimensions \[2\] \(2 values\)"),
    (_operand(0, data="abc"), "main operand 0: data must be a list of values"),
    (_operand(2, lifetime="SUBGRAPH"), "main operand 2: a SUBGRAPH operand's data is .* references none"),
    (_operand(2, data=[2**40]), r"main operand 2: INT32 data must lie in \[-2147483648, 2147483647\]"),
    (lambda r: r["main"]["operations"][0].update(inputs=[0, 9, 2]), "main: operation 0 inputs must be a list of"),
    (lambda r: r.pop("main"), "main: a subgraph is a JSON object"),
    (lambda r: r["main"].update(operations=[[0, 1]]), "main operation 0: an operation is an object"),
    (_self_reference, r"referenced\[0\] refers to itself"),
    (_operand(0, data=[1e39, 1.0]),
     "main operand 0: TENSOR_FLOAT32 data holds 1e\\+39, which TENSOR_FLOAT32 rounds to an infinity"),
    # a NaN or a string hid the value from the range check (loaded as a silent infinity);
    # an integer past float64 raised a raw OverflowError
    (_operand(0, data=[float("nan"), 1e39]), "main operand 0: TENSOR_FLOAT32 data holds 1e\\+39, which"),
    (_operand(0, data=["1e39", "1e39"]), "main operand 0: TENSOR_FLOAT32 data holds 1e\\+39, which"),
    (_operand(0, data=["nan", 10**400]), "main operand 0: TENSOR_FLOAT32 data holds an integer beyond the type's "
                                         "largest finite value"),
    (_operand(0, data=["x", 1.0]), "main operand 0: TENSOR_FLOAT32 data must be numbers, got 'x'"),
    (_operand(2, data=[1.5]), "main operand 2: INT32 data must be integers"),
    (_operand(1, lifetime="TEMPORARY_VARIABLE"), "main operand 1: lifetime TEMPORARY_VARIABLE, in inputIndexes"),
    (_operand(0, dimensions=[-1]), "main operand 0: dimensions must be a list of unsigned 32-bit integers"),
    (lambda r: r.update(expectFailure="yes"), "expectFailure must be true or false"),
    # one per rule no other case reached (each rule turned off, the suite still passed)
    (lambda r: r["main"]["operations"][0].update(outputs=[9]), "main: operation 0 outputs must be a list of"),
    (lambda r: r["main"].update(inputIndexes=[0, 1, 0]), "main: inputIndexes lists an operand twice"),
    (_operand(2, type="BOOL", data=[1]), "main operand 2: BOOL data must be true / false values"),
    (lambda r: r.update(isRelaxed=1), "isRelaxed must be true or false"),
    (_operand(2, data=[0, 0]), r"main operand 2: 2 values for dimensions \[\] \(1 values\)"),
    (_operand(3, lifetime="TEMPORARY_VARIABLE"), "main operand 3: lifetime TEMPORARY_VARIABLE, in outputIndexes"),
    (_operand(0, scale="0.5"), "main operand 0: scale must be a number and zeroPoint an integer"),
    (lambda r: r.update(test=["add"]), r"the record has no test name \(a string\)"),
    (_operand(0, channelQuant={"channelDim": "0", "scales": [1.0]}), "main operand 0: channelQuant must be null or"),
    (lambda r: r.update(referenced={}), "referenced must be a list of subgraphs"),
]


@pytest.mark.parametrize("change, rule", BROKEN, ids=[rule[:40] for _, rule in BROKEN])
def test_a_broken_record_is_refused_naming_file_line_and_rule(tmp_path, change, rule):
    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(_changed(change)) + "\n")
    with pytest.raises(VectorFileError, match=f"^{path}:3: {rule}"):
        list(load_records(path))


def test_a_float_that_rounds_to_the_largest_finite_value_is_kept(tmp_path):
    """65510 is float16 65504 (the largest finite value), not an infinity; 65520 is one."""
    def float16(*values):
        def change(r):
            for operand in r["main"]["operands"][:2] + r["main"]["operands"][3:]:
                operand["type"] = "TENSOR_FLOAT16"
            r["main"]["operands"][0]["data"] = list(values)
        return _changed(change)

    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(float16(65510.0, "-65510")) + "\n")
    assert list(load_records(path))[0]["main"]["operands"][0]["data"] == [65510.0, "-65510"]
    path.write_text(json.dumps(float16(1.0, -65520)) + "\n")
    with pytest.raises(VectorFileError, match="TENSOR_FLOAT16 data holds 65520.0, which TENSOR_FLOAT16 rounds to an"):
        list(load_records(path))


def test_unreadable_lines_and_files_name_the_line(tmp_path):
    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(GOOD) + '\n{"x": 1\n')
    with pytest.raises(VectorFileError, match=f"^{path}:2: not a JSON record"):
        list(load_records(path))
    path.write_text("[1, 2]\n")
    with pytest.raises(VectorFileError, match=f"^{path}:1: a record is a JSON object, not list"):
        list(load_records(path))
    gz = tmp_path / "vectors.jsonl.gz"
    gz.write_bytes(gzip.compress((json.dumps(GOOD) + "\n").encode() * 3)[:-30])
    with pytest.raises(VectorFileError, match=f"^{gz}:[0-9]+: unreadable"):
        list(load_records(gz))


def test_the_cli_prints_one_line(tmp_path, capsys):
    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(_changed(_operand(0, type="FOO"))) + "\n")
    assert main(["conformance", "-q", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"nnapi conformance: {path}:1: main operand 0: unknown operand type 'FOO'\n"
    assert main(["conformance", "-q", "--device", "nnapi-reference", str(path).replace("vectors", "missing")]) == 2


@pytest.mark.parametrize("command", [["dump"], ["placement"], ["bisect", "--device", "nnapi-reference"],
                                     ["conformance", "-q"]])
def test_an_unknown_operation_type_is_refused_by_the_tools(tmp_path, capsys, command):
    """An operation type that is no OperationCode passed check_record (a string) and ended
    `nnapi dump`, `placement` and `bisect` in a KeyError traceback (build_model's lookup)."""
    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(_changed(lambda r: r["main"]["operations"][0].update(type="NOT_AN_OP"))) + "\n")
    assert main([*command, str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"nnapi {command[0]}: {path}:1: main operation 0: unknown operation type 'NOT_AN_OP'\n"


def test_multinomial_records_and_samples_are_checked(tmp_path):
    """A multinomial record whose output is not integer samples raised a raw TypeError out
    of run_record (np.bincount of floats); samples a device gives outside [0, classes)
    raised a raw ValueError ('negative' bincount): now a failed vector naming them."""
    def float_samples(r):
        r["main"]["operands"][r["main"]["outputIndexes"][0]]["type"] = "TENSOR_FLOAT32"

    path = tmp_path / "vectors.jsonl"
    path.write_text(json.dumps(_changed(float_samples, MULTINOMIAL)) + "\n")
    with pytest.raises(VectorFileError, match=":1: a multinomial record's first output is TENSOR_INT32 samples"):
        list(load_records(path))
    from nnapi.conformance import _multinomial_check

    samples = {0: -np.ones((1, 128), np.int32)}
    assert _multinomial_check(MULTINOMIAL, samples) == "samples outside [0, 1024): -1 to -1"


def test_a_quant8_variant_of_a_record_without_zero_point_is_derived():
    """variant_quant8_signed read operand["zeroPoint"], which the format leaves optional
    (build_model reads it with a default): a raw KeyError out of `--variant quant8_signed`."""
    record = next(r for r in load_records(default_vector_files()[0]) if r["test"] == "add_quant8")
    for operand in record["main"]["operands"]:
        operand.pop("zeroPoint")
    variant = variant_quant8_signed(record)
    assert variant is not None
    assert {o["zeroPoint"] for o in variant["main"]["operands"] if o["type"] == "TENSOR_QUANT8_ASYMM_SIGNED"} \
        == {-128}


def test_nesting_past_the_parsers_is_refused(tmp_path):
    """A JSON line nested past the parser's depth raised a raw RecursionError; so did
    referenced subgraphs nested hundreds deep, in build_model."""
    path = tmp_path / "vectors.jsonl"
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(VectorFileError, match=f"^{path}:1: not a JSON record"):
        list(load_records(path))
    record = copy.deepcopy(GOOD)
    record["referenced"] = [copy.deepcopy(GOOD["main"]) for _ in range(500)]
    for number, subgraph in enumerate([record["main"], *record["referenced"][:-1]]):
        subgraph["operands"][2].update(lifetime="SUBGRAPH", type="MODEL", dimensions=[], data=[number])
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(VectorFileError, match=f"^{path}:1: referenced subgraphs nest more than 64 deep"):
        list(load_records(path))
