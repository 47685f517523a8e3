"""Numbers a visitor types into the page's knobs, and the ranges the page offers.

Gradio's own slider refuses a typed value outside its range with a red "Error: Value 10000 is greater than
maximum value 8." and an empty box with a server traceback (`None < minimum`). The page's sliders are `Knob`s:
a typed value outside the range is taken as the nearest end of it (the box then shows that end), an empty or
non-finite one as the knob's value when the page was built. A handler always receives a number in range.

    RANGES   the page's range for each knob with a fixed range (a link is held to the same ranges,
             `eagleviz.app.share`); draft tokens and max new tokens end at the server's limits
"""

from __future__ import annotations

import math
from abc import ABCMeta

import gradio as gr

RANGES = {"steps": (1, 8), "topk": (1, 8), "temperature": (0.0, 1.5), "top_p": (0.05, 1.0)}


def clamp(value, lo: float | None, hi: float | None, fallback):
    """`value` moved into [lo, hi] (either end None: open); None, a non-number or NaN gives `fallback`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return fallback
    if math.isnan(number):
        return fallback
    if lo is not None and number < lo:
        return lo
    if hi is not None and number > hi:
        return hi
    return value


class _Component(type(gr.Slider)):
    """Gradio's component metaclass without its last act, writing a `.pyi` stub beside the module of every
    subclass (for packaged custom components): these subclasses add no event and no argument, so there is
    nothing to declare, and a file written into the source tree at each start would be noise."""

    def __new__(mcs, name, bases, attrs):
        return ABCMeta.__new__(mcs, name, bases, attrs)


class Knob(gr.Slider, metaclass=_Component):
    """A slider whose typed values are taken into its range instead of refused (see the module docstring)."""

    @classmethod
    def get_block_name(cls) -> str:   # drawn by the browser as Gradio's own slider
        return "slider"

    def preprocess(self, payload: float | None) -> float | None:
        fallback = self.value if isinstance(self.value, (int, float)) else self.minimum
        return super().preprocess(clamp(payload, self.minimum, self.maximum, fallback))


class WholeNumber(gr.Number, metaclass=_Component):
    """A number box (the seed) whose typed values are taken into its range; empty gives its build value."""

    @classmethod
    def get_block_name(cls) -> str:
        return "number"

    def preprocess(self, payload: float | None) -> float | int | None:
        fallback = self.value if isinstance(self.value, (int, float)) else (self.minimum or 0)
        return super().preprocess(clamp(payload, self.minimum, self.maximum, fallback))
