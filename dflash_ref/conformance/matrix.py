"""The conformance matrix: every shipped port × every greedy bundle, each cell the bundle's verdict,
its first divergence (with the hint) and the design variants the port declared or showed.

    python -m dflash_ref matrix --bundle DIR --out dflash_ref/conformance/MATRIX.md

A port whose package is not installed (zlab: `dflash`; mlx: the `mlx` extra) is listed as such; an engine
that is not installed, or refuses a bundle (vLLM and llama.cpp refuse the tiny ones: no tokenizer), is
"n/a" in its words. `matrix --engines` adds the engine-shaped bundles (engine_scenarios.py). The sampling
bundles go to every port that samples (SAMPLED: its verifiers), checked by their distributions (`verify --sampling`),
in a table of their own and as the conditions' "sampled" column.
"""

from __future__ import annotations

import datetime
import math
import platform
import time
from pathlib import Path

from .bundle import find_bundles
from .exact import verify_sampling
from .known_bugs import causes
from .report import NotApplicable, Report
from .verify import resolve, verify

PORTS = ("reference", "zlab", "mlx", "transformers", "dflash-mlx", "mlx-dspark", "speculators", "vllm", "vllm-batch",
         "vllm-serve", "llamacpp", "llama-server")  # fmt: skip
ALONE = "one sequence"  # the condition of a bundle of no serving scenario
SAMPLED_CONDITION = "sampled"  # the conditions' column of the sampling bundles
# the ports that sample, and their verifiers (sampling.py): dflash 0.1.0 rejects by q; llama.cpp's server keeps a
# greedy proposal while it equals the target's sample; vLLM does either (its draft_sample_method)
SAMPLED = {"reference": ("rejection", "match"), "zlab": ("rejection",), "transformers": ("rejection",),
           "mlx-dspark": ("rejection",), "vllm": ("match", "rejection"), "llama-server": ("match",)}  # fmt: skip

# Every FAIL the matrix has shown, followed to its cause in a report (reports/*.md, each header listing the cells
# it explains: known_bugs.py). A FAIL no report explains is said to be unexplained: a new finding to follow
# (README.md, "Real ports, measured").
CAUSES = causes()


def cells(report: Report) -> list[dict]:
    """Per bundle of one report: its status (report.STATUSES: pass, fail, n/a, crash, timeout), its reason (the
    first divergence with the hint, the port's words, or what a pass covers), a fail's cause (CAUSES: its report's), the
    variants."""
    rows = []
    for bundle in report.bundles():
        checks = [c for c in report.checks if c.bundle == bundle]
        status = report.status(bundle)
        cause = ""
        if status != "pass" and status != "n/a":  # a fail's first divergence, a crash's or a timeout's raise
            crashed = [c for c in checks if c.key == "adapter"]
            first = crashed[0] if crashed else report.first_failure_in(checks)
            stage = first.stage if first is not None else ""
            cause = CAUSES.get((report.impl, stage, bundle)) or CAUSES.get(
                (report.impl, stage), "unexplained: a new finding, to follow to its cause"
            )
        variants = {k: v for k, (v, how) in report.variants.get(bundle, {}).items() if how != "reference"}
        rows.append(
            {
                "bundle": bundle,
                "verdict": status,
                "first": report.reason(bundle),
                "cause": cause,
                "variants": ", ".join(f"{k}={v}" for k, v in variants.items()),
            }
        )
    return rows


def label(port: str) -> str:
    """A port as the matrix names it: with the release that ran where the port says one (a library the user
    upgrades: `transformers 5.15.0`), so that runs in several environments merge (`merge`)."""
    try:
        version = resolve(port).version
    except Exception:  # noqa: BLE001 - a port that cannot be made is named plainly; its run says why
        version = None
    return f"{port} {version}" if version else port


