"""`python -m dflash_ref verify`: check an implementation against golden bundles, stage by stage
(conformance/verify.py), or a sampler by its output distribution (conformance/exact.py, --sampling)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..conformance.bundle import find_bundles
from ..conformance.page import check_plotly, write_report_html
from ..conformance.variants import VARIANTS, parse_variant
from ..conformance.verify import InputError, verify_dump
from ..conformance.verify import verify as run_verify
from .folders import check_output_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    candidate = p.add_mutually_exclusive_group(required=True)
    candidate.add_argument(
        "--impl",
        help="reference | zlab | mlx | transformers | dflash-mlx | mlx-dspark | speculators | vllm | vllm-batch | "
        "vllm-serve | llamacpp | llama-server | "
        "package.module:factory or path/to/adapter.py:factory (an adapter)",
    )
    candidate.add_argument("--dump", help="a port's tensors: .npz or .safetensors keyed {bundle}/{key}")
    candidate.add_argument(
        "--endpoint",
        metavar="URL",
        help="an OpenAI-compatible server (http://host:port, its base URL; a /v1 or /v1/completions after it is "
        "taken off): the requests of --bundle, or of --prompts on "
        "--target and --draft, each held to the reference's run of it alone (conformance/endpoint/)",
    )
    candidate.add_argument(
        "--outputs",
        metavar="FILE.jsonl",
        help="outputs a user has (one JSON object a line: prompt_ids, output_ids, optionally logprobs, name, "
        "max_tokens, stop_token_ids), each position held to --target's float64 argmax: pass, tie or FAIL, no server "
        "needed. A line that cannot be judged refuses the whole file, naming the line, before any is judged",
    )
    p.add_argument("--bundle", help="a bundle or a folder of bundles (default: the one in the package)")
    served = p.add_argument_group("with --endpoint or --outputs")
    served.add_argument(
        "--target",
        help="the target the server runs, a folder or a name as generate takes it (smollm2) (with --prompts; "
        "--outputs: the replay's)",
    )
    served.add_argument("--draft", help="the DFlash draft folder the server runs (with --prompts)")
    served.add_argument(
        "--prompts",
        metavar="FILE",
        help="one prompt a line: JSON {prompt_ids | prompt, max_tokens, name} or plain text (the target's tokenizer)",
    )
    served.add_argument("--model", help="the server's model id to ask for (default: the only one it serves)")
    served.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the engine's dtype: what a tie is (a float64 margin below its resolution) and whether the acceptance "
        "is held exactly (float32) or reported as a ratio (default float32)",
    )
    served.add_argument("--device", default="cpu", help="where the reference and the float64 replay run (cpu, cuda)")
    served.add_argument(
        "--serving",
        default="alone",
        metavar="LIST",
        help="with --prompts, the conditions to send them under, comma-separated: "
        "alone, repeat, shared-prefix, long, concurrent (default alone)",
    )
    served.add_argument("--max-new-tokens", type=int, default=64, help="with --prompts: per prompt (default 64)")
    served.add_argument("--strict", action="store_true", help="a tie fails too (exit 1)")
    served.add_argument(
        "--plain",
        metavar="URL",
        help="with --endpoint: the same model served without speculation, whose answers the API's fields on the "
        "speculative route (stop strings, max_tokens, finish_reason, n, echo, …) are held to, field by field",
    )
    served.add_argument(
        "--outputs-only",
        action="store_true",
        help="with --endpoint: take a request whose output is right as verified even where nothing the server shows "
        "says it decoded speculatively (else its status is unobserved and the run exits 3)",
    )
    p.add_argument("--allow-missing", action="store_true", help="tensors a candidate lacks do not fail")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per tensor")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a design variant the port follows: "
        + ", ".join(f"{key}={'|'.join(choices)}" for key, choices in VARIANTS.items())
        + " (default: detected, else the reference's; conformance/variants.py)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="STAGE",
        help="a stage the port knowingly does not produce or match (printed in the report)",
    )
    p.add_argument(
        "--sampling",
        action="store_true",
        help="check the sampler instead: chi-square of its outputs against the exact distribution, and "
        "its first-step τ against the exact mean (the sampling bundles, DFlash 1 and 2; "
        "default: fresh ones)",
    )
    p.add_argument("--verifier", choices=["rejection", "match"], help="with --sampling: the verifier the sampler uses")
    p.add_argument("--runs", type=int, help="with --sampling: how many sampled runs (default: the bundle's, 2000)")
    p.add_argument(
        "--profile",
        help="with --dump: a JSON profile {variants, skip} (default: FILE.profile.json beside the dump, if there)",
    )
    p.add_argument(
        "--json",
        metavar="FILE",
        help="also write the report as JSON: each bundle's status (pass, fail, n/a, crash, timeout) and reason, its "
        "independent divergences and coverage, and the run's divergences by cause",
    )
    p.add_argument(
        "--timeout",
        type=seconds,
        metavar="SECONDS",
        help="with --impl: a bundle whose run takes longer is a timeout (an in-process port: checked on the main "
        "thread); with --endpoint: each request's deadline, from connecting to the last byte of its answer (a server "
        "that trickles bytes is held to it too; default 600)",
    )
    p.add_argument(
        "--no-diagnose",
        action="store_true",
        help="with --impl or --dump: leave each bundle's first divergence to the hints read from the tensors, without "
        "re-running the reference under each catalogued cause to find the one that reproduces it (conformance/causes/)",
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML page (offline): each bundle's stages, and at the "
        "first divergence the reference's and the port's tensors side by side, their difference and the hint",
    )


SERVED = ("target", "draft", "prompts", "model", "strict", "outputs_only", "plain")


def seconds(text: str) -> float:
    """--timeout's value: a finite number of seconds > 0, else a usage error (argparse's type): never a NaN or an
    infinity handed to a socket, whose error would read as the server's."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of seconds > 0")
    return value


