"""Borders between the package's modules: no import cycles (lazy imports inside functions included), the lesson
apart from the tools, every package folder a real package, `weights` never reaching for `hub`, and "is this path
remote" decided in one place."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "moonvit_kernels"


def module_files(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__) for every .py file under `package`."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside `if TYPE_CHECKING:` blocks: annotations only, never executed."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def _absolute(module: str | None, level: int, here: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = here.split(".") if is_package else here.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (top level or inside functions);
    `from .a import b` counts as importing `a.b` when that is a module, else `a`."""
    modules = module_files(package)
    graph = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        skipped = _type_checking_only(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node.module, node.level, name, is_package)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)  # a module's own parent packages are imported by Python itself
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other (strongly connected components of more than one
    module), each sorted; found by Tarjan's algorithm, iteratively."""
    index, low, on_stack, stack, groups = {}, {}, set(), [], []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "moonvit_kernels.hub" in graph["moonvit_kernels.checkpoints"]
    assert cycles(graph) == []


def test_weights_never_imports_hub():
    assert not {"moonvit_kernels.hub", "moonvit_kernels.checkpoints"} & import_graph(PACKAGE)["moonvit_kernels.weights"]


def _write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_the_cycle_finder_sees_lazy_relative_and_deep_cycles(tmp_path):
    pkg = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "from .b import f\n",
            "b.py": "def f():\n    from . import c  # lazy\n",
            "c.py": "import pkg.sub.d\n",
            "sub/__init__.py": "",
            "sub/d.py": "from ..a import f\n",
            "e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .f import X\n",
            "f.py": "from .e import TYPE_CHECKING\nfrom . import a\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.b"] == {"pkg.c"} and graph["pkg.sub.d"] == {"pkg.a"} and graph["pkg.e"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.sub.d"]]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert cycles(import_graph(pkg)) == []


# ============================================================================ the lesson and the tools
TOOLS = "moonvit_kernels.tools"
# Where the lesson (everything outside moonvit_kernels/tools) may import a tool: a notebook teaches that tool there.
# Keys and values are module prefixes; each line says which notebook teaches it.
TAUGHT_TOOLS = {
    # the exercise checker runs a learner's kernel on the CPU stand-ins (notebooks 00-08)
    "moonvit_kernels.exercises": ("tools.emulation", "tools.simulator", "tools.xray"),
    # with the simulator on, numba's cuda gets the simulator's stand-ins (notebook 00: what the simulator is)
    "moonvit_kernels.numba_backend._cuda": ("tools.simulator",),
    # the prediction tables of notebooks 00, 01, 03, 06 and 09 are the X-ray's (notebook 07 teaches it)
    "moonvit_kernels.plots.prediction": ("tools.xray",),
}
ALIASES = {"moonvit_kernels.gpu_check"}  # `python -m moonvit_kernels.gpu_check`, the short name of the tool


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def border_crossings(graph: dict[str, set[str]], taught: dict[str, tuple[str, ...]], tools: str) -> list[str]:
    """ "lesson module -> tool module" for every import from outside `tools` into it that `taught` does not
    allow (`taught`: lesson prefix -> tool prefixes relative to the package, e.g. "tools.xray")."""
    root = tools.split(".")[0]
    found = []
    for module, targets in sorted(graph.items()):
        if _under(module, tools) or module in ALIASES:
            continue
        allowed = [f"{root}.{t}" for prefix, ts in taught.items() if _under(module, prefix) for t in ts]
        for target in sorted(targets):
            if target != tools and _under(target, tools) and not any(_under(target, a) for a in allowed):
                found.append(f"{module} -> {target}")
    return found


def test_the_lesson_imports_a_tool_only_where_a_notebook_teaches_it():
    graph = import_graph(PACKAGE)
    assert border_crossings(graph, TAUGHT_TOOLS, TOOLS) == []
    tool_modules = [m for m in graph if _under(m, TOOLS)]
    assert {f"{TOOLS}.emulation", f"{TOOLS}.xray", f"{TOOLS}.gpu_check", f"{TOOLS}.compile_check"} <= set(tool_modules)


def test_every_backend_module_serves_the_lesson():
    """A learner opening numba_backend/ or cuda_backend/ sees kernels, launchers and what runs them: no module
    there is used by the tools alone (own_kernels is an entry point: notebook 06 imports it)."""
    graph = import_graph(PACKAGE)
    used_by_lesson = {t for m, ts in graph.items() if not _under(m, TOOLS) for t in ts if t != m}
    backends = [m for m in graph if m.split(".")[1:2] in (["numba_backend"], ["cuda_backend"]) and m.count(".") > 1]
    assert [m for m in backends if m not in used_by_lesson and not m.endswith(".own_kernels")] == []


def test_the_border_check_sees_a_crossing(tmp_path):
    pkg = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "kernels.py": "def f():\n    from pkg.tools import emulator  # lazy\n",
            "exercises.py": "from pkg.tools.emulator import run\n",
            "plots.py": "from .tools import xray\n",
            "tools/__init__.py": "",
            "tools/emulator.py": "import pkg.kernels\n",
            "tools/xray.py": "",
        },
    )
    graph = import_graph(pkg)
    taught = {"pkg.exercises": ("tools.emulator",)}
    assert border_crossings(graph, taught, "pkg.tools") == [
        "pkg.kernels -> pkg.tools.emulator",
        "pkg.plots -> pkg.tools.xray",
    ]
    assert (
        border_crossings(graph, {**taught, "pkg.kernels": ("tools",), "pkg.plots": ("tools.xray",)}, "pkg.tools") == []
    )


