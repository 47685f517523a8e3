"""Regenerate the small recorded traces the figure tests read (real engine, random draft head).

    python tests/data/regenerate.py
"""

from pathlib import Path

from eagleviz.config import SamplingConfig, TreeConfig
from eagleviz.decoding.load import load_engine

HERE = Path(__file__).parent
PROMPT = "Name three colours."
RUNS = {
    "trace_greedy.json": (TreeConfig.create(steps=3, topk=2, draft_tokens=6), SamplingConfig(max_new_tokens=4)),
    "trace_sampling.json": (TreeConfig.create(steps=3, topk=2, draft_tokens=6),
                            SamplingConfig(temperature=0.8, top_p=0.95, max_new_tokens=4, seed=3)),
    "trace_chain.json": (TreeConfig.create(steps=3, topk=1, draft_tokens=4), SamplingConfig(max_new_tokens=3)),
}

if __name__ == "__main__":
    engine = load_engine(head="random")
    for name, (tree, sampling) in RUNS.items():
        run = engine.generate(PROMPT, tree, sampling)
        (HERE / name).write_text(run.to_json(indent=None), encoding="utf-8")
        print(name, len(run.cycles), "cycles,", len(run.to_json()), "bytes")
