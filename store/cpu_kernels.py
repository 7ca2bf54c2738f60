"""Which of torch's CPU kernels (the values of `ATEN_CPU_CAPABILITY`) this machine can run.

torch trusts the variable: set to a kernel the CPU lacks (`avx512` on a CPU without AVX-512), the first
vectorised operation dies of an illegal instruction (SIGILL, exit 132) with nothing printed. So whatever
sets it (tests/test_portable_record.py, tests/conftest.py, .ci/run, benchmarks/bench_kernel_vectors.py)
asks here first, runs the kernels the CPU has and says which it skipped and why.

    python -m grandrounds.store.cpu_kernels             # the runnable kernels, space-separated
    python -m grandrounds.store.cpu_kernels --all       # every kernel name, runnable or not
    python -m grandrounds.store.cpu_kernels --explain   # the CPU, what torch picks, what runs, what not

The answer comes from torch's own report (`torch.backends.cpu.get_cpu_capability()`, asked in a child
process without `ATEN_CPU_CAPABILITY`: with it set, torch reports the variable, not the CPU), and from
the CPU's flags where torch cannot be imported. This module imports nothing heavy itself.
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# Best first, spelt as ATEN_CPU_CAPABILITY spells them. On x86-64 torch builds all three; `default` is
# plain C++ and runs on any CPU, `avx2` on every x86-64 CPU of this project's machines.
KERNELS = ("avx512", "avx2", "default")

# What torch's own check (aten/src/ATen/native/DispatchStub.cpp, through cpuinfo) requires of the CPU
# for each kernel, as /proc/cpuinfo names the flags: used only when torch cannot answer.
_REQUIRED_FLAGS = {
    "avx512": frozenset({"avx512f", "avx512vl", "avx512bw", "avx512dq", "fma"}),
    "avx2": frozenset({"avx2", "fma"}),
    "default": frozenset(),
}
_INSTRUCTION_SET = {"avx512": "AVX-512", "avx2": "AVX2", "default": "nothing beyond the base instruction set"}


@dataclass(frozen=True)
class CpuKernels:
    """The kernels one CPU can run. `best` is the kernel torch picks on its own (lower case; `default` on
    a CPU with neither AVX2 nor AVX-512); `source` says where the answer came from."""

    cpu: str
    best: str
    runnable: tuple[str, ...]
    source: str

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(k for k in KERNELS if k not in self.runnable)

    def skip_reason(self, kernel: str) -> str | None:
        """None if `kernel` runs here; otherwise why not, naming the CPU and the kernel (a pytest skip's
        reason, and what .ci/run prints)."""
        if kernel in self.runnable:
            return None
        if kernel not in KERNELS:
            return (f"ATEN_CPU_CAPABILITY={kernel}: not a kernel torch knows (it knows {', '.join(KERNELS)}); "
                    f"torch would ignore it and run {self.best}")
        return (f"ATEN_CPU_CAPABILITY={kernel}: this CPU ({self.cpu}) has no {_INSTRUCTION_SET[kernel]}, "
                f"so torch's {kernel} kernel cannot run here (its best here is {self.best})")

    def explain(self) -> str:
        lines = [f"CPU: {self.cpu}",
                 f"torch's best kernel: {self.best} ({self.source})",
                 f"runs: {' '.join(self.runnable)}"]
        lines += [f"skips: {reason}" for reason in (self.skip_reason(k) for k in self.missing) if reason]
        return "\n".join(lines)


def kernels_for(capability: str, cpu: str, source: str = "torch.backends.cpu.get_cpu_capability()") -> CpuKernels:
    """The kernels a CPU runs, given torch's report of its best capability ("AVX512", "AVX2", "DEFAULT";
    a non-x86 report such as "SVE256" or "VSX" leaves only `default` of the x86 kernels). Pure: the tests
    fake both answers through it."""
    best = capability.strip().lower()
    if best not in KERNELS:
        return CpuKernels(cpu=cpu, best=best, runnable=("default",), source=source)
    return CpuKernels(cpu=cpu, best=best, runnable=KERNELS[KERNELS.index(best):], source=source)


def kernels_from_flags(flags: frozenset[str] | set[str], cpu: str, machine: str = "x86_64") -> CpuKernels:
    """The kernels a CPU runs, judged from its flags as /proc/cpuinfo lists them (the fallback)."""
    source = "the CPU's flags in /proc/cpuinfo"
    if machine.lower() not in ("x86_64", "amd64"):
        return CpuKernels(cpu=cpu, best="default", runnable=("default",), source=source)
    best = next(k for k in KERNELS if _REQUIRED_FLAGS[k] <= set(flags))
    return kernels_for(best, cpu, source)


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _torch_capability() -> str | None:
    """torch's report of the best kernel for this CPU, from a child process with ATEN_CPU_CAPABILITY unset
    (and no CUDA probing); None if torch cannot be imported or the child fails."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    prog = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    try:
        proc = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[-1].strip() if proc.returncode == 0 and lines else None


@functools.lru_cache(maxsize=1)
def machine_kernels() -> CpuKernels:
    """This machine's answer (asked once a process)."""
    cpu = cpu_name()
    capability = _torch_capability()
    if capability is not None:
        return kernels_for(capability, cpu)
    return kernels_from_flags(_cpu_flags(), cpu, platform.machine())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["--all"], ["--explain"]):
        print("usage: python -m grandrounds.store.cpu_kernels [--all | --explain]", file=sys.stderr)
        return 2
    if args == ["--all"]:
        print(" ".join(KERNELS))
        return 0
    found = machine_kernels()
    print(found.explain() if args == ["--explain"] else " ".join(found.runnable))
    return 0


if __name__ == "__main__":
    sys.exit(main())
