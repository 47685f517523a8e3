"""Numbers a visitor types into the page's knobs, and the ranges the page offers.

Gradio's own slider refuses a typed value outside its range with a red "Error: Value 10000 is greater than
maximum value 8." and an empty box with a server traceback (`None < minimum`). The page's sliders are `Knob`s:
a typed value outside the range is taken as the nearest end of it, a whole-number knob's fraction as the nearest
whole number (halves up, where the slider's thumb shows it), an empty or non-finite one as the knob's value when
the page was built; the box is then set to what runs and a line under the knobs says why (`Knob.noted`). A
handler always receives a number in range.

    RANGES   the page's range for each knob with a fixed range (a link is held to the same ranges,
             `eagleviz.app.share`); draft tokens and max new tokens end at the server's limits
"""

from __future__ import annotations

import math
from abc import ABCMeta

import gradio as gr

RANGES = {"steps": (1, 8), "topk": (1, 8), "temperature": (0.0, 1.5), "top_p": (0.05, 1.0)}


def taken(value, lo: float | None, hi: float | None, step: float | None, fallback) -> tuple[float, str]:
    """What a typed `value` runs as, and why where that is not the value typed: into [lo, hi] (`clamp`), a whole-
    number knob's (step 1) to the nearest whole number, halves up (where its slider's thumb shows it)."""
    number = clamp(value, lo, hi, fallback)
    if step == 1 and number == number and not float(number).is_integer():
        number = math.floor(float(number) + 0.5)
    try:
        typed = float(value)
    except (TypeError, ValueError):
        typed = None
    if typed is not None and typed == float(number):
        return number, ""
    if value in (None, ""):
        return number, f"the box is empty: {float(number):g}, the page's first value, is used"
    shown = f"{value!r}" if typed is None else f"{value:g}"
    if typed is None or math.isnan(typed):
        why = "is not a number"
    elif lo is not None and typed < lo:
        why = f"is below the knob's range, which starts at {lo:g}"
    elif hi is not None and typed > hi:
        why = f"is above the knob's range, which ends at {hi:g}"
    else:
        why = "is not a whole number"
    return number, f"{shown} {why}: {float(number):g} is used"


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
        return super().preprocess(taken(payload, self.minimum, self.maximum, self.step, self.fallback())[0])

    def fallback(self) -> float:  # (a method: Gradio reads every attribute while the component is built)
        """What an empty or non-number box runs as: the knob's value when the page was built."""
        return self.value if isinstance(self.value, (int, float)) else self.minimum

    def noted(self, payload) -> tuple:
        """After a value is typed (its raw payload): the knob set to what it runs as where that differs, and one
        line saying why ("" where the value runs as typed). Outputs: the knob, the note."""
        number, why = taken(payload, self.minimum, self.maximum, self.step, self.fallback())
        name = str(self.label or "").split(" \u00b7 ")[0]
        return (number, f"\u26a0 {name}: {why}.") if why else (gr.skip(), "")


class WholeNumber(gr.Number, metaclass=_Component):
    """A number box (the seed) whose typed values are taken into its range; empty gives its build value."""

    @classmethod
    def get_block_name(cls) -> str:
        return "number"

    def preprocess(self, payload: float | None) -> float | int | None:
        return super().preprocess(taken(payload, self.minimum, self.maximum, 1, self.fallback())[0])

    def fallback(self) -> float:
        return self.value if isinstance(self.value, (int, float)) else (self.minimum or 0)

    def noted(self, payload) -> tuple:
        """As `Knob.noted`."""
        number, why = taken(payload, self.minimum, self.maximum, 1, self.fallback())
        return (number, f"\u26a0 {self.label}: {why}.") if why else (gr.skip(), "")
