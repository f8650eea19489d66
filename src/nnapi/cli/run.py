"""``nnapi run``: compile and run the built-in demo model, print its outputs and latency."""

from __future__ import annotations

import argparse
import time

import numpy as np

import nnapi
from nnapi.cli._common import EXIT_FAILED, find_device


def register(commands, common) -> None:
    parser = commands.add_parser("run", parents=[common],
                                 help="compile and run the built-in demo model, print outputs and latency")
    parser.add_argument("--device", help="device name (default: let the runtime choose)")
    parser.add_argument("--iterations", type=int, default=20, help="executions to time (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random input")
    parser.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from nnapi.demo import build_demo_model, demo_expected, demo_input

    device = find_device(args.device)
    model = build_demo_model()
    compilation = nnapi.Compilation(model, [device] if device else None)
    compilation.finish()
    x = demo_input(args.seed)
    y = np.empty((1, 4), np.float32)
    latencies = []
    for _ in range(max(args.iterations, 1)):
        execution = nnapi.Execution(compilation)
        execution.set_input(0, x)
        execution.set_output(0, y)
        start = time.perf_counter()
        execution.compute()
        latencies.append(time.perf_counter() - start)
    chosen = compilation.device.name if compilation.device else "?"
    print("model: built-in demo CNN (CONV_2D, MAX_POOL_2D, CONV_2D, AVERAGE_POOL_2D, RESHAPE, "
          f"FULLY_CONNECTED, SOFTMAX) on {chosen}")
    print(f"input  0: float32{list(x.shape)}")
    print(f"output 0: float32{execution.get_output_operand_dimensions(0)} (class scores)")
    with np.printoptions(precision=5, suppress=True):
        print(f"  {y[0]}  -> class {int(np.argmax(y[0]))}")
    matches = np.allclose(y, demo_expected(x), rtol=1e-4, atol=1e-6)
    print(f"matches numpy: {'yes' if matches else 'NO'}")
    ms = np.array(latencies) * 1e3
    print(f"latency over {len(ms)} runs: mean {ms.mean():.3f} ms, median {np.median(ms):.3f} ms, "
          f"min {ms.min():.3f} ms")
    return 0 if matches else EXIT_FAILED
