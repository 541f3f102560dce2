"""`python -m dflash_ref evaluate`: a SmolLM2 draft's (or, with `--target DIR --draft DIR`, any chat
model's: loading/chat.py) acceptance on named sets of prompts, greedy, in fp32, by the procedure of a
training run's held-out evaluation (`measure.acceptance_by_position`):

    τ + 1  = mean tokens per decode step (τ accepted draft tokens + the bonus), over all the set's steps
    a_k    = fraction of whole-block steps in which block position k (1 … b − 1) was accepted

τ + 1 pools the steps of all prompts; dflash's benchmark.py instead averages each prompt's tokens per step
("Average Acceptance length"), printed beside it as "mean of prompts" (`measure.mean_of_prompts`).

The draft is `--draft` (a folder, or shipped:dflash1 / shipped:dflash2), by default the shipped DFlash 2
draft. (`DIR/eval.json` measures the fp32 draft `DIR/draft`; a bf16 folder such as `DIR/draft-bf16` or a
shipped draft is read into fp32 from bf16-rounded weights, so its τ + 1 can differ slightly from the run's.)

A set is SPLIT:START:COUNT, the prompts prompt_sets.split_prompts(SPLIT)[START:START + COUNT]: `train` has
7140 prompts over 595 topics (the shipped DFlash 1 draft was trained on the first 5580, the defaults on the
first 1860; the shipped DFlash 2 draft on `mixed`'s first 4000: train's first 2000 and varied's, in turn),
`heldout` 144 over 12 topics no draft here was trained on, `varied` the 28560 of `train --prompt-set varied`
(48 styles), `heldout-styles` 48 written by hand in 12 styles no training prompt
has, on other topics (training/heldout_styles.py); SPLIT may also be a prompts file of one's own (.txt or
.jsonl, training/prompt_file.py), e.g. `--sets my_prompts.jsonl:0:50`. So

    python -m dflash_ref evaluate --sets heldout:0:12 train:0:12 train:3000:12 train:6000:12

sets held-out prompts beside prompts the shipped DFlash 1 draft was trained on and prompts it never saw on
topics it knows (figures/training/README.md). `--by-template` also reports each set split by the
prompts' template ("What is {t}?", "Write a short poem about {t}.", …) or style from the same decoding runs.
`--teacher-forced` measures instead at every position of the target's own greedy responses to the
set's prompts, split by the target's confidence (training/teacher_forced.py), without decoding.
With `--paths M` (a DFlash 2 draft) it measures a tree instead of the selector's one path: its M most probable
paths merged by their prefixes, τ the longest leading match of any, and the tree's mean nodes (a verify of that
tree would take 1 + nodes tokens); decoding verifies one path, so this says what a tree verify could keep.
`--lookup N` decodes with prompt lookup beside the draft (extensions/prompt_lookup.py): τ + 1 and a_k are then
the decoder's, its lookup steps counted with the draft's, and each set also reports the two apart.

`--out FILE.json` also writes FILE.md beside it: the same results as a Markdown page (`render`), headed by
the command that regenerates both and the machine it ran on (figures/training/ holds such pages)."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import time
from pathlib import Path

from ..bench.timing import machine
from ..drafts.checkpoint import draft_option
from ..drafts.folder import check_fits, open_draft
from ..drafts.shipped import SHIPPED_NAMES
from ..extensions.prompt_lookup import check_lookup
from ..loading.chat import SMOLLM2, open_chat_target
from ..loading.folder import check_target_name
from ..loading.smollm2 import longest_chat_prompt
from ..trace.plots import save_figure
from ..training.distill import self_distill
from ..training.measure import acceptance_by_position, fractions, mean_of_prompts, number, tally
from ..training.prompt_file import SUFFIXES, read_prompts
from ..training.prompt_sets import SPLITS, kind_of, split_prompts
from ..training.teacher_forced import bin_label, check_paths, plot, teacher_forced
from .folders import check_output_file, check_output_folder

DEFAULT_TOKENS = 128  # __main__'s --tokens default: `command_line` leaves it out


def parse_set(spec: str) -> tuple[str, int, int]:
    """'SPLIT:START:COUNT' → (split, start, count), or a ValueError naming what is wrong. SPLIT is a split
    of the prompts written here, or a prompts file of one's own (.txt or .jsonl, training/prompt_file.py)."""
    found = re.fullmatch(r"(.+):(\d+):(\d+)", spec, re.ASCII)
    if not found or not (found[1] in SPLITS or found[1].endswith(SUFFIXES)):
        raise ValueError(
            f"prompt set {spec!r}: expected SPLIT:START:COUNT with SPLIT one of {list(SPLITS)} "
            f"or a prompts file ({' or '.join(SUFFIXES)}), and START, COUNT whole numbers, "
            "e.g. heldout:0:12"
        )
    split, start, count = found[1], int(found[2]), int(found[3])
    available = len(set_prompts(split))
    if count < 1:
        raise ValueError(f"prompt set {spec!r}: COUNT must be at least 1")
    if start + count > available:
        where = f"the {split} split" if split in SPLITS else split
        raise ValueError(
            f"prompt set {spec!r}: prompts {start}…{start + count - 1} asked for, but {where} "
            f"has {available} (0…{available - 1})"
        )
    return split, start, count


