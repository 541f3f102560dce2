"""`python -m dflash_ref verify MODE`: check an implementation against golden bundles, stage by stage (impl, dump:
conformance/verify.py), from outside (endpoint, outputs: conformance/endpoint/), or a sampler by its output
distribution (sampling impl | endpoint: conformance/exact.py, conformance/endpoint/sampling.py).

Each mode is a subcommand with its own options, so the parser itself refuses an option a mode does not take,
naming the modes that take it (`Mode`); the flags of earlier releases (`--impl NAME`, `--dump FILE`,
`--endpoint URL`, `--outputs FILE`, `--sampling`) are read as the modes they name (`respell`)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from ..conformance.bundle import find_bundles
from ..conformance.page import check_plotly, write_report_html
from ..conformance.variants import VARIANTS, parse_variant
from ..conformance.verify import InputError, verify_dump
from ..conformance.verify import verify as run_verify
from .folders import check_output_file

MODES = {  # name → its line in `verify --help`
    "impl": "a port run here (NAME), stage by stage against the golden bundles",
    "dump": "a port's tensors, written already (FILE), stage by stage against the golden bundles",
    "endpoint": "an OpenAI-compatible server (URL), each request held to the reference's run of it alone",
    "outputs": "outputs a user has (FILE.jsonl), each position held to the target's float64 argmax; no server",
    "sampling": "a sampler, a port's (impl NAME) or a server's (endpoint URL), by its output distribution",
}
SAMPLERS = {  # the sampling modes' lines in `verify sampling --help`
    "sampling impl": "a port's sampler (NAME) against the sampling bundles' exact distributions",
    "sampling endpoint": "a server's samples (URL) against the exact distributions of the sampling bundle it serves",
}
OLD = {"--impl": "impl", "--dump": "dump", "--endpoint": "endpoint", "--outputs": "outputs"}  # the old spellings
SPELLED = {"impl": "impl NAME", "dump": "dump FILE", "endpoint": "endpoint URL", "outputs": "outputs FILE.jsonl"}

DESCRIPTION = """Check an implementation in one of five modes, each with its own options (verify MODE --help):

  verify impl NAME | dump FILE | endpoint URL | outputs FILE.jsonl
  verify sampling impl NAME | sampling endpoint URL --bundle DIR

