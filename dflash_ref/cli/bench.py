"""Benchmarks as side-by-side ratios (`python -m dflash_ref bench [NAMES] [--repeats N] [--out DIR]`).

Every variant runs in the same process, interleaved round-robin over the repeats, and is reported
as median, spread (min–max) and its ratio to the baseline: the median over the repeats of its time
over the baseline's in the same repeat. Absolute
times on a shared machine drift, ratios measured together much less, and paired ones least. Nothing
here is asserted (tests check correctness, benchmarks report). Each benchmark writes a markdown table
and JSON, some a plot:

    baselines  transformers' own generate (the headline's baseline) vs dflash_ref's AR (F.linear and the
               measured linear plan) vs the official `dflash_generate` vs dflash_ref's spec_generate,
               shipped DFlash 1 draft (the official class's kind), every output token-identical to AR
    steps      one AR step and one verify of q = 2 … 16 tokens by linear plan, beside transformers'
               forward and the bandwidth bound; a draft pass with its proposals' lm_head
    dflash2    one DFlash 2 draft pass (convolution + selector) vs DFlash 1 at blocks 4 and 16
    rollback   a hybrid target's exact rollback: a verify keeping every position's linear-layer state vs
               the final state only vs replaying the accepted tokens, at blocks 4 and 16
    official   the reference loop vs the official `dflash_generate`, same weights, same proposals
    tracing    hook points with nothing attached vs no hook support at all vs full draft tracing
    blocks     one draft pass vs block size 2..32, beside an autoregressive drafter (γ passes)
    ceiling    SmolLM2 + oracle draft per block size: measured speedup over AR vs the ideal
               b · t_step / (t_draft(b) + t_verify(b)), and the τ at which DFlash breaks even here
    memory     cache sizes and peak RSS against generated length (the draft cache stays at the context)
    trained    --draft DIR and the shipped SmolLM2 drafts (DFlash 2 and DFlash 1) on held-out prompts of both
               kinds (template topics, hand-written other styles): τ + 1 and speed vs transformers' generate and
               AR, per block size
    engines    vLLM and llama.cpp beside dflash_ref on SmolLM2 and the shipped drafts: tokens/s, τ + 1 by
               each one's own count, peak memory, output equal to AR (each in its own process and environment)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

from ..bench import baselines, engines, hybrid_rollback, steps, suite, trained
from ..bench.timing import machine, measure, summarise  # noqa: F401  (the harness, re-exported)
from ..drafts.checkpoint import draft_option
from ..fast_cpu import streamed
from ..fast_cpu.plan import linear_mode
from .folders import make_folder

BENCHES: dict[str, Callable] = {
    "baselines": baselines.bench_baselines,
    "steps": steps.bench_steps,
    "dflash2": baselines.bench_dflash2,
    "rollback": hybrid_rollback.bench_rollback,
    "official": suite.bench_official,
    "tracing": suite.bench_tracing,
    "blocks": suite.bench_blocks,
    "ceiling": suite.bench_ceiling,
    "memory": suite.bench_memory,
    "trained": trained.bench_trained,
    "engines": engines.bench_engines,
}
FAST_CPU_BENCHES = {"baselines", "steps"}  # the benchmarks that time the fast CPU path beside the plain one


def markdown(rows: list[dict], title: str) -> str:
    """A table of whatever columns the rows have (floats to 4 significant digits); a column only later
    rows have is placed after the column that precedes it in the first row that has it."""
    if not rows:
        return f"### {title}\n\n(no rows)"
    cols: list[str] = []
    for row in rows:
        at = 0
        for c in row:
            if c not in cols:
                cols.insert(at, c)
            at = cols.index(c) + 1
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = [f"### {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def fast_cpu_footer() -> str:
    """What the footer adds for a benchmark that timed the opt-in fast CPU path (FAST_CPU_BENCHES): its
    plan mode and whether its C product was built here (fast_cpu/). Asked only after such a
    benchmark ran, so that no other run compiles or loads the C product."""
    return f", --fast-cpu plan {linear_mode()} ({streamed.status()})"


def check_draft_option(names: list[str], draft: str | Path | None) -> None:
    """A draft folder is for `trained` alone: refuse one given to a run without it (ValueError)."""
    if draft is not None and "trained" not in names:
        raise ValueError(
            f"--draft {draft}: only the trained benchmark measures a draft folder, and it is "
            f"not among those asked for ({', '.join(names)})"
        )
    draft_option(draft)  # a folder that is not there or whose config does not read, before anything runs


def check_options(names: list[str], repeats: int, out: str | Path, draft: str | Path | None = None) -> dict:
    """Everything a run can be refused for before it measures anything (ValueError): a draft folder
    without `trained`, --repeats below 1, an --out that cannot be a folder, a bench.json of another
    kind in it. Makes the folder; returns the earlier results it holds."""
    check_draft_option(names, draft)
    if repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {repeats}")
    make_folder("--out", out)
    return read_report(Path(out) / "bench.json")


def read_report(path: Path) -> dict:
    """The earlier results in out/bench.json, which a run adds to; checked before any benchmark runs
    (ValueError), so that a file of another kind does not cost a finished benchmark's results."""
    if not path.is_file():
        return {"results": {}}
    try:
        report = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not JSON ({e}); move it or choose another --out") from None
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, dict) or not all(
        isinstance(r, dict) and isinstance(r.get("tables"), dict) and "machine" in r and "repeats" in r
        for r in results.values()
    ):
        raise ValueError(
            f'{path} is not a bench results file ({{"results": {{name: {{machine, repeats, tables}}}}}}); '
            f"move it or choose another --out"
        )
    return report