def set_prompts(split: str) -> list[str]:
    """All the prompts of a split written here, or of a prompts file."""
    return split_prompts(split) if split in SPLITS else read_prompts(split, "--sets")


def check_arguments(args) -> None:
    """What can be refused before loading anything: the sets (each valid, none twice; no file with
    --by-template), --tokens, --block-size, --figures without --teacher-forced, --teacher-forced with
    --by-template, --block-size or --lookup, a bad --lookup, --out, an unknown shipped draft's name, and a
    --target without a --draft (the shipped drafts are SmolLM2's), --paths without --teacher-forced or below 1
    (a draft without a selector, or more paths than its lattice has, is refused by `run` once it reads the draft)."""
    check_target_name(args.target)
    draft_option(args.draft)  # there, with a config that reads
    if args.target != SMOLLM2 and not args.draft:
        raise ValueError(f"--target {args.target} needs a --draft trained for it (the shipped drafts are SmolLM2's)")
    parsed = [parse_set(spec) for spec in args.sets]
    twice = sorted({spec for spec, key in zip(args.sets, parsed) if parsed.count(key) > 1})
    if twice:
        raise ValueError(f"prompt sets {twice} name the same prompts more than once")
    files = [spec for spec, (split, _, _) in zip(args.sets, parsed) if split not in SPLITS]
    if args.by_template and files:
        raise ValueError(
            f"--by-template splits the prompts written here by their template or style; {files[0]} is a file"
        )
    if args.tokens < 2:
        raise ValueError(
            f"--tokens must be at least 2 (the first token is the prefill's; decode steps start at "
            f"the second), got {args.tokens}"
        )
    if args.block_size is not None and args.block_size < 2:
        raise ValueError(f"--block-size must be at least 2 (the bonus token and one proposal), got {args.block_size}")
    for flag, given in (("--figures", args.figures), ("--paths", args.paths is not None)):
        if given and not args.teacher_forced:
            raise ValueError(f"{flag} goes with the teacher-forced measure: give it with --teacher-forced")
    if args.paths is not None and args.paths < 1:
        raise ValueError(f"--paths must be at least 1 (1: the most probable path alone), got {args.paths}")
    if args.teacher_forced:
        both = [
            flag
            for flag, given in (
                ("--by-template", args.by_template),
                ("--block-size", args.block_size is not None),
                ("--lookup", args.lookup is not None),
            )
            if given
        ]
        if both:
            raise ValueError(
                f"--teacher-forced measures the draft's own block size over all prompts together; "
                f"it takes no {' or '.join(both)}"
            )
    check_lookup(args.lookup)
    if args.out:
        check_output_file("--out", args.out, "eval.json", parents=False)  # Path.write_text: its folder must exist
        check_output_file(f"--out {args.out}: its page", page_path(args.out), "eval.md", parents=False)
    if args.figures:
        check_output_folder("--figures", args.figures)