# ============================================================================ every own import resolves
def top_level_names(path: Path) -> set[str]:
    """Names a module binds at its top level (defs, classes, assignments, imports, also inside top-level if/try)."""
    names = set()
    for stmt in ast.parse(path.read_text(encoding="utf-8")).body:
        nodes = ast.walk(stmt) if isinstance(stmt, (ast.If, ast.Try)) else [stmt]
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def unresolved_imports(package: Path) -> list[str]:
    """Imports of the package's own modules, anywhere in a file (inside functions too), that name a module or a
    top-level name that does not exist: "file:line what"."""
    modules, root = module_files(package), package.name
    found = []
    for name, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                          if a.name.split(".")[0] == root and a.name not in modules]  # fmt: skip
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(node.module, node.level, name, is_package)
                if base.split(".")[0] != root:
                    continue
                if base not in modules:
                    found.append(f"{path.name}:{node.lineno} from {base}: no such module")
                    continue
                names = top_level_names(modules[base][0])
                found += [f"{path.name}:{node.lineno} from {base} import {a.name}" for a in node.names
                          if a.name != "*" and a.name not in names and f"{base}.{a.name}" not in modules]  # fmt: skip
    return found


def test_every_import_of_the_package_resolves_lazy_ones_included():
    """Code that only a GPU runs (gpu_check's device paths, CuPy branches) imports lazily, inside functions, and is
    never executed here: a moved or renamed module would break it only on a GPU. Resolved without importing."""
    assert unresolved_imports(PACKAGE) == []


def unresolved_module_strings(package: Path) -> list[str]:
    """String constants that are a dotted name under the package (a module handed to `python -m`, `importlib`, a
    subprocess) naming no module and no top-level name of one: "file:line name"."""
    modules, root = module_files(package), package.name
    found = []
    for path, _ in modules.values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            dotted = node.value
            if not re.fullmatch(rf"{root}(\.\w+)+", dotted) or dotted in modules:
                continue
            owner, _, attr = dotted.rpartition(".")
            if owner not in modules or attr not in top_level_names(modules[owner][0]):
                found.append(f"{path.name}:{node.lineno} {dotted}")
    return found


def test_every_module_named_in_a_string_exists():
    assert unresolved_module_strings(PACKAGE) == []


