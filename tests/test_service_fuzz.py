"""The driver service's wire protocol under hostile input, both ways: a mutated message to
the service gets an error naming the field and the rule (never a Python exception's text,
never a dead or hung service), and a mutated reply to the runtime's client is a failure of
the driver (OP_FAILED / DEAD_OBJECT), never a raw exception, a wrong code or a wrong answer
given as a success. The seeded fuzz runs are short versions of ``tools/fuzz_service.py``;
the other tests are the bugs it found, one each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.drivers.reference import ReferenceDevice  # noqa: E402
from nnapi.drivers.service import wire  # noqa: E402
from nnapi.drivers.service.server import Service, _Session  # noqa: E402
from nnapi.hal import ErrorStatus, serialize  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


def load_fuzzer():
    path = Path(__file__).resolve().parents[1] / "tools" / "fuzz_service.py"
    spec = importlib.util.spec_from_file_location("fuzz_service", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzzer()


# --- the service's answers (in process: the service's own decoding) ------------------------------
def _ask(service: Service, session: _Session, op: str, args: dict, payload: bytes | None = None) -> dict:
    message = wire.pack({"v": wire.PROTOCOL_VERSION, "id": 5, "op": op, "a": args}) if payload is None else payload
    reply, keep_going = service._handle(message, [], session, True)
    assert keep_going
    return reply


def _add_model() -> nnapi.Model:
    model = nnapi.Model()
    tensor = OperandType(T.TENSOR_FLOAT32, [4])
    a = model.add_operand(tensor)
    b = model.add_operand(tensor)
    fuse = model.add_operand(OperandType(T.INT32))
    out = model.add_operand(tensor)
    model.set_operand_value(b, np.arange(4, dtype=np.float32))
    model.set_operand_value(fuse, np.int32(0))
    model.add_operation(Op.ADD, [a, b, fuse], [out])
    model.identify_inputs_and_outputs([a], [out])
    model.finish()
    return model


@pytest.mark.parametrize(("payload", "rule"), [
    (b"\x82\xa1v\x03", "truncated"),
    (b"\x81\x91\x01\x02", "a map key that is a list or a map"),
    (b"\x81\xa2\xff\xfe\x01", "not valid UTF-8"),
    (b"\x80\x01", "extra bytes"),
    (b"\xc1", "not valid msgpack"),
    (b"\xdd\xff\xff\xff\xff", "a length past the end"),
])
def test_undecodable_payloads_are_named_not_python_errors(payload, rule):
    """msgpack's refusals were passed on with their Python type (``malformed message:
    TypeError: unhashable type: 'list'``, ``UnicodeDecodeError: ...``)."""
    reply = _ask(Service([ReferenceDevice()], "/nonexistent"), _Session(), "", {}, payload)
    assert (reply["ok"], reply["status"]) == (False, int(ErrorStatus.INVALID_ARGUMENT))
    assert reply["msg"].startswith("malformed message: ") and rule in reply["msg"], reply["msg"]
    assert not fuzz.INTERNAL.search(reply["msg"]), reply["msg"]


def test_release_of_a_kind_that_is_not_a_string():
    """A list as ``kind`` was looked up in a dict: GENERAL_FAILURE 'TypeError: unhashable type'."""
    service, session = Service([ReferenceDevice()], "/nonexistent"), _Session()
    for kind in ([], {"h": 1}, 7):
        reply = _ask(service, session, "release", {"kind": kind, "h": 1})
        assert (reply["ok"], reply["status"]) == (False, int(ErrorStatus.INVALID_ARGUMENT))
        assert "release kind: expected a string" in reply["msg"]
    reply = _ask(service, session, "release", {"kind": "model", "h": 1})
    assert "release kind: 'model' is not one of prepared, burst" in reply["msg"]
    assert _ask(service, session, "release", {"kind": "burst", "h": 1})["ok"] is True


def test_a_cache_token_of_the_wrong_length_is_malformed():
    """A token of 31 bytes reached the driver, which then said GENERAL_FAILURE 'cache
    rejected: written for another token'; the HAL's token is 32 bytes."""
    service, session = Service([ReferenceDevice()], "/nonexistent"), _Session()
    plain = serialize.model_to_plain(build_hal_model(_add_model())[0])
    for op, args in (("prepare", {"dev": 0, "model": plain, "token": bytes(31)}),
                     ("prepare_cache", {"dev": 0, "token": bytes(33)})):
        reply = _ask(service, session, op, args)
        assert (reply["ok"], reply["status"]) == (False, int(ErrorStatus.INVALID_ARGUMENT)), reply
        assert "token: must be 32 bytes" in reply["msg"]
    assert _ask(service, session, "prepare", {"dev": 0, "model": plain, "token": bytes(32)})["ok"] is True


def test_a_constant_of_unspecified_dimensions_is_refused_before_the_driver():
    """HAL validation let a constant with a dimension 0 (or no dimensions) through; the
    reference driver then failed with 'ValueError: cannot reshape array of size 16 into
    shape (0,)' as GENERAL_FAILURE. Android's rule: a constant's length is the size its
    dimensions give, so its dimensions must be known."""
    service, session = Service([ReferenceDevice()], "/nonexistent"), _Session()
    for dims in ([0], [], [4, 0]):
        plain = serialize.model_to_plain(build_hal_model(_add_model())[0])
        plain["main"]["operands"][1]["dimensions"] = dims
        reply = _ask(service, session, "prepare", {"dev": 0, "model": plain})
        assert (reply["ok"], reply["status"]) == (False, int(ErrorStatus.INVALID_ARGUMENT)), reply
        assert "operand 1: constant of" in reply["msg"] and "has unspecified dimensions" in reply["msg"], reply