def by_template(chosen: list[str], records: list[list], block_size: int, say=print) -> dict:
    """τ + 1 (tokens per step) and a_k of each template's (or style's) prompts in a set (their steps pooled, as
    for the set), printed from the highest down: which kinds of answer the draft predicts, and which it does not."""
    groups: dict[str, list] = {}
    for prompt, steps in zip(chosen, records):
        groups.setdefault(kind_of(prompt), []).append(steps)
    found = {}
    for template, runs in groups.items():
        by_position, tau = tally([step for steps in runs for step in steps], block_size)
        found[template] = {"tokens_per_step": tau, "acceptance_by_position": by_position, "prompts": len(runs)}
    for template, r in sorted(found.items(), key=lambda item: -(item[1]["tokens_per_step"] or 0)):
        say(
            f"{'':>22}tokens/step {number(r['tokens_per_step'])}  {fractions(r['acceptance_by_position'])}"
            f"  {r['prompts']:>3} × {template}"
        )
    return found


def by_proposer(records: list[list], block_size: int, say=print) -> dict:
    """With --lookup: the steps whose proposals the lookup copied and those the draft made, each with its
    share of the steps and its τ + 1 (tokens committed per step, `tally`'s)."""
    steps = [step for run in records for step in run]
    found = {}
    for name, mine in (("lookup", [r for r in steps if r.lookup]), ("draft", [r for r in steps if not r.lookup])):
        found[name] = {
            "steps": len(mine),
            "share": len(mine) / len(steps) if steps else None,
            "tokens_per_step": tally(mine, block_size)[1],
        }
    say(
        f"{'':>22}"
        + ", ".join(
            f"{name} proposed {number(f['share'])} of the steps, τ + 1 = {number(f['tokens_per_step'])}"
            for name, f in found.items()
        )
    )
    return found


def measure_teacher_forced(
    draft,
    chat,
    spec: str,
    chosen: list[str],
    tokens: int,
    figures: str | None,
    folder: Path,
    say=print,
    paths: int | None = None,
) -> dict:
    """The target's greedy responses to `chosen` (fp32, not stored), then training/teacher_forced.py on them
    (a tree of the selector's `paths` best paths, if given); with `figures`, its plot as
    FIGURES/teacher_forced_SPLIT_START_COUNT.png. chat: target/chat.ChatTarget."""
    target, tokenizer = chat.model, chat.tokenizer
    longest, limit = longest_chat_prompt(tokenizer, chosen), target.config.max_position_embeddings
    if longest + tokens > limit:  # as decoding refuses it (compat.check_request), before generating
        raise SystemExit(
            f"prompt set {spec}: its longest prompt ({longest} tokens) + --tokens {tokens} exceeds "
            f"{chat.label}'s {limit} positions; at most {limit - longest}"
        )
    rows = self_distill(
        target, tokenizer, chosen, None, tokens, batch_size=16, stop_token_ids=chat.stop_token_ids, say=say
    )
    found = {**teacher_forced(draft, target, rows, paths=paths), "prompts": chosen}
    if not found["anchors"]:
        raise SystemExit(
            f"prompt set {spec}: no response of {tokens} tokens or fewer holds a whole block of "
            f"{draft.block_size}; raise --tokens"
        )
    tree = "" if paths is None else f" of a tree of {paths} paths, {found['mean_nodes']:.2f} nodes on average,"
    say(
        f"{spec:>20}  teacher-forced τ + 1 = {found['tokens_per_step']:.3f}{tree} over {found['anchors']} anchors; "
        f"acceptance by block position {fractions(found['acceptance_by_position'])}"
    )
    for b in found["by_confidence"]:
        if b["anchors"]:
            say(
                f"{'':>22}target confidence {bin_label(b)}: {100 * b['share']:4.1f} % "
                f"of anchors, τ + 1 = {b['tokens_per_step']:.3f}, {fractions(b['acceptance_by_position'])}"
            )
    if figures:
        title = (
            f"{folder.parent.name}/{folder.name}, {spec}: teacher-forced τ + 1 = {found['tokens_per_step']:.3f}"
            f"{tree} over {found['anchors']} anchors"
        )
        path = Path(figures) / (
            "teacher_forced_" + spec.replace(":", "_") + ("" if paths is None else f"_paths{paths}") + ".png"
        )
        say(f"wrote {save_figure(plot(found, title), path)}")
    return found


