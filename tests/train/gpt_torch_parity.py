#!/usr/bin/python3
"""gpt_torch_parity.py: `loom train --model gpt` against the same GPT-2 written in PyTorch 1.13,
step by step (issue 25, item 5). PyTorch is a baseline here, never a dependency of loom:
gpt_torch_parity.sh skips (77) where /usr/bin/python3 has no torch.

What is the same on both sides:
  - the weights: loom writes its initial weights (a first run of one step at --lr 0
    --weight-decay 0, which leaves every parameter bit for bit as initialised, saved with
    --save), this script reads that model.safetensors (8-byte little-endian header length, JSON
    header, raw little-endian data; no safetensors package) into torch, and the measured loom
    run starts from the same file (--init);
  - the model: GPT-2 as include/loom/gpt.h has it: wte + wpe, pre-norm blocks
    x + attn(ln_1(x)), x + mlp(ln_2(x)), nn.Linear's [out, in] layout, causal attention written
    out (matmul, scale 1/sqrt(head dim), future masked with -inf, softmax, matmul: 1.13 has no
    F.scaled_dot_product_attention), GELU tanh, LayerNorm eps 1e-5, ln_f, lm_head tied to wte,
    mean cross entropy over all B x T positions, no dropout;
  - the batches: loom_text_batch's rule (include/loom/io.h) reimplemented here: the last tenth
    of the text is validation, row r of step s (0-based) starts at training offset
    hash(hash(seed, s), r) mod (train_size - context), hash = loom_rng_hash (splitmix64), on
    the text loom_text_load reads (by default the fortunes, by loom's rule: see fortunes()),
    so the data rules are checked too, not only the model;
  - the optimizer: torch.optim.AdamW(lr, betas (0.9, 0.999), eps 1e-8, weight_decay) over every
    parameter in one group, as `loom train` (tools/train_run.c: every segment decays), and a
    constant learning rate (--schedule constant on loom's side): no schedule to mirror;
  - threads: loom --threads N; torch.set_num_threads(N) and the OpenBLAS pool capped to N
    (bench/torch_threads.py).

Usage: gpt_torch_parity.py LOOM_BIN WORKDIR [--text FILE] [--amp off|bf16] [--steps N]
       [--threads N] [--tol1 X] [--tol X] [--f32-attention]
       [--layers N --heads N --dim N --context N --batch N --seed N --lr X --weight-decay X]
Prints one line per step (step, loom loss, torch loss, relative difference), then
"parity <amp>: step 1 rel diff X (tol T1); max over N steps X (tol T)". Exit 0 when both are
within their tolerances, 1 when not, 2 on a usage or run error."""
import argparse
import json
import math
import os
import re
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import torch_threads  # noqa: E402

M64 = (1 << 64) - 1


def die(msg):
    print(f"gpt_torch_parity: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def splitmix64(x):
    """One step of splitmix64 on state x: (new state, output), as src/core/rng.c."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return x, z ^ (z >> 31)


def rng_hash(seed, index):
    """loom_rng_hash(seed, index)."""
    x = (seed ^ ((index * 0xD1342543DE82EF95) & M64)) & M64
    x, _ = splitmix64(x)
    _, z = splitmix64(x)
    return z


def fortunes():
    """loom_text_load(NULL): every regular file of /usr/share/games/fortunes whose name has no
    '.', in strcmp order, concatenated, each line holding "%" alone read as an empty line."""
    d = b"/usr/share/games/fortunes"
    out = bytearray()
    for name in sorted(os.listdir(d)):
        path = os.path.join(d, name)
        regular = os.path.isfile(path) and not os.path.islink(path)
        if name.startswith(b".") or b"." in name or not regular:
            continue
        with open(path, "rb") as f:
            out += re.sub(rb"(?m)^%(?=\n|\Z)", b"", f.read())
    return bytes(out)


def batch(torch, text, seed, step, rows, context):
    """loom_text_batch(text, seed, step, 0, rows, context): (x, y) i64 [rows, context]."""
    ntrain = len(text) - len(text) // 10
    span = ntrain - context
    key = rng_hash(seed, step)
    xs, ys = [], []
    for r in range(rows):
        o = rng_hash(key, r) % span
        w = text[o:o + context + 1]
        xs.append(list(w[:-1]))
        ys.append(list(w[1:]))
    return torch.tensor(xs, dtype=torch.int64), torch.tensor(ys, dtype=torch.int64)


def read_safetensors_raw(path):
    """{name: (shape, raw little-endian f32 bytes)} of a safetensors file (F32 entries only, as
    loom writes a model), in the file's order. Needs no torch (bench/llmc/llmc_files.py)."""
    with open(path, "rb") as f:
        data = f.read()
    (hlen,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + hlen])
    base = 8 + hlen
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            die(f"{path}: {name} is {e['dtype']}, not F32")
        b, end = e["data_offsets"]
        out[name] = (e["shape"], data[base + b:base + end])
    return out


