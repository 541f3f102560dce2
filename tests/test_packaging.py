"""Packaging: environment.yml mirrors pyproject.toml (core + test extras), torch pinned in both, CI
runs exactly the README's test command, and the package keeps its layout: layers imported only
downwards, no import cycle, imports at module top, the named subpackages, READMEs whose links resolve."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
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
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


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
            if name == normalise(PROJECT):  # dflash-ref[hf,notebooks]: those extras, inline
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
        line = re.sub(r"(^|\s)#.*$", "", line).rstrip()  # YAML comments
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
    assert found == expected, (
        f"only in environment.yml: {sorted(set(found) - set(expected))}; "
        f"only in pyproject: {sorted(set(expected) - set(found))}; different: "
        f"{sorted(n for n in set(found) & set(expected) if found[n] != expected[n])}"
    )


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


def shell_commands(lines: list[str]) -> list[str]:
    """Shell lines → commands: a line ending in a backslash continues on the next (joined with one space)."""
    commands, current = [], ""
    for line in lines:
        current += line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip() + " "
            continue
        commands.append(current)
        current = ""
    return commands + ([current.strip()] if current.strip() else [])


def test_shell_commands_by_hand():
    assert shell_commands(["a && \\", "  b", "c"]) == ["a && b", "c"]


def readme_test_command() -> str:
    """The command after the README's comment line that names the tests, in its bash block."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, flags=re.S)
    commands = []
    for block in blocks:
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("#") and "test" in line.lower() and i + 1 < len(lines):
                commands.append(shell_commands(lines[i + 1 :])[0])
    assert len(commands) == 1, f"expected one test command in the README, found {commands}"
    return commands[0]


def test_ci_runs_exactly_the_readme_test_command():
    command = readme_test_command()
    assert "pytest" in command and "ruff check" in command and "ruff format --check" in command
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ci[0].startswith("#!")
    code = shell_commands([line for line in ci[1:] if line.strip() and not line.lstrip().startswith("#")])
    # besides shell settings, moving to the repository root and marking the run as CI's, the one command
    # is the README's
    assert code[-1] == command
    assert all(line.startswith(("set ", "cd ", "export DFLASH_REF_CI=")) for line in code[:-1]), code
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


