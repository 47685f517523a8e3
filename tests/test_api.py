"""The documented API: gradio_client drives a run through the `generate` endpoint of a live server."""

from __future__ import annotations

import pytest

from eagleviz.app.session import EngineHub
from eagleviz.trace import RunTrace
from eagleviz.app.ui import build_app
from servers import client, serving
from tiny import tiny_engine


@pytest.fixture(scope="module")
def server():
    with serving(build_app(EngineHub(tiny_engine("llama", vocab=8), model_id="tiny"))) as url:
        yield url


def test_generate_endpoint_returns_the_trace(server):
    api = client(server)
    assert "/generate" in api.view_api(print_info=False, return_format="dict")["named_endpoints"]
    data = api.predict("abc", 3, 2, 6, 0.0, 1.0, 8, 0, api_name="/generate")
    run = RunTrace.from_dict(data)
    assert len(run.output) == 8 and run.cycles
    assert run.config["tree"] == {"steps": 3, "topk": 2, "draft_tokens": 6, "adaptive": True,
                                  "source": "eagle+lookup", "adjustments": []}
    assert data["summary"]["num_cycles"] == len(run.cycles)


def test_generate_endpoint_reports_bad_knobs(server):
    api = client(server)
    with pytest.raises(Exception, match="steps must be in"):
        api.predict("abc", 0, 2, 6, 0.0, 1.0, 8, 0, api_name="/generate")
