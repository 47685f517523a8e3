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
    speed           measured speed: the bench table and bar chart, the verification cost curve cost(n) / cost(1)
    fit             what fits where: each figure laid out for a phone's width, its title under Plotly's toolbar
"""

from eagleviz.visuals.accepted_path import accepted_path_figure
from eagleviz.visuals.attention_mask import attention_mask_figure
from eagleviz.visuals.draft_tree import draft_tree_figure
from eagleviz.visuals.kv_rewind import kv_rewind_figure
from eagleviz.visuals.replay import replay_acceptance, replay_figure
from eagleviz.visuals.speed import SpeedView, bench_figure, speed_view, verify_cost_figure
from eagleviz.visuals.summary import summary_figure
from eagleviz.visuals.views import CycleView, check_displayable, cycle_view, empty_view

__all__ = ["accepted_path_figure", "attention_mask_figure", "draft_tree_figure", "kv_rewind_figure",
           "replay_acceptance", "replay_figure", "summary_figure", "CycleView", "check_displayable", "cycle_view",
           "empty_view", "SpeedView", "bench_figure", "speed_view", "verify_cost_figure"]