def run(args, say=print) -> dict:
    """Evaluate args.draft (default: the shipped DFlash 2 draft) on each of args.sets; write args.out if given."""
    draft, folder = open_draft(args.draft, proposing=args.block_size is None)
    block_size = draft.block_size if args.block_size is None else args.block_size
    if block_size > draft.block_size:
        # measured on purpose, and said, as spec_generate allows it (generate refuses it, where a run would say
        # nothing): the draft runs any block length (its attention has no size of its own), but positions past its
        # training block never had a label
        untrained = (
            f"position {block_size - 1} was"
            if block_size == draft.block_size + 1
            else f"positions {draft.block_size} … {block_size - 1} were"
        )
        say(
            f"--block-size {block_size}: this draft was trained on blocks of {draft.block_size}; "
            f"{untrained} never trained"
        )
    if args.paths is not None:
        try:
            check_paths(draft, args.paths)  # the draft alone says, before the target is loaded
        except ValueError as e:
            raise SystemExit(f"--{e}") from None  # "--paths=M: …"
    chat = open_chat_target(args.target)
    target, tokenizer = chat.model, chat.tokenizer
    check_fits(draft, folder, target, "SmolLM2-135M" if chat.name == SMOLLM2 else chat.label)
    results = {
        "target": args.target,
        "draft": shown_path(folder),
        "block_size": block_size,
        "lookup": args.lookup,
        "trained_block_size": draft.block_size,
        "tokens": args.tokens,
        "sets": {},
    }
    for spec in args.sets:
        split, start, count = parse_set(spec)
        chosen = set_prompts(split)[start : start + count]
        if args.teacher_forced:
            results["sets"][spec] = measure_teacher_forced(
                draft, chat, spec, chosen, args.tokens, args.figures, folder, say, args.paths
            )
            continue
        records, started = [], time.perf_counter()

        def done(i: int, spec=spec, count=count, started=started) -> None:  # progress per 12 prompts of a longer set
            if i % 12 == 0 and i < count:
                say(f"{spec}: {i}/{count} prompts, {time.perf_counter() - started:.0f} s")

        try:
            by_position, tau = acceptance_by_position(
                draft,
                target,
                tokenizer,
                chosen,
                args.tokens,
                chat.stop_token_ids,
                block_size,
                records=records,
                done=done,
                lookup=args.lookup,
            )
        except ValueError as e:  # e.g. --tokens past the target's positions (compat.check_request)
            raise SystemExit(f"prompt set {spec}: {e}") from None
        per_prompt = mean_of_prompts(records)
        results["sets"][spec] = {
            "tokens_per_step": tau,
            "tokens_per_step_mean_of_prompts": per_prompt,
            "acceptance_by_position": by_position,
            "prompts": chosen,
        }
        say(
            f"{spec:>20}  τ + 1 = {number(tau)} tokens/step (mean of prompts {number(per_prompt)})  "
            f"acceptance by block position {fractions(by_position)}"
        )
        if None in by_position:
            say(f"{'':>22}(n/a: no step verified a whole block of {block_size}; raise --tokens)")
        if args.lookup is not None:
            results["sets"][spec]["by_proposer"] = by_proposer(records, block_size, say)
        if args.by_template:
            results["sets"][spec]["by_template"] = by_template(chosen, records, block_size, say)
    if args.out:
        text = json.dumps(results, indent=1) + "\n"
        try:
            Path(args.out).write_text(text)
        except OSError as e:  # the results are not lost with the file
            print(text)
            raise SystemExit(
                f"--out {args.out}: cannot write it ({e.strerror}); the results are printed above"
            ) from None
        say(f"wrote {args.out}")
        page = page_path(args.out)
        try:
            page.write_text(render(results, command_line(args), machine(speed=False)))
        except OSError as e:  # the results are in the JSON already
            raise SystemExit(
                f"--out {args.out}: the results are written there, but not their page {page} ({e.strerror})"
            ) from None
        say(f"wrote {page}")
    return results


