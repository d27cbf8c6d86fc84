"""CPU kernels that take the instruction set out of a seed's numbers on x86-64 machines with AVX2.

ATen's vectorised CPU kernels (softmax, norms, activations, reductions, the optimizer's foreach ops) dispatch on
the widest instruction set the CPU has, and the AVX-512 and AVX2 kernels round differently. Over a few hundred
steps the difference grows into the result: ``make train`` gives validation perplexity 534.2 with AVX-512 kernels
and 533.1 with AVX2 ones, same seed, same machine (2-core AMD EPYC, 2026-11-24). MKL's matrix products dispatch the
same way, so its conditional-reproducibility branch is pinned to AVX2 as well (MKL_CBWR=AVX2 gave 533.1 there too).
``ATTNLAB_CPU_KERNELS=native`` keeps the libraries' own choice (fastest). Both libraries read their setting once,
at their first kernel: the commands (``attnlab-train``, ``python train.py``, ...) pin before they start their job,
and a Python user who wants the commands' numbers calls ``attnlab.pin_cpu_kernels()`` before any torch operation.
Importing ``attnlab`` changes nothing in the process (its environment is the user's, and its children's).

Pinning removes the instruction set from the numbers, not the processor model: with the same AVX2 kernels, the same
MKL branch, threads, torch and seed, ``make train`` gives 533.1 on the 2-core AMD EPYC machines and 534.6 on a
2-core Intel Xeon of family 6, model 207 (AVX-512 and AMX; 2026-11-26), each the same on every run and under any
load. So a seed fixes the numbers for a given torch version, thread count and processor model (``cpu_identity``,
recorded in ``results.json`` as ``cpu``), not across vendors.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

SETTING = "ATTNLAB_CPU_KERNELS"  # portable (default): AVX2 kernels | native: torch's widest
CHOICES = ("portable", "native")


def cpu_has_avx2(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU reports AVX2 (Linux); elsewhere we cannot tell, and nothing is pinned."""
    try:
        return any(line.startswith("flags") and " avx2" in line for line in cpuinfo.read_text().splitlines())
    except OSError:
        return False


def cpu_identity(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """``"<vendor> family <f> model <m>"`` of the first CPU (Linux; ``"unknown"`` elsewhere): what a seed's numbers
    still depend on with the kernels pinned. Virtual machines often hide the model name, not these three."""
    try:
        first = cpuinfo.read_text().split("\n\n")[0]
    except OSError:
        return "unknown"
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first.splitlines())}
    if "vendor_id" not in fields:
        return "unknown"
    return f"{fields['vendor_id']} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"


PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}  # ATen's kernels, MKL's reproducible branch


def pin_cpu_kernels(environ: os._Environ | dict[str, str] = os.environ) -> dict[str, str]:
    """Set ``PINNED`` on an x86-64 CPU with AVX2, each unless the user set it (theirs wins), and none with
    ``ATTNLAB_CPU_KERNELS=native``; returns what was set. A value other than ``CHOICES`` raises ``ConfigError``."""
    from attnlab.errors import require_choice

    choice = environ.get(SETTING, "portable")
    require_choice(choice, CHOICES, SETTING)
    if choice == "native" or platform.machine().lower() not in ("x86_64", "amd64") or not cpu_has_avx2():
        return {}
    pinned = {key: value for key, value in PINNED.items() if key not in environ}
    environ.update(pinned)
    return pinned


def kernel_record() -> dict[str, object]:
    """What a run's numbers depend on besides its config and seed, for ``results.json``."""
    import torch

    return {
        "torch": torch.__version__,
        "cpu_kernels": torch.backends.cpu.get_cpu_capability(),
        "mkl_branch": os.environ.get("MKL_CBWR", "auto"),
        "cpu_threads": torch.get_num_threads(),
        "cpu": cpu_identity(),
        **code_record(),
    }


PACKAGES = ("lightning", "hydra-core", "datasets", "tokenizers", "numpy")


def code_record() -> dict[str, object]:
    """The code a run ran: attnlab's version, the commit of its clone (``checkout_commit``) and the packages its
    numbers depend on."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(package: str) -> str | None:
        try:
            return version(package)
        except PackageNotFoundError:
            return None

    return {
        "attnlab": installed("attnlab"),
        "commit": checkout_commit(),
        "packages": {p: installed(p) for p in PACKAGES},
    }


def checkout_commit() -> str | None:
    """HEAD of the clone attnlab runs from, ``+dirty`` with uncommitted changes to tracked files; None when attnlab
    is installed (its site-packages may sit inside some other repository) or git is missing."""
    import subprocess

    checkout = Path(__file__).resolve().parents[2]  # src/attnlab/numerics.py in a clone
    if not (checkout / "pyproject.toml").is_file():
        return None
    git = ["git", "-C", str(checkout)]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        changes = subprocess.run(
            [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("+dirty" if changes.stdout.strip() else "")
