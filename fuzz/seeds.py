#!/usr/bin/env python3
"""seeds.py: writes the fuzzers' seed corpus (fuzz/corpus/<harness>/): a few small valid files of
each format, made by the formats' own rules (safetensors; loom's checkpoint/2 with its whole-file
CRC-32, include/loom/io.h; IDX plain and gzip'd; `loom train --metrics` JSON Lines). The files are kept in the repository (each a
few hundred bytes); run this to make them again. Inputs a fuzzer once crashed on go next to them
as regression cases (fuzz/corpus/<harness>/crash-*)."""
import gzip, json, os, struct, zlib

here = os.path.dirname(os.path.abspath(__file__))

def st(tensors, meta=None):
    """safetensors bytes: tensors = [(name, dtype, shape, raw bytes)]"""
    header, data = {}, b""
    for name, dt, shape, raw in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    if meta is not None:
        header["__metadata__"] = meta
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

def f32(*v): return struct.pack("<%df" % len(v), *v)
def f16(*v): return struct.pack("<%de" % len(v), *v)
def bf16(*v): return b"".join(struct.pack("<f", x)[2:] for x in v)

def checkpoint(tensors, meta):
    m = dict(meta)
    m["loom.format"] = "checkpoint/2"
    m["loom.crc32"] = "00000000"
    b = st(tensors, m)
    i = b.index(b'"loom.crc32":"00000000"') + len(b'"loom.crc32":"')
    crc = "%08x" % (zlib.crc32(b) & 0xffffffff)
    return b[:i] + crc.encode() + b[i + 8:]

def idx(dtype_code, dims, raw):
    return struct.pack(">BBBB", 0, 0, dtype_code, len(dims)) + b"".join(struct.pack(">I", d) for d in dims) + raw

def write(harness, name, b):
    d = os.path.join(here, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(b)

mlp = [("layers.0.weight", "F32", [2, 3], f32(0.1, -0.2, 0.3, 0.4, 0.5, -0.6)),
       ("layers.0.bias", "F32", [2], f32(0.0, 1.0))]
for h in ("fuzz_safetensors", "fuzz_loader"):
    write(h, "mlp_f32.safetensors", st(mlp, {"format": "pt"}))
    write(h, "mixed.safetensors", st([("a", "F16", [2, 2], f16(1, -2, 0.5, 65504)),
                                      ("b", "BF16", [3], bf16(1.0, -0.0, 3.5)),
                                      ("c", "I64", [1], struct.pack("<q", 7)),
                                      ("d", "F64", [1], struct.pack("<d", 2.5))]))
    write(h, "meta_only.safetensors", st([], {"step": "12", "lr": "0.001"}))
write("fuzz_checkpoint", "state.ckpt", checkpoint(
    mlp + [("layers.0.weight.exp_avg_sq", "F32", [2, 3], f32(0, 1e-3, 2e-3, 0, 0, 1)),
           ("amp.scaler", "I64", [2], struct.pack("<qq", 65536, 3))],
    {"step": "3", "epoch": "0"}))
write("fuzz_checkpoint", "empty.ckpt", checkpoint([], {"step": "0"}))
images = idx(0x08, [2, 3, 3], bytes(range(18)))
labels = idx(0x08, [2], bytes([3, 7]))
floats = idx(0x0D, [2, 2], struct.pack(">4f", 1, 2, 3, 4))
for h, wrap in (("fuzz_idx", lambda b: b), ("fuzz_idx_gz", lambda b: b)):
    write(h, "images.idx", wrap(images))
    write(h, "labels.idx", wrap(labels))
    write(h, "floats.idx", wrap(floats))
write("fuzz_idx", "images.idx.gz", gzip.compress(images, mtime=0))
write("fuzz_idx", "labels.idx.gz", gzip.compress(labels, mtime=0))

def metrics(rows):
    """loom train --metrics records, as it writes them (tools/train_metrics.c)"""
    return "".join('{"step": %s, "epoch": 0, "loss": %s, "lr": %s, "scale": %s, "overflow": %s, '
                   '"samples_per_s": %s, "mem": {"compute": {"current_bytes": %s, "peak_bytes": 0}}}\n'
                   % r for r in rows).encode()
write("fuzz_plot", "run.jsonl", metrics([(s, 2.3 / s, 0.001, 65536 >> (s // 3), "true" if s % 3 == 0 else "false",
                                          1000.0 + s, 1000000 + s) for s in range(1, 7)]))
write("fuzz_plot", "extremes.jsonl", metrics([("1e16", 1, 0.1, "1e308", "false", 0, 0),
                                              (2, "nan", "inf", 0, "true", "-inf", "1e308"),
                                              (3, "-1e300", -1, -5, "false", 1, 1),
                                              (4, 1, 1, "1e-300", "false", 1, 1)]))
write("fuzz_plot", "flat.jsonl", b'{"step": 7, "loss": 1}\n{"step": 7, "loss": 1, "scale": 2}\n')

# loom_text (`loom train --model gpt --text FILE`): byte 0 is the context - 1, byte 1 the rows
# (mod 8) - 1 and the seed, the rest the text (fuzz/fuzz_text.c)
prose = (b"It was the best of times, it was the worst of times, it was the age of wisdom, it was "
         b"the age of foolishness, it was the epoch of belief, it was the epoch of incredulity.\n")
write("fuzz_text", "prose_ctx8", bytes([7, 3]) + prose)
write("fuzz_text", "short_ctx1", bytes([0, 0]) + b"ab" * 12)
write("fuzz_text", "binary_ctx16", bytes([15, 5]) + bytes(range(256)))
write("fuzz_text", "long_ctx256", bytes([255, 7]) + prose * 16)
write("fuzz_text", "too_short", bytes([63, 1]) + prose[:40])
