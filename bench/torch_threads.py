"""torch_threads.py: run PyTorch as a fair baseline on N threads, and say how many it ran with.

torch.set_num_threads(n) sets only PyTorch's own (OpenMP) pool. Debian's PyTorch runs f32
matmul through OpenBLAS, whose pool keeps one thread per core unless OPENBLAS_NUM_THREADS is
set before the library loads (or openblas_set_num_threads is called). cap(n) does all three:
sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS in this process's environment (children, such
as torch.multiprocessing's spawned ranks, inherit it), imports torch, calls
torch.set_num_threads(n) and, when an OpenBLAS is loaded, openblas_set_num_threads(n).

It also makes sure OpenBLAS runs kernels of this CPU's class: Debian's OpenBLAS 0.3.21 does not
know every CPU (an Intel Xeon of family 6 model 207, for one) and silently falls back to its
SSE3 "Prescott" kernels, 5x slower. When OPENBLAS_CORETYPE is unset and the core OpenBLAS chose
is below the CPU (an AVX-512 CPU on a core without AVX-512 kernels, an AVX2 CPU on one without
AVX2), cap() sets OPENBLAS_CORETYPE to SkylakeX or Haswell and re-executes the same command
line (/proc/self/cmdline) before anything ran, so the library loads with it; line() says so.
A user's own OPENBLAS_CORETYPE is left as it is. Import this module before torch; cap() before
any work.

    import torch_threads
    torch = torch_threads.cap(1)
    print(torch_threads.line())
    # "torch_threads <torch threads> <openblas threads> core <OpenBLAS core>[ (...)]"

The OpenBLAS count is -1 and the core "none" when no OpenBLAS is loaded in the process.
Used by bench/bench_matmul.c, bench_mlp.c, bench_unscale.c, torch_ddp.py and
tests/train/torch_train.py."""
import ctypes
import os
import sys


def _openblas():
    """The OpenBLAS library loaded in this process (ctypes handle), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {l.split()[-1] for l in maps if "openblas" in l and "/" in l}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_num_threads  # noqa: B018 (raises AttributeError if absent)
            return lib
        except (OSError, AttributeError):
            continue
    return None


# OpenBLAS cores with AVX2 kernels and those with AVX-512 ones (the same list as loom's GEMM rule,
# loom__blas_core_has_avx2 in src/ops/gemm_blas.c).
_AVX2_CORES = {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"}
_AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
_FELL_BACK = "LOOM_BENCH_OPENBLAS_FELL_BACK"  # the core OpenBLAS chose before the re-exec


def _core(lib):
    """OpenBLAS's core name (openblas_get_corename)."""
    lib.openblas_get_corename.restype = ctypes.c_char_p
    return lib.openblas_get_corename().decode()


def best_core():
    """The OpenBLAS core this CPU should run: SkylakeX with AVX-512 (F, BW, VL, DQ), Haswell with
    AVX2 and FMA, None otherwise (the CPU's flags from /proc/cpuinfo)."""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((set(l.split(":", 1)[1].split()) for l in info if l.startswith("flags")), set())
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def _fix_core(lib):
    """Re-executes this process with OPENBLAS_CORETYPE set when OpenBLAS fell below the CPU."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    core, best = _core(lib).lower(), best_core()
    fast = _AVX512_CORES if best == "SkylakeX" else _AVX2_CORES
    if best is None or core in fast:
        return
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0")[:-1]]
    os.environ["OPENBLAS_CORETYPE"] = best
    os.environ[_FELL_BACK] = _core(lib)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def cap(n):
    """Caps PyTorch and OpenBLAS to n threads each, on a core of this CPU's class (see above);
    returns the torch module."""
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch
    lib = _openblas()
    if lib is not None:
        _fix_core(lib)  # returns only when the core is right
        lib.openblas_set_num_threads(n)
    torch.set_num_threads(n)
    return torch


def counts():
    """(torch.get_num_threads(), OpenBLAS's thread count or -1)."""
    import torch
    lib = _openblas()
    return torch.get_num_threads(), (lib.openblas_get_num_threads() if lib is not None else -1)


def core():
    """OpenBLAS's core as this process runs it, and why: "SkylakeX", or "SkylakeX
    (OPENBLAS_CORETYPE set: OpenBLAS chose Prescott)"; "none" without OpenBLAS."""
    lib = _openblas()
    if lib is None:
        return "none"
    why = os.environ.get(_FELL_BACK)
    return _core(lib) + (f" (OPENBLAS_CORETYPE set: OpenBLAS chose {why})" if why else "")


def line():
    """The line the C benchmarks parse: "torch_threads <torch> <openblas> core <core...>"."""
    t, o = counts()
    return f"torch_threads {t} {o} core {core()}"
