"""The conformance matrix: every shipped port × every greedy bundle, each cell the bundle's verdict,
its first divergence (with the hint) and the design variants the port declared or showed.

    python -m dflash_ref matrix --bundle DIR --out dflash_ref/conformance/MATRIX.md

A port whose package is not installed (zlab: `dflash`; mlx: the `mlx` extra) is listed as such.
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

from .bundle import TITLES
from .report import Report
from .verify import verify

PORTS = ("reference", "zlab", "mlx")


def cells(report: Report) -> list[dict]:
    """Per bundle of one report: verdict (pass | FAIL | raised | n/a), first divergence, variants."""
    rows = []
    for bundle in dict.fromkeys(c.bundle for c in report.checks):
        checks = [c for c in report.checks if c.bundle == bundle]
        first = report.first_failure_in(checks)
        variants = {k: v for k, (v, how) in report.variants.get(bundle, {}).items() if how != "reference"}
        if any(c.key == "bundle" for c in checks):
            verdict, where = "n/a", next(c.detail for c in checks if c.key == "bundle")
        elif first is None:
            verdict, where = "pass", f"{sum(c.status == 'pass' for c in checks)} tensors agree"
        elif first.status == "error":
            verdict, where = "raised", first.detail
        else:
            verdict = "FAIL"
            where = f"{first.where.split(' · ', 1)[-1]} · {TITLES.get(first.stage, first.stage)}" + (
                f" (hint: {first.hint})" if first.hint else ""
            )
        rows.append(
            {
                "bundle": bundle,
                "verdict": verdict,
                "first": where,
                "variants": ", ".join(f"{k}={v}" for k, v in variants.items()),
            }
        )
    return rows


def matrix(bundle: str | Path | None, ports=PORTS) -> str:
    """The matrix as Markdown: one table per port."""
    lines = [
        "# Conformance matrix",
        "",
        f"`python -m dflash_ref matrix` on {datetime.date.today()}, {platform.machine()}, Python "
        f"{platform.python_version()}. Verdict per bundle; the first divergence is the first failing "
        "semantic tensor along the data's walk (README.md in this folder: how to read it).",
        "",
    ]
    for port in ports:
        lines += [f"## {port}", ""]
        try:
            report = verify(port, bundle)
        except Exception as e:  # noqa: BLE001 - an uninstalled port is a row of the matrix, not a crash
            lines += [f"not run: {type(e).__name__}: {e}", ""]
            continue
        lines += [
            f"`verify {report.impl}`",
            "",
            "| bundle | verdict | first divergence | variants (declared or detected) |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['bundle']} | {r['verdict']} | {r['first'].replace('|', '/')} | {r['variants']} |"
            for r in cells(report)
        ]
        lines.append("")
    return "\n".join(lines)