def _sections(text: str) -> tuple[list[str], dict[str, list[str]]]:
    """A matrix's lines before its first section, and its sections by title, each its lines (title included)."""
    head, sections, current = [], {}, None
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("## "):
            current = line[3:]
            sections[current] = []
        (sections[current] if current is not None else head).append(line)
    return head, sections


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _merge_table(old: list[str], new: list[str]) -> list[str]:
    """A table section of rows keyed by their first cell (the port): a new row replaces the old one of its port in
    the columns it has, the old row's other cells stay (a run measures its own columns only), the other old rows
    stay; columns are the union, old first; a new table without words of its own keeps the old section's."""
    old_table, new_table = [x for x in old if x.startswith("|")], [x for x in new if x.startswith("|")]
    if len(old_table) < 2 or len(new_table) < 2:
        return new if len(new_table) >= 2 else old
    old_columns, new_columns = _cells(old_table[0]), _cells(new_table[0])
    columns = old_columns + [c for c in new_columns if c not in old_columns]
    new_rows = [dict(zip(new_columns, _cells(r))) for r in new_table[2:]]
    rows = [dict(zip(old_columns, _cells(r))) for r in old_table[2:]]
    kept = {r[old_columns[0]]: r for r in rows}
    for r in new_rows:  # a port's row keeps its cells of the columns this run did not measure (ENDPOINT's, …)
        if r[new_columns[0]] in kept:
            r.update({c: v for c, v in kept[r[new_columns[0]]].items() if c not in new_columns})
    fresh = {r[new_columns[0]]: r for r in new_rows}
    rows = [fresh.pop(r[old_columns[0]], r) for r in rows] + list(fresh.values())  # in the old order, new ones last
    prose = [x for x in new if not x.startswith("|")]  # the title and what it says, blank lines between
    if not any(x.strip() for x in prose[1:]):  # a table alone (matrix --endpoint): the section's words stay
        prose = [x for x in old if not x.startswith("|")]
    while prose and not prose[-1].strip():
        prose.pop()
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return [*prose, "", *table, *("| " + " | ".join(r.get(c, "") for c in columns) + " |" for r in rows), ""]


TABLES = ("Sampled decoding", "Serving conditions")
ENDPOINT = "endpoint"  # the serving conditions' column of a deployment checked from outside (verify --endpoint)


def endpoint_rows(reports: dict[str, list[dict]]) -> list[str]:
    """`matrix --endpoint PORT=REPORT.json[,…]`: each port's runs of `verify --endpoint --json` as its "endpoint"
    cell of the serving conditions (pass, tie k of n, unobserved k of n, FAIL k of n over the requests the server
    took, an acceptance held to the sum of several requests' counted as each of theirs, a run whose departures go
    beyond its control's a FAIL; refused ones n/a), a table `merge` puts into the matrix beside the port's other
    cells."""
    lines = ["## Serving conditions", "", f"| port | {ENDPOINT} |", "|---|---|"]
    for port, runs in reports.items():
        statuses = [r["status"] for run in runs for r in run["requests"]]
        failed = {r["name"] for run in runs for r in run["requests"] if r["status"] in ("FAIL", "error")}
        failed |= {n for run in runs for s in run.get("shared", []) if s["failed"] for n in s["names"]}
        ties, refused, unseen = statuses.count("tie"), statuses.count("n/a"), statuses.count("unobserved")
        departs = any((run.get("control") or {}).get("failed") for run in runs)  # departures beyond the control's
        ran = len(statuses) - refused
        cell = (
            "n/a" if not ran
            else f"FAIL ({len(failed)} of {ran})" if failed
            else f"FAIL (departures beyond the control's, {ran} requests)" if departs
            else f"unobserved ({unseen} of {ran}: speculation not seen)" if unseen
            else f"tie ({ties} of {ran})" if ties
            else f"pass ({ran} requests)"
        ) + (f"; {refused} n/a" if refused and ran else "")  # fmt: skip
        lines.append(f"| {port} | {cell} |")
    return lines + [""]


def merge(old: str, new: str) -> str:
    """`matrix --merge`: the ports of `new` (a run in another environment: a port's own venv, another release)
    put into the matrix `old`: their sections replace those of the same title, their rows of the shared tables
    replace their own; everything else of `old` stays, and its header says both runs."""
    old_head, old_sections = _sections(old)
    new_head, new_sections = _sections(new)
    said = next((line for line in new_head if line.startswith("`")), "")
    command = said.split(" on ", 1)[0]  # the same command run again replaces its own line
    head = [line for line in old_head if line.strip() and not line.startswith(f"Merged with {command} on ")]
    head += [f"Merged with {said}"] if said else []
    head = [head[0], "", *head[1:], ""] if head else new_head
    # a port run here with its release named replaces its row of a run where it was not installed (no release)
    named = {t.split(" ", 1)[0] for t in new_sections if " " in t and t not in TABLES}
    old_sections = {t: body for t, body in old_sections.items() if t not in named}
    for title in TABLES:
        if title in old_sections:
            old_sections[title] = [x for x in old_sections[title] if not x.startswith("|") or _cells(x)[0] not in named]
    titles = [t for t in old_sections if t not in TABLES] + [
        t for t in new_sections if t not in TABLES and t not in old_sections
    ]
    out = list(head)
    for title in titles:
        body = new_sections.get(title) or old_sections[title]
        out += body if body[-1] == "" else [*body, ""]
    for title in TABLES:
        if title in old_sections or title in new_sections:
            both = (old_sections.get(title), new_sections.get(title))
            body = _merge_table(*both) if all(both) else (both[1] or both[0])
            out += body if body[-1] == "" else [*body, ""]
    return "\n".join(out).rstrip("\n")


