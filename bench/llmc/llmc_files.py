#!/usr/bin/python3
"""llmc_files.py: the inputs of llm.c's train_gpt2.c for bench/llmc_side_by_side.sh, from
loom's own: a model checkpoint and a token file (llm.c's formats), and PyTorch's step timed
at the same shape (optional). No numpy or torch needed for the files.

  checkpoint SAFETENSORS OUT --layers L --heads H --dim C --context T
      loom's model.safetensors (GPT-2 names, nn.Linear [out, in] layout) as llm.c's checkpoint
      (gpt2_build_from_checkpoint): 256 int32 header (magic 20240326, version 3, max_seq_len,
      vocab_size, num_layers, num_heads, channels, padded_vocab_size), then every f32
      parameter in fill_in_parameter_sizes' order, each of the 12 per-layer kinds stacked over
      the layers. llm.c's matmul_forward takes its weight as (OC, C), [out, in], as loom: the
      tensors are copied as they are. Vocabulary 256 (bytes); llm.c pads the vocabulary to a
      multiple of 128, which 256 already is, so padded_vocab_size = 256 and wte is loom's.
  tokens OUT [--text FILE]
      the training part of loom's text (loom_text_load's rule: by default the fortunes; the
      last tenth is validation) as llm.c's token file (dataloader.h: 256 int32 header, magic
      20240520, version 1, token count, then uint16 tokens, one per byte).
  torch SAFETENSORS --layers L --heads H --context T --batch B --threads N --steps S
      [--amp off|bf16]: PyTorch 1.13's step (zero_grad, forward, backward, AdamW) on the
      parity test's model (tests/train/gpt_torch_parity.py) and windows, one line per step.
  window SAFETENSORS OUT --layers L --heads H --context T
      the conversion's check: the first window of loom's step 1 (row 0, T + 1 tokens) as an
      llm.c token file, and PyTorch's loss on it from loom's weights ("torch loss X"): llm.c's
      first loss at B 1 on that file must be the same (float rounding).

The text, the windows, the safetensors reader and the model are gpt_torch_parity.py's."""
import argparse
import os
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "train"))
sys.path.insert(0, os.path.join(HERE, ".."))
import gpt_torch_parity as parity  # noqa: E402  (imports no torch by itself)


def checkpoint(a):
    W = parity.read_safetensors_raw(a.safetensors)
    L, C, T = a.layers, a.dim, a.context
    V = W["wte.weight"][0][0]
    Vp = (V + 127) // 128 * 128
    if Vp != V:
        parity.die(f"vocabulary {V}: llm.c would pad it to {Vp}; only 256 is handled")
    want_wpe = [W["wpe.weight"][0][0], C]
    if W["wte.weight"][0] != [V, C] or want_wpe[0] < T:
        parity.die(f"shape mismatch: wte {W['wte.weight'][0]}, wpe {W['wpe.weight'][0]}")
    maxT = W["wpe.weight"][0][0]
    per_layer = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    sizes = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, C * 4 * C, C]
    header = [20240326, 3, maxT, V, L, a.heads, C, Vp] + [0] * 248
    with open(a.out, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(W["wte.weight"][1])
        f.write(W["wpe.weight"][1])
        for kind, n in zip(per_layer, sizes):
            for i in range(L):
                shape, raw = W[f"h.{i}.{kind}"]
                if len(raw) != 4 * n:
                    parity.die(f"h.{i}.{kind}: {shape}, expected {n} elements")
                f.write(raw)
        f.write(W["ln_f.weight"][1])
        f.write(W["ln_f.bias"][1])
    used = {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"} | {
        f"h.{i}.{k}" for i in range(L) for k in per_layer}
    extra = sorted(set(W) - used)
    if extra:
        parity.die(f"tensors llm.c has no place for: {extra}")
    print(f"llmc checkpoint {a.out}: maxT {maxT} V {V} Vp {Vp} L {L} NH {a.heads} C {C}")


def write_tokens(path, toks):
    """llm.c's token file (dataloader.h): 256 int32 header, then uint16 tokens."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))


def tokens(a):
    if a.text:
        with open(a.text, "rb") as f:
            text = f.read()
    else:
        text = parity.fortunes()
    train = text[:len(text) - len(text) // 10]
    write_tokens(a.out, train)
    print(f"llmc tokens {a.out}: {len(train)} bytes of text (the training part of {len(text)})")


def torch_steps(a):
    import torch_threads
    torch = torch_threads.cap(a.threads)
    print(torch_threads.line(), f"torch {torch.__version__}", flush=True)
    W = parity.read_safetensors(torch, a.safetensors)
    for t in W.values():
        t.requires_grad_(True)
    forward = parity.build_model(torch, W, a.layers, a.heads)
    opt = torch.optim.AdamW(list(W.values()), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.01)
    text = parity.fortunes()
    for s in range(a.steps):
        x, y = parity.batch(torch, text, 0, s, a.batch, a.context)
        t0 = time.perf_counter()
        loss = parity.train_step(torch, forward, opt, x, y, a.amp)
        ms = (time.perf_counter() - t0) * 1000
        print(f"step {s}: train loss {float(loss):f} (took {ms:f} ms)", flush=True)


def window(a):
    import torch_threads
    torch = torch_threads.cap(1)
    x, y = parity.batch(torch, parity.fortunes(), 0, 0, 1, a.context)
    toks = x[0].tolist() + [int(y[0, -1])]
    write_tokens(a.out, toks)
    W = parity.read_safetensors(torch, a.safetensors)
    with torch.no_grad():
        loss = parity.build_model(torch, W, a.layers, a.heads)(x, y)
    print(f"torch loss {float(loss):f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("checkpoint")
    c.add_argument("safetensors")
    c.add_argument("out")
    t = sub.add_parser("tokens")
    t.add_argument("out")
    t.add_argument("--text", default=None)
    p = sub.add_parser("torch")
    p.add_argument("safetensors")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--amp", default="off", choices=["off", "bf16"])
    w = sub.add_parser("window")
    w.add_argument("safetensors")
    w.add_argument("out")
    for q in (c, p, w):
        q.add_argument("--layers", type=int, required=True)
        q.add_argument("--heads", type=int, required=True)
        q.add_argument("--context", type=int, required=True)
    c.add_argument("--dim", type=int, required=True)
    a = ap.parse_args()
    {"checkpoint": checkpoint, "tokens": tokens, "torch": torch_steps, "window": window}[a.cmd](a)


if __name__ == "__main__":
    main()
