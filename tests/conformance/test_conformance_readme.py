"""The kit's README walks a port author from nothing to a verdict: its adapter runs, as written, on the shipped
bundle, and prints what the README says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "dflash_ref" / "conformance" / "README.md"


def test_the_readmes_adapter_gives_the_verdict_it_shows():
    pytest.importorskip("dflash.model")
    text = README.read_text()
    [code] = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    [said] = re.findall(r"It prints `(.*?)`", text)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})
    assert printed.getvalue().strip().splitlines()[-1] == said