def run(names: list[str], repeats: int, out: str | Path, say=print, draft: str | Path | None = None) -> dict:
    """Run the named benchmarks; their results replace those of the same names in out/bench.json
    (others stay), and out/bench.md is rewritten from all of them. `draft`: the folder `trained`
    measures first, beside the shipped drafts (the others take none)."""
    report = check_options(names, repeats, out, draft)
    out = Path(out)
    where = machine()
    saved = out / "bench.json"
    for name in names:
        say(f"== bench {name} ==")
        t0 = time.perf_counter()
        options = {"draft": draft} if name == "trained" and draft is not None else {}
        tables = BENCHES[name](repeats, out=out, progress=lambda s, n=name: say(f"   {n}: {s}"), **options)
        footer = where + (fast_cpu_footer() if name in FAST_CPU_BENCHES else "")
        report["results"][name] = {"machine": footer, "repeats": repeats, "tables": tables}
        for title, rows in tables.items():
            say(markdown(rows, title))
        say(f"   ({time.perf_counter() - t0:.0f} s)")
        saved.write_text(json.dumps(report, indent=1) + "\n")
        (out / "bench.md").write_text(render(report))
    return report


def render(report: dict) -> str:
    """bench.md: every table of every benchmark in the report, each with its machine's footer."""
    texts = [
        f"{markdown(rows, title)}\n\n({r['machine']}; {r['repeats']} interleaved repeats; medians)"
        for r in report["results"].values()
        for title, rows in r["tables"].items()
    ]
    return "\n\n".join(texts) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`bench`'s options."""
    p.add_argument(
        "names",
        nargs="*",
        help="baselines steps dflash2 rollback official tracing blocks ceiling memory trained engines (default: all)",
    )
    p.add_argument("--repeats", type=int, default=7, help="timed runs of each variant")
    p.add_argument("--out", default="figures/bench", help="folder of the results: bench.json, bench.md, figures")
    p.add_argument(
        "--draft",
        help="bench trained: this official-format SmolLM2 draft folder too, first, beside the "
        "shipped ones (give --out elsewhere to keep figures/bench's results)",
    )


def main(args, parser: argparse.ArgumentParser) -> int:
    args.names = args.names or list(BENCHES)
    unknown = sorted(set(args.names) - set(BENCHES))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {sorted(BENCHES)}")
    try:
        check_options(args.names, args.repeats, args.out, args.draft)
    except ValueError as e:
        parser.error(str(e))
    run(args.names, args.repeats, args.out, draft=args.draft)
    return 0