The flags of earlier releases still work, as the modes they name: verify --impl NAME …, --dump FILE,
--endpoint URL, --outputs FILE, and --sampling with --impl or --endpoint."""

IMPLS = (
    "reference | zlab | mlx | transformers | dflash-mlx | mlx-dspark | speculators | vllm | vllm-batch | vllm-serve | "
    "llamacpp | llama-server | package.module:factory or path/to/adapter.py:factory (an adapter)"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    Mode = _mode_parser(type(p))
    modes = p.add_subparsers(dest="mode", required=True, metavar="MODE", parser_class=Mode, title="modes")

    impl = _add_mode(modes, "impl")
    impl.add_argument("impl", metavar="NAME", help=IMPLS)
    _greedy(impl)
    impl.add_argument(
        "--timeout",
        type=seconds,
        metavar="SECONDS",
        help="a bundle whose run takes longer is a timeout (an in-process port: checked on the main thread)",
    )
    impl.set_defaults(run=_greedy_run, dump=None, profile=None)

    dump = _add_mode(modes, "dump")
    dump.add_argument("dump", metavar="FILE", help="a port's tensors: .npz or .safetensors keyed {bundle}/{key}")
    _greedy(dump)
    dump.add_argument(
        "--profile",
        help="a JSON profile {variants, skip} (default: FILE.profile.json beside the dump, if there)",
    )
    dump.set_defaults(run=_greedy_run, impl=None, timeout=None)

    endpoint = _add_mode(modes, "endpoint")
    endpoint.add_argument(
        "endpoint",
        metavar="URL",
        help="an OpenAI-compatible server (http://host:port, its base URL; a /v1 or /v1/completions after it is "
        "taken off): the requests of --bundle, or of --prompts on --target and --draft, each held to the "
        "reference's run of it alone (conformance/endpoint/)",
    )
    endpoint.add_argument("--bundle", help="a bundle or a folder of bundles whose requests to send")
    endpoint.add_argument(
        "--target", help="the target the server runs, a folder or a name as generate takes it (with --prompts)"
    )
    endpoint.add_argument("--draft", help="the DFlash draft folder the server runs (with --prompts)")
    endpoint.add_argument(
        "--prompts",
        metavar="FILE",
        help="one prompt a line: JSON {prompt_ids | prompt, max_tokens, name} or plain text (the target's tokenizer)",
    )
    _model(endpoint)
    _replay(endpoint)
    endpoint.add_argument(
        "--serving",
        default="alone",
        metavar="LIST",
        help="with --prompts, the conditions to send them under, comma-separated: "
        "alone, repeat, shared-prefix, long, concurrent (default alone)",
    )
    endpoint.add_argument("--max-new-tokens", type=int, default=64, help="with --prompts: per prompt (default 64)")
    endpoint.add_argument(
        "--plain",
        metavar="URL",
        help="the same model served without speculation, whose answers the API's fields on the speculative route "
        "(stop strings, max_tokens, finish_reason, n, echo, …) are held to, field by field",
    )
    endpoint.add_argument(
        "--outputs-only",
        action="store_true",
        help="take a request whose output is right as verified even where nothing the server shows says it "
        "decoded speculatively (else its status is unobserved and the run exits 3)",
    )
    _json(endpoint)
    _timeout(endpoint)
    endpoint.set_defaults(run=_served, outputs=None)

    outputs = _add_mode(modes, "outputs")
    outputs.add_argument(
        "outputs",
        metavar="FILE.jsonl",
        help="one JSON object a line: prompt_ids, output_ids, optionally logprobs, name, max_tokens, "
        "stop_token_ids; each position held to --target's float64 argmax: pass, tie or FAIL. A line that cannot "
        "be judged refuses the whole file, naming the line, before any is judged",
    )
    outputs.add_argument("--target", help="the target to replay, a folder or a name as generate takes it (smollm2)")
    _replay(outputs)
    _json(outputs)
    outputs.set_defaults(run=_served, endpoint=None)

    sampling = _add_mode(modes, "sampling")
    samplers = sampling.add_subparsers(dest="sampler", required=True, metavar="{impl,endpoint}")
    sampled = _add_mode(samplers, "impl", "sampling impl")
    sampled.add_argument("impl", metavar="NAME", help="the port whose sampler to check: " + IMPLS)
    sampled.add_argument("--bundle", help="a sampling bundle or a folder of them (default: fresh ones, DFlash 1 and 2)")
    _sampling(sampled)
    sampled.set_defaults(run=_sampled_impl)
    served = _add_mode(samplers, "endpoint", "sampling endpoint")
    served.add_argument("endpoint", metavar="URL", help="the server whose samples to check (its base URL)")
    served.add_argument(
        "--bundle",
        required=True,
        help="the sampling bundle the server serves (golden --engines writes engine_sampling)",
    )
    _model(served)
    _sampling(served)
    _timeout(served)
    served.set_defaults(run=_sampled_endpoint)

    Mode.where = _options(modes)


def _add_mode(parent: argparse.Action, name: str, mode: str | None = None) -> argparse.ArgumentParser:
    """A mode's parser, `mode` its name after `verify` where that is not `name` ("sampling impl")."""
    help = SAMPLERS[mode] if mode else MODES[name]
    sub = parent.add_parser(name, help=help, description=help)
    sub.mode = mode or name
    sub.set_defaults(parser=sub)
    return sub


def _greedy(p: argparse.ArgumentParser) -> None:
    """The options of the greedy bundles' check, a port run here (impl) or its tensors (dump)."""
    p.add_argument("--bundle", help="a bundle or a folder of bundles (default: the one in the package)")
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
        "--json",
        metavar="FILE",
        help="also write the report as JSON: each bundle's status (pass, fail, n/a, crash, timeout) and reason, its "
        "independent divergences and coverage, and the run's divergences by cause",
    )
    p.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML page (offline): each bundle's stages, and at the "
        "first divergence the reference's and the port's tensors side by side, their difference and the hint",
    )
    p.add_argument(
        "--no-diagnose",
        action="store_true",
        help="leave each bundle's first divergence to the hints read from the tensors, without re-running the "
        "reference under each catalogued cause to find the one that reproduces it (conformance/causes/)",
    )


def _replay(p: argparse.ArgumentParser) -> None:
    """What the float64 replay of a served output takes (endpoint, outputs)."""
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the engine's dtype: what a tie is (a float64 margin below its resolution) and whether the acceptance "
        "is held exactly (float32) or reported as a ratio (default float32)",
    )
    p.add_argument("--device", default="cpu", help="where the reference and the float64 replay run (cpu, cuda)")
    p.add_argument("--strict", action="store_true", help="a tie fails too (exit 1)")


def _model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="the server's model id to ask for (default: the only one it serves)")


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON")


def _timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout",
        type=seconds,
        metavar="SECONDS",
        help="each request's deadline, from connecting to the last byte of its answer (a server that trickles "
        "bytes is held to it too; default 600)",
    )


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--verifier", choices=["rejection", "match"], help="the verifier the sampler uses (default rejection)"
    )
    p.add_argument("--runs", type=int, help="how many sampled runs (default: the bundle's, 2000)")


