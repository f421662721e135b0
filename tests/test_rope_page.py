"""The page of `rope --html`, its script run: QuickJS (a JavaScript engine, pip-installed) executes the page's own
`<script>` against a small stand-in of the DOM (elements with value / checked / textContent and listeners, and a
2-D canvas that records its pixels), then the test moves the controls as a reader would and reads what the page
drew. Not a browser: layout and CSS are not checked; what the script computes and draws is.
"""

from __future__ import annotations

import json
import math
import re

import pytest

from moonvit_kernels import rope_command

pytest.importorskip("quickjs", reason="quickjs (the test extra) is not installed")
import quickjs  # noqa: E402

# The DOM the page's script touches: getElementById, input values, textContent, events, canvas 2-D contexts.
DOM = r"""
const elements = {};
function canvas(width, height) {
  const pixels = new Uint8ClampedArray(width * height * 4);
  const ctx = {
    cells: [], fillStyle: "",
    createImageData: (w, h) => ({width: w, height: h, data: new Uint8ClampedArray(w * h * 4)}),
    putImageData: (img) => pixels.set(img.data),
    fillRect: function () { this.cells.push(this.fillStyle); },
  };
  return {width, height, pixels, getContext: () => ctx, ctx};
}
function element(id) {
  const sizes = {map: [320, 320], off: [325, 325]};
  const e = sizes[id] ? canvas(...sizes[id]) : {};
  Object.assign(e, {id, value: "", checked: false, textContent: "", max: "", listeners: [],
                    addEventListener(type, fn) { this.listeners.push(fn); }});
  return e;
}
const defaults = {fi: "0", axis: "w", ww: "100", hw: "35"};
const document = {getElementById(id) {
  if (!elements[id]) { elements[id] = element(id); if (id in defaults) elements[id].value = defaults[id]; }
  return elements[id];
}};
function set(id, value) {
  const e = document.getElementById(id);
  if (typeof value === "boolean") e.checked = value; else e.value = String(value);
  e.listeners.forEach(fn => fn());
}
function mapValues() {  // the red channel of the slot map along its first row and first column
  const c = elements.map, row = [], col = [];
  for (let x = 0; x < c.width; x++) row.push(c.pixels[4 * x]);
  for (let y = 0; y < c.height; y++) col.push(c.pixels[4 * y * c.width]);
  return JSON.stringify({row, col});
}
"""


def _script(page: str) -> str:
    (script,) = re.findall(r"<script>(.*?)</script>", page, re.S)
    return script


@pytest.fixture
def page(tmp_path):
    """The page for head_dim 64 on a 30 x 46 grid (pictures are not part of what the script reads)."""
    ctx = quickjs.Context()
    ctx.eval(DOM)
    ctx.eval(_script(rope_command.html_page(64, (30, 46), [])))
    return ctx


def _turns(text: str) -> float:
    return float(re.search(r"it turns ([0-9.]+) times", text)[1])


def test_the_slot_map_is_drawn_and_says_how_often_the_slot_turns(page):
    """At load: frequency 0 (f = 1 rad/patch), the width slot, a 46-patch side: (46 − 1)·1 / 2π turns, and the
    canvas holds cos(column) — changing along a row, constant down a column."""
    info = page.eval("elements.mapinfo.textContent")
    assert info.startswith("slot 0: cos(angle) over a 46×46 grid")
    assert _turns(info) == pytest.approx(45 / (2 * math.pi), abs=5e-4)
    drawn = json.loads(page.eval("mapValues()"))
    assert len(set(drawn["row"])) > 10 and len(set(drawn["col"])) == 1


def test_the_controls_redraw_the_map(page):
    """The height slot turns with the row (the picture transposes); a higher frequency turns slower, as
    f_i = θ^(−4i/hd) says; a smaller grid turns less."""
    page.eval('set("axis", "h")')
    drawn = json.loads(page.eval("mapValues()"))
    assert len(set(drawn["col"])) > 10 and len(set(drawn["row"])) == 1
    assert page.eval("elements.mapinfo.textContent").startswith("slot 1: ")
    page.eval('set("fi", 5)')
    f5 = 10000 ** (-4 * 5 / 64)
    assert f"f = {f5:.3g} rad/patch" in page.eval("elements.fiv.textContent")
    assert _turns(page.eval("elements.mapinfo.textContent")) == pytest.approx(45 * f5 / (2 * math.pi), abs=5e-4)
    page.eval('set("side", 8)')
    assert _turns(page.eval("elements.mapinfo.textContent")) == pytest.approx(7 * f5 / (2 * math.pi), abs=5e-4)


def test_the_offset_picture_fills_every_cell_and_the_swap_transposes_it(page):
    """65 x 65 offsets, each a filled cell, not all alike; swapping width and height (the bug the checkbox shows)
    draws the transpose: the cell of offset (row, column) takes the colour of (column, row)."""
    n = 65
    first = json.loads(page.eval("JSON.stringify(elements.off.ctx.cells)"))
    assert len(first) == n * n and len(set(first)) > 20
    page.eval('set("swap", true)')
    cells = json.loads(page.eval("JSON.stringify(elements.off.ctx.cells)"))
    swapped = cells[n * n :]
    assert len(swapped) == n * n and swapped != first
    assert swapped == [first[c * n + r] for r in range(n) for c in range(n)]


def test_the_page_carries_its_parameters_and_no_network(tmp_path):
    page = rope_command.html_page(64, (30, 46), [])
    params = json.loads(re.search(r"const P = (\{.*?\});", page)[1])
    assert params == {"headDim": 64, "theta": rope_command.THETA, "rows": 30, "cols": 46}
    assert "http://" not in page and "https://" not in page and "<script src" not in page
