"""Which of torch's CPU kernels this machine runs (store/cpu_kernels.py): both answers faked, the real one,
and the session skip that keeps a kernel the CPU lacks from killing a test run with SIGILL."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from grandrounds.store.cpu_kernels import KERNELS, kernels_for, kernels_from_flags, machine_kernels, main

ROOT = Path(__file__).resolve().parents[1]
AVX512_FLAGS = {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512vl", "avx512bw", "avx512dq", "avx512cd"}
AVX2_FLAGS = {"sse4_2", "avx", "avx2", "fma"}


def test_a_cpu_with_avx512_runs_all_three_kernels():
    found = kernels_for("AVX512", "Intel(R) Xeon(R) Platinum 8481C CPU")
    assert found.runnable == ("avx512", "avx2", "default") and found.missing == ()
    assert found.best == "avx512"
    assert all(found.skip_reason(k) is None for k in KERNELS)


def test_a_cpu_without_avx512_runs_avx2_and_default_and_says_why_not_avx512():
    found = kernels_for("AVX2", "AMD EPYC 7B13")
    assert found.runnable == ("avx2", "default") and found.missing == ("avx512",)
    reason = found.skip_reason("avx512")
    assert "AMD EPYC 7B13" in reason and "avx512" in reason and "AVX-512" in reason
    assert found.skip_reason("avx2") is None and found.skip_reason("default") is None
    assert "runs: avx2 default" in found.explain() and "skips: ATEN_CPU_CAPABILITY=avx512" in found.explain()


def test_a_cpu_torch_gives_no_vector_kernel_runs_default_only():
    assert kernels_for("DEFAULT", "old").runnable == ("default",)
    arm = kernels_for("SVE256", "Neoverse-V1")
    assert arm.runnable == ("default",) and "Neoverse-V1" in arm.skip_reason("avx2")


def test_an_unknown_kernel_name_is_refused_by_name():
    reason = kernels_for("AVX2", "AMD EPYC").skip_reason("avx1024")
    assert "avx1024" in reason and "not a kernel torch knows" in reason


def test_without_torch_the_cpu_flags_decide_as_torch_would():
    assert kernels_from_flags(AVX512_FLAGS, "x").runnable == KERNELS
    assert kernels_from_flags(AVX2_FLAGS, "x").runnable == ("avx2", "default")
    # AVX-512 foundation alone is not enough for torch's avx512 kernel (it needs VL, BW and DQ too)
    assert kernels_from_flags(AVX2_FLAGS | {"avx512f"}, "x").runnable == ("avx2", "default")
    assert kernels_from_flags(set(), "x").runnable == ("default",)
    assert kernels_from_flags(AVX512_FLAGS, "x", machine="aarch64").runnable == ("default",)


def test_the_command_prints_the_kernels_for_shell_loops(capsys):
    assert main(["--all"]) == 0
    assert capsys.readouterr().out.split() == list(KERNELS)
    assert main([]) == 0
    assert capsys.readouterr().out.split() == list(machine_kernels().runnable)
    assert main(["--bogus"]) == 2


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="not an x86-64 CPU")
def test_this_x86_machine_runs_at_least_avx2_and_default_and_torch_honours_each():
    found = machine_kernels()
    assert {"avx2", "default"} <= set(found.runnable), found.explain()
    prog = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    for kernel in found.runnable:
        env = {**os.environ, "ATEN_CPU_CAPABILITY": kernel}
        out = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300,
                             check=True).stdout.split()[-1]
        assert out.lower() == kernel


def test_a_session_under_a_kernel_the_cpu_lacks_is_skipped_with_the_reason_not_killed():
    """tests/conftest.py: a kernel name this CPU cannot run (an unknown name stands in for avx512 on a CPU
    without AVX-512, so the check runs on any machine) skips every test, the reason in the summary."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx1024"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "tests/test_cpu_kernels.py::test_an_unknown_kernel_name_is_refused_by_name"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "1 skipped" in proc.stdout and "ATEN_CPU_CAPABILITY=avx1024" in proc.stdout
    for kernel in machine_kernels().missing:  # and a real missing kernel, where this CPU has one
        env["ATEN_CPU_CAPABILITY"] = kernel
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                               "tests/test_cpu_kernels.py::test_an_unknown_kernel_name_is_refused_by_name"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and "1 skipped" in proc.stdout, proc.stdout[-2000:]
        assert machine_kernels().cpu in proc.stdout


def test_ci_takes_its_kernels_from_this_module_and_prints_them():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "grandrounds.store.cpu_kernels" in ci
    assert "for cap in avx512 avx2 default" not in ci  # no hard-coded kernel list