# -- the results as a Markdown page, written beside --out's JSON ------------------------------------------


def page_path(out: str | Path) -> Path:
    """Where `run` writes the page of --out FILE.json: FILE.md (FILE.json.md if --out itself ends in .md)."""
    out = Path(out)
    return out.with_name(out.name + ".md") if out.suffix == ".md" else out.with_suffix(".md")


def command_line(args) -> str:
    """The command that gives these results again, from the parsed arguments: every option given, --sets
    always, --target and --tokens where not their defaults."""
    words = ["python", "-m", "dflash_ref", "evaluate"]
    if args.target != SMOLLM2:
        words += ["--target", str(args.target)]
    if args.draft:
        words += ["--draft", str(args.draft)]
    words += ["--sets", *args.sets]
    if args.tokens != DEFAULT_TOKENS:
        words += ["--tokens", str(args.tokens)]
    for flag, value in (("--block-size", args.block_size), ("--lookup", args.lookup)):
        if value is not None:
            words += [flag, str(value)]
    words += ["--by-template"] * bool(args.by_template) + ["--teacher-forced"] * bool(args.teacher_forced)
    for flag, value in (("--paths", args.paths), ("--figures", args.figures), ("--out", args.out)):
        if value is not None:
            words += [flag, str(value)]
    return shlex.join(words)


def shown_path(folder) -> str:
    """A folder as the results keep it: relative to the working directory where it lies below it (results
    committed from the repository name no machine's paths), else absolute."""
    folder = Path(folder).resolve()
    try:
        return folder.relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(folder)


def draft_label(draft: str) -> str:
    """The draft as the page names it: a shipped draft by its --draft name and its folder in the repository
    (wherever the results found it), any other folder as the results give it."""
    path = Path(draft)
    for name, folder in SHIPPED_NAMES.items():
        if path.parts[-3:] == folder.parts[-3:]:
            return f"{name} (`{'/'.join(folder.parts[-3:])}`)"
    return f"`{draft}`"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def _positions(values) -> str:
    """a_1 / a_2 / … as the page gives them (3 decimals, n/a where nothing was measured)."""
    return " / ".join(number(a) for a in values) if values is not None else "n/a"


def _a_header(values) -> str:
    return " / ".join(f"a_{k}" for k in range(1, len(values) + 1)) if values else "a_k"


