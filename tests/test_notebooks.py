"""The workbook: every notebook runs headless, and the committed copies carry clean outputs.

Each notebook is a pair: `NN_name.py` (jupytext percent format, the reviewable source) and
`NN_name.ipynb` (the same cells, committed with outputs). Edit either and run
`python scripts/execute_notebooks.py` to sync the pair and re-execute it; the tests fail when a pair
is out of sync. Each notebook is executed from a fresh kernel ("python3") in a scratch working
directory, as a learner would run it from anywhere; with no GPU its first cell turns on the CUDA
simulator and it picks tiny sizes. The committed outputs must show that run: every code cell executed
in order, some outputs, and no error among them.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
EXPECTED = [
    "00_tour",
    "00a_warmups",
    "01_patch_embed_gemm",
    "02_rmsnorm",
    "03_rope_2d",
    "04_attention",
    "05_merge_and_projector",
    "06_full_encoder",
    "07_performance_without_a_gpu",
    "08_hopper",
    "09_two_compilers",
]
IDS = [p.stem for p in NOTEBOOKS]


def code_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_every_stage_has_a_notebook():
    assert IDS == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_and_its_py_pair_hold_the_same_cells(path):
    import jupytext

    pair = path.with_suffix(".py")
    assert pair.is_file(), f"{path.name} has no jupytext pair {pair.name}"
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent", f"{path.name} is not paired"
    text = jupytext.read(pair)
    got = [(c.cell_type, c.source.strip()) for c in nb.cells]
    want = [(c.cell_type, c.source.strip()) for c in text.cells]
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        assert a == b, f"{path.name} cell {i} differs from {pair.name}: run python scripts/execute_notebooks.py"
    assert len(got) == len(want), f"{path.name} has {len(got)} cells, {pair.name} {len(want)}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_committed_outputs_are_clean(path):
    nb = nbformat.read(path, as_version=4)
    cells = code_cells(nb)
    counts = [c.execution_count for c in cells]
    assert None not in counts, f"{path.name}: cells {[i for i, n in enumerate(counts) if n is None]} never ran"
    assert counts == list(range(1, len(cells) + 1)), f"{path.name}: not run top to bottom in one kernel: {counts}"
    outputs = [o for c in cells for o in c.outputs]
    assert outputs, f"{path.name} was committed without outputs"
    errors = [f"{o.ename}: {o.evalue}" for o in outputs if o.output_type == "error"]
    assert not errors, f"{path.name} was committed with errors: {errors}"
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} shows no picture"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=IDS)
def test_notebook_follows_the_workbook_rules(path):
    nb = nbformat.read(path, as_version=4)
    cells = code_cells(nb)
    assert "use_simulator_without_gpu()" in cells[0].source, "the first cell must set up the simulator"
    setup = cells[0].source
    switch = setup.index("use_simulator_without_gpu()")
    numba_import = re.search(r"^\s*(from|import)\s+(numba|moonvit_kernels\.(numba_backend|model))", setup, re.M)
    assert numba_import is None or numba_import.start() > switch, "numba is imported before the simulator switch"
    for c in cells:
        assert "matplotlib.use(" not in c.source, "a notebook must not force a matplotlib backend"
    headings = [c.source for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises")]
    assert headings, f"{path.name} has no '## Exercises' section"
    start = nb.cells.index(
        next(c for c in nb.cells if c.cell_type == "markdown" and c.source.startswith("## Exercises"))
    )
    asserts = [c for c in nb.cells[start:] if c.cell_type == "code" and re.search(r"^\s*assert ", c.source, re.M)]
    assert asserts, f"{path.name}: exercises have no checking assert"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_markdown_heading_hides_in_a_code_cell(path):
    """A `# ### Heading` comment in a code cell is markdown that lost its `# %% [markdown]` line: the learner sees
    a comment where a section should start (as "Worked exercises" did in 01, 02 and 05)."""
    nb = nbformat.read(path, as_version=4)
    hidden = [line for c in code_cells(nb) for line in c.source.splitlines() if re.match(r"^# #{1,6} \S", line)]
    assert not hidden, f"{path.name}: markdown headings inside code cells: {hidden}"


def run_notebook(path, tmp_path):
    """Execute `path` top to bottom in a fresh kernel from `tmp_path`; fail on any error."""
    from jupyter_client import KernelManager
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    committed = [output_structure(c) for c in code_cells(nb)]
    for c in code_cells(nb):
        c.outputs = []
        c.execution_count = None
    # The kernel talks over Unix sockets in a folder of its own: TCP ports are picked free and then released
    # before the kernel binds them, so beside other notebook kernels and Ray a port can be taken in between
    # (seen in CI: "Address already in use", "Kernel died before replying to kernel_info").
    sockets = tempfile.mkdtemp(prefix="nbk")  # short: a Unix socket path has at most 107 bytes
    km = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "k"))
    client = NotebookClient(
        nb,
        km=km,
        shutdown_kernel="immediate",  # killed when done: a graceful shutdown waits up to 5 s per notebook
        timeout=600,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(tmp_path)}},  # any working directory
    )
    try:
        client.execute(cleanup_kc=True)  # a kernel manager passed in is otherwise left running until exit
    except CellExecutionError as e:
        pytest.fail(f"{path.name} failed:\n{e}")
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
    assert not km.has_kernel, f"{path.name}: the kernel still runs after its notebook"
    errors = [o for c in code_cells(nb) for o in c.outputs if o.output_type == "error"]
    assert not errors
    fresh = [output_structure(c) for c in code_cells(nb)]
    stale = [i for i, (a, b) in enumerate(zip(committed, fresh, strict=True)) if a != b]
    assert not stale, (
        f"{path.name}: the committed outputs of code cells {stale} are not what a fresh run gives "
        f"(committed {[committed[i] for i in stale][:3]}, fresh {[fresh[i] for i in stale][:3]}): "
        "re-execute it (python scripts/execute_notebooks.py)"
    )


def output_structure(cell: nbformat.NotebookNode) -> tuple:
    """What a code cell shows, without its exact text: its pictures, tables and values (the kinds of its
    rich outputs and their MIME types), and whether it prints at all. Printed text itself is left out: build
    and cache messages come and go between runs."""
    rich = tuple((o.output_type, tuple(sorted(o.get("data", {})))) for o in cell.outputs if o.output_type != "stream")
    prints = any(o.output_type == "stream" and o.get("name") == "stdout" for o in cell.outputs)
    return rich, prints


# The runs are the suite's longest module: two classes, so that pytest-xdist (one scope per class) gives each half
# to its own worker. The split is by the notebooks' running time (~165 s and ~135 s on 2 cores).
FIRST_HALF = [p for p in NOTEBOOKS if p.name < "06"]
SECOND_HALF = [p for p in NOTEBOOKS if p.name >= "06"]


@pytest.mark.slow
class TestRunThroughTheStages:
    @pytest.mark.parametrize("path", FIRST_HALF, ids=[p.stem for p in FIRST_HALF])
    def test_notebook_runs(self, path, tmp_path):
        run_notebook(path, tmp_path)


@pytest.mark.slow
class TestRunTheEncoderAndBeyond:
    @pytest.mark.parametrize("path", SECOND_HALF, ids=[p.stem for p in SECOND_HALF])
    def test_notebook_runs(self, path, tmp_path):
        run_notebook(path, tmp_path)


def test_the_halves_hold_every_notebook_once():
    assert sorted(FIRST_HALF + SECOND_HALF) == NOTEBOOKS and FIRST_HALF and SECOND_HALF
