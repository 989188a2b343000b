#!/usr/bin/python3
"""torch_ddp.py: the PyTorch 1.13 DDP baseline of bench_ddp: an MLP trained on random data with
DistributedDataParallel over gloo, N processes on this machine, 1 thread each: torch's pool and
the OpenBLAS pool behind its f32 matmul are both capped (torch_threads.py; torch.set_num_threads
alone leaves OpenBLAS on every core, so N ranks would oversubscribe the cores). Prints
"torch_threads <torch> <openblas>" (rank 0's counts, as it ran) and then one line
"torch_ddp <dtype> <ranks> <samples_per_s>" (samples over all ranks per second, median of the
timed steps). Usage: torch_ddp.py SIZES BATCH STEPS {f32|bf16} [RANKS]"""
import os
import sys
import time

import torch_threads

torch = torch_threads.cap(1)  # before the ranks start: they inherit the environment
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402


def mlp(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def worker(rank, world, sizes, batch, steps, dtype, port, out):
    torch_threads.cap(1)
    threads = torch_threads.line()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(mlp(sizes))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, sizes[0])
    y = torch.randint(0, sizes[-1], (batch,))
    loss_fn = nn.CrossEntropyLoss()
    times = []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=(dtype == "bf16")):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        timed = sorted(times[2:])
        out.put((threads, world * batch / timed[len(timed) // 2]))
    dist.destroy_process_group()


def main():
    sizes = [int(s) for s in sys.argv[1].split("-")]
    batch, steps, dtype = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    world = int(sys.argv[5]) if len(sys.argv) > 5 else 2
    port = 29500 + os.getpid() % 1000
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, sizes, batch, steps, dtype, port, q))
             for r in range(world)]
    for p in procs:
        p.start()
    threads, result = q.get(timeout=600)
    for p in procs:
        p.join()
    print(threads)
    print(f"torch_ddp {dtype} {world} {result:.1f}")


if __name__ == "__main__":
    main()