def render(results: dict, command: str, machine: str) -> str:
    """FILE.md of `evaluate --out FILE.json`: the run's results (`run`'s dict, as the JSON holds them) as a
    Markdown page, numbers as the command prints them: the sets, then whichever of the by-template,
    by-proposer (--lookup) and teacher-forced tables the results hold. `command` is the command that gives
    them again (`command_line`), `machine` where it ran (`machine`)."""
    sets = results["sets"]
    b, trained = results["block_size"], results.get("trained_block_size", results["block_size"])
    lines = [
        f"# `evaluate`: {draft_label(results['draft'])}",
        "",
        "Generated, with the JSON beside it, by the command below (`dflash_ref/cli/evaluate.py`); rerun it "
        "to regenerate both rather than editing this page.",
        "",
        "```bash",
        command,
        "```",
        "",
        f"- draft: {draft_label(results['draft'])}, target `{results['target']}`",
        f"- block size: {b}"
        + ("" if b == trained else f" (trained at {trained}: positions {trained} … {b - 1} never trained)"),
        f"- tokens: at most {results['tokens']} per prompt, greedy, fp32",
    ]
    if results.get("lookup") is not None:
        lines.append(f"- prompt lookup beside the draft: N = {results['lookup']} (`--lookup`)")
    lines += [f"- machine: {machine}", ""]
    decoded = {spec: r for spec, r in sets.items() if "by_confidence" not in r}
    forced = {spec: r for spec, r in sets.items() if "by_confidence" in r}
    if decoded:
        lines += _decoded(decoded, b)
    if forced:
        lines += _teacher_forced(forced)
    return "\n".join(lines).rstrip("\n") + "\n"


def _decoded(sets: dict, b: int) -> list[str]:
    """The sets' decoding table, then each set's by-template table and the by-proposer table, where present."""
    some = next((r["acceptance_by_position"] for r in sets.values() if r["acceptance_by_position"]), None)
    lines = [
        "## Decoding",
        "",
        "τ + 1: tokens per target pass (τ accepted proposals + the bonus), pooled over all the set's steps; "
        "beside it the mean of each prompt's τ + 1 (how dflash's benchmark.py averages). a_k: the share of "
        "whole-block steps in which block position k was accepted.",
        "",
        *_table(
            ["set", "prompts", "τ + 1 (pooled)", "τ + 1, mean of prompts", _a_header(some)],
            [
                [
                    f"`{spec}`",
                    str(len(r["prompts"])),
                    number(r["tokens_per_step"]),
                    number(r.get("tokens_per_step_mean_of_prompts")),
                    _positions(r["acceptance_by_position"]),
                ]
                for spec, r in sets.items()
            ],
        ),
    ]
    if any(None in (r["acceptance_by_position"] or [None]) for r in sets.values()):
        lines += ["", f"n/a: no step verified a whole block of {b}; raise --tokens."]
    lines.append("")
    for spec, r in sets.items():
        if "by_template" not in r:
            continue
        groups = sorted(r["by_template"].items(), key=lambda item: -(item[1]["tokens_per_step"] or 0))
        lines += [
            f"### `{spec}` by template or style (`--by-template`), highest τ + 1 first",
            "",
            *_table(
                ["template or style", "prompts", "τ + 1", _a_header(some)],
                [
                    [
                        t.replace("|", "\\|"),
                        str(g["prompts"]),
                        number(g["tokens_per_step"]),
                        _positions(g["acceptance_by_position"]),
                    ]
                    for t, g in groups
                ],
            ),
            "",
        ]
    proposers = {spec: r["by_proposer"] for spec, r in sets.items() if "by_proposer" in r}
    if proposers:
        lines += [
            "### Steps by proposer (`--lookup`)",
            "",
            "Each step's block was proposed by prompt lookup or by the draft; τ + 1 of each kind's steps.",
            "",
            *_table(
                ["set", "lookup: steps", "share", "τ + 1", "draft: steps", "share", "τ + 1"],
                [
                    [f"`{spec}`"]
                    + [
                        x
                        for name in ("lookup", "draft")
                        for x in (str(p[name]["steps"]), number(p[name]["share"]), number(p[name]["tokens_per_step"]))
                    ]
                    for spec, p in proposers.items()
                ],
            ),
            "",
        ]
    return lines


