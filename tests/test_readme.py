"""README.md: a newcomer's guide of at most 250 lines whose speed tables are the committed bench files. Each row of
a table under "Speed, measured" names its file in assets/bench/, and every figure in that row is the file's, as
rounded there; each row names its machine (as the file records it), a commit git knows and the measurement's date.
A rerun that changes a file without the README, or a figure typed wrong, fails here."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH = ROOT / "assets" / "bench"
PEERS = (("hf-generate", "HF `generate`"), ("llama-cpp", "llama.cpp"), ("lookup", "prompt lookup on our loop"))


def section(text: str, title: str) -> str:
    """The README's `## title` section, up to the next `## ` heading."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Each Markdown table in `text`: its header cells and its body rows' cells (the separator row dropped)."""
    found, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            found.append((rows[0], rows[2:]))
            rows = []
    return found


def speed_rows() -> list[tuple[str, dict[str, str]]]:
    """(table: "CPU" or "GPU", {header: cell}) for every row of the speed tables."""
    speed = section(README.read_text(), "Speed, measured")
    rows = []
    for kind in ("CPU", "GPU"):
        start = speed.index(f"**{kind}**")
        header, body = tables(speed[start:])[0]
        assert body, f"the {kind} table has no rows"
        rows += [(kind, dict(zip(header, cells, strict=True))) for cells in body]
    return rows


def named_file(row: dict[str, str]) -> Path:
    names = re.findall(r"`([\w./-]+\.json)`", row["machine, run"])
    assert len(names) == 1, f"a row names one bench file: {row['machine, run']}"
    return BENCH / names[0]


def ratio(row: dict) -> str:
    """A method's ratio to our plain loop with its 95% interval, as the README writes it."""
    low, high = row["vs_plain_ci95"]
    return f"{row['vs_plain']:.3f}x ({low:.3f}-{high:.3f})"


def expected_cells(run: dict) -> dict[str, str]:
    """Every figure of a speed-table row, from its bench file."""
    rows, eagle = run["rows"], run["rows"]["eagle-tree"]
    on_cpu = run["machine"]["device"] == "cpu"
    cells = {"T": f"{run['sampling']['temperature']:g}", "plain, tokens/s": f"{rows['plain']['tokens_per_s']:.1f}",
             "tau": f"{eagle['tau']:.2f}"}
    cells["the default vs plain (95% interval)" if on_cpu else "EAGLE vs plain (95% interval)"] = ratio(eagle)
    if on_cpu:
        peers = [f"{label} {ratio(rows[m])}" for m, label in PEERS if m in rows]
        cells["peers vs our plain loop (95% interval)"] = ", ".join(peers) or "-"
        cells["the default vs HF `generate`"] = f"{eagle['speedup']:.2f}x" if run["reference"] == "hf-generate" else "-"
    return cells


