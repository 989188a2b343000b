"""torch_threads.py: run PyTorch as a fair baseline on N threads, and say how many it ran with.

torch.set_num_threads(n) sets only PyTorch's own (OpenMP) pool. Debian's PyTorch runs f32
matmul through OpenBLAS, whose pool keeps one thread per core unless OPENBLAS_NUM_THREADS is
set before the library loads (or openblas_set_num_threads is called). cap(n) does all three:
sets OPENBLAS_NUM_THREADS and OMP_NUM_THREADS in this process's environment (children, such
as torch.multiprocessing's spawned ranks, inherit it), imports torch, calls
torch.set_num_threads(n) and, when an OpenBLAS is loaded, openblas_set_num_threads(n). It
never touches OPENBLAS_CORETYPE. Import this module before torch; cap() before any work.

    import torch_threads
    torch = torch_threads.cap(1)
    print(torch_threads.line())   # "torch_threads <torch threads> <openblas threads>"

The OpenBLAS count is -1 when no OpenBLAS is loaded in the process (another BLAS, or none).
Used by bench/bench_matmul.c, bench_mlp.c, bench_unscale.c, torch_ddp.py and
tests/train/torch_train.py."""
import ctypes
import os


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


def cap(n):
    """Caps PyTorch and OpenBLAS to n threads each; returns the torch module."""
    os.environ["OPENBLAS_NUM_THREADS"] = str(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch
    torch.set_num_threads(n)
    lib = _openblas()
    if lib is not None:
        lib.openblas_set_num_threads(n)
    return torch


def counts():
    """(torch.get_num_threads(), OpenBLAS's thread count or -1)."""
    import torch
    lib = _openblas()
    return torch.get_num_threads(), (lib.openblas_get_num_threads() if lib is not None else -1)


def line():
    """The line the C benchmarks parse: "torch_threads <torch> <openblas>"."""
    t, o = counts()
    return f"torch_threads {t} {o}"
