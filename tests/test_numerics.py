"""kernels/numerics.py and the results measured with it: the version follows the C code's arithmetic and flags,
not its comments, and the committed results that depend on the last bits (the 80-prompt bitwise check,
`python -m eagleviz lossless`; the int8 accuracy, `python -m eagleviz int8-accuracy`) were measured with today's
version, say what the README quotes, and hold what they claim."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eagleviz.paths import ASSETS
from kernels import cpu_ops, numerics

ROOT = Path(__file__).resolve().parents[1]
LOSSLESS = ASSETS / "bench" / "lossless.json"
INT8 = ASSETS / "bench" / "int8-accuracy.json"
RERUN = "the code its numbers come from changed since it was measured: run `{}` again and commit the JSON"


def test_the_version_follows_the_code_and_flags_not_the_comments(tmp_path):
    source = cpu_ops.SOURCE.read_text()
    copy = tmp_path / cpu_ops.SOURCE.name

    def version(text: str, flags=cpu_ops.FLAGS) -> str:
        copy.write_text(text)
        return numerics.numerics_version(((copy, flags),))

    today = version(source)
    assert version("/* a new comment */\n" + source.replace("    ", "\t") + "\n// and a last line\n") == today
    assert version(source.replace("0.693359375f", "0.6933594f", 1)) != today  # one constant of exp
    assert version(source, cpu_ops.FLAGS + ("-ffast-math",)) != today


def test_a_python_modules_version_follows_its_code_not_its_docstrings_or_comments(tmp_path):
    module = tmp_path / "engine.py"

    def version(text: str) -> str:
        module.write_text(text)
        return numerics.numerics_version((), (module,))

    code = 'def accept(p, u):\n    """Accepted iff u < p."""\n    return u < p\n'
    today = version(code)
    assert version("# why\n" + code.replace('"""Accepted iff u < p."""', '"""Another word."""') + "\n\n") == today
    assert version(code.replace("u < p", "u <= p")) != today


def test_the_lossless_version_covers_every_c_file_and_the_engines_python(monkeypatch, tmp_path):
    from eagleviz.perf.lossless import lossless_version
    from kernels import sample_ops

    today = lossless_version()
    copy = tmp_path / sample_ops.SOURCE.name
    copy.write_text(sample_ops.SOURCE.read_text().replace("{", "{ int unused_ = 0; (void) unused_;", 1))
    monkeypatch.setattr(sample_ops, "SOURCE", copy)
    assert lossless_version() != today  # sample_ops.c picks every greedy token
    assert today != numerics.numerics_version()  # more than the forward's C code


def _committed(path, command: str, version: str) -> dict:
    result = json.loads(path.read_text())
    assert result["numerics"] == version, RERUN.format(command)
    assert result["command"].startswith(command)
    return result


def test_the_committed_bitwise_check_ran_on_every_prompt_with_todays_numerics():
    from eagleviz.perf.lossless import lossless_version

    result = _committed(LOSSLESS, "python -m eagleviz lossless", lossless_version())
    assert result["prompts"] == 80 and result["weights"] == "blocks"
    assert set(result["differ"]) == {"chain", "tree", "large", "cost-aware", "cost-aware+lookup"}
    assert all(prompts == [] for prompts in result["differ"].values()), result["differ"]
    assert all(prompts == [] for prompts in result["chains_short"].values()), result["chains_short"]


def test_the_committed_int8_accuracy_has_todays_numerics_and_is_what_the_readme_quotes():
    result = _committed(INT8, "python -m eagleviz int8-accuracy", numerics.numerics_version())
    assert result["prompts"] == 80
    int8 = result["variants"]["int8"]
    readme = (ROOT / "README.md").read_text()
    quoted = re.search(r"top-1 agreement ([\d.]+)%, mean KL\s+([\d.]+)\s+nats", readme)
    assert quoted, "the README no longer quotes the int8 accuracy"
    assert float(quoted[1]) == pytest.approx(100 * int8["top1_agreement"], abs=1e-9)
    assert float(quoted[2]) == pytest.approx(int8["mean_kl_nats"], rel=1e-9)
    assert int8["top1_agreement"] > 0.9 and result["variants"]["fp32"]["top1_agreement"] >= int8["top1_agreement"]
