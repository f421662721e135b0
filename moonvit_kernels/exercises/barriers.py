"""Barriers in divergent code, found in a numba kernel's source before it runs.

A `cuda.syncthreads()` must be reached by every thread of the block that has not exited. One inside an `if`, a
`while` or a `for` whose condition or range depends on the thread (its index, or a value computed from it) is
reached by some threads and skipped by others: undefined behaviour on a GPU, commonly a hang. At run time the
simulator cannot tell the threads that skip it from threads that returned early before it (which is allowed),
so the checker reads the source: which names depend on the thread (assigned, directly or through other names,
from `cuda.threadIdx`, `cuda.grid`, `cuda.laneid` or a value read from an array indexed by them), and which
barriers sit under a condition that reads one.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

_THREAD_ATTRIBUTES = {"threadIdx", "laneid"}
_THREAD_CALLS = {"grid", "gridsize"}


def _reads_thread(node: ast.AST, dependent: set[str]) -> bool:
    """Whether the expression `node` reads the thread's index, directly or through a name in `dependent`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in _THREAD_ATTRIBUTES:
            return True
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in _THREAD_CALLS:
            return True
        if isinstance(sub, ast.Name) and sub.id in dependent:
            return True
    return False


def _targets(target: ast.AST) -> list[str]:
    """The names a target binds: `a`, `a, b`; not `buf[t]` (a store into an array leaves the array's name
    uniform: which element a thread writes is the index's business)."""
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for e in target.elts for n in _targets(e)]
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    return []


def thread_dependent_names(tree: ast.AST) -> set[str]:
    """The names a kernel assigns from a thread-dependent value (to a fixed point: `i = t + 1` after `t = ...`)."""
    dependent: set[str] = set()
    while True:
        before = len(dependent)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                if _reads_thread(node.value, dependent):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    dependent.update(n for t in targets for n in _targets(t))
            elif isinstance(node, ast.AugAssign) and _reads_thread(node.value, dependent):
                dependent.update(_targets(node.target))
            elif isinstance(node, ast.For) and _reads_thread(node.iter, dependent):
                dependent.update(_targets(node.target))
        if len(dependent) == before:
            return dependent


def _is_barrier(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "syncthreads"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "cuda"
    )


def divergent_barriers(source: str, first_line: int = 1) -> list[str]:
    """One sentence per `cuda.syncthreads()` of the kernel `source` (a `def`, its first line numbered
    `first_line`) that sits under a thread-dependent `if`, `while` or `for`, naming both lines."""
    tree = ast.parse(textwrap.dedent(source))
    dependent = thread_dependent_names(tree)
    found: list[str] = []

    def visit(node: ast.AST, guards: list[tuple[str, int, str]]) -> None:
        if _is_barrier(node) and guards:
            kind, line, text = guards[-1]
            found.append(
                f"divergent barrier: cuda.syncthreads() at line {node.lineno + first_line - 1} is inside "
                f"`{kind} {text}` (line {line + first_line - 1}), which depends on the thread: the threads that "
                "skip it leave the others waiting (undefined behaviour on a GPU, commonly a hang). Put the barrier "
                "where every thread of the block reaches it, and the condition around the work only."
            )
        for child in ast.iter_child_nodes(node):
            inner = guards
            if isinstance(node, ast.If | ast.While) and child is not node.test and _reads_thread(node.test, dependent):
                inner = [*guards, ("if" if isinstance(node, ast.If) else "while", node.lineno, ast.unparse(node.test))]
            elif isinstance(node, ast.For) and child is not node.iter and _reads_thread(node.iter, dependent):
                text = f"{ast.unparse(node.target)} in {ast.unparse(node.iter)}"
                inner = [*guards, ("for", node.lineno, text)]
            visit(child, inner)

    visit(tree, [])
    return found


def kernel_barrier_problems(kernel: Any) -> list[str]:
    """`divergent_barriers` of a numba kernel (its Python function's source, with the file's line numbers);
    empty when the source cannot be read (a kernel made by `exec` of a string)."""
    fn = getattr(kernel, "py_func", kernel)
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return []
    return divergent_barriers("".join(lines), first)