def main(args, parser: argparse.ArgumentParser) -> int:
    if args.endpoint or args.outputs:
        return _served(args, parser)
    given = [f"--{k}" for k in SERVED if getattr(args, k)]
    if given or args.dtype != "float32" or args.device != "cpu" or args.serving != "alone":
        parser.error(f"{' '.join(given) or '--dtype, --device and --serving'} go with --endpoint or --outputs")
    if args.sampling:
        if args.json or args.timeout is not None:
            raise SystemExit("verify: --json and --timeout go with the greedy bundles' report, not --sampling's")
        if args.html:
            raise SystemExit("verify: --html draws the greedy bundles' tensors; --sampling's report has none")
        if args.dump or args.variant or args.skip or args.profile:
            raise SystemExit(
                "verify: --sampling runs a sampler (--impl); --dump, --variant, --skip and "
                "--profile are for the greedy bundles"
            )
        from ..conformance.exact import verify_sampling  # torch: a dump is compared with numpy alone

        try:
            results = verify_sampling(args.impl, args.bundle, args.runs, args.verifier or "rejection")
        except (ValueError, OSError) as e:
            raise SystemExit(f"verify: {e}") from None
        ran = [r for _, r in results if not isinstance(r, Exception)]
        for name, result in results:
            said = f"n/a: {result}" if isinstance(result, Exception) else result.text()
            print(f"{name}: {args.impl}\n{said}")
        if not ran:
            print(f"verify: {args.impl} took none of the sampling bundles")
        return 0 if ran and all(r.passed for r in ran) else 1
    if args.runs is not None or args.verifier:
        raise SystemExit("verify: --runs and --verifier go with --sampling")
    if args.timeout is not None and args.dump:
        raise SystemExit("verify: --timeout is for a port run with --impl (a dump has run already)")
    if args.json:  # now, not after the verification has run
        try:
            check_output_file("--json", args.json, "report.json", parents=False)
        except ValueError as e:
            raise SystemExit(f"verify: {e}") from None
    if args.html:  # now, not after the verification has run
        try:
            check_output_file("--html", args.html, "report.html")
            check_plotly()
        except ValueError as e:
            raise SystemExit(f"verify: {e}") from None
    try:  # what cannot be read: the bundles, the dump, the implementation named or its declaration
        # (a crashing implementation is a result in the report, not an error here)
        variants = dict(parse_variant(v) for v in args.variant)
        if args.profile and not args.dump:
            raise InputError("--profile goes with --dump (an adapter declares its own `variants`)")
        report = (
            verify_dump(
                args.dump, args.bundle, args.allow_missing, variants, args.skip, args.profile, not args.no_diagnose
            )
            if args.dump
            else run_verify(
                args.impl, args.bundle, args.allow_missing, variants, args.skip, args.timeout, not args.no_diagnose
            )
        )
    except (InputError, ValueError) as e:
        raise SystemExit(f"verify: {e}") from None
    print(report.text(verbose=args.verbose))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(report.to_dict(), indent=1, ensure_ascii=False) + "\n")
        except OSError as e:
            raise SystemExit(f"verify: --json {args.json}: {e}") from None
        print("wrote", args.json)
    if args.html:
        try:
            print("wrote", write_report_html(report, find_bundles(args.bundle), args.html))
        except (OSError, ValueError, RuntimeError) as e:
            raise SystemExit(f"verify: --html {args.html}: {e}") from None
    return 0 if report.passed else 1