def _options(modes: argparse.Action) -> dict[str, list[str]]:
    """Each option → the modes that take it, read from their parsers (a mode's modes too): what a refusal names."""
    where: dict[str, list[str]] = {}
    for sub in modes.choices.values():
        for action in sub._actions:
            taking = _options(action) if isinstance(action, argparse._SubParsersAction) else {}
            taking.update({option: [sub.mode] for option in action.option_strings if option not in ("-h", "--help")})
            for option, names in taking.items():
                where.setdefault(option, []).extend(n for n in names if n not in where[option])
    return where


def _mode_parser(base: type) -> type:
    """The modes' parsers, of the command's parser class: an option a mode does not take is refused in one line
    naming the modes that take it (`where`, read from their parsers) where argparse would say "unrecognized
    arguments"; an old mode flag after a mode says it is a mode of its own."""

    class Mode(base):
        mode = ""  # its name after `verify`, e.g. "sampling impl"
        where: dict[str, list[str]] = {}  # option → the modes that take it

        def parse_known_args(self, args=None, namespace=None):
            namespace, extras = super().parse_known_args(args, namespace)
            for extra in extras:
                option = extra.split("=", 1)[0]
                if option in ("--sampling", *OLD):
                    spelled = {**SPELLED, "sampling": "sampling impl NAME | sampling endpoint URL"}
                    self.error(f"{option} is a mode of its own: verify {spelled[option[2:]]} (verify --help)")
                if self.where.get(option):
                    *some, last = self.where[option]
                    taking = f"{', '.join(some)} and {last}" if some else last
                    self.error(f"{option} goes with verify {taking}, not verify {self.mode}")
            return namespace, extras

    return Mode


def respell(argv: list[str]) -> list[str]:
    """The flags of earlier releases as the modes they name (__main__ calls this before parsing): `verify --impl
    NAME …` as `verify impl NAME …`, `--dump FILE`, `--endpoint URL` and `--outputs FILE` likewise, the mode's value
    first and the other options after it as given; with `--sampling`, `verify sampling impl NAME …` or
    `verify sampling endpoint URL …`. A command line that starts with a mode is left as it is."""
    at = argv.index("verify") + 1
    end = argv.index("--", at) if "--" in argv[at:] else len(argv)
    rest = argv[at:end]
    if not rest or rest[0] in MODES or rest[0] in ("-h", "--help"):
        return argv
    modes, kept, i = [], [], 0
    while i < len(rest):
        flag, eq, value = rest[i].partition("=")
        if flag in OLD:
            if not eq and i + 1 == len(rest):
                _usage_error(f"argument {flag}: expected one argument")
            modes.append([OLD[flag], value if eq else rest[i + 1]])
            i += 1 if eq else 2
        else:
            kept.append(rest[i])
            i += 1
    if len(modes) > 1:
        _usage_error(f"{' and '.join('--' + m for m, _ in modes)} are two modes: give one")
    if not modes:  # a mode misspelt is the parser's to say (its choices); none at all, here
        if rest[0].startswith("-"):
            _usage_error(f"give a mode first: verify {' | '.join(SPELLED.values())} | sampling … (verify --help)")
        return argv
    sampling = ["sampling"] if "--sampling" in kept else []
    return [*argv[:at], *sampling, *modes[0], *(a for a in kept if a != "--sampling"), *argv[end:]]


def _usage_error(message: str) -> None:
    """A usage error before the parser runs, as the parser says one: one line, exit code 2."""
    sys.stderr.write(f"python -m dflash_ref verify: error: {message}\n")
    raise SystemExit(2)


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
    return args.run(args, args.parser)  # the mode's runner, with the mode's parser (its usage in an error)


def _greedy_run(args, parser: argparse.ArgumentParser) -> int:
    """verify impl NAME / verify dump FILE: the greedy bundles, stage by stage (conformance/verify.py)."""
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


def _sampled_impl(args, parser: argparse.ArgumentParser) -> int:
    """verify sampling impl NAME: a port's sampler against the sampling bundles' exact distributions
    (conformance/exact.py)."""
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


def _served(args, parser: argparse.ArgumentParser) -> int:
    """verify endpoint URL / verify outputs FILE (conformance/endpoint/)."""
    from ..conformance.endpoint import (
        EndpointError,
        LineError,
        RequestsError,
        UsageError,
        parse_conditions,
        verify_endpoint,
        verify_outputs,
    )

    if args.endpoint and args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.json:
        try:
            check_output_file("--json", args.json, "report.json", parents=False)
        except ValueError as e:
            parser.error(str(e))
    progress = lambda line: print(line, flush=True)  # noqa: E731
    try:
        if args.outputs:
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
    """verify sampling endpoint URL --bundle DIR: the server's samples against the sampling bundles' exact
    distributions (conformance/endpoint/sampling.py)."""
    from ..conformance.endpoint import EndpointError
    from ..conformance.endpoint.client import Endpoint
    from ..conformance.endpoint.sampling import EndpointSampler
    from ..conformance.sampling import judge_sampling

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