def _teacher_forced(sets: dict) -> list[str]:
    """The sets' teacher-forced table (with the tree's paths and nodes where --paths gave them), then each
    set's bins of the target's confidence c_a."""
    some = next((r["acceptance_by_position"] for r in sets.values() if r["acceptance_by_position"]), None)
    tree = any("paths" in r for r in sets.values())
    lines = [
        "## Teacher-forced (`--teacher-forced`)",
        "",
        "The draft at every anchor of the target's own greedy responses (`dflash_ref/training/teacher_forced.py`), "
        "no decoding: τ + 1 (teacher-forced) = 1 + the mean number of leading proposals equal to the target's "
        "greedy tokens, a_k = the share of anchors whose first k proposals all are."
        + (
            " With `--paths M`: the longest match of a tree of the selector's M most probable paths, and the "
            "tree's mean nodes (a verify would take 1 + nodes tokens)."
            if tree
            else ""
        ),
        "",
        *_table(
            ["set", "prompts", "anchors", "τ + 1 (teacher-forced)", _a_header(some)]
            + (["paths", "mean nodes"] if tree else []),
            [
                [
                    f"`{spec}`",
                    str(len(r["prompts"])),
                    str(r["anchors"]),
                    number(r["tokens_per_step"]),
                    _positions(r["acceptance_by_position"]),
                ]
                + ([str(r.get("paths", "")), number(r.get("mean_nodes"), 2)] if tree else [])
                for spec, r in sets.items()
            ],
        ),
        "",
    ]
    for spec, r in sets.items():
        bins = [x for x in r["by_confidence"] if x["anchors"]]
        lines += [
            f"### `{spec}` by the target's confidence c_a in the token after the anchor",
            "",
            *_table(
                ["c_a", "anchors", "share of anchors", "τ + 1 (teacher-forced)", _a_header(some)],
                [
                    [
                        bin_label(x),
                        str(x["anchors"]),
                        f"{100 * x['share']:.1f} %",
                        number(x["tokens_per_step"]),
                        _positions(x["acceptance_by_position"]),
                    ]
                    for x in bins
                ],
            ),
            "",
        ]
    return lines


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`evaluate`'s options."""
    p.add_argument(
        "--target",
        default="smollm2",
        help="smollm2, or the Hugging Face chat model folder the --draft was trained for",
    )
    p.add_argument(
        "--draft",
        help="an official-format draft folder, or shipped:dflash1 / shipped:dflash2 "
        "(default: the shipped SmolLM2 DFlash 2 draft; needed with --target DIR)",
    )
    p.add_argument(
        "--sets",
        nargs="+",
        default=["heldout:0:12"],
        metavar="SPLIT:START:COUNT",
        help="prompt sets, split train, heldout, varied, mixed or heldout-styles, or a prompts file "
        "(default: heldout:0:12, the training run's held-out evaluation)",
    )
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt")
    p.add_argument("--block-size", type=int, help="verify blocks of this size (default: the draft's)")
    p.add_argument(
        "--lookup",
        type=int,
        metavar="N",
        help="decode with prompt lookup beside the draft, "
        "as generate --lookup (extensions/prompt_lookup.py; default: off)",
    )
    p.add_argument("--out", help="write the results here as JSON, and beside it their page (FILE.md)")
    p.add_argument(
        "--by-template",
        action="store_true",
        help="also report each set split by the prompts' template or style (training/prompt_sets.py)",
    )
    p.add_argument(
        "--teacher-forced",
        action="store_true",
        help="measure at every position of the target's own greedy responses instead of decoding, "
        "split by the target's confidence (training/teacher_forced.py)",
    )
    p.add_argument(
        "--paths",
        type=int,
        metavar="M",
        help="with --teacher-forced and a DFlash 2 draft: measure "
        "what verifying a tree of the selector's M most probable paths would keep (a measure only)",
    )
    p.add_argument("--figures", help="with --teacher-forced: write each set's plot to this folder")


def main(args, parser: argparse.ArgumentParser) -> int:
    try:
        check_arguments(args)
    except ValueError as e:
        parser.error(str(e))
    run(args)
    return 0