def git(*args: str) -> subprocess.CompletedProcess | None:
    """git run in this checkout, or None where there is no git or no full history to ask."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() == "true":
        return None
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def test_the_readme_is_a_guide_of_at_most_250_lines():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert text.startswith("---\n") and "\nsdk_version: " in text.split("\n---\n")[0]  # what a Space reads
    assert "](docs/screenshot.png)" in text and (ROOT / "docs" / "screenshot.png").stat().st_size < 500_000


def test_both_speed_tables_hold_the_newest_runs_of_the_default():
    """The CPU table holds the AVX2-only EPYC's lockstep runs at T = 0 and T = 1 and a run with peers; the GPU table
    runs of the default at T = 0 and T = 1 on a CUDA device."""
    files = {kind: [named_file(row) for k, row in speed_rows() if k == kind] for kind in ("CPU", "GPU")}
    assert {BENCH / "lockstep-epyc-T0.json", BENCH / "lockstep-epyc-T1.json"} <= set(files["CPU"])
    assert any("hf-generate" in json.loads(f.read_text())["rows"] for f in files["CPU"])
    runs = [json.loads(f.read_text()) for f in files["GPU"]]
    assert all(run["machine"]["device"].startswith("cuda") for run in runs)
    assert {run["sampling"]["temperature"] for run in runs if run["tree"]["adaptive"]} == {0.0, 1.0}


@pytest.mark.parametrize("kind,row", speed_rows(), ids=lambda r: named_file(r).stem if isinstance(r, dict) else r)
def test_every_figure_in_a_speed_row_is_its_files(kind, row):
    run = json.loads(named_file(row).read_text())
    assert (run["machine"]["device"] == "cpu") == (kind == "CPU")
    expected = expected_cells(run)
    assert {key: row[key].replace("**", "") for key in expected} == expected
    assert f"--limit {run['prompts']} " in run["command"]
    lockstep = run.get("pairing") == "step" and "--lockstep" in run["command"]
    assert ("in lockstep" in row["machine, run"]) == lockstep
    if kind == "CPU":  # the table says every greedy output of ours is plain decoding's
        assert run["prompts"] == 80 and {m["method"] for m in run["greedy_mismatches"]} <= {"hf-generate"}
    else:
        assert run["prompts"] == 20


@pytest.mark.parametrize("kind,row", speed_rows(), ids=lambda r: named_file(r).stem if isinstance(r, dict) else r)
def test_every_speed_row_names_its_machine_a_commit_and_the_date(kind, row):
    """The machine as the file records it (the CPU's name and vector unit; the GPU a gpu-check report names, and
    the dtype); a commit of 7+ hex digits that git knows (the one the file records, measured on a checkout without
    changes; else where the file's name carries one, that one; where the file records no date, the commit that
    committed it); the date the file records, or else that commit's."""
    path, machine_cell = named_file(row), re.sub(r"`[^`]*`", "", row["machine, run"]).replace("-", "")
    run = json.loads(path.read_text())
    machine = run["machine"]
    if kind == "CPU":
        name, unit = (part.strip() for part in machine["cpu"].split(",")[:2])
        assert name in machine_cell and unit in machine_cell
        assert ("emulating" in machine["cpu"]) == ("held to" in machine_cell)
    else:
        gpus = {json.loads(p.read_text())["environment"]["gpu"] for p in (BENCH / "gpu").glob("gpu-check-*.json")}
        assert any(gpu.replace("-", "") in machine_cell for gpu in gpus), gpus
        dtypes = {"bfloat16": "bf16", "float32": "fp32"}
        assert [d for d in dtypes.values() if d in machine_cell] == [dtypes[machine["dtype"]]]
    commit, date = row["commit"], row["date"]
    assert re.fullmatch(r"[0-9a-f]{7,40}", commit) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", date)
    named = re.search(r"-([0-9a-f]{7,40})-", path.name)
    assert named is None or commit == named[1]
    if machine.get("commit"):  # the file records the code it measured (eagleviz.perf.provenance): that one
        assert machine["commit"].startswith(commit) and not machine.get("dirty"), (machine["commit"], commit)
    if "date" in machine:
        assert date == machine["date"]
    known = git("cat-file", "-e", f"{commit}^{{commit}}")
    if known is None:
        return  # no history here to check the commit against
    assert known.returncode == 0, f"git does not know {commit}"
    if "date" not in machine:
        last = git("log", "-1", "--format=%H %ad", "--date=short", "--", str(path.relative_to(ROOT))).stdout.split()
        assert last[0].startswith(commit) and date == last[1]


def test_the_readmes_figures_on_what_the_head_needs_to_pay_are_the_committed_run():
    """Where nothing drafted pays, the README says the head's guess must be accepted some share of the time to pay
    and is accepted a lower share whatever the target's confidence in the root: the committed run of
    docs/performance.md entry 44, every tenth of that confidence under what is needed."""
    run = json.loads((BENCH / "head-signal-epyc-T0.json").read_text())
    assert "--out assets/bench/head-signal-epyc-T0.json" in run["command"] and run["temperature"] == 0
    tenths = [row for row in run["rows"] if row["read"] == "root probability"]
    assert len(tenths) == run["bins"] == 10 and sum(row["cycles"] for row in tenths) >= 1000
    low, high = (f(row["accepted"] for row in tenths) for f in (min, max))
    assert high < run["needed"]
    paragraphs = [" ".join(p.split()) for p in README.read_text().split("\n\n") if "head-signal-epyc-T0.json" in p]
    assert len(paragraphs) == 1
    quoted = re.search(r"must be accepted (\d+)% of the time to pay and is accepted (\d+)-(\d+)% of the time",
                       paragraphs[0])
    assert quoted, "the README no longer quotes what the head needs"
    assert [int(q) for q in quoted.groups()] == [round(run["needed"] * 100), round(low * 100), round(high * 100)]