def read_safetensors(torch, path):
    """{name: f32 tensor} of a safetensors file (read_safetensors_raw)."""
    return {name: torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape).clone()
            for name, (shape, raw) in read_safetensors_raw(path).items()}


def bf16_gemm_accumulates_in_bf16(torch):
    """Whether torch's own bf16 matmul loses the f32 accumulation on this CPU. 1.13 runs bf16
    products on oneDNN only where the CPU has AVX-512 (BW, VL, DQ); elsewhere (an AVX2-only
    Zen 3, say) its fallback GEMM sums a non-transposed product in bf16: measured 8.6e-2
    relative error at 64x512x256, against 2.7e-3 (one bf16 rounding of the output) for the
    transposed layouts and for oneDNN."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(64, 512, generator=g).bfloat16()
    b = torch.randn(512, 256, generator=g).bfloat16()
    ref = a.float() @ b.float()
    return float(((a @ b).float() - ref).abs().max() / ref.abs().max()) > 1e-2


def build_model(torch, W, layers, heads, f32_attention=False, f32_accumulate=False):
    """The GPT-2 of loom/gpt.h over the parameters W (leaf tensors, requires_grad).
    f32_accumulate (where bf16_gemm_accumulates_in_bf16): under autocast each product (linear,
    matmul) takes its operands rounded to bf16 as autocast casts them, sums in f32 and rounds
    its output to bf16 once, as oneDNN's bf16 GEMM does and as autocast's bf16 matmul means;
    the gradients are rounded at the same casts, so the backward's products are the same
    roundings too. Everything else stays torch's own autocast.
    f32_attention (a measurement, not the baseline): under autocast, the attention between
    c_attn and c_proj computed in f32 from the bf16 q, k, v and rounded once to bf16, as loom's
    fused op does on a CPU without AMX (with AMX its products take bf16 operands, p and the
    gradients rounded to bf16 as a bf16 matmul takes them), instead of 1.13's bf16 scores and
    softmax."""
    F = torch.nn.functional
    C = W["wte.weight"].shape[1]
    D = C // heads

    def ln(x, p):
        return F.layer_norm(x, (C,), W[p + ".weight"], W[p + ".bias"], eps=1e-5)

    def bf16_f32(t):  # autocast's cast to bf16, then exact in f32
        return t.bfloat16().float()

    def f32_acc():
        return f32_accumulate and torch.is_autocast_cpu_enabled()

    def linear(x, w, b=None):
        if not f32_acc():
            return F.linear(x, w, b)
        with torch.autocast("cpu", enabled=False):
            return F.linear(bf16_f32(x), bf16_f32(w), None if b is None else bf16_f32(b)).bfloat16()

    def matmul(x, y):
        if not f32_acc():
            return torch.matmul(x, y)
        with torch.autocast("cpu", enabled=False):
            return torch.matmul(bf16_f32(x), bf16_f32(y)).bfloat16()

    def lin(x, p):
        return linear(x, W[p + ".weight"], W[p + ".bias"])

    def attn(x, p):
        B, T, _ = x.shape
        q, k, v = lin(x, p + ".c_attn").split(C, dim=2)
        q = q.view(B, T, heads, D).transpose(1, 2)
        k = k.view(B, T, heads, D).transpose(1, 2)
        v = v.view(B, T, heads, D).transpose(1, 2)
        if f32_attention and torch.is_autocast_cpu_enabled():
            with torch.autocast("cpu", enabled=False):
                y = core(q.float(), k.float(), v.float()).to(q.dtype)
        else:
            y = core(q, k, v)
        return lin(y.transpose(1, 2).reshape(B, T, C), p + ".c_proj")

    def core(q, k, v):
        T = q.shape[2]
        att = matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        return matmul(att, v)

    def mlp(x, p):
        return lin(F.gelu(lin(x, p + ".c_fc"), approximate="tanh"), p + ".c_proj")

    def forward(idx, targets):
        T = idx.shape[1]
        x = F.embedding(idx, W["wte.weight"]) + W["wpe.weight"][:T]
        for i in range(layers):
            x = x + attn(ln(x, f"h.{i}.ln_1"), f"h.{i}.attn")
            x = x + mlp(ln(x, f"h.{i}.ln_2"), f"h.{i}.mlp")
        logits = linear(ln(x, "ln_f"), W["wte.weight"])  # lm_head tied to wte, no bias
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return forward


def train_step(torch, forward, opt, x, y, amp):
    """One step: zero_grad, forward (under bf16 autocast when amp is "bf16"), backward, the
    optimizer's step; returns the loss."""
    opt.zero_grad(set_to_none=True)
    if amp == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(x, y)
    else:
        loss = forward(x, y)
    loss.backward()
    opt.step()
    return loss


