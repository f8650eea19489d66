"""Driver service overhead: the same driver (nnapi-reference) in process and behind
``nnapi serve`` in another process, per execution (plain, and in a burst) on a trivial
model and on MobileNet v1, and throughput with 1 and 4 client processes.

    python benchmarks/bench_service.py [--iterations N] [--seconds S] [--model PATH.tflite]

Three ways to run: a new Execution per run (``compute``); one reusable execution in a
burst (its request bound in the service once, then one small message per run); the same
with tensors in shared memory (``Memory.create_shared``: they cross by descriptor). The
in-process and service runs are interleaved in batches so that load on the machine hits
both alike. Prints median microseconds per execution, the difference (the service's added
cost; targets: <= 100 us added per execution, <= 30 us in a burst) and the tensor bytes
the client copied per execution (plain numpy buffers are staged in shared memory once
each way; shared memory is never copied). LiteRT's single-threaded MobileNet latency is
printed beside ours for scale. Throughput depends on numpy's BLAS threads in the service
process (OPENBLAS_NUM_THREADS, default: one per core), printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np

import nnapi
from nnapi import FuseCode
from nnapi import OperandCode as T
from nnapi import OperationCode as Op

MOBILENET = Path("/work/shared/models/mobilenet_v1_1.0_224_float.tflite")


def trivial_model() -> tuple[nnapi.Model, list[np.ndarray], list[np.ndarray]]:
    """ADD of two float32[1, 4] tensors."""
    model = nnapi.Model()
    a = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [1, 4]))
    b = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [1, 4]))
    act = model.add_operand(nnapi.OperandType(T.INT32))
    out = model.add_operand(nnapi.OperandType(T.TENSOR_FLOAT32, [1, 4]))
    model.set_operand_value(act, np.int32(FuseCode.FUSED_NONE))
    model.add_operation(Op.ADD, [a, b, act], [out])
    model.identify_inputs_and_outputs([a, b], [out])
    model.finish()
    return model, [np.ones((1, 4), np.float32), np.full((1, 4), 2, np.float32)], [np.zeros((1, 4), np.float32)]


def mobilenet_model(path: Path):
    imported = nnapi.load_tflite(path)
    rng = np.random.default_rng(0)
    inputs = [rng.random(spec.shape, dtype=np.float32) for spec in imported.inputs]
    outputs = [np.zeros(spec.shape, np.float32) for spec in imported.outputs]
    return imported, inputs, outputs


def set_arguments(execution, inputs, outputs, memories) -> None:
    """Plain numpy buffers, or (``memories``) the same bytes in shared memory."""
    if memories is None:
        for i, x in enumerate(inputs):
            execution.set_input(i, x)
        for i, y in enumerate(outputs):
            execution.set_output(i, y)
        return
    ins, outs = memories
    for i, memory in enumerate(ins):
        execution.set_input_from_memory(i, memory, 0, inputs[i].nbytes)
    for i, memory in enumerate(outs):
        execution.set_output_from_memory(i, memory, 0, outputs[i].nbytes)


def shared_memories(inputs, outputs):
    """Shared memories (sealed memfds) holding ``inputs`` and room for ``outputs``."""
    ins = []
    for x in inputs:
        memory = nnapi.Memory.create_shared(x.nbytes)
        np.frombuffer(memory.buffer, x.dtype)[:] = x.reshape(-1)
        ins.append(memory)
    return ins, [nnapi.Memory.create_shared(y.nbytes) for y in outputs]


def time_executions(compilation, inputs, outputs, iterations: int, burst: bool, memories=None) -> list[float]:
    """Seconds per execution: a fresh Execution per run, or one reusable execution in a burst."""
    times = []
    if burst:
        handle = nnapi.Burst(compilation)
        execution = nnapi.Execution(compilation)
        execution.set_reusable(True)
        set_arguments(execution, inputs, outputs, memories)
        for _ in range(iterations):
            start = time.perf_counter()
            execution.burst_compute(handle)
            times.append(time.perf_counter() - start)
        return times
    for _ in range(iterations):
        start = time.perf_counter()
        execution = nnapi.Execution(compilation)
        set_arguments(execution, inputs, outputs, memories)
        execution.compute()
        times.append(time.perf_counter() - start)
    return times


KINDS = (("execution", False, False), ("burst", True, False), ("burst, shared memory", True, True))


def compare(name: str, model, inputs, outputs, local, remote, iterations: int) -> None:
    """Median per execution in process and through the service, the runs of both devices
    interleaved (one batch each in turn) so that load on the machine hits both alike."""
    link = remote._hal._link
    memories = shared_memories(inputs, outputs)
    compilations = {}
    for label, device in (("in process", local), ("service", remote)):
        compilations[label] = nnapi.Compilation(model, [device])
        compilations[label].finish()
    results: dict = {}
    staged: dict = {}
    batch = max(iterations // 10, 1)
    for kind, burst, shared in KINDS:
        for compilation in compilations.values():  # warm up
            time_executions(compilation, inputs, outputs, max(batch, 2), burst, memories if shared else None)
        for _ in range(max(iterations // batch, 1)):
            for label, compilation in compilations.items():
                before = link.staged_bytes
                times = time_executions(compilation, inputs, outputs, batch, burst, memories if shared else None)
                results.setdefault((label, kind), []).extend(times)
                if label == "service":
                    staged[kind] = (link.staged_bytes - before) // batch
                if not shared:
                    results.setdefault((label, "out"), [y.copy() for y in outputs])
    same = all(np.allclose(a, b, rtol=1e-5, atol=1e-6)
               for a, b in zip(results[("in process", "out")], results[("service", "out")]))
    for kind, _, _ in KINDS:
        local_us = statistics.median(results[("in process", kind)]) * 1e6
        remote_us = statistics.median(results[("service", kind)]) * 1e6
        print(f"{name:<13} {kind:<21} in process {local_us:9.1f} us  service {remote_us:9.1f} us  "
              f"added {remote_us - local_us:+8.1f} us  ratio {remote_us / local_us:5.2f}x  "
              f"tensor bytes copied {staged[kind]}")
    print(f"{name:<13} outputs equal: {'yes' if same else 'NO'}")


CLIENT = textwrap.dedent('''
    import sys, time, numpy as np, nnapi
    sys.path.insert(0, sys.argv[3])
    from bench_service import mobilenet_model, trivial_model
    from pathlib import Path
    kind, seconds = sys.argv[1], float(sys.argv[2])
    if kind == "trivial":
        model, inputs, outputs = trivial_model()
    else:
        imported, inputs, outputs = mobilenet_model(Path(kind))
        model = imported.model
    device = next(d for d in nnapi.get_devices() if d.name.endswith("@bench"))
    compilation = nnapi.Compilation(model, [device])
    compilation.finish()
    burst = nnapi.Burst(compilation)
    execution = nnapi.Execution(compilation)
    execution.set_reusable(True)
    for i, x in enumerate(inputs):
        execution.set_input(i, x)
    for i, y in enumerate(outputs):
        execution.set_output(i, y)
    execution.burst_compute(burst)
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    sys.stdin.readline()
    end = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < end:
        execution.burst_compute(burst)
        count += 1
    print(count)
''')


def throughput(socket_path: str, kind: str, clients: int, seconds: float) -> float:
    env = dict(os.environ, NNAPI_REMOTE_DEVICES=socket_path)
    here = str(Path(__file__).resolve().parent)
    procs = [subprocess.Popen([sys.executable, "-c", CLIENT, kind, str(seconds), here], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(clients)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    total = sum(int(proc.communicate()[0].strip()) for proc in procs)
    return total / seconds


def litert_latency(path: Path, x: np.ndarray, iterations: int) -> float | None:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        return None
    interpreter = Interpreter(model_path=str(path), num_threads=1)
    interpreter.allocate_tensors()
    index = interpreter.get_input_details()[0]["index"]
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        interpreter.set_tensor(index, x)
        interpreter.invoke()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--mobilenet-iterations", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--model", type=Path, default=MOBILENET)
    args = parser.parse_args()
    from nnapi.drivers.service.client import connect_devices
    from nnapi.runtime import manager

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "bench.sock")
        service = subprocess.Popen([sys.executable, "-m", "nnapi.drivers.service", "--driver", "reference",
                                    "--socket", path], stdout=subprocess.PIPE, text=True)
        try:
            assert service.stdout.readline().startswith("serving")
            (remote,) = connect_devices(path)
            manager.register_device(remote)
            devices = {d.name: d for d in nnapi.get_devices()}
            local, remote = devices["nnapi-reference"], devices["nnapi-reference@bench"]
            print(f"median per execution ({args.iterations} runs; MobileNet {args.mobilenet_iterations})")
            model, inputs, outputs = trivial_model()
            compare("trivial ADD", model, inputs, outputs, local, remote, args.iterations)
            if args.model.exists():
                imported, inputs, outputs = mobilenet_model(args.model)
                compare("MobileNet v1", imported.model, inputs, outputs, local, remote, args.mobilenet_iterations)
                litert = litert_latency(args.model, inputs[0], args.mobilenet_iterations)
                if litert is not None:
                    print(f"MobileNet v1   LiteRT (1 thread) {litert:10.1f} us")
            else:
                print(f"(no {args.model}: MobileNet skipped)")
            print(f"throughput, bursts, {args.seconds:g} s; {os.cpu_count()} cores, BLAS threads per process: "
                  f"{os.environ.get('OPENBLAS_NUM_THREADS', 'one per core')}:")
            for clients in (1, 4):
                rate = throughput(path, "trivial", clients, args.seconds)
                print(f"trivial ADD    {clients} client process(es): {rate:10.0f} executions/s")
            if args.model.exists():
                for clients in (1, 4):
                    rate = throughput(path, str(args.model), clients, args.seconds * 2)
                    print(f"MobileNet v1   {clients} client process(es): {rate:10.1f} executions/s")
        finally:
            service.terminate()
            service.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