# -- the package's layers ------------------------------------------------------------------------
# Each module may import from its own layer and the layers below it, never from one above, and no
# module imports itself back through others. `__init__` (a lazy facade, imports by name on first use)
# stands outside the layers; `__main__` is the command line, the top. The core is the top of the
# package (the equations, the loop, the caches, the configs, the hooks) and `target/` (the targets
# written out here); every subpackage but `target/` is a tool.
PACKAGE = ROOT / "dflash_ref"
LAYERS = ["core", "extensions", "instruments", "loading", "drafts", "training", "apps", "cli"]
APPS = {"bench", "tour", "conformance"}
INSTRUMENTS = {"trace", "viewer"}  # the trace (an observer of the loop), its plots, its page


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    head = module.split(".")[0]
    if head == "fast_cpu":  # the opt-in speed path: beside the loop's extensions, as opt-in as they are
        return "extensions"
    if head in ("extensions", "loading", "drafts", "training", "cli"):
        return head
    if head in INSTRUMENTS:
        return "instruments"
    if head in APPS:
        return "apps"
    if head == "__main__":
        return "cli"
    return "core"  # the top's modules and target/


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[str, int, bool]]:
    """(imported dflash_ref module, line, at module top) for every import in `source`, the text of
    `module` (a package's __init__ when `is_package`), resolved against the package: `from . import x`
    names the module x where x is one, and a name imported from the package root that is no module is
    an import of the facade, "__init__"."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    package = [p for p in package if p]
    tree = ast.parse(source)
    top = {id(node) for node in tree.body}
    found = []

    def add(base: str, names: list[str], node) -> None:
        for name in names:
            full = f"{base}.{name}".lstrip(".")
            if (PACKAGE / (full.replace(".", "/") + ".py")).exists() or (PACKAGE / full.replace(".", "/")).is_dir():
                found.append((full, node.lineno, id(node) in top))
            else:
                found.append((base or "__init__", node.lineno, id(node) in top))

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
            add(".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names], node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "dflash_ref":
            add(node.module.removeprefix("dflash_ref").lstrip("."), [a.name for a in node.names], node)
        elif isinstance(node, ast.Import):
            found += [
                (a.name.removeprefix("dflash_ref").lstrip(".") or "__init__", node.lineno, id(node) in top)
                for a in node.names
                if a.name.split(".")[0] == "dflash_ref"
            ]
    return found


def imports_of(path: Path) -> list[tuple[str, int, bool]]:
    return imports_in(path.read_text(), module_name(path), path.name == "__init__.py")


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def test_layer_of_by_hand():
    assert [
        layer_of(m)
        for m in (
            "rope",
            "decoding",
            "target.qwen3",
            "fast_cpu.linear",
            "trace.plots",
            "loading.hf",
            "drafts.oracle",
            "training.recipe",
            "bench.suite",
            "conformance.verify",
            "cli.generate",
            "__main__",
        )
    ] == ["core", "core", "core", "extensions", "instruments", "loading", "drafts", "training", "apps", "apps", "cli",
          "cli"]  # fmt: skip


def test_imports_of_resolves_relative_imports():
    modules = {m for m, _, _ in imports_of(PACKAGE / "training" / "driver.py")}
    assert {"training.distill", "training.options", "drafts.checkpoint", "trace.plots"} <= modules
    assert ("decoding", True) in {(m, at_top) for m, _, at_top in imports_of(PACKAGE / "training" / "measure.py")}
    source = (
        "from . import trace\nfrom . import spec_generate\nfrom dflash_ref import load_draft\n"
        "import dflash_ref.attention\n\n\ndef f():\n    from .cache import KVCache\n"
    )
    assert imports_in(source, "rope") == [
        ("trace", 1, True),
        ("__init__", 2, True),
        ("__init__", 3, True),
        ("attention", 4, True),
        ("cache", 8, False),
    ]
    assert imports_in("from ..loading import hf\nfrom . import qwen3\n", "drafts.x")[0][0] == "loading.hf"
    assert imports_in("from . import qwen3\n", "target", is_package=True) == [("target.qwen3", 1, True)]


def test_no_module_of_the_package_imports_its_facade():
    """dflash_ref/__init__ resolves names lazily for users; a module inside imports the module that
    defines a name (else the layers and the cycle check could not see the real dependency)."""
    facade = [
        f"{path.relative_to(ROOT)}:{line}"
        for module, path in package_modules().items()
        if module
        for target, line, _ in imports_of(path)
        if target == "__init__"
    ]
    assert not facade, facade


def test_no_module_imports_from_a_layer_above_its_own():
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = []
    for module, path in package_modules().items():
        if module == "":
            continue
        for target, line, _ in imports_of(path):
            if target and rank[layer_of(target)] > rank[layer_of(module)]:
                upward.append(
                    f"{path.relative_to(ROOT)}:{line} ({layer_of(module)}) imports {target} ({layer_of(target)})"
                )
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)


# the apps stand side by side, each on the layers below, never on one another: the kit stands on the toy models
# (drafts/toy.py), not on the tour that walks them; the tour and the bench may run the kit, the kit runs neither.
# The bench times the engines the kit runs (their runners: the kit's engine ports), and nothing else of the kit.
APP_IMPORTS_OK = {"conformance": set(), "tour": {"conformance"}, "bench": {"conformance"}}
BENCH_FROM_THE_KIT = ("conformance.ports.engines", "conformance.report")


def test_the_apps_stand_beside_each_other():
    across = []
    for module, path in package_modules().items():
        head = module.split(".")[0]
        if head not in APPS:
            continue
        for target, line, _ in imports_of(path):
            other = target.split(".")[0]
            if other in APPS and other != head and other not in APP_IMPORTS_OK[head]:
                across.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
            if head == "bench" and other == "conformance" and not target.startswith(BENCH_FROM_THE_KIT):
                across.append(f"{path.relative_to(ROOT)}:{line} imports {target} (the bench: engines alone)")
    assert not across, "imports across the apps:\n" + "\n".join(across)


def test_nothing_outside_the_kit_imports_it_but_the_apps_and_the_commands():
    """The core, the loaders, the drafts, training and the instruments never import the conformance kit."""
    reach = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for module, path in package_modules().items()
        if module and layer_of(module) not in ("apps", "cli")
        for target, line, _ in imports_of(path)
        if target.split(".")[0] == "conformance"
    ]
    assert not reach, reach


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk meets, as [a, b, …, a]."""
    done, path, cycles = set(), [], []

    def visit(m):
        if m in path:
            cycles.append(path[path.index(m) :] + [m])
            return
        if m in done:
            return
        path.append(m)
        for t in sorted(graph[m]):
            visit(t)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    return cycles


