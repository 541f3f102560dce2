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
from pathlib import Path

from .bundle import find_bundles
from .exact import verify_sampling
from .report import NotApplicable, Report, title
from .verify import verify

PORTS = ("reference", "zlab", "mlx", "transformers", "vllm", "vllm-batch", "vllm-serve", "llamacpp", "llama-server")
ALONE = "one sequence"  # the condition of a bundle of no serving scenario
SAMPLED_CONDITION = "sampled"  # the conditions' column of the sampling bundles
# the ports that sample, and their verifiers (sampling.py): dflash 0.1.0 rejects by q; llama.cpp's server keeps a
# greedy proposal while it equals the target's sample; vLLM does either (its draft_sample_method)
SAMPLED = {"reference": ("rejection", "match"), "zlab": ("rejection",), "transformers": ("rejection",),
           "vllm": ("match", "rejection"), "llama-server": ("match",)}  # fmt: skip

# Every FAIL the matrix has shown, followed to its cause: (port as its report names it, stage of the first
# divergence), or (port, stage, bundle) where the stage alone would not tell the cause → the cause.
# A FAIL not listed here is said to be unexplained: a new finding to follow (README.md, "Real ports, measured").
CAUSES = {
    ("zlab [0.1.0 code]", "recurrent_state"): "a bug of `dflash` 0.1.0 with transformers' Qwen3.5: it rolls a "
    "hybrid target back by `DynamicCache.crop` alone, which cannot cut back a recurrent state",
    ("zlab [github code]", "pattern"): "a bug of the official GitHub code: its draft's sliding window goes to the "
    "attention kernel as a keyword SDPA ignores",
    ("zlab [github code]", "extra_step"): "a bug of the official GitHub code: it looks for stop tokens only after "
    "a decode step, so a stop token as x_0 still costs a whole draft and verify step (its tokens then cut away)",
    ("mlx", "k_rot"): "a bug of the official MLX backend: after a one-position update it reads its rotating cache "
    "in ring order while its mask counts in temporal order",
    ("mlx", "prefill_logits"): "a bug of mlx-lm 0.32.2's Llama, the MLX backend's target: it reads `rope_theta` "
    "alone, so a config in transformers 5's spelling runs at θ = 10⁴ and the target's own logits differ first "
    "(reports/mlx-lm-llama-rope-parameters.md)",
    ("transformers 5.15.0", "first_token"): "a bug of transformers 5.15.0's assisted decoding (fixed in 5.18.0): "
    "a prompt that ends with a stop token is returned alone, the stop taken for the end of the output "
    "(reports/transformers-dflash-prompt-ends-in-stop-token.md)",
    ("vllm", "k_ctx"): "a bug of vLLM on a CPU: every draft layer's context K normalised with layer 0's k_norm "
    "(reports/vllm-cpu-context-k-norm.md)",
    # the batch compares the loop's observables only: the proposals are off by the bug `verify vllm` names at its
    # stage (each bundle's: its context K after KNorm, or the last target layer's features)
    ("vllm-batch", "draft_tokens"): "the proposals of a bug of vLLM's drafter that `verify vllm` names at its stage: "
    "the context-K norm on a CPU (reports/vllm-cpu-context-k-norm.md), or the target's last layer read before "
    "its final norm (reports/vllm-last-target-layer-before-norm.md)",
    ("vllm", "target_hidden"): "a bug of vLLM: for a target layer id L − 1 it reads that layer's own output, where "
    "DFlash reads hidden_states[L], after the target's final norm (reports/vllm-last-target-layer-before-norm.md)",
    ("mlx", "target_hidden"): "a departure of the official MLX backend from its PyTorch code, as vLLM's: for a "
    "target layer id L − 1 its features are that layer's output before the target's final norm (the hint's test), "
    "where the PyTorch code reads hidden_states[L], after it (reports/vllm-last-target-layer-before-norm.md)",
    ("llamacpp", "pattern"): "a bug of llama.cpp: a sliding layer of a draft whose config means a causal window "
    "(layer_types, no is_causal) attends a symmetric one (reports/llamacpp-dflash-sliding-window-causal.md)",
    ("llama-server", "draft_accepted", "engine_sliding"): "the acceptance lost to llama.cpp's sliding-window bug "
    "(its output still the target's), which `verify llamacpp` names at the attention weights "
    "(reports/llamacpp-dflash-sliding-window-causal.md)",
    ("vllm-serve", "k_ctx"): "the same bug of vLLM on a CPU, under every serving condition: every draft layer's "
    "context K normalised with layer 0's k_norm (reports/vllm-cpu-context-k-norm.md)",
}


