"""Fuzz the public API with random sequences of calls; count raw exceptions, crashes,
hangs and wrong results.

Each worker is a subprocess running a random sequence of calls over a pool of live (and
freed) objects: models, compilations, executions, bursts, memories (hostile descriptors
included), memory descriptors and events, with junk arguments, strided and odd-dtype
numpy arrays, calls after free and after finish, and a random global numpy error state.
A call may fail only with an NnapiError; anything else is a raw exception. A worker
killed by a signal is a crash, one stuck in a call is a hang (faulthandler names the
call in both cases), and a successful ADD / MUL / LOGISTIC computation whose result
differs from numpy's is a wrong result.

    python tools/fuzz_api.py --minutes 5 --workers 2          # the long run
    python tools/fuzz_api.py --calls 2000 --seed 7            # a quick one

The test suite runs a short version (tests/test_fuzz_api.py).
"""

from __future__ import annotations

import argparse
import collections
import faulthandler
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

#: An NnapiError message that is really a Python exception's text.
_INTERNAL = re.compile(r"\b(AttributeError|TypeError|ValueError|KeyError|IndexError|ZeroDivisionError|"
                       r"OverflowError|FloatingPointError|MemoryError|RuntimeError|AssertionError)\b|"
                       r"object has no attribute|'NoneType'|object is not")

#: A single call taking longer than this is a hang.
CALL_TIMEOUT_S = 20