def test_the_resolvers_see_stale_lazy_imports_and_module_names(tmp_path):
    pkg = _write(
        tmp_path / "pkg",
        {
            "__init__.py": "",
            "a.py": "X = 1\ndef f():\n    from pkg.old_place import g\n    from .b import missing, Y\n",
            "b.py": "try:\n    Y = 2\nexcept ImportError:\n    pass\n",
            "c.py": "import pkg.a\nimport pkg.gone\nfrom . import a, b\n",
            "d.py": "RUN = ['-m', 'pkg.old.worker']\nOK = ('pkg.a', 'pkg.a.X', 'pkg.b.Z', 'a pkg.gone text')\n",
        },
    )
    assert unresolved_module_strings(pkg) == ["d.py:1 pkg.old.worker", "d.py:2 pkg.b.Z"]
    assert unresolved_imports(pkg) == [
        "a.py:3 from pkg.old_place: no such module",
        "a.py:4 from pkg.b import missing",
        "c.py:2 import pkg.gone",
    ]


def package_folders(package: Path) -> list[Path]:
    """Every folder under `package` (itself included) that holds Python files."""
    return sorted({p.parent for p in package.rglob("*.py") if "__pycache__" not in p.parts})


def test_every_package_folder_has_an_init():
    folders = package_folders(PACKAGE)
    assert PACKAGE / "tools" / "emulation" in folders
    assert [f for f in folders if not (f / "__init__.py").is_file()] == []


def test_the_init_check_sees_a_folder_without_one(tmp_path):
    pkg = _write(tmp_path / "pkg", {"__init__.py": "", "sub/mod.py": "", "sub/deeper/x.py": "", "notes/a.txt": ""})
    assert [f for f in package_folders(pkg) if not (f / "__init__.py").is_file()] == [
        pkg / "sub",
        pkg / "sub" / "deeper",
    ]


# ============================================================================ remote: one definition
def remote_tests(path: Path) -> list[str]:
    """Places in one source file that decide "is this path remote" themselves: a definition of
    `is_remote`, a `"://" in x` test, or `.startswith(...)` with a URL scheme ending in "://" (`hub` telling
    `hf://` from `http(s)://` once a source is known to be remote is dispatch, not this test)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef) and node.name == "is_remote":
            found.append(f"{path.name}:{node.lineno} def is_remote")
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if isinstance(node.left, ast.Constant) and node.left.value == "://":
                found.append(f"{path.name}:{node.lineno} '://' in")
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
            schemes = [c.value for a in node.args for c in ast.walk(a) if isinstance(c, ast.Constant)]
            if any(isinstance(s, str) and s.endswith("://") and s != "hf://" for s in schemes):
                found.append(f"{path.name}:{node.lineno} startswith{tuple(schemes)}")
    return found


def test_is_this_path_remote_is_decided_once():
    found = {path: remote_tests(path) for path in PACKAGE.rglob("*.py")}
    assert {p.name for p, places in found.items() if places} == {"remote.py"}, found
    assert remote_tests(PACKAGE / "remote.py") == ["remote.py:17 def is_remote"]


def test_the_remote_scan_sees_each_form(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "def is_remote(p):\n    return '://' in p\n"
        "x = s.startswith(('http://', 'https://'))\ny = s.startswith('hf://')\nz = '://' not in s\n"
    )
    assert sorted(line.split(" ")[0] for line in remote_tests(src)) == ["m.py:1", "m.py:2", "m.py:3", "m.py:5"]


@pytest.mark.parametrize(
    "source, remote",
    [
        ("hf://moonshotai/Kimi-K3", True),
        ("hf://org/repo@v2", True),
        ("https://host/ckpt/", True),
        ("http://127.0.0.1:8000", True),
        ("ckpt/hf", False),
        ("data/tiny", False),
        ("s3://bucket/ckpt", False),
        ("HF://org/repo", False),
        (" hf://org/repo", False),
        (Path("hf://org/repo"), False),
    ],
)
def test_is_remote(source, remote):
    from moonvit_kernels.remote import is_remote

    assert is_remote(source) is remote


def test_cli_only_parses_arguments_and_dispatches():
    tree = ast.parse((PACKAGE / "cli.py").read_text(encoding="utf-8"))
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == ["build_parser", "main"]
