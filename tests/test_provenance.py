"""eagleviz/perf/provenance.py: a result says which code (commit, changes), machine (CPU model and speed flags,
GPU) and versions it was measured with, and the commands that write committed results record it."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from eagleviz.perf import bench
from eagleviz.perf.provenance import SPEED_FLAGS, code_version, cpu_identity, provenance

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B45
flags\t\t: fpu sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 sha_ni

processor\t: 1
model name\t: AMD EPYC 9B45
flags\t\t: fpu sse2 avx2 fma f16c avx512f avx512bw avx512vl avx512_bf16 sha_ni
"""


def test_the_cpu_is_named_with_the_flags_its_speed_depends_on():
    assert cpu_identity(CPUINFO) == {"cpu_model": "AMD EPYC 9B45",
                                     "cpu_flags": ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                                                   "avx512_bf16"]}
    assert cpu_identity("")["cpu_flags"] == [] and cpu_identity("")["cpu_model"]  # not Linux: still a name
    assert set(cpu_identity()["cpu_flags"]) <= set(SPEED_FLAGS)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed here")
def test_the_commit_and_whether_the_checkout_had_changes(tmp_path):
    assert code_version(tmp_path) == {"commit": None, "dirty": None}  # not a checkout (an installed wheel)

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    assert code_version(tmp_path) == {"commit": None, "dirty": None}  # a checkout that does not track it
    git("add", "a.py")
    git("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert code_version(tmp_path) == {"commit": head.strip(), "dirty": False}
    (tmp_path / "new.txt").write_text("untracked files do not count\n")
    assert code_version(tmp_path)["dirty"] is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert code_version(tmp_path) == {"commit": head.strip(), "dirty": True}


def test_a_bench_result_records_the_code_the_machine_the_versions_and_the_paths_taken(tiny_cli):
    prompts = tiny_cli / "prompts.txt"
    prompts.write_text("abc\n")
    out = tiny_cli / "out"
    assert bench.bench_main(["--prompts", str(prompts), "--max-new-tokens", "4", "--repeats", "1", "--steps", "2",
                             "--topk", "2", "--draft-tokens", "4", "--methods", "plain,eagle-tree",
                             "--out", str(out)]) == 0
    machine = json.loads((out / "bench-T0.json").read_text())["machine"]
    assert {k: machine[k] for k in provenance()} == json.loads(json.dumps(provenance()))
    assert machine["decode"] == "eager" and machine["attn_impl"] in ("torch", "sdpa", "triton")
    assert isinstance(machine["notes"], list) and machine["versions"]["torch"] == machine["torch"]
