"""``nnapi bisect``: the first operation whose output differs between a device and the
reference beyond the CTS tolerance."""

from __future__ import annotations

from nnapi.cli._common import EXIT_FAILED, CliError, add_signature, find_device, load_model, print_json


def _tolerance(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    try:
        parts = [float(part) for part in text.split(",")]
    except ValueError:
        raise CliError(f"--tolerance: expected ATOL or ATOL,RTOL, got {text!r}") from None
    if len(parts) not in (1, 2) or any(part < 0 for part in parts):
        raise CliError(f"--tolerance: expected ATOL or ATOL,RTOL (non-negative), got {text!r}")
    return (parts[0], parts[1] if len(parts) == 2 else 0.0)


def register(commands, common) -> None:
    parser = commands.add_parser("bisect", parents=[common],
                                 help="find the first operation whose output differs between DEVICE and "
                                      "nnapi-reference (exit 1 when one does)")
    add_signature(parser)
    parser.add_argument("model", help="a .tflite model or a CTS vector file (.jsonl[.gz])")
    parser.add_argument("--device", required=True, metavar="NAME", help="the device under test")
    parser.add_argument("--tolerance", metavar="ATOL[,RTOL]",
                        help="float tolerance (default: the CTS one for the operand type)")
    parser.add_argument("--quant-steps", type=int, default=1, metavar="N",
                        help="quantized steps allowed (default 1, as CTS)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(func=cmd_bisect)


def cmd_bisect(args) -> int:
    from nnapi.tools.bisect import bisect, format_result

    tolerance = _tolerance(args.tolerance)
    if args.quant_steps < 0:
        raise CliError("--quant-steps must not be negative")
    device = find_device(args.device)
    loaded = load_model(args.model, args.keep_loops, args.input_shape, args.signature)
    result = bisect(loaded.model, device, seed=args.seed, tolerance=tolerance, quant_limit=args.quant_steps)
    if args.json:
        print_json(result.as_dict())
    else:
        print(format_result(result, loaded.operand_names))
    return EXIT_FAILED if result.first is not None else 0