def check_ports(ports) -> None:
    """Every name a shipped port's, else a ValueError naming the unknown ones (before anything runs)."""
    unknown = [p for p in ports if p not in PORTS]
    if unknown:
        raise ValueError(f"unknown port(s) {unknown}; the shipped ports: {list(PORTS)}")


def conditions(rows_by_port: dict[str, list[dict]], condition_of: dict[str, str]) -> list[str]:
    """The serving conditions as columns: per port, each condition's verdict over its bundles (pass, fail k of
    n, crash, n/a), a bundle of no serving scenario under "one sequence"."""
    columns = list(dict.fromkeys([ALONE, *condition_of.values()]))
    lines = ["## Serving conditions", "", "| port | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for port, rows in rows_by_port.items():
        cells = []
        for column in columns:
            verdicts = [r["verdict"] for r in rows if condition_of.get(r["bundle"], ALONE) == column]
            ran = [v for v in verdicts if v != "n/a"]
            if not ran:
                cells.append("n/a" if verdicts else "")
            elif any(v != "pass" for v in ran):
                failed = sum(v != "pass" for v in ran)
                worst = next(v for v in ("fail", "crash", "timeout") if v in ran)
                cells.append(f"{worst} ({failed} of {len(ran)})")
            else:
                cells.append(
                    "pass" + (f" ({len(ran)} of {len(verdicts)}; the rest n/a)" if len(ran) < len(verdicts) else "")
                )
        lines.append(f"| {port} | " + " | ".join(cells) + " |")
    return lines + [""]


def sampled(bundle: str | Path, ports, texts: dict | None = None) -> tuple[list[str], dict[str, list[str]], bool]:
    """The sampling bundles at `bundle` through each port of SAMPLED, each verifier it takes → (the table's lines,
    port → its verdicts, whether none failed or crashed). `texts`, where given, gets what `verify --sampling --impl
    PORT --verifier V` prints, keyed (port, "sampling", V): (its text, the seconds it took)."""
    lines = [
        "## Sampled decoding",
        "",
        "`verify --sampling`: outputs against the exact distribution (chi-square), the first step's τ against its "
        "exact mean (z); each bundle's runs, seeded 0 … runs − 1",
        "",
        "| port | bundle | verifier | outputs | first-step τ | verdict |",
        "|---|---|---|---|---|---|",
    ]
    verdicts: dict[str, list[str]] = {}
    clean = True
    for port in (p for p in ports if p in SAMPLED):
        named = label(port)
        for verifier in SAMPLED[port]:
            start = time.monotonic()
            try:
                results = verify_sampling(port, bundle, verifier=verifier)
            except Exception as e:  # noqa: BLE001 - a port that cannot sample is a row, not a crash
                if texts is not None:
                    texts[port, "sampling", verifier] = (f"verify: {e}", time.monotonic() - start)
                lines.append(f"| {named} | | {verifier} | | | crash: {' '.join(str(e).split())} |")
                verdicts.setdefault(named, []).append("crash")
                clean = False
                continue
            if texts is not None:  # as `verify --sampling` prints them
                said = [
                    f"{name}: {port}\n" + (f"n/a: {r}" if isinstance(r, Exception) else r.text()) for name, r in results
                ]
                if not any(not isinstance(r, Exception) for _, r in results):
                    said.append(f"verify: {port} took none of the sampling bundles")
                texts[port, "sampling", verifier] = ("\n".join(said), time.monotonic() - start)
            for name, r in results:
                if isinstance(r, NotApplicable):
                    lines.append(f"| {named} | {name} | {verifier} | | | n/a: {' '.join(str(r).split())} |")
                    verdicts.setdefault(named, []).append("n/a")
                    continue
                tau = (
                    f"{r.mean_tau:.3f} vs {r.expected_tau:.3f}, z = {r.z:+.2f}"
                    if not math.isnan(r.z)
                    else "not reported"
                )
                verdict = "pass" if r.passed else "fail"
                verdict += f": {r.note}" if r.note else ""
                lines.append(
                    f"| {named} | {name} | {verifier} | χ² {r.chi2:.1f} on {r.df} df, p = {r.p_value:.3g} | {tau} "
                    f"| {verdict} |"
                )
                verdicts.setdefault(named, []).append("pass" if r.passed else "fail")
                clean = clean and r.passed
    return lines + [""], verdicts, clean


TITLE = "# Conformance matrix"
COMMAND = "`python -m dflash_ref matrix"  # how the line that says which command wrote a matrix begins


def header(command: str) -> list[str]:
    """A matrix's first lines: its title, and the command that wrote it, where and when."""
    return [
        TITLE,
        "",
        f"`{command}` on {datetime.date.today()}, {platform.machine()}, Python "
        f"{platform.python_version()}. Verdict per bundle; the first divergence is the first failing "
        "semantic tensor along the data's walk (README.md in this folder: how to read it).",
        "",
    ]


def check_matrix_file(path: str | Path) -> None:
    """`matrix --out FILE` writes or merges into FILE: one not there, empty, or a matrix this command wrote (TITLE,
    then the line of the command that wrote it); anything else is a ValueError, since a merge would append a matrix
    to an unrelated file and a write would replace it."""
    file = Path(path)
    if not file.is_file():
        return
    try:
        lines = file.read_text(encoding="utf-8").strip().split("\n")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--out {path}: cannot read it to merge into ({e})") from None
    if lines == [""]:
        return
    if lines[0].rstrip() != TITLE or not any(line.startswith(COMMAND) for line in lines[1:4]):
        raise ValueError(
            f"--out {path} is there and is not a matrix this command wrote (a first line {TITLE!r}, then the command "
            "that wrote it): give another file, or the matrix to merge into"
        )


def report_kind(report) -> str:
    """What a `verify --json` report is: "endpoint" (verify --endpoint), "outputs" (verify --outputs), "bundles"
    (verify --impl or --dump), else "unknown". Reports from before the endpoint ones said their kind are read by
    their header."""
    if not isinstance(report, dict):
        return "unknown"
    if isinstance(report.get("requests"), list):
        kind = report.get("kind")
        if kind is None:
            first = (report.get("header") or [""])[0]
            kind = "outputs" if str(first).startswith("outputs ") else "endpoint" if str(first).startswith(
                "endpoint ") else "unknown"  # fmt: skip
        return kind if kind in ("endpoint", "outputs") else "unknown"
    return "bundles" if "impl" in report and "statuses" in report else "unknown"


def matrix(
    bundle: str | Path | None, ports=PORTS, command: str = "python -m dflash_ref matrix", texts: dict | None = None
) -> tuple[str, bool]:
    """The matrix as Markdown: one table per port, then the serving conditions as columns where the bundles have
    serving scenarios; `command` is what its header says made it. → (the text, whether every row passed or is
    n/a: no fail, no port that crashed). `texts`, where given, gets each port's report as `verify --impl PORT`
    prints it, keyed (port,): (its text, the seconds it took), and the samplers' (`sampled`): a CI that shows
    the reports runs each port once."""
    check_ports(ports)
    clean = True
    lines = header(command)
    rows_by_port: dict[str, list[dict]] = {}
    for port in ports:
        lines += [f"## {label(port)}", ""]
        start = time.monotonic()
        try:
            report = verify(port, bundle)
        except Exception as e:  # noqa: BLE001 - a port that cannot start is a row of the matrix, not a crash
            lines += [f"not run: {type(e).__name__}: {e}", ""]
            clean = False
            if texts is not None:
                texts[(port,)] = (f"verify: {e}", time.monotonic() - start)
            continue
        if texts is not None:
            texts[(port,)] = (report.text(), time.monotonic() - start)
        lines += [
            f"`verify {report.impl}`",
            "",
            "| bundle | verdict | first divergence | cause | variants (declared or detected) |",
            "|---|---|---|---|---|",
        ]
        rows = rows_by_port[label(port)] = cells(report)
        clean = clean and all(r["verdict"] in ("pass", "n/a") for r in rows)
        lines += [
            f"| {r['bundle']} | {r['verdict']} | {r['first'].replace('|', '/')} | {r['cause']} | {r['variants']} |"
            for r in rows
        ]
        lines.append("")
    found = find_bundles(bundle)
    served = {b.name: b.manifest["serving"]["condition"] for b in found if "serving" in b.manifest}
    if any(b.manifest.get("kind") == "sampling" for b in found):
        table, verdicts, ok = sampled(bundle, ports, texts)
        lines += table
        clean = clean and ok
        for port, said in verdicts.items():  # the conditions' "sampled" column
            rows_by_port.setdefault(port, []).extend({"bundle": SAMPLED_CONDITION, "verdict": v} for v in said)
        served[SAMPLED_CONDITION] = SAMPLED_CONDITION
    return "\n".join(lines + (conditions(rows_by_port, served) if served and rows_by_port else [])), clean