def _served(args, parser: argparse.ArgumentParser) -> int:
    """--endpoint URL / --outputs FILE (conformance/endpoint/)."""
    from ..conformance.endpoint import (
        EndpointError,
        LineError,
        RequestsError,
        UsageError,
        parse_conditions,
        verify_endpoint,
        verify_outputs,
    )

    if args.sampling and args.endpoint:
        return _sampled_endpoint(args, parser)
    if args.runs is not None or args.verifier:
        parser.error("--runs and --verifier go with --sampling")
    if args.sampling or args.variant or args.skip or args.profile or args.html or args.allow_missing:
        parser.error("--endpoint and --outputs take neither --sampling (but --sampling --endpoint URL does), "
                     "--variant, --skip, --profile, --html nor --allow-missing")  # fmt: skip
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.json:
        try:
            check_output_file("--json", args.json, "report.json", parents=False)
        except ValueError as e:
            parser.error(str(e))
    progress = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if args.outputs:
            if args.bundle or args.prompts or args.draft or args.serving != "alone" or args.timeout is not None:
                parser.error(
                    "--outputs replays the --target alone: no --bundle, --prompts, --draft, --serving or --timeout"
                )
            if args.outputs_only or args.plain:
                parser.error("--outputs-only and --plain go with --endpoint: a file of outputs is no server")
            report = verify_outputs(args.outputs, args.target, args.dtype, args.device, progress)
        else:
            try:
                conditions = parse_conditions(args.serving)
            except RequestsError as e:
                parser.error(str(e))
            report = verify_endpoint(
                args.endpoint, args.bundle, args.target, args.draft, args.prompts, args.model, args.dtype,
                args.device, conditions, args.max_new_tokens, args.timeout, progress, args.outputs_only,
                plain=args.plain,
            )  # fmt: skip
    except LineError as e:  # the file's line, not the command line: one line, without the usage
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    except UsageError as e:
        parser.error(str(e))
    except (EndpointError, RequestsError) as e:
        raise SystemExit(f"verify: {e}") from None
    print(report.text())
    if args.json:
        try:
            Path(args.json).write_text(report.json())
        except OSError as e:
            raise SystemExit(f"verify: --json {args.json}: {e}") from None
        print("wrote", args.json)
    return {"pass": 0, "fail": 1, "unobserved": 3}[report.verdict(args.strict)]


def _sampled_endpoint(args, parser: argparse.ArgumentParser) -> int:
    """--sampling --endpoint URL --bundle DIR: the server's samples against the sampling bundles' exact
    distributions (conformance/endpoint/sampling.py)."""
    from ..conformance.endpoint import EndpointError
    from ..conformance.endpoint.client import Endpoint
    from ..conformance.endpoint.sampling import EndpointSampler
    from ..conformance.sampling import judge_sampling

    served = args.dtype != "float32" or args.strict or args.serving != "alone" or args.max_new_tokens != 64
    if args.bundle is None or args.target or args.draft or args.prompts or args.json or args.html or served:
        parser.error("--sampling --endpoint takes the sampling bundle the server serves: --bundle DIR, and none "
                     "of --target, --draft, --prompts, --json, --html, --dtype, --strict, --serving, "
                     "--max-new-tokens")  # fmt: skip
    try:
        bundles = [b for b in find_bundles(args.bundle) if b.manifest.get("kind") == "sampling"]
    except (OSError, ValueError) as e:
        parser.error(f"--bundle {args.bundle}: {e}")
    if not bundles:
        parser.error(f"--bundle {args.bundle}: no sampling bundle there (golden --engines writes engine_sampling)")
    verifier = args.verifier or "rejection"
    try:
        endpoint = Endpoint(args.endpoint, args.model, **({"timeout": args.timeout} if args.timeout else {}))
        results = []
        for b in bundles:
            print(f"{b.name}: sampling {args.runs or b.manifest['sampling']['runs']} runs through {endpoint.url}",
                  flush=True)  # fmt: skip
            sampler = EndpointSampler(endpoint, b)
            result = judge_sampling(b.manifest["sampling"], sampler, args.runs, verifier)
            result.note = sampler.note
            results.append(result)
            print(result.text())
    except (EndpointError, ValueError, RuntimeError) as e:
        raise SystemExit(f"verify: {e}") from None
    return 0 if all(r.passed for r in results) else 1