def test_find_cycles_by_hand():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle():
    graph = {
        module: {t for t, _, _ in imports_of(path) if t and t != module}
        for module, path in package_modules().items()
        if module
    }
    for module, targets in graph.items():  # importing p.q.r from outside p runs p/__init__ (and p/q/...) first
        for target in list(targets):
            parts = target.split(".")
            targets |= {
                ".".join(parts[:i])
                for i in range(1, len(parts))
                if not (module + ".").startswith(".".join(parts[:i]) + ".")
            }
    graph = {m: {t for t in targets if t in graph} for m, targets in graph.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" → ".join(c) for c in cycles)


# the ports' wing of the conformance kit: everything that runs an implementation (torch, MLX, engines)
PORTS = ("conformance.ports", "conformance.golden")


def test_the_judge_imports_no_port_and_no_torch(tmp_path):
    """The kit's judge (judge.py, and the port contract it is handed) stands below every port: nothing it imports,
    at the top of any module it reaches, runs an implementation or brings torch."""
    graph = {m: {t for t, _, at_top in imports_of(p) if t and at_top} for m, p in package_modules().items() if m}
    reached, todo = set(), ["conformance.judge", "conformance.port", "conformance.known_bugs"]
    while todo:
        m = todo.pop()
        if m not in reached and m in graph:
            reached.add(m)
            todo += graph[m]
    assert not {m for m in reached if m.startswith(PORTS)}, sorted(reached)
    script = (
        "import sys\nfrom dflash_ref.conformance import judge, known_bugs, port, verify\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint('numpy only: ok')"
    )
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0 and "numpy only: ok" in done.stdout, done.stderr


# function-local imports allowed in the package, each for a stated reason: optional heavy dependencies
# (the hf, notebooks and mlx extras, the official package), and where torch must wait: conformance/verify.py's
# adapters and `verify --sampling`'s sampler (a dump is compared with numpy alone; torch comes only when an
# implementation is run). (__main__ imports the one command named with importlib, so `--help` waits for none.)
# The PyPI ports the kit reads (conformance/ports/pypi/) are optional too, and so is loguru, speculators' logger.
LOCAL_IMPORT_OK = {"transformers", "dflash", "jupytext", "nbclient", "nbformat", "mlx", "mlx_lm", "vllm"} | {
    "dflash_mlx",
    "mlx_dspark",
    "speculators",
    "loguru",
}
# None: any. training/init_draft.py reads a draft's config.json through config.py only for `train --init DRAFT`:
# config.py brings torch, which training's options otherwise never import (`train --help` stays cheap)
LOCAL_IMPORT_OF = {
    # torch: a dump is compared with numpy alone; a server (conformance/endpoint/) is checked with the reference
    "cli/verify.py": {
        "conformance.exact",
        "conformance.endpoint",
        "conformance.endpoint.client",
        "conformance.endpoint.sampling",
        "conformance.sampling",
    },
    # reading a bundle imports no torch; asking whether its draft is a Muse folder does (config.py)
    "conformance/bundle.py": {"muse_glimmer"},
    # the diagnosis re-runs the reference (torch): a dump is still judged with numpy alone
    "conformance/verify.py": {"conformance.ports.registry", "conformance.causes.diagnose"},
    "training/init_draft.py": {"config", "config_fields"},
    # the trace's payload imports torch; the kit's numpy-only page (conformance/page.py) imports the viewer's page
    "viewer/__init__.py": {"viewer.payload"},
}


def test_imports_sit_at_module_top_but_optional_dependencies():
    hidden = []
    for module, path in package_modules().items():
        if module == "":  # the facade: its imports are for type checkers only
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        local = {line: target for target, line, at_top in imports_of(path) if not at_top}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in top:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if getattr(node, "level", 0) == 0 and all(n.split(".")[0] in LOCAL_IMPORT_OK for n in names):
                continue
            allowed = LOCAL_IMPORT_OF.get(rel, set())
            if allowed is None or local.get(node.lineno) in allowed:
                continue
            hidden.append(f"{rel}:{node.lineno}")
    assert not hidden, "function-local imports (move them to the top, or say why they must wait): " + ", ".join(hidden)


def test_tooling_lives_in_the_named_subpackages():
    # the top holds the equations of DFlash 1 and 2 in the order of the walk, the loop, and what every
    # stage shares, and target/ the targets written out here: the core; everything else is in one of
    # these (dflash_ref/README.md maps them)
    subpackages = sorted(p.parent.relative_to(PACKAGE).as_posix() for p in PACKAGE.glob("**/__init__.py"))
    assert subpackages == [".", "bench", "cli", "conformance", "conformance/causes", "conformance/endpoint",
                           "conformance/ports", "conformance/ports/engines", "conformance/ports/pypi", "drafts",
                           "extensions", "fast_cpu", "loading", "target", "tour", "trace", "training",
                           "viewer"]  # fmt: skip


