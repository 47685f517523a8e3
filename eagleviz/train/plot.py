"""The training curve: loss and top-1 agreement with the target, train and held-out, as one Plotly page."""

from __future__ import annotations

from pathlib import Path


def curve_figure(history: list[dict], title: str = ""):
    """Two panels over training steps: loss (left) and top-1 at unroll step 0 (right)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "top-1 agreement with the target"))
    series = (("train", "#1f77b4"), ("heldout", "#d62728"))
    for split, color in series:
        points = [h for h in history if split in h]
        steps = [h["step"] for h in points]
        fig.add_scatter(x=steps, y=[h[split]["loss"] for h in points], name=f"{split} loss", row=1, col=1,
                        line={"color": color})
        fig.add_scatter(x=steps, y=[h[split]["acc"][0] for h in points], name=f"{split} top-1", row=1, col=2,
                        line={"color": color})
    ho = [h for h in history if "heldout" in h]
    if ho and len(ho[0]["heldout"]["acc"]) > 1:
        for k in range(1, len(ho[0]["heldout"]["acc"])):
            fig.add_scatter(x=[h["step"] for h in ho], y=[h["heldout"]["acc"][k] for h in ho],
                            name=f"heldout top-1, unroll step {k}", row=1, col=2,
                            line={"color": "#d62728", "dash": "dot", "width": 1}, opacity=1 - 0.15 * k)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title=title, height=420, width=1100, template="plotly_white")
    return fig


def write_curve(history: list[dict], path: Path, title: str = "") -> bool:
    """A small HTML file (plotly.js from its CDN) with the curves of `history`; False, and no file, where plotly
    is not installed (a GPU machine lent bare: history.json holds the same numbers)."""
    try:
        figure = curve_figure(history, title)
    except ImportError:
        return False
    figure.write_html(str(path), include_plotlyjs="cdn", full_html=True)
    return True