# --- the worker: one random sequence of calls --------------------------------------------------
class Worker:
    """A random sequence of public-API calls over a pool of objects."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        import nnapi

        self.np, self.nnapi = np, nnapi
        self.rng = random.Random(seed)
        self.calls = 0
        self.raw: collections.Counter[str] = collections.Counter()
        self.raw_examples: dict[str, str] = {}
        self.wrong: list[str] = []
        self.checked = 0
        self.outcomes: collections.Counter[str] = collections.Counter()
        self.models: list[Any] = []
        self.compilations: list[Any] = []
        self.executions: list[Any] = []  # (execution, expected or None, outputs)
        self.memories: list[Any] = []
        self.descs: list[Any] = []
        self.events: list[Any] = []  # (event, may_never_signal)
        self.bursts: list[Any] = []
        self.fds: list[int] = []  # descriptors this worker owns (hostile ones included)
        self.tmp = tempfile.mkdtemp(prefix="nnapi-fuzz-")
        settings = self.rng.choice([{"all": "raise"}, {"all": "warn"}, {"all": "ignore"}, {"under": "raise"}])
        np.seterr(**settings)

    # --- helpers -------------------------------------------------------------------------
    def pick(self, pool: list, fresh: float = 0.0):
        if not pool or self.rng.random() < fresh:
            return None
        return self.rng.choice(pool)

    def junk(self) -> Any:
        np, rng = self.np, self.rng
        choices = [None, -1, 0, 1, 2, 3, 7, 2**31, 2**63, 2**64, -(2**40), 1.7, float("nan"), float("inf"), True,
                   "x", b"\x00" * 4, [], [1, 2], [2**40], (0,), np.array(1), np.array([1, 2]),
                   np.zeros(3, np.float64), np.zeros(2, object), object(), np.int64(2), np.float32(0.5),
                   self.pick(self.models), self.pick(self.memories), self.pick(self.compilations)]
        return rng.choice(choices)

    def array(self, dtype, shape) -> Any:
        """A value for an operand: right, strided, wrong dtype, wrong shape or not an array."""
        np, rng = self.np, self.rng
        count = int(np.prod(shape)) if shape else 1
        kind = rng.random()
        if kind < 0.6:
            return (np.arange(count) % 7).astype(dtype).reshape(shape)
        if kind < 0.85:  # non-contiguous: strided, reversed or transposed
            base = (np.arange(count * 2) % 5).astype(dtype)
            way = rng.random()
            if way < 0.4:
                return base[::2].reshape(shape)
            if way < 0.7 or len(shape) < 2:
                return base[count:][::-1].reshape(shape)
            return base[:count].reshape(shape[::-1]).T
        if kind < 0.9:
            return np.zeros(shape, rng.choice([np.float64, np.int32, np.int8, np.bool_, np.complex64, object,
                                               np.dtype(">f4"), np.float16]))
        if kind < 0.95:
            return np.zeros(rng.choice([(count + 1,), (1, count), (), (0,)]), dtype)
        if kind < 0.97:
            return np.ma.masked_array(np.zeros(shape, dtype))
        return self.junk()

    # --- hostile descriptors ---------------------------------------------------------------
    def hostile_fd(self) -> tuple[int, bool]:
        """A descriptor (owned by the worker) and whether it is a fence that may never signal."""
        rng = self.rng
        kind = rng.choice(["memfd", "sealable", "file", "pipe", "socket", "eventfd", "devzero", "closed"])
        if kind in ("memfd", "sealable"):
            fd = os.memfd_create("fuzz", os.MFD_ALLOW_SEALING if kind == "sealable" else 0)
            os.ftruncate(fd, rng.choice([0, 16, 64, 4096]))
        elif kind == "file":
            fd = os.open(os.path.join(self.tmp, f"f{rng.randrange(4)}"), os.O_RDWR | os.O_CREAT)
            os.ftruncate(fd, rng.choice([0, 64, 4096]))
        elif kind == "pipe":
            fd, write_end = os.pipe()
            if rng.random() < 0.5:
                os.write(write_end, b"x")
            self.fds.append(write_end)
        elif kind == "socket":
            left, right = socket.socketpair()
            fd = os.dup(left.fileno())
            left.close(), right.close()  # peer closed: readable (EOF)
        elif kind == "eventfd":
            fd = os.eventfd(rng.choice([0, 1]))
        elif kind == "devzero":
            fd = os.open("/dev/zero", os.O_RDWR)
        else:
            fd = os.open("/dev/null", os.O_RDONLY)
            os.close(fd)
            return fd, True
        self.fds.append(fd)
        return fd, kind in ("pipe", "eventfd")

    # --- models ----------------------------------------------------------------------------
    def build_model(self):
        """A small valid model (or a broken one), remembering how to check its results."""
        nnapi, rng = self.nnapi, self.rng
        from nnapi import OperandCode as T
        from nnapi import OperandType
        from nnapi import OperationCode as Op

        dims = rng.choice([[4], [2, 3], [1, 2, 2], [0], [2, 0]])
        code = rng.choice([Op.ADD, Op.MUL, Op.LOGISTIC, Op.SOFTMAX])
        dtype = rng.choice([T.TENSOR_FLOAT32, T.TENSOR_FLOAT32, T.TENSOR_FLOAT16])
        model = nnapi.Model()
        a = model.add_operand(OperandType(dtype, dims))
        if code in (Op.ADD, Op.MUL):
            b = model.add_operand(OperandType(dtype, dims))
            act = model.add_operand(OperandType(T.INT32))
            out = model.add_operand(OperandType(dtype, dims))
            if rng.random() < 0.2 and 0 not in dims:
                memory = self.pick(self.memories)
                if memory is not None:
                    model.set_operand_value_from_memory(b, memory, 0, rng.choice([16, 24, 32, 48]))
                    inputs = [a]
                else:
                    inputs = [a, b]
            else:
                inputs = [a, b]
            model.set_operand_value(act, rng.choice([0, 0, 0, 1, 1, 1.7, 5]))
            model.add_operation(code, [a, b, act], [out])
        elif code == Op.LOGISTIC:
            out = model.add_operand(OperandType(dtype, dims))
            model.add_operation(code, [a], [out])
            inputs = [a]
        else:
            beta = model.add_operand(OperandType(T.FLOAT32 if dtype == T.TENSOR_FLOAT32 else T.FLOAT16))
            out = model.add_operand(OperandType(dtype, dims))
            model.set_operand_value(beta, rng.choice([1.0, 1.0, 1e30, -1.0]))
            model.add_operation(code, [a, beta], [out])
            inputs = [a]
        model.identify_inputs_and_outputs(inputs, [out])
        model._fuzz = (code, inputs, dims, dtype)
        if rng.random() < 0.1:
            model.relax_computation_float32_to_float16(self.junk())
        if rng.random() < 0.9:
            model.finish()
        return model

    def expected(self, model, feeds) -> Any:
        """numpy's result for a model with all inputs given as arrays (None if unknown)."""
        np = self.np
        from nnapi import OperationCode as Op

        code, inputs, dims, dtype = model._fuzz
        if len(inputs) != 2 and code in (Op.ADD, Op.MUL):
            return None
        if any(not isinstance(f, np.ndarray) or isinstance(f, np.ma.MaskedArray) or f.shape != feeds[0].shape
               or f.dtype != feeds[0].dtype for f in feeds):
            return None
        with np.errstate(all="ignore"):
            x = [f.astype(np.float64) for f in feeds]
            if code == Op.ADD:
                return x[0] + x[1]
            if code == Op.MUL:
                return x[0] * x[1]
            if code == Op.LOGISTIC:
                return 1 / (1 + np.exp(-x[0]))
        return None

    # --- the actions ----------------------------------------------------------------------------
    def act_model(self) -> None:
        if self.rng.random() < 0.6 or not self.models:
            self.models.append(self.build_model())
            return
        model = self.pick(self.models)
        method = self.rng.choice(["add_operand", "set_operand_value", "set_operand_value_from_memory",
                                  "add_operation", "identify_inputs_and_outputs", "finish", "free",
                                  "get_supported_operations_for_devices", "relax_computation_float32_to_float16"])
        if method == "free":
            model.free()
        elif method == "get_supported_operations_for_devices":
            model.get_supported_operations_for_devices(self.rng.choice([self.nnapi.get_devices(), [], self.junk()]))
        else:
            self.call_junk(model, method)

    def call_junk(self, target, method: str) -> None:
        import inspect

        function = getattr(target, method)
        parameters = [p for p in inspect.signature(function).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        count = self.rng.randint(sum(p.default is p.empty for p in parameters), len(parameters))
        function(*[self.junk() for _ in range(count)])

    def act_compilation(self) -> None:
        nnapi, rng = self.nnapi, self.rng
        if rng.random() < 0.5 or not self.compilations:
            devices = rng.choice([None, None, nnapi.get_devices()[:1], nnapi.get_devices(), self.junk()])
            compilation = nnapi.Compilation(self.pick(self.models) or self.build_model(), devices)
            self.compilations.append(compilation)
            if rng.random() < 0.8:
                compilation.finish()
            return
        compilation = self.pick(self.compilations)
        method = rng.choice(["set_preference", "set_priority", "set_timeout", "set_caching", "finish", "free",
                             "get_preferred_memory_alignment_for_input", "get_preferred_memory_padding_for_output"])
        if method in ("finish", "free"):
            getattr(compilation, method)()
        elif method == "set_caching" and rng.random() < 0.5:
            compilation.set_caching(self.tmp, os.urandom(32))
        else:
            self.call_junk(compilation, method)

    def act_execution(self) -> None:
        nnapi, rng = self.nnapi, self.rng
        if rng.random() < 0.35 or not self.executions:
            compilation = self.pick(self.compilations)
            if compilation is None:
                return
            execution = nnapi.Execution(compilation)
            entry = {"execution": execution, "feeds": None, "outputs": None, "model": compilation.model}
            self.executions.append(entry)
            if rng.random() < 0.3:
                execution.set_reusable(rng.choice([True, False, self.junk()]))
            self.bind(entry)
            return
        entry = self.pick(self.executions)
        execution = entry["execution"]
        method = rng.choice(["bind", "compute", "compute", "start", "burst", "results", "free", "junk",
                             "memory_args"])
        if method == "bind":
            self.bind(entry)
        elif method == "compute":
            execution.compute()
            self.check(entry)
        elif method == "start":
            dependencies = [e for e, _ in rng.sample(self.events, min(len(self.events), rng.randint(0, 2)))]
            never = any(n for e, n in self.events if any(e is d for d in dependencies))
            duration = rng.choice([0, 0, 10**9, -1])
            event = execution.start_compute_with_dependencies(dependencies, duration)
            self.events.append((event, never))
            if not never and rng.random() < 0.7:
                event.wait()
                self.check(entry)
        elif method == "burst":
            burst = self.pick(self.bursts)
            if burst is None or rng.random() < 0.2:
                burst = nnapi.Burst(self.pick(self.compilations) or execution._compilation)
                self.bursts.append(burst)
            if rng.random() < 0.1:
                burst.free()
            execution.burst_compute(burst)
            self.check(entry)
        elif method == "results":
            getattr(execution, rng.choice(["get_output_operand_rank", "get_output_operand_dimensions",
                                           "is_output_sufficient", "get_duration"]))(rng.choice([0, 1, -1, 2**40]))
        elif method == "free":
            execution.free()
        elif method == "memory_args":
            entry["expected"] = None  # an argument may be rebound: no longer checkable
            memory = self.pick(self.memories)
            if memory is not None:
                device_memory = memory.is_from_desc if not memory._freed else False
                getattr(execution, rng.choice(["set_input_from_memory", "set_output_from_memory"]))(
                    rng.choice([0, 1, 2]), memory, 0 if device_memory else rng.choice([0, 4, 8, 60, -1]),
                    0 if device_memory else rng.choice([0, 8, 16, 24, 64]))
        else:
            entry["expected"] = None
            self.call_junk(execution, rng.choice(["set_input", "set_output", "set_timeout", "set_loop_timeout",
                                                  "set_measure_timing", "enable_input_and_output_padding",
                                                  "set_input_from_memory", "set_output_from_memory"]))

    def bind(self, entry) -> None:
        """Give every input and output a value (good or bad), remembering numpy's answer."""
        rng = self.rng
        execution, model = entry["execution"], entry["model"]
        if not hasattr(model, "_fuzz"):
            return
        code, inputs, dims, dtype = model._fuzz
        from nnapi.operand import DTYPES

        element = DTYPES[dtype]
        shape = tuple(d or rng.randint(1, 3) for d in dims)
        feeds = [self.array(element, shape) for _ in inputs]
        entry["feeds"], entry["outputs"] = None, None
        for position, feed in enumerate(feeds):
            execution.set_input(position, feed)
        output = self.array(element, shape) if rng.random() < 0.8 else rng.choice([bytearray(8), None])
        execution.set_output(0, output)
        entry["feeds"], entry["outputs"] = feeds, output
        entry["expected"] = self.expected(model, feeds)

    def check(self, entry) -> None:
        """A successful computation with numpy arguments must agree with numpy."""
        np = self.np
        expected, output = entry.get("expected"), entry.get("outputs")
        if expected is None or not isinstance(output, np.ndarray) or output.shape != expected.shape:
            return
        if entry["model"]._fuzz[0] == self.nnapi.OperationCode.ADD or \
                entry["model"]._fuzz[0] == self.nnapi.OperationCode.MUL:
            return self._check_arith(entry, expected, output)
        tolerance = 1e-2 if output.dtype == np.float16 else 1e-5
        self.checked += 1
        if not np.allclose(output.astype(np.float64), expected, rtol=tolerance, atol=tolerance, equal_nan=True):
            self.wrong.append(f"{entry['model']._fuzz}: got {output.tolist()}, expected {expected.tolist()}")

    def _check_arith(self, entry, expected, output) -> None:
        """ADD / MUL: the fused activation is NONE or RELU (the fuzzer's valid choices)."""
        np = self.np
        with np.errstate(all="ignore"):
            candidates = [expected, np.maximum(expected, 0)]
        tolerance = 1e-2 if output.dtype == np.float16 else 1e-5
        got = output.astype(np.float64)
        self.checked += 1
        if not any(np.allclose(got, c.astype(output.dtype).astype(np.float64), rtol=tolerance, atol=tolerance,
                               equal_nan=True) for c in candidates):
            self.wrong.append(f"{entry['model']._fuzz}: got {got.tolist()}, expected {expected.tolist()}")

    def act_memory(self) -> None:
        nnapi, rng = self.nnapi, self.rng
        choice = rng.random()
        if choice < 0.3:
            memory = nnapi.Memory.create_shared(rng.choice([64, 16, 4096, 1, 0, -5, True, 2**63, 1.5]))
            self.memories.append(memory)
        elif choice < 0.6:
            fd, _ = self.hostile_fd()
            prot = rng.choice([nnapi.PROT_READ, nnapi.PROT_READ | nnapi.PROT_WRITE, 0, 0x40])
            memory = nnapi.Memory.from_fd(rng.choice([16, 64, 4096, 2**64]), prot, fd, rng.choice([0, 0, 8, 4096]))
            self.memories.append(memory)
            if rng.random() < 0.5:
                try:
                    os.ftruncate(fd, rng.choice([0, 8]))  # pull the file from under the memory
                except OSError:
                    pass  # sealed against shrinking: what from_fd does to a sealable memfd
        elif choice < 0.75 and self.memories:
            nnapi.Memory.copy(self.pick(self.memories), rng.choice([self.pick(self.memories), self.junk()]))
        elif choice < 0.85 and self.memories:
            memory = self.pick(self.memories)
            view = memory.buffer
            if not view.readonly and len(view):
                view[0] = 1
            bytes(view[:16])
        elif choice < 0.92 and self.memories:
            self.pick(self.memories).free()
        else:
            desc = self.pick(self.descs)
            if desc is None or rng.random() < 0.3:
                self.descs.append(nnapi.MemoryDesc())
                return
            action = rng.choice(["input", "output", "dims", "finish", "allocate", "free"])
            if action in ("input", "output"):
                getattr(desc, f"add_{action}_role")(self.pick(self.compilations) or self.junk(),
                                                    rng.choice([0, 1, 5]), rng.choice([1.0, 0.5, 0, 2]))
            elif action == "dims":
                desc.set_dimensions(rng.choice([[4], [2, 3], [0], [], [2**40], 5, [float("nan")], [-1]]))
            elif action == "finish":
                desc.finish()
            elif action == "allocate":
                self.memories.append(nnapi.Memory.from_desc(desc))
            else:
                desc.free()

    def act_event(self) -> None:
        nnapi, rng = self.nnapi, self.rng
        choice = rng.random()
        if choice < 0.35:
            fd, never = self.hostile_fd()
            self.events.append((nnapi.Event.create_from_sync_fence_fd(rng.choice([fd, fd, -1, 2**31])), never))
            return
        if not self.events:
            return
        event, never = self.pick(self.events)
        if choice < 0.55 and not never:
            event.wait()
        elif choice < 0.7:
            fd = event.get_sync_fence_fd()
            self.fds.append(fd)
            if rng.random() < 0.5:  # a fence chained into a new event
                self.events.append((nnapi.Event.create_from_sync_fence_fd(fd), never))
        elif choice < 0.8:
            _ = event.is_done
        elif not never:
            event.free()

    def act_junk_construct(self) -> None:
        """Public classes called directly with junk (as many arguments as they take)."""
        import inspect

        nnapi, rng = self.nnapi, self.rng
        cls = rng.choice([nnapi.Event, nnapi.Device, nnapi.Memory, nnapi.Burst, nnapi.Execution, nnapi.Compilation,
                          nnapi.OperandType, nnapi.MemoryDesc, nnapi.Model, nnapi.SymmPerChannelQuantParams])
        parameters = [p for p in inspect.signature(cls).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        count = rng.randint(sum(p.default is p.empty for p in parameters), len(parameters))
        cls(*[self.junk() for _ in range(count)])

    def act_threads(self) -> None:
        """The same objects used from several threads at once: one execution computed,
        freed and rebound concurrently; whatever fails must fail with an NnapiError."""
        import threading

        entry = self.pick(self.executions)
        if entry is None:
            return
        execution = entry["execution"]
        entry["expected"] = None
        raw: list[BaseException] = []

        def hammer(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(3):
                try:
                    rng.choice([execution.compute, execution.compute, lambda: execution.start_compute().wait(),
                                lambda: self.bind(entry), execution.free])()
                except self.nnapi.NnapiError:
                    pass
                except BaseException as error:  # noqa: BLE001 - reported below
                    raw.append(error)

        threads = [threading.Thread(target=hammer, args=(self.rng.random(),)) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        entry["expected"] = None
        if raw:
            raise raw[0]

    def act_device(self) -> None:
        """Devices and the module-level queries, with junk where they take arguments."""
        nnapi, rng = self.nnapi, self.rng
        choice = rng.random()
        if choice < 0.3:
            nnapi.get_device(rng.choice([0, self.junk()]))
        elif choice < 0.6:
            device = rng.choice(nnapi.get_devices())
            for name in ("name", "version", "type", "feature_level", "capabilities"):
                getattr(device, name)
            device.wait()
        else:
            for function in (nnapi.get_device_count, nnapi.get_runtime_feature_level,
                             nnapi.get_default_loop_timeout, nnapi.get_maximum_loop_timeout):
                function()

    ACTIONS = ["act_model", "act_compilation", "act_execution", "act_execution", "act_execution",
               "act_memory", "act_event", "act_junk_construct", "act_device", "act_threads"]

    def step(self) -> None:
        action = self.rng.choice(self.ACTIONS)
        self.calls += 1
        faulthandler.dump_traceback_later(CALL_TIMEOUT_S, exit=True)
        try:
            getattr(self, action)()
            self.outcomes[f"{action} ok"] += 1
        except self.nnapi.NnapiError as error:
            self.outcomes[f"{action} {error.code.name}"] += 1
            if _INTERNAL.search(str(error)):
                # an internal Python error dressed as a result code is a raw exception too
                key = f"{error.code.name} carrying an internal error: {_INTERNAL.search(str(error)).group(0)}"
                self.raw[key] += 1
                self.raw_examples.setdefault(key, f"{action}: {error!s:.200}")
        except _FuzzerLimit:
            pass
        except Exception as error:  # noqa: BLE001 - counting these is the point
            frame = traceback.extract_tb(error.__traceback__)[-1]
            key = f"{type(error).__name__} at {Path(frame.filename).name}:{frame.lineno}"
            self.raw[key] += 1
            self.raw_examples.setdefault(key, f"{action}: {error!s:.200}")
        finally:
            faulthandler.cancel_dump_traceback_later()
        # keep the pools small: old objects are dropped (and collected)
        for pool in (self.models, self.compilations, self.executions, self.memories, self.descs, self.bursts):
            if len(pool) > 12:
                del pool[: len(pool) - 12]
        if len(self.events) > 12:
            self.events = [e for e in self.events if e[1]][-4:] + [e for e in self.events if not e[1]][-8:]
        if len(self.fds) > 64:
            for fd in self.fds[:-32]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            del self.fds[:-32]


class _FuzzerLimit(Exception):
    pass


def worker_main(seed: int, calls: int, seconds: float) -> None:
    """Entry of a worker subprocess: print one JSON line with its figures."""
    faulthandler.enable()
    worker = Worker(seed)
    end = time.monotonic() + seconds if seconds else None
    while worker.calls < calls and (end is None or time.monotonic() < end):
        worker.step()
    print(json.dumps({"calls": worker.calls, "raw": dict(worker.raw), "examples": worker.raw_examples,
                      "wrong": worker.wrong[:5], "wrong_count": len(worker.wrong),
                      "checked": worker.checked, "outcomes": dict(worker.outcomes)}), flush=True)
    os._exit(0)  # do not wait on anything the sequence left behind


# --- the parent: run workers, count what happened ------------------------------------------------
def run_worker(seed: int, calls: int, seconds: float) -> dict:
    """Run one worker subprocess; classify its end."""
    command = [sys.executable, __file__, "--worker", str(seed), "--calls", str(calls), "--seconds", str(seconds)]
    limit = (seconds or calls * 0.05) + CALL_TIMEOUT_S + 30
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as expired:
        return {"seed": seed, "calls": 0, "hang": True, "detail": f"no answer in {limit:.0f} s",
                "stderr": (expired.stderr or b"")[-2000:] if isinstance(expired.stderr, bytes) else ""}
    report: dict[str, Any] = {"seed": seed, "calls": 0}
    last = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if last:
        report.update(json.loads(last[-1]))
    if result.returncode < 0:
        report["crash"] = signal.Signals(-result.returncode).name
        report["stderr"] = result.stderr[-3000:]
    elif "Timeout (" in result.stderr:
        report["hang"] = True
        report["stderr"] = result.stderr[-3000:]
    elif result.returncode != 0:
        report["crash"] = f"exit {result.returncode}"
        report["stderr"] = result.stderr[-3000:]
    return report


def summarize(reports: list[dict]) -> dict:
    raw: collections.Counter[str] = collections.Counter()
    examples: dict[str, str] = {}
    for report in reports:
        raw.update(report.get("raw", {}))
        examples.update(report.get("examples", {}))
    return {
        "workers": len(reports),
        "calls": sum(r.get("calls", 0) for r in reports),
        "raw_exceptions": sum(raw.values()),
        "raw_causes": dict(raw),
        "raw_examples": {k: examples.get(k, "") for k in raw},
        "crashes": [{"seed": r["seed"], "signal": r["crash"], "stderr": r.get("stderr", "")}
                    for r in reports if "crash" in r],
        "hangs": [{"seed": r["seed"], "stderr": r.get("stderr", "")} for r in reports if r.get("hang")],
        "wrong_results": sum(r.get("wrong_count", 0) for r in reports),
        "checked": sum(r.get("checked", 0) for r in reports),
        "outcomes": sum((collections.Counter(r.get("outcomes", {})) for r in reports), collections.Counter()),
        "wrong_examples": [w for r in reports for w in r.get("wrong", [])][:5],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=0, help="run workers for this long")
    parser.add_argument("--calls", type=int, default=3000, help="calls per worker")
    parser.add_argument("--workers", type=int, default=2, help="workers at once")
    parser.add_argument("--verbose", action="store_true", help="print the outcome of each kind of call")
    parser.add_argument("--seed", type=int, default=None, help="first seed (random by default)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker, args.calls, args.seconds)
        return 0
    from concurrent.futures import ThreadPoolExecutor

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    start = time.monotonic()
    reports: list[dict] = []
    end = start + args.minutes * 60
    round_seconds = 60.0 if args.minutes else 0.0
    with ThreadPoolExecutor(args.workers) as pool:
        while True:
            seeds = [seed + len(reports) + i for i in range(args.workers)]
            seconds = min(round_seconds, max(5.0, end - time.monotonic())) if args.minutes else 0.0
            calls = args.calls if not args.minutes else 10**9
            reports += pool.map(run_worker, seeds, [calls] * len(seeds), [seconds] * len(seeds))
            if not args.minutes or time.monotonic() >= end - 5:
                break
    summary = summarize(reports)
    elapsed = time.monotonic() - start
    print(f"seeds {seed}..{seed + len(reports) - 1}, {elapsed:.0f} s")
    print(f"calls            {summary['calls']}")
    print(f"raw exceptions   {summary['raw_exceptions']} ({len(summary['raw_causes'])} root causes)")
    for cause, count in sorted(summary["raw_causes"].items(), key=lambda kv: -kv[1]):
        print(f"  {count:6d}  {cause}   e.g. {summary['raw_examples'][cause]}")
    print(f"crashes          {len(summary['crashes'])}")
    for crash in summary["crashes"]:
        print(f"  seed {crash['seed']}: {crash['signal']}\n{crash['stderr']}")
    print(f"hangs            {len(summary['hangs'])}")
    for hang in summary["hangs"]:
        print(f"  seed {hang['seed']}\n{hang['stderr']}")
    print(f"results checked  {summary['checked']} against numpy")
    print(f"wrong results    {summary['wrong_results']}")
    for wrong in summary["wrong_examples"]:
        print(f"  {wrong}")
    if args.verbose:
        for outcome, count in sorted(summary["outcomes"].items()):
            print(f"  {count:7d}  {outcome}")
    bad = summary["raw_exceptions"] or summary["crashes"] or summary["hangs"] or summary["wrong_results"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
