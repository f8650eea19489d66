"""The driver service's wire protocol under hostile input, both ways: a mutated message to
the service gets an error naming the field and the rule (never a Python exception's text,
never a dead or hung service), and a mutated reply to the runtime's client is a failure of
the driver (OP_FAILED / DEAD_OBJECT), never a raw exception, a wrong code or a wrong answer
given as a success. The seeded fuzz runs are short versions of ``tools/fuzz_service.py``;
the other tests are the bugs it found, one each."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("msgpack")

import nnapi  # noqa: E402
from nnapi import OperandCode as T  # noqa: E402
from nnapi import OperandType  # noqa: E402
from nnapi import OperationCode as Op  # noqa: E402
from nnapi.codes import DurationCode, ResultCode  # noqa: E402
from nnapi.drivers.reference import ReferenceDevice  # noqa: E402
from nnapi.drivers.service import wire  # noqa: E402
from nnapi.drivers.service.client import connect_devices  # noqa: E402
from nnapi.drivers.service.server import Service, _Session  # noqa: E402
from nnapi.hal import ErrorStatus, HalError, serialize  # noqa: E402
from nnapi.operand import MAX_RANK  # noqa: E402
from nnapi.runtime import manager  # noqa: E402
from nnapi.runtime.model_builder import build_hal_model  # noqa: E402


def load_fuzzer():
    path = Path(__file__).resolve().parents[1] / "tools" / "fuzz_service.py"
    spec = importlib.util.spec_from_file_location("fuzz_service", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = load_fuzzer()


# --- the seeded fuzz runs ------------------------------------------------------------------------
def test_mutated_messages_to_the_service(tmp_path):
    """600 mutations of the recorded messages of every operation (seed 7): each answered
    with an error naming the field, or accepted; the service never dies, hangs or
    balloons, and a well-behaved client of it keeps getting right answers throughout.
    The long run: ``python tools/fuzz_service.py --direction to-service --cases 20000``."""
    counts, bugs = fuzz.fuzz_to_service(600, 7, str(tmp_path), log=lambda *_: None)
    assert bugs == []
    assert sum(counts.values()) >= 590  # a few mutations msgpack cannot pack are skipped
    # the mutations reach the schema's checks, and some still pass them (and are run)
    assert counts["refused INVALID_ARGUMENT"] > 200 and counts["accepted"] > 10, counts


def test_mutated_replies_to_the_client(tmp_path):
    """200 scenarios of the public API (and the HAL's fenced execution) each with one reply
    of the service mutated (seed 7): every failure is an NnapiError / HalError of a failing
    driver, every success has the right values. The long run: ``python
    tools/fuzz_service.py --direction to-client --cases 10000``."""
    counts, bugs = fuzz.fuzz_to_client(200, 7, str(tmp_path), log=lambda *_: None)
    assert bugs == []
    assert sum(counts.values()) == 200
    assert counts["ok"] > 5 and counts["error OP_FAILED"] > 5 and counts["error DEAD_OBJECT"] > 5, counts


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


def test_a_payload_that_decodes_into_too_many_values():
    """A payload of 2 MiB of empty lists decoded into 3 million Python lists (about 200
    MiB; 64 MiB of them, the frame limit, would have been gigabytes: the long fuzz run saw
    the service's peak memory grow 1,189 MiB from one 'map' message)."""
    import msgpack

    payload = msgpack.packb({"v": 3, "a": [[[]] * 1000] * 3000})
    with pytest.raises(wire.WireError, match=f"malformed message: more than {wire.MAX_VALUES} values"):
        wire.unpack(payload)
    with pytest.raises(wire.WireError, match="a list or map of more than"):
        wire.unpack(msgpack.packb([0] * (wire.MAX_VALUES + 1)), list)
    model = [[{"type": 3, "dimensions": [1, 4], "scale": 0.0}] * 10_000]  # a large model's worth: decoded
    assert wire.unpack(msgpack.packb(model), list) == model


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


def test_an_operand_of_thousands_of_dimensions_is_refused_quickly():
    """The product of 3,690 dimensions of 40,000 became a number of 17,000 digits, which
    the constant length check's message could not print: 'malformed model: ValueError:
    Exceeds the limit (4300 digits) for integer string conversion' (2 million dimensions
    of 2 would have taken minutes to multiply). Android's limit, a size within uint32, is
    checked multiplying only until it is passed."""
    import time

    service, session = Service([ReferenceDevice()], "/nonexistent"), _Session()
    for operand, dims in ((1, [40000] * 3690), (0, [2] * 1_000_000), (1, [65536, 65536]), (1, [65536] * MAX_RANK)):
        plain = serialize.model_to_plain(build_hal_model(_add_model())[0])
        plain["main"]["operands"][operand]["dimensions"] = dims
        start = time.monotonic()
        reply = _ask(service, session, "prepare", {"dev": 0, "model": plain})
        assert time.monotonic() - start < 10
        assert (reply["ok"], reply["status"]) == (False, int(ErrorStatus.INVALID_ARGUMENT)), reply
        if len(dims) > MAX_RANK:  # numpy's limit on an array's dimensions, checked before the size
            assert f"operand {operand}: rank {len(dims)} is above {MAX_RANK}" in reply["msg"], reply["msg"][:300]
        else:
            assert f"operand {operand}: TENSOR_FLOAT32 of {len(dims)} dimensions" in reply["msg"], reply["msg"][:300]
            assert "larger than 4 GiB (its size overflows uint32:" in reply["msg"]


# --- the client's reading of replies (a man in the middle mutates one) ----------------------------
@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    work = tmp_path_factory.mktemp("svcreply")
    running = fuzz.ServiceProcess(str(work / "up.sock"))
    yield running, str(work)
    running.stop()


@pytest.fixture
def middle(upstream):
    """A proxy to the service whose replies pass through ``edit(op, reply) -> reply | None``
    (None: as the service sent it); yields (path, a setter for ``edit``)."""
    running, work = upstream
    edits = {}

    def on_reply(request, reply):
        edit = edits.get("edit")
        if edit is None or not isinstance(request, dict):
            return None
        changed = edit(request.get("op"), wire.unpack(reply))
        return None if changed is None else ("payload", wire.pack(changed))

    path = os.path.join(work, f"mitm{len(os.listdir(work))}.sock")
    proxy = fuzz.Proxy(path, running.path, on_reply=on_reply)
    yield path, lambda edit: edits.__setitem__("edit", edit)
    proxy.stop()


def _remote_device(path: str):
    hal = connect_devices(path)[0]
    hal._link.timeout_s = 10.0
    manager.register_device(hal)
    return next(d for d in nnapi.get_devices() if d.name == hal.name)


@pytest.fixture
def registered():
    names = []
    yield names
    for name in names:
        manager.unregister_device(name)


def _compute_add(device, x=None):
    compilation = nnapi.Compilation(_add_model(), [device])
    compilation.finish()
    x = np.array([10, 20, 30, 40], np.float32) if x is None else x
    execution = nnapi.Execution(compilation)
    execution.set_input(0, x)
    y = np.zeros(4, np.float32)
    execution.set_output(0, y)
    execution.set_measure_timing(True)
    execution.compute()
    return execution, y


def _on_execute(change):
    def edit(op, reply):
        if op == "execute" and reply.get("ok"):
            change(reply["r"])
            return reply
        return None
    return edit


@pytest.mark.parametrize(("change", "rule"), [
    (lambda r: r[0].__setitem__(0, [[3], True]), "output 0: shape [3] does not match [4]"),
    (lambda r: r[0].__setitem__(0, [[4, 1], True]), "output 0: shape [4, 1] does not match [4]"),
    (lambda r: r[0].__setitem__(0, [[], True]), "output 0: shape [] does not match [4]"),
    (lambda r: r[0].append(r[0][0]), "output shapes: 2 for 1 outputs"),
    (lambda r: r[0].__setitem__(0, [[4], False]), "output 0: insufficient in a successful execution"),
    (lambda r: r.__setitem__(1, [-1, 5]), "time on device: -1 out of range"),
    (lambda r: r.__setitem__(1, ["1", 5]), "time on device: expected an integer"),
    (lambda r: r[0].__setitem__(0, [[-4], True]), "output shape[0]: -4 out of range"),
])
def test_an_execution_result_that_disagrees_with_the_request_is_a_driver_failure(middle, registered, change, rule):
    """Before, shapes that disagreed with the outputs were a success (the runtime then
    reported dimensions [3] for a [4] output and copied back 12 of its 16 bytes, or []
    and 4 bytes), and a malformed shape or timing was INVALID_ARGUMENT, so the caller
    saw BAD_DATA, as if its own arguments were wrong."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    execution, y = _compute_add(device)  # right, unmutated
    np.testing.assert_array_equal(y, [10, 21, 32, 43])
    set_edit(_on_execute(change))
    with pytest.raises(nnapi.OpFailedError) as caught:
        _compute_add(device)
    assert caught.value.code == ResultCode.OP_FAILED
    assert "sent a bad reply to execute" in str(caught.value) and rule in str(caught.value), str(caught.value)


def test_an_open_output_shape_past_its_buffer_is_a_driver_failure(middle, registered):
    """An output of open dimension, a 16-byte buffer: a reply that the output holds 400 or
    4,000,000 values (which would need more than the buffer) is the driver's failure, never
    a success reporting those dimensions (found by reviewer R2 with the check removed: every
    test passed); the true shape [4] is a success."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    fuse = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(fuse, np.int32(0))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))
    model.add_operation(Op.ADD, [x, x, fuse], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    for shape in ([4], [400], [4_000_000]):
        set_edit(_on_execute(lambda r, shape=shape: r[0].__setitem__(0, [shape, True])))
        execution = nnapi.Execution(compilation)
        execution.set_input(0, np.arange(4, dtype=np.float32))
        out = np.zeros(4, np.float32)
        execution.set_output(0, out)
        if shape == [4]:
            execution.compute()
            assert execution.get_output_operand_dimensions(0) == [4]
            np.testing.assert_array_equal(out, [0, 2, 4, 6])
            continue
        with pytest.raises(nnapi.OpFailedError) as caught:
            execution.compute()
        assert f"shape {shape} needs {4 * shape[0]} bytes, its buffer has 16" in str(caught.value), str(caught.value)


def test_a_tensor_output_of_unknown_rank_needs_a_rank_in_a_success(middle, registered):
    """Android's validateOutputShapesFromDriver: a successful result gives every tensor output
    a known rank. For an output the model leaves of unknown rank, a reply of [] is the
    driver's failure (it was a success reporting a tensor of rank 0); [4] is a success."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    model = nnapi.Model()
    x = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    fuse = model.add_operand(OperandType(T.INT32))
    model.set_operand_value(fuse, np.int32(0))
    y = model.add_operand(OperandType(T.TENSOR_FLOAT32, None))
    model.add_operation(Op.ADD, [x, x, fuse], [y])
    model.identify_inputs_and_outputs([x], [y])
    model.finish()
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    for shape in ([4], []):
        set_edit(_on_execute(lambda r, shape=shape: r[0].__setitem__(0, [shape, True])))
        execution = nnapi.Execution(compilation)
        execution.set_input(0, np.arange(4, dtype=np.float32))
        out = np.zeros(4, np.float32)
        execution.set_output(0, out)
        if shape:
            execution.compute()
            assert execution.get_output_operand_dimensions(0) == [4]
            np.testing.assert_array_equal(out, [0, 2, 4, 6])
            continue
        with pytest.raises(nnapi.OpFailedError) as caught:
            execution.compute()
        assert "output 0: a tensor of unknown rank (dimensions []) in a successful execution" in str(caught.value)


def _reusable_add(middle, registered, x: np.ndarray) -> tuple:
    """(set_edit, a reusable Execution of _add_model on ``x`` through the man in the middle,
    its output array)."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    compilation = nnapi.Compilation(_add_model(), [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    execution.set_input(0, x)
    y = np.zeros(4, np.float32)
    execution.set_output(0, y)
    return set_edit, execution, y


def test_a_reusable_execution_reports_each_replys_timing(middle, registered):
    """The client keeps the last reply it checked so that a bound request's repeat is not
    decoded again: a reply that differs (here its timing) must be decoded afresh (reviewer
    R2: reusing the first decoded result for every later reply passed every test)."""
    set_edit, execution, y = _reusable_add(middle, registered, np.array([10, 20, 30, 40], np.float32))
    execution.set_measure_timing(True)
    durations = []
    for nanoseconds in (111, 222, 222, 333):
        def timing(op, reply, ns=nanoseconds):
            if op in ("execute", "run") and reply.get("ok"):
                reply["r"][1] = [ns, ns + 1]
                return reply
            return None

        set_edit(timing)
        execution.compute()
        durations.append(execution.get_duration(DurationCode.DURATION_ON_HARDWARE))
        np.testing.assert_array_equal(y, [10, 21, 32, 43])
    assert durations == [111, 222, 222, 333]


def test_a_failure_reply_without_a_failure_status(middle, registered):
    """{"ok": False, "status": 0} raised HalError(NONE): a failure the runtime reported as
    NO_ERROR; a status out of range or of another type was taken as GENERAL_FAILURE but
    malformed shapes beside it were BAD_DATA."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    for status, shapes, rule in ((0, [], "status: 0 out of range [1, 10000]"),
                                 ("2", [], "status: expected an integer"),
                                 (99, [], "status: 99 is no ErrorStatus"),
                                 (3, [[[-1], False]], "output shape[0]: -1 out of range")):
        def failure(op, reply, status=status, shapes=shapes):
            if op != "execute":
                return None
            return {"v": reply["v"], "id": reply["id"], "ok": False, "status": status, "msg": "no", "shapes": shapes}

        set_edit(failure)
        with pytest.raises(nnapi.OpFailedError) as caught:
            _compute_add(device)
        assert rule in str(caught.value), str(caught.value)
    # a well-formed failure is passed on with its status
    set_edit(lambda op, reply: None if op != "execute" else {
        "v": reply["v"], "id": reply["id"], "ok": False, "status": 7, "msg": "busy", "shapes": []})
    with pytest.raises(nnapi.NnapiError) as caught:
        _compute_add(device)
    assert caught.value.code == ResultCode.RESOURCE_EXHAUSTED_TRANSIENT and "busy" in str(caught.value)


@pytest.mark.parametrize(("change", "rule"), [
    (lambda d: d.pop("name"), "device 0 name: expected a string"),
    (lambda d: d.__setitem__("name", ""), "device 0 name: must not be empty"),
    (lambda d: d.__setitem__("type", 99), "device 0 type: 99 is not a valid DeviceTypeCode"),
    (lambda d: d.__setitem__("cache", [1]), "device 0 cache files: expected 2 counts"),
    (lambda d: d.__setitem__("ext", [["x", [[1, "yes", 4]]]]), "device 0 extensions"),
    (lambda d: d["caps"].__setitem__("rs", [float("nan"), 1.0]),
     "relaxed_float32_to_float16_scalar.exec_time: must be a number > 0, got nan"),
    (lambda d: d["caps"].__setitem__("rt", [1.0, 0.0]),
     "relaxed_float32_to_float16_tensor.power_usage: must be a number > 0, got 0.0"),
    (lambda d: d["caps"].__setitem__("ops", [[0, 0.0, 1.0]]),
     "operand_performance[FLOAT32].exec_time: must be a number > 0, got 0.0"),
    (lambda d: d["caps"].__setitem__("if", [1.0, -2.0]), "if_performance.power_usage: must be a number > 0, got -2.0"),
    (lambda d: d["caps"].__setitem__("while", [-1.0, 1.0]),
     "while_performance.exec_time: must be a number > 0, got -1.0"),
])
def test_a_bad_hello_is_a_driver_failure_at_discovery(middle, change, rule):
    """A device without a name raised KeyError out of connect_devices (so discovery listed
    'KeyError: name'); a capability of the wrong type was INVALID_ARGUMENT; extensions were
    taken unchecked and failed later in get_supported_extensions; a performance figure of 0
    was taken, and the runtime then gave the whole device no performance information."""
    path, set_edit = middle

    def edit(op, reply):
        if op == "hello":
            change(reply["r"]["devices"][0])
            return reply
        return None

    set_edit(edit)
    with pytest.raises(HalError) as caught:
        connect_devices(path)
    assert caught.value.status == ErrorStatus.GENERAL_FAILURE
    assert "sent a bad reply to hello" in str(caught.value) and rule in str(caught.value), str(caught.value)


def test_other_bad_results_are_driver_failures(middle, registered):
    """A 'supported' answer of the wrong type, a prepared model's number of the wrong type
    and a fenced execution's info of the wrong shape were INVALID_ARGUMENT (BAD_DATA)."""
    path, set_edit = middle
    device = _remote_device(path)
    registered.append(device.name)
    hal_model = build_hal_model(_add_model())[0]
    set_edit(lambda op, reply: dict(reply, r=["yes"]) if op == "supported" else None)
    with pytest.raises(HalError) as caught:
        device._hal.get_supported_operations(hal_model)
    assert caught.value.status == ErrorStatus.GENERAL_FAILURE and "supported: expected a boolean" in str(caught.value)
    set_edit(lambda op, reply: dict(reply, r=[None, None]) if op == "reasons" else None)
    with pytest.raises(HalError) as caught:
        device._hal.get_unsupported_reasons(hal_model)
    assert caught.value.status == ErrorStatus.GENERAL_FAILURE and "2 answers for 1 operations" in str(caught.value)
    set_edit(lambda op, reply: dict(reply, r=str(reply["r"])) if op == "prepare" else None)
    with pytest.raises(nnapi.OpFailedError, match="handle: expected an integer"):
        nnapi.Compilation(_add_model(), [device]).finish()


def test_a_bound_execution_whose_first_result_is_missing(middle, registered):
    """A reusable execution remembered its last result to skip decoding a repeat, starting
    from None: a first reply without a result (None) matched it and the decoded None was
    unpacked, 'TypeError: cannot unpack non-iterable NoneType object' as OP_FAILED."""
    set_edit, execution, y = _reusable_add(middle, registered, np.ones(4, np.float32))
    set_edit(lambda op, reply: {k: v for k, v in reply.items() if k != "r"} if op == "run" else None)
    with pytest.raises(nnapi.OpFailedError) as caught:
        execution.compute()
    assert "sent a bad reply to run: execution result: expected a list, got NoneType" in str(caught.value)
    set_edit(lambda op, reply: None)
    execution.compute()
    np.testing.assert_array_equal(y, [1, 2, 3, 4])


def test_results_of_an_omitted_output_and_a_dynamic_one_are_accepted(middle, registered):
    """The checks of an execution's result leave alone what the request does not pin: an
    omitted output (no buffer, but a shape) and the dimensions a model leaves open."""
    path, _ = middle
    device = _remote_device(path)
    registered.append(device.name)
    model = nnapi.Model()
    a = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    b = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    fuse = model.add_operand(OperandType(T.INT32))
    total = model.add_operand(OperandType(T.TENSOR_FLOAT32, [0]))  # dimension left open
    product = model.add_operand(OperandType(T.TENSOR_FLOAT32, [4]))
    model.set_operand_value(fuse, np.int32(0))
    model.add_operation(Op.ADD, [a, b, fuse], [total])
    model.add_operation(Op.MUL, [a, b, fuse], [product])
    model.identify_inputs_and_outputs([a, b], [total, product])
    model.finish()
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    execution = nnapi.Execution(compilation)
    execution.set_input(0, np.array([1, 2, 3, 4], np.float32))
    execution.set_input(1, np.array([10, 20, 30, 40], np.float32))
    y = np.zeros(4, np.float32)
    execution.set_output(0, y)
    execution.set_output(1, None)
    execution.compute()
    np.testing.assert_array_equal(y, [11, 22, 33, 44])
    assert execution.get_output_operand_dimensions(0) == [4]


def test_discovery_through_the_environment_names_a_bad_hello(middle):
    """``nnapi devices`` with NNAPI_REMOTE_DEVICES naming a service whose hello lacks a
    device's name listed the load failure as "KeyError: 'name'"."""
    import subprocess
    import sys

    path, set_edit = middle
    set_edit(lambda op, reply: (reply["r"]["devices"][0].pop("name"), reply)[1] if op == "hello" else None)
    env = dict(os.environ, NNAPI_REMOTE_DEVICES=path)
    result = subprocess.run([sys.executable, "-m", "nnapi", "devices"], capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"FAILED to load {path} (NNAPI_REMOTE_DEVICES)" in result.stdout
    assert "sent a bad reply to hello: device 0 name: expected a string" in result.stdout, result.stdout
    assert "KeyError" not in result.stdout
