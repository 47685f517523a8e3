"""The house's layering, stated once and checked on every module's imports (function-level and relative ones
included): the data flows one way (decoding -> trace -> visuals -> app), and the folders say so.

    app       may import decoding, perf, visuals, models and the root vocabulary; nothing imports app
    perf      may import decoding, models, visuals, kernels; never app or train
    decoding  imports models and kernels; never app, perf, train or visuals
    models    imports kernels; never decoding, app, perf, train or visuals
    visuals   never torch, never decoding, models, app or perf (everything is drawn from a trace)
    train     never app or perf
    kernels   never eagleviz
    root      config, trace, errors, prompts, measured, paths, journal: the shared vocabulary, importing no wing
              (cli is the command line's entry point and dispatches to the wings)
No import circle between modules. In fresh interpreters: the engine never loads gradio or plotly, the trace,
the visuals and the finder of measured results never load torch, the bench's table never loads plotly."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WINGS = ("app", "perf", "decoding", "models", "visuals", "train")
VOCABULARY = ("config", "trace", "errors", "prompts", "measured", "paths", "journal")

FORBIDDEN = {  # importer's layer -> layers (or top-level packages) it must never import
    "app": set(),
    "perf": {"app", "train"},
    "decoding": {"app", "perf", "train", "visuals"},
    "models": {"decoding", "app", "perf", "train", "visuals"},
    "visuals": {"decoding", "models", "app", "perf", "train", "torch", "gradio", "transformers"},
    "train": {"app", "perf"},
    "kernels": {"eagleviz"},
    "root": set(WINGS),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module the file at `path` imports (`imports_in` on its text, relative imports resolved)."""
    module = module_name(path)
    return imports_in(path.read_text(), module if path.stem == "__init__" else module.rpartition(".")[0])


def imports_in(source: str, package: str) -> set[str]:
    """Every module an `import` or `from ... import` in `source` names, wherever it sits; a relative import is
    resolved against `package`, the package the source's module belongs to (`from ..app import x` in
    eagleviz/perf/bench.py names eagleviz.app.x)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")  # level 1 is the package itself, each level more one package up
            base = parts[: len(parts) + 1 - node.level] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:  # `from eagleviz.app import presets` names the module eagleviz.app.presets
                sub = f"{module}.{a.name}"
                names.add(sub if is_module(sub) else module)
    return names


def is_module(name: str) -> bool:
    """Whether `name` is a module or a package of this repository."""
    path = ROOT / name.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def breaches(module: str, imports: set[str]) -> list[str]:
    """The imports a module in `module`'s layer must not make."""
    banned = FORBIDDEN.get(layer(module), set())
    return sorted(i for i in imports if layer(i) in banned or i.split(".")[0] in banned)


def layer(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "kernels":
        return "kernels"
    if parts[0] != "eagleviz":
        return parts[0]
    if len(parts) > 1 and parts[1] in WINGS:
        return parts[1]
    return "root" if len(parts) > 1 and parts[1] in VOCABULARY else "entry"


MODULES = {module_name(p): p for base in ("eagleviz", "kernels") for p in sorted((ROOT / base).rglob("*.py"))}
GRAPH = {m: {i for i in imports_of(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def test_the_vocabulary_is_all_that_sits_at_the_root():
    root = {p.stem for p in (ROOT / "eagleviz").glob("*.py")} - {"__init__", "__main__", "cli"}
    assert root == set(VOCABULARY)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_from_a_lower_layer_to_a_higher_one(module):
    found = breaches(module, imports_of(MODULES[module]))
    assert found == [], f"{module} ({layer(module)}) imports {found}"


def test_a_relative_import_that_climbs_a_layer_is_caught():
    """Relative imports are resolved against the importer's package, so they cannot slip past the rules."""
    climbs = "from ..app import handlers\nfrom .. import train\nfrom . import tune\n"
    found = imports_in(climbs, "eagleviz.perf")
    assert found == {"eagleviz.app.handlers", "eagleviz.train", "eagleviz.perf.tune"}
    assert breaches("eagleviz.perf.bench", found) == ["eagleviz.app.handlers", "eagleviz.train"]
    assert imports_in("from .tree import VerifyTree\n", "eagleviz.decoding") == {"eagleviz.decoding.tree"}


def test_nothing_imports_the_app_from_outside_it():
    outside = sorted((m, i) for m, deps in GRAPH.items() for i in deps
                     if layer(i) == "app" and layer(m) != "app")
    assert outside == []


def test_no_import_circle():
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                pytest.fail("import circle: " + " -> ".join(stack[stack.index(d):] + [d]))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m)


CASES = [
    ("eagleviz.decoding.engine", {"gradio", "plotly"}),
    ("eagleviz.trace", {"torch", "gradio", "plotly", "transformers"}),
    ("eagleviz.visuals", {"torch", "gradio", "transformers"}),
    ("eagleviz.visuals.table", {"torch", "gradio", "plotly", "transformers"}),  # bench's table on a bare machine
    ("eagleviz.measured", {"torch", "gradio", "plotly", "transformers"}),
    ("eagleviz.paths", {"torch", "gradio", "plotly", "transformers"}),
]


@pytest.mark.parametrize("module,forbidden", CASES)
def test_module_does_not_import(module, forbidden):
    code = (f"import sys, importlib; m = importlib.import_module({module!r}); "
            "[getattr(m, name) for name in getattr(m, '__all__', ())]; "  # a package's names load on first use
            f"print(sorted(m for m in {sorted(forbidden)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"{module} imports {out}"
