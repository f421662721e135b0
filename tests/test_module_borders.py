"""Borders between the package's modules: no import cycles (lazy imports inside functions included), every
package folder a real package, `weights` never reaching for `hub`, and "is this path remote" decided in one place."""

import ast
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
