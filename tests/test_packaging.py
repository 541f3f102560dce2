"""Packaging: environment.yml mirrors pyproject.toml (core + test extras), torch pinned in both, and CI
runs exactly the README's test command."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (pyproject allows it): the same parser under its old name
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "dflash-ref"
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*?)\s*$")


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()      # PEP 503


def parse_requirement(text: str) -> tuple[str, frozenset[str], str]:
    """'name[extra1,extra2] >=1, <2' → (name, extras, specifier set as a sorted, space-free string)."""
    match = REQUIREMENT.match(text)
    assert match, f"cannot parse requirement {text!r}"
    name, extras, spec = match.groups()
    extras = frozenset(e.strip() for e in (extras or "[]")[1:-1].split(",") if e.strip())
    spec = ",".join(sorted(s.replace(" ", "") for s in spec.split(",") if s.strip()))
    return normalise(name), extras, spec


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def pyproject_requirements(extras: list[str]) -> dict[str, str]:
    """Core dependencies plus the given extras, expanding self-references like dflash-ref[hf]."""
    project = pyproject()["project"]
    optional = project.get("optional-dependencies", {})
    out: dict[str, str] = {}
    seen: set[str] = set()

    def add(lines: list[str]) -> None:
        for line in lines:
            name, sub_extras, spec = parse_requirement(line)
            if name == normalise(PROJECT):          # dflash-ref[hf,notebooks]: those extras, inline
                for extra in sorted(sub_extras - seen):
                    seen.add(extra)
                    add(optional[extra])
                continue
            assert out.setdefault(name, spec) == spec, f"{name} is required twice with different versions"

    add(project["dependencies"])
    for extra in extras:
        assert extra in optional, f"pyproject.toml has no extra {extra!r}"
        seen.add(extra)
        add(optional[extra])
    return out


def environment_pip_lines(text: str) -> list[str]:
    """The entries of the `- pip:` list in a conda environment file (a small, indentation-based reader)."""
    entries, pip_indent = [], None
    for line in text.splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()    # YAML comments
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if pip_indent is None:
            if line.strip() == "- pip:":
                pip_indent = indent
            continue
        if indent <= pip_indent:
            break
        item = line.strip()
        assert item.startswith("- "), f"unexpected line in the pip list: {item!r}"
        entries.append(item[2:].strip())
    assert pip_indent is not None, "environment.yml has no `- pip:` list"
    return entries


def environment_requirements() -> dict[str, str]:
    out = {}
    for entry in environment_pip_lines((ROOT / "environment.yml").read_text()):
        if entry.startswith("-e ") or entry.startswith("--"):
            continue
        name, _, spec = parse_requirement(entry)
        assert name not in out, f"{name} listed twice in environment.yml"
        out[name] = spec
    return out


def test_requirement_parser_by_hand():
    assert parse_requirement("torch==2.13.0") == ("torch", frozenset(), "==2.13.0")
    assert parse_requirement("Jupyter_Lab >= 4, <5") == ("jupyter-lab", frozenset(), "<5,>=4")
    assert parse_requirement("dflash-ref[hf,notebooks]") == ("dflash-ref", frozenset({"hf", "notebooks"}), "")


def test_environment_reader_by_hand():
    text = "name: x\ndependencies:\n  - python=3.11\n  - pip\n  - pip:\n      - a>=1  # why\n      - -e .\n  - zlib\n"
    assert environment_pip_lines(text) == ["a>=1", "-e ."]


def test_environment_yml_matches_pyproject_core_and_test_extras():
    expected = pyproject_requirements(["test"])
    found = environment_requirements()
    assert found == expected, (f"only in environment.yml: {sorted(set(found) - set(expected))}; "
                               f"only in pyproject: {sorted(set(expected) - set(found))}; different: "
                               f"{sorted(n for n in set(found) & set(expected) if found[n] != expected[n])}")


def test_environment_yml_installs_the_project_itself():
    assert "-e ." in environment_pip_lines((ROOT / "environment.yml").read_text())


def test_environment_reader_agrees_with_pyyaml():
    yaml = pytest.importorskip("yaml")
    data = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in data["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert pip == environment_pip_lines((ROOT / "environment.yml").read_text())


def test_torch_is_pinned_in_both():
    core = [parse_requirement(r) for r in pyproject()["project"]["dependencies"]]
    assert ("torch", frozenset(), "==2.13.0") in core
    assert environment_requirements()["torch"] == "==2.13.0"


def test_transformers_pin_matches_the_official_dflash_requirement():
    assert pyproject_requirements(["hf"])["transformers"] == "==5.15.0"


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("#") and "test" in line.lower() and i + 1 < len(lines):
                commands.append(lines[i + 1])
    assert len(commands) == 1, f"expected one test command in the README, found {commands}"
    return commands[0]


def test_ci_runs_exactly_the_readme_test_command():
    command = readme_test_command()
    assert "pytest" in command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[0].startswith("#!")
    code = [line for line in ci[1:] if line.strip() and not line.lstrip().startswith("#")]
    # besides shell settings and moving to the repository root, the one command is the README's
    assert code[-1] == command
    assert all(line.startswith(("set ", "cd ")) for line in code[:-1]), code
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