def cells(report: Report) -> list[dict]:
    """Per bundle of one report: verdict (pass | FAIL | raised | n/a), first divergence, its cause (a FAIL's,
    from CAUSES), variants."""
    rows = []
    for bundle in dict.fromkeys(c.bundle for c in report.checks):
        checks = [c for c in report.checks if c.bundle == bundle]
        first = report.first_failure_in(checks)
        variants = {k: v for k, (v, how) in report.variants.get(bundle, {}).items() if how != "reference"}
        if any(c.key == "bundle" for c in checks):
            verdict, where = "n/a", next(c.detail for c in checks if c.key == "bundle")
        elif first is None:
            cov = report.coverage(bundle)
            apart = cov.apart(report.allow_missing)
            verdict, where = "pass", f"{cov.passed} of {cov.total} tensors agree"
            where += f" ({'; '.join(apart)})" if apart else ""
        elif first.status == "error":
            verdict, where = "raised", first.detail
        else:
            verdict = "FAIL"
            said = f"hint: {first.hint}" if first.hint else first.detail
            where = f"{first.where.split(' · ', 1)[-1]} · {title(first.stage)}" + (f" ({said})" if said else "")
            cause = CAUSES.get((report.impl, first.stage, bundle)) or CAUSES.get(
                (report.impl, first.stage), "unexplained: a new finding, to follow to its cause"
            )
        rows.append(
            {
                "bundle": bundle,
                "verdict": verdict,
                "first": where,
                "cause": cause if verdict == "FAIL" else "",
                "variants": ", ".join(f"{k}={v}" for k, v in variants.items()),
            }
        )
    return rows


def check_ports(ports) -> None:
    """Every name a shipped port's, else a ValueError naming the unknown ones (before anything runs)."""
    unknown = [p for p in ports if p not in PORTS]
    if unknown:
        raise ValueError(f"unknown port(s) {unknown}; the shipped ports: {list(PORTS)}")


