"""kernels/self_check.py: `auto` takes the Triton kernel on CUDA only after it agrees with PyTorch attention; a
kernel that fails to compile or disagrees is replaced by PyTorch attention with a note, which the engine's
traces carry. The kernel and the device are injected, so every branch runs on a CPU."""

import pytest
import torch

from kernels import self_check as sc
from kernels.self_check import AttentionChoice, KernelCheck, choose_attention, self_check

CUDA = torch.device("cuda")  # a device name only: nothing is allocated on it below


@pytest.fixture
def triton_installed(monkeypatch):
    """`choose_attention` asks only whether Triton imported; the tests below inject the kernel's check, so with
    a stand-in for the module they hold where Triton is not installed (EAGLEVIZ_TEST_WITHOUT_TRITON=1) too."""
    if sc.ta.tl is None:
        monkeypatch.setattr(sc.ta, "tl", object())


def _compile_error(*args, **kwargs):
    raise RuntimeError("PassManager::run failed\nat line 2")


def _garbage(q, k, v, prefix_len, mask, scale, **kwargs):
    return torch.zeros_like(q), None


@pytest.mark.triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_the_real_kernel_passes_in_the_interpreter(dtype):
    result = self_check("cpu", dtype)
    assert result.ok and result.error < sc.CHECK_TOLERANCE[dtype], result


def test_a_kernel_that_does_not_compile_fails_with_a_one_line_note():
    result = self_check("cpu", torch.float32, kernel=_compile_error)
    assert not result.ok and result.error is None
    assert "failed on cpu (RuntimeError: PassManager::run failed)" in result.note and "\n" not in result.note
    assert result.note.endswith("verification uses PyTorch attention")


def test_a_kernel_that_disagrees_fails_with_its_error():
    result = self_check("cpu", torch.float16, kernel=_garbage)
    assert not result.ok and result.error == pytest.approx(1.0, abs=0.05)
    assert "disagreed with PyTorch attention on cpu (float16: relative error" in result.note


def test_auto_on_cuda_falls_back_with_the_note_of_a_failed_check(triton_installed):
    failing = KernelCheck(False, None, "the kernel failed")
    calls = []

    def check(device, dtype):
        calls.append((device, dtype))
        return failing

    choice = choose_attention("auto", CUDA, torch.bfloat16, check=check)
    assert choice == AttentionChoice("torch", ("the kernel failed",)) and calls == [(CUDA, torch.bfloat16)]
    assert choose_attention("auto", CUDA, check=lambda d, t: KernelCheck(True, 0.0, "ok")) == AttentionChoice("triton")


def test_a_simulated_gpu_whose_kernel_disagrees_falls_back(triton_installed):
    """The whole path on a CPU: the real self-check, with the garbage kernel, standing in for a GPU's."""
    choice = choose_attention("auto", CUDA, check=lambda d, t: self_check("cpu", t, kernel=_garbage))
    assert choice.impl == "torch" and "disagreed" in choice.notes[0]


def test_explicit_choices_and_cpus_are_never_checked(triton_installed):
    def never(device, dtype):
        raise AssertionError("checked")

    assert choose_attention("torch", CUDA, check=never) == AttentionChoice("torch")
    assert choose_attention("triton", CUDA, check=never) == AttentionChoice("triton")
    assert choose_attention("auto", "cpu", check=never) == AttentionChoice("torch")


def test_an_explicit_triton_without_triton_is_refused(monkeypatch):
    monkeypatch.setattr(sc.ta, "tl", None)
    with pytest.raises(ValueError, match="needs the triton package"):
        choose_attention("triton", CUDA)


def test_auto_on_cuda_without_triton_says_so(monkeypatch):
    monkeypatch.setattr(sc.ta, "tl", None)
    choice = choose_attention("auto", CUDA, check=lambda d, t: KernelCheck(True, 0.0, "ok"))
    assert choice.impl == "torch" and "Triton is not installed" in choice.notes[0]