def test_readme_links_resolve():
    """Every relative link in README.md, the package's README and the figures' READMEs exists, and so
    does every module the two READMEs of the walk (README.md, dflash_ref/README.md) name, relative to
    the repository or to dflash_ref/."""
    missing = []
    for doc in [
        ROOT / "README.md",
        PACKAGE / "README.md",
        PACKAGE / "conformance" / "README.md",
        ROOT / "figures" / "bench" / "README.md",
        ROOT / "figures" / "training" / "README.md",
    ]:
        text = doc.read_text()
        for link in re.findall(r"\]\(([^)#]+)\)", text):
            if not link.startswith("http") and not (doc.parent / link).exists():
                missing.append(f"{doc.relative_to(ROOT)}: {link}")
        pattern = r"`([\w/]+\.py)`" if doc.parent in (ROOT, PACKAGE) else r"`((?:dflash_ref|tests)/[\w/]+\.py)`"
        for path in re.findall(pattern, text):  # relative to the repository or to dflash_ref/
            if not ((ROOT / path).is_file() or (PACKAGE / path).is_file()):
                missing.append(f"{doc.relative_to(ROOT)}: {path}")
    assert not missing, missing


# what the core may import: the standard library, torch, einops, safetensors, and itself (anywhere in a
# module, function-local imports included): a reader who opens it meets nothing of the tools
CORE_DEPENDENCIES = {"torch", "einops", "safetensors"}


def outside_imports(source: str) -> list[tuple[str, int]]:
    """(top-level package, line) of every absolute import in `source` that is not of dflash_ref."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append(((node.module or "").split(".")[0], node.lineno))
    return [(name, line) for name, line in found if name != "dflash_ref"]


def test_outside_imports_by_hand():
    source = "import os.path\nfrom torch import nn\nfrom . import rope\n\n\ndef f():\n    import transformers\n"
    assert outside_imports(source) == [("os", 1), ("torch", 2), ("transformers", 7)]


def test_the_core_imports_only_torch_einops_safetensors_and_itself():
    import sys

    wrong = []
    for module, path in package_modules().items():
        if not module or layer_of(module) != "core":
            continue
        rel = path.relative_to(ROOT)
        source = path.read_text()
        wrong += [
            f"{rel}:{line} imports {target}" for target, line, _ in imports_of(path) if layer_of(target) != "core"
        ]
        wrong += [
            f"{rel}:{line} imports {name}"
            for name, line in outside_imports(source)
            if name not in CORE_DEPENDENCIES and name not in sys.stdlib_module_names and name != "__future__"
        ]
    assert not wrong, "the core reaches outside itself:\n" + "\n".join(wrong)


def test_importing_the_core_loads_none_of_the_tools():
    """At run time too: the loop, the DFlash 2 classes and the own targets, imported in a fresh process,
    bring in no module outside the core."""
    import subprocess
    import sys

    code = (
        "import sys, dflash_ref.decoding, dflash_ref.dflash2, dflash_ref.target\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('dflash_ref.')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    tools = [m for m in loaded.stdout.split() if layer_of(m.removeprefix("dflash_ref.")) != "core"]
    assert not tools, tools


def test_the_ports_share_one_taps_layer():
    """Every port lives in the ports' wing (conformance/ports/; port.py's own wrappers of a run function aside),
    and reads its implementation through one taps layer, torch_taps.py or mlx_taps.py: no port writes its own
    Taps, Tap, to_numpy, as_numpy or attention weights again."""
    shared = {"class Taps", "class Tap", "def to_numpy", "def as_numpy", "def _np", "def attention_weights"}
    wing = PACKAGE / "conformance" / "ports"
    again = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sorted(wing.rglob("*.py"))
        if path.name not in ("torch_taps.py", "mlx_taps.py")
        for line in path.read_text().splitlines()
        if any(line.startswith(d + ("(" if d.startswith("def") else "")) or line.startswith(d + ":") for d in shared)
    ]
    assert not again, again
    outside = [
        module
        for module, path in package_modules().items()
        if module.startswith("conformance.")
        and not module.startswith("conformance.ports")
        and module != "conformance.port"
        for line in path.read_text().splitlines()
        if line.startswith("class ") and line.rstrip(":").endswith("(Port)")
    ]
    assert not outside, f"ports outside the wing: {outside}"