def conditions(rows_by_port: dict[str, list[dict]], condition_of: dict[str, str]) -> list[str]:
    """The serving conditions as columns: per port, each condition's verdict over its bundles (pass, FAIL k of
    n, raised, n/a), a bundle of no serving scenario under "one sequence"."""
    columns = list(dict.fromkeys([ALONE, *condition_of.values()]))
    lines = ["## Serving conditions", "", "| port | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for port, rows in rows_by_port.items():
        cells = []
        for column in columns:
            verdicts = [r["verdict"] for r in rows if condition_of.get(r["bundle"], ALONE) == column]
            ran = [v for v in verdicts if v != "n/a"]
            if not ran:
                cells.append("n/a" if verdicts else "")
            elif "FAIL" in ran or "raised" in ran:
                failed = sum(v != "pass" for v in ran)
                cells.append(f"{'FAIL' if 'FAIL' in ran else 'raised'} ({failed} of {len(ran)})")
            else:
                cells.append(
                    "pass" + (f" ({len(ran)} of {len(verdicts)}; the rest n/a)" if len(ran) < len(verdicts) else "")
                )
        lines.append(f"| {port} | " + " | ".join(cells) + " |")
    return lines + [""]


def sampled(bundle: str | Path, ports) -> tuple[list[str], dict[str, list[str]], bool]:
    """The sampling bundles at `bundle` through each port of SAMPLED, each verifier it takes → (the table's lines,
    port → its verdicts, whether none failed or raised)."""
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
        for verifier in SAMPLED[port]:
            try:
                results = verify_sampling(port, bundle, verifier=verifier)
            except Exception as e:  # noqa: BLE001 - a port that cannot sample is a row, not a crash
                lines.append(f"| {port} | | {verifier} | | | raised: {' '.join(str(e).split())} |")
                verdicts.setdefault(port, []).append("raised")
                clean = False
                continue
            for name, r in results:
                if isinstance(r, NotApplicable):
                    lines.append(f"| {port} | {name} | {verifier} | | | n/a: {' '.join(str(r).split())} |")
                    verdicts.setdefault(port, []).append("n/a")
                    continue
                tau = (
                    f"{r.mean_tau:.3f} vs {r.expected_tau:.3f}, z = {r.z:+.2f}"
                    if not math.isnan(r.z)
                    else "not reported"
                )
                verdict = "pass" if r.passed else "FAIL" + (f": {r.note}" if r.note else "")
                lines.append(
                    f"| {port} | {name} | {verifier} | χ² {r.chi2:.1f} on {r.df} df, p = {r.p_value:.3g} | {tau} "
                    f"| {verdict} |"
                )
                verdicts.setdefault(port, []).append("pass" if r.passed else "FAIL")
                clean = clean and r.passed
    return lines + [""], verdicts, clean


def matrix(bundle: str | Path | None, ports=PORTS, command: str = "python -m dflash_ref matrix") -> tuple[str, bool]:
    """The matrix as Markdown: one table per port, then the serving conditions as columns where the bundles have
    serving scenarios; `command` is what its header says made it. → (the text, whether every row passed or is
    n/a: no FAIL, no port that raised)."""
    check_ports(ports)
    clean = True
    lines = [
        "# Conformance matrix",
        "",
        f"`{command}` on {datetime.date.today()}, {platform.machine()}, Python "
        f"{platform.python_version()}. Verdict per bundle; the first divergence is the first failing "
        "semantic tensor along the data's walk (README.md in this folder: how to read it).",
        "",
    ]
    rows_by_port: dict[str, list[dict]] = {}
    for port in ports:
        lines += [f"## {port}", ""]
        try:
            report = verify(port, bundle)
        except Exception as e:  # noqa: BLE001 - a port that cannot start is a row of the matrix, not a crash
            lines += [f"not run: {type(e).__name__}: {e}", ""]
            clean = False
            continue
        lines += [
            f"`verify {report.impl}`",
            "",
            "| bundle | verdict | first divergence | cause | variants (declared or detected) |",
            "|---|---|---|---|---|",
        ]
        rows = rows_by_port[port] = cells(report)
        clean = clean and all(r["verdict"] in ("pass", "n/a") for r in rows)
        lines += [
            f"| {r['bundle']} | {r['verdict']} | {r['first'].replace('|', '/')} | {r['cause']} | {r['variants']} |"
            for r in rows
        ]
        lines.append("")
    found = find_bundles(bundle)
    served = {b.name: b.manifest["serving"]["condition"] for b in found if "serving" in b.manifest}
    if any(b.manifest.get("kind") == "sampling" for b in found):
        table, verdicts, ok = sampled(bundle, ports)
        lines += table
        clean = clean and ok
        for port, said in verdicts.items():  # the conditions' "sampled" column
            rows_by_port.setdefault(port, []).extend({"bundle": SAMPLED_CONDITION, "verdict": v} for v in said)
        served[SAMPLED_CONDITION] = SAMPLED_CONDITION
    return "\n".join(lines + (conditions(rows_by_port, served) if served and rows_by_port else [])), clean
