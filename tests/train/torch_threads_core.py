"""torch_threads_core.py: bench/torch_threads.py runs PyTorch's OpenBLAS on kernels of this CPU's
class (issue 27): when OpenBLAS chose a core below the CPU (simulated: the core read as
"Prescott" until the re-exec), cap() re-executes the same command line with OPENBLAS_CORETYPE set
to best_core() and line() says so; a user's own OPENBLAS_CORETYPE is left alone. Exits 77
without torch, 1 on a failed check."""
import os
import subprocess
import sys

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
try:
    import torch  # noqa: F401
except ImportError:
    print("skipped: no torch for /usr/bin/python3")
    sys.exit(77)
sys.path.insert(0, BENCH)
import torch_threads  # noqa: E402

CHILD = f"""
import os, sys
sys.path.insert(0, {BENCH!r})
import torch_threads as t
real = t._core
t._core = lambda lib: real(lib) if "LOOM_BENCH_OPENBLAS_FELL_BACK" in os.environ else "Prescott"
t.cap(1)
print(t.line())
print("coretype", os.environ.get("OPENBLAS_CORETYPE"))
"""


def run(env):
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        print(out.stdout, out.stderr)
        sys.exit(1)
    return out.stdout


fails = 0
best = torch_threads.best_core()
env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
got = run(env)
if best is not None:
    want = f"(OPENBLAS_CORETYPE set: OpenBLAS chose Prescott)"
    if want not in got or f"coretype {best}" not in got:
        print(f"FAIL: a fallback core was not replaced by {best}:\n{got}")
        fails += 1
user = dict(env, OPENBLAS_CORETYPE="Haswell")
got = run(user)
if "coretype Haswell" not in got or "OPENBLAS_CORETYPE set" in got:
    print(f"FAIL: the user's OPENBLAS_CORETYPE was not left alone:\n{got}")
    fails += 1
print("torch_threads core:", "ok" if not fails else f"{fails} failed", "(best core here:", best, ")")
sys.exit(1 if fails else 0)
