"""Pictures and tables of the model, one module per topic; every name is re-exported here.

Each picture is split in two: a function that computes what is drawn (plain data, tested) and a plot
function that draws it and returns a `matplotlib.figure.Figure` built without pyplot (no backend is
chosen, nothing is shown twice; Jupyter displays a figure that ends a cell; save with `fig.savefig`).

- `model`: The tower as a whole: stage shapes and the architecture figure, parameter and FLOP tables.
- `rope`: 2D RoPE: angle/frequency maps over the patch grid, offset invariance of q·k, which dims pair up.
- `norm`: RMSNorm: how eps shrinks the output of low-variance rows.
- `position`: Absolute position embedding: the learned grid resized to several patch grids.
- `attention`: Attention over packed items: the block-diagonal mask, score-memory table, the online softmax traced.
- `merge`: Patch merge: which merged token and slot each source patch lands in, merged tokens back on the grid.
- `images`: Images: the patch (and merge) grid over a picture, PCA of patch features as colours.
- `errors`: Errors: |got − ref| heat maps, and a backend comparison (`compare.StageReport`) per stage.
- `launch`: Launches: which block and thread of a 2-D grid owns each element of an output.
- `prediction`: Prediction beside measurement: the X-ray's roofline for a stage's kernels, gpu_check's numbers.
- `timing`: Timing and tables: median of repeated calls, labelled bars of times, Markdown tables.
"""

from .attention import (
    MemoryRow,
    attention_kv_traffic,
    attention_mask,
    attention_mask_picture,
    attention_memory_table,
    online_softmax_trace,
    plot_online_softmax,
)
from .errors import error_heatmap, error_matrix, plot_stage_report, stage_report_series
from .images import patch_grid_overlay, pca_colors, pca_overlay
from .launch import launch_owners, plot_launch_map
from .merge import merge_index_map, merge_index_table, merged_to_grid
from .model import CountRow, Stage, flop_table, parameter_table, plot_architecture, stage_shapes
from .norm import plot_eps_effect, rmsnorm_output_rms
from .position import plot_position_grids, position_grids
from .prediction import measured_reports, prediction_rows
from .rope import (
    RopePair,
    k3_map_frequencies,
    plot_raster_vs_2d,
    plot_rope_comb,
    plot_rope_k3_maps,
    plot_rope_offset_map,
    plot_rope_pairing,
    raster_vs_2d_scores,
    rope_angle_maps,
    rope_angle_range,
    rope_comb,
    rope_frequency_maps,
    rope_offset_invariance,
    rope_offset_map,
    rope_offset_scores,
    rope_pairs,
    rope_wavelengths,
)
from .timing import markdown_table, median_seconds, plot_timings

__all__ = [
    "Stage",
    "stage_shapes",
    "plot_architecture",
    "CountRow",
    "parameter_table",
    "flop_table",
    "rope_angle_maps",
    "rope_comb",
    "plot_rope_comb",
    "rope_offset_map",
    "plot_rope_offset_map",
    "plot_raster_vs_2d",
    "raster_vs_2d_scores",
    "rope_wavelengths",
    "k3_map_frequencies",
    "plot_rope_k3_maps",
    "rope_frequency_maps",
    "rope_angle_range",
    "rope_offset_scores",
    "rope_offset_invariance",
    "RopePair",
    "rope_pairs",
    "plot_rope_pairing",
    "rmsnorm_output_rms",
    "plot_eps_effect",
    "position_grids",
    "plot_position_grids",
    "attention_mask",
    "attention_mask_picture",
    "MemoryRow",
    "attention_memory_table",
    "attention_kv_traffic",
    "online_softmax_trace",
    "plot_online_softmax",
    "merge_index_table",
    "merge_index_map",
    "merged_to_grid",
    "launch_owners",
    "plot_launch_map",
    "patch_grid_overlay",
    "pca_colors",
    "pca_overlay",
    "error_matrix",
    "error_heatmap",
    "stage_report_series",
    "plot_stage_report",
    "measured_reports",
    "prediction_rows",
    "median_seconds",
    "plot_timings",
    "markdown_table",
]
