"""Sync each notebook with its jupytext pair, execute it headless and save it with its outputs.

    python scripts/execute_notebooks.py              # every notebook
    python scripts/execute_notebooks.py 03 04        # those whose name starts with 03 or 04

The newer file of each pair (`notebooks/NN_name.py` ⇄ `.ipynb`) wins the sync, as `jupytext --sync`
decides. Each notebook runs in a fresh "python3" kernel from a scratch directory (the notebooks find
the bundled data through the package, not the working directory); with no GPU they run on the
CUDA simulator. A failing cell stops the script with its error and leaves the notebook unsaved.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"


def execute(path: Path) -> float:
    """Run `path` top to bottom in a fresh kernel, write it back with outputs; seconds taken."""
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cwd:
        NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(prefixes: list[str]) -> int:
    notebooks = sorted(p for p in NOTEBOOK_DIR.glob("*.ipynb") if not prefixes or p.stem.startswith(tuple(prefixes)))
    for path in notebooks:
        pair = path.with_suffix(".py")
        subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--sync", str(pair)], check=True)
        print(f"{path.name}: {execute(path):.1f} s", flush=True)
        subprocess.run([sys.executable, "-m", "jupytext", "--quiet", "--sync", str(path)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
