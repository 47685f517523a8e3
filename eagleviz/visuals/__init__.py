"""Trace -> Plotly figures. Imports no torch and no gradio: everything is drawn from a `RunTrace`, except the
measured speed, drawn from the JSON results of `bench` and `tune`.

    draft_tree      the cycle's draft tree (tidy layout, status by shape, cumulative draft probability)
    attention_mask  the verification mask: prefix block | tree block
    accepted_path   per depth: draft vs target, accept or reject; p, q and u bars at T > 0
    kv_rewind       target and draft caches before and after the commit
    summary         accept length per cycle, n-alpha, time per phase
    replay          the acceptance step replayed many times against the target distribution
    explain         plain-language texts with the cycle's numbers
    views           everything for one selected cycle, and the checks for imported traces
    speed           measured speed: the bench's bar chart, the verification cost curve cost(n) / cost(1)
    table           the bench result as a Markdown table (no Plotly: `bench` writes it on a machine without it)
    fit             what fits where: each figure laid out for a phone's width, its title under Plotly's toolbar

The names below are imported from their modules on first use (PEP 562), so that `eagleviz.visuals.table`
loads without Plotly: `bench`, `ceiling` and `tune` run on a machine that has none.
"""

from __future__ import annotations

import importlib

EXPORTS = {  # name -> the module that defines it
    "accepted_path_figure": "accepted_path", "attention_mask_figure": "attention_mask",
    "draft_tree_figure": "draft_tree", "kv_rewind_figure": "kv_rewind", "replay_acceptance": "replay",
    "replay_figure": "replay", "summary_figure": "summary", "CycleView": "views", "check_displayable": "views",
    "cycle_view": "views", "empty_view": "views", "SpeedView": "speed", "bench_figure": "speed",
    "speed_view": "speed", "verify_cost_figure": "speed",
}
__all__ = list(EXPORTS)


def __getattr__(name: str):
    if name not in EXPORTS:  # a submodule (`from eagleviz.visuals import compare`) is imported by Python itself
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
