#!/usr/bin/python3
"""torch_train.py: PyTorch 1.13's side of tests/train/accuracy.sh: the same MLP as `loom train`
(784-1024-1024-10, nn.Sequential of Linear/ReLU), AdamW (lr 1e-3, weight decay 0.01), batch
256, cosine schedule over the run, Fashion-MNIST normalised as loom does, on 1 thread: torch's
pool and the OpenBLAS pool behind its f32 matmul both capped (bench/torch_threads.py;
torch.set_num_threads alone leaves OpenBLAS on every core); prints the thread counts it ran with,
the test accuracy after each epoch and the training samples/s (time inside steps only, as loom
reports it). A benchmark baseline only: loom never needs it.
Usage: torch_train.py [f32|bf16] [epochs] [data dir]"""
import gzip, math, os, sys, time
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_threads  # noqa: E402

torch = torch_threads.cap(1)
import torch.nn.functional as F  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "f32"
epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
root = sys.argv[3] if len(sys.argv) > 3 else "/usr/share/datasets/fashion-mnist"
print(torch_threads.line(), flush=True)
torch.manual_seed(0)

def idx(name):
    with gzip.open(f"{root}/{name}.gz") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(dims)

def load(split):
    x = torch.tensor(idx(f"{split}-images-idx3-ubyte"), dtype=torch.float32).reshape(-1, 784)
    y = torch.tensor(idx(f"{split}-labels-idx1-ubyte"), dtype=torch.int64)
    return (x / 255 - 0.2860) / 0.3530, y

xtr, ytr = load("train")
xte, yte = load("t10k")
m = torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                        torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01)
B = 256
spe = (len(xtr) + B - 1) // B
total = epochs * spe
bf = mode == "bf16"
step, train_s, samples = 0, 0.0, 0
for e in range(epochs):
    perm = torch.randperm(len(xtr))
    for i in range(spe):
        sel = perm[i * B:(i + 1) * B]
        x, y = xtr[sel], ytr[sel]
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = 1e-3 * (1 + math.cos(math.pi * step / total)) / 2
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf):
            loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        train_s += time.perf_counter() - t0
        samples += len(sel)
        step += 1
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf):
        acc = (m(xte).argmax(1) == yte).float().mean().item() * 100
    print(f"torch {mode} epoch {e + 1}: test accuracy {acc:.2f}%", flush=True)
print(f"torch {mode}: test accuracy {acc:.2f}% after {epochs} epochs, {samples / train_s:.0f} samples/s")