def run(cmd, env):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if r.returncode != 0:
        sys.stdout.write(r.stdout)
        die(f"failed ({r.returncode}): {' '.join(cmd)}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("workdir")
    ap.add_argument("--text", default=None, help="default: the fortunes, loom's default text")
    ap.add_argument("--amp", default="off", choices=["off", "bf16"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--f32-attention", action="store_true",
                    help="bf16: attention in f32 as loom's fused op without AMX (a measurement)")
    ap.add_argument("--tol1", type=float, default=None)
    ap.add_argument("--tol", type=float, default=None)
    a = ap.parse_args()
    # Relative loss differences, from measurement (BENCHMARKS.md, "Parity with PyTorch"), at
    # this model and --lr 3e-4. f32: step 1 differs by float rounding alone (measured <= 9e-8,
    # a loss ulp is 0.6-1.2e-7), 50 steps by <= 2.4e-7; the bounds are 4x that or more, and
    # LayerNorm eps 1e-6 (1.8e-5 at step 1), AdamW eps 1e-7 (1.1e-5) or exact GELU (1.6e-6)
    # exceed them. bf16: two bf16 computations differ by their roundings (measured <= 4.9e-6 at
    # step 1, <= 1e-4 over 50 steps, whichever attention precision torch uses); the bounds
    # are 10x / 5x that, still 1/80 and 1/8 of one bf16 rounding (2^-8).
    # At --lr 1e-3 this model's loss spikes near step 22 (in torch as in loom) and a 1e-5
    # difference grows to percents: no tolerance is meaningful there.
    tol1 = a.tol1 if a.tol1 is not None else (5e-7 if a.amp == "off" else 5e-5)
    tol = a.tol if a.tol is not None else (1e-6 if a.amp == "off" else 5e-4)

    # loom runs with the environment as given (make check-avx2's LOOM_CPU / ONEDNN_MAX_CPU_ISA
    # caps included); torch, the baseline, on the CPU as it is: 1.13's bf16 linear fails under
    # oneDNN capped at AVX2 ("could not create a primitive descriptor iterator").
    loom_env = dict(os.environ)
    capped = [v for v in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA") if os.environ.pop(v, None)]
    torch = torch_threads.cap(a.threads)
    if capped:
        print(f"note: {', '.join(capped)} unset for torch (loom keeps it)", flush=True)
    print(torch_threads.line(), f"torch {torch.__version__}", flush=True)
    os.makedirs(a.workdir, exist_ok=True)
    shape = ["--model", "gpt", *(["--text", a.text] if a.text else []),
             "--layers", str(a.layers), "--heads", str(a.heads), "--dim", str(a.dim),
             "--context", str(a.context), "--batch", str(a.batch),
             "--seed", str(a.seed), "--threads", str(a.threads), "--schedule", "constant",
             "--epochs", "1000", "--eval-windows", "1", "--quiet"]
    init = os.path.join(a.workdir, "init")
    run([a.loom, "train", *shape, "--max-steps", "1", "--lr", "0", "--weight-decay", "0",
         "--save", init, "--overwrite"], loom_env)
    metrics = os.path.join(a.workdir, f"metrics-{a.amp}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    out = run([a.loom, "train", *shape, "--max-steps", str(a.steps), "--lr", repr(a.lr),
               "--weight-decay", repr(a.weight_decay), "--amp", a.amp,
               "--init", os.path.join(init, "model.safetensors"), "--metrics", metrics], loom_env)
    sys.stdout.write(out)
    with open(metrics) as f:
        loom_loss = {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}

    W = read_safetensors(torch, os.path.join(init, "model.safetensors"))
    for t in W.values():
        t.requires_grad_(True)
    f32_acc = a.amp == "bf16" and bf16_gemm_accumulates_in_bf16(torch)
    if f32_acc:
        print("note: torch's bf16 matmul sums in bf16 on this CPU (no oneDNN bf16 in 1.13 "
              "without AVX-512): its autocast products computed with f32 accumulation", flush=True)
    forward = build_model(torch, W, a.layers, a.heads, a.f32_attention, f32_acc)
    params = list(W.values())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay)
    if a.text:
        with open(a.text, "rb") as f:
            text = f.read()
    else:
        text = fortunes()

    worst, worst_step, first = 0.0, 0, None
    for s in range(a.steps):
        x, y = batch(torch, text, a.seed, s, a.batch, a.context)
        loss = train_step(torch, forward, opt, x, y, a.amp)
        tl, ll = float(loss), loom_loss.get(s + 1)
        if ll is None:
            die(f"{metrics}: no loss for step {s + 1}")
        rel = abs(ll - tl) / abs(tl)
        if first is None:
            first = rel
        if rel > worst:
            worst, worst_step = rel, s + 1
        print(f"step {s + 1:3d}  loom {ll:.7f}  torch {tl:.7f}  rel {rel:.2e}", flush=True)
    ok = first <= tol1 and worst <= tol
    print(f"parity {a.amp}: step 1 rel diff {first:.2e} (tol {tol1:g}); max over {a.steps} steps "
          f"{worst:.2e} at step {worst_step} (tol {tol:g}): {'ok' if ok else 'FAIL'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
