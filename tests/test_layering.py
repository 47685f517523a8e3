"""The data flows one way (engine -> trace -> visuals -> UI): the engine never imports gradio or plotly, and
the trace and the visuals never import torch; nor does the finder of measured results, read by the page at
start-up without a model."""

import subprocess
import sys

import pytest

CASES = [
    ("eagleviz.engine", {"gradio", "plotly"}),
    ("eagleviz.trace", {"torch", "gradio", "plotly", "transformers"}),
    ("eagleviz.visuals", {"torch", "gradio", "transformers"}),
    ("eagleviz.measured", {"torch", "gradio", "plotly", "transformers"}),
]


@pytest.mark.parametrize("module,forbidden", CASES)
def test_module_does_not_import(module, forbidden):
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            f"print(sorted(m for m in {sorted(forbidden)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"{module} imports {out}"
