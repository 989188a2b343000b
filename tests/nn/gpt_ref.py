# gpt_ref.py: prints the reference values pasted into test_gpt.c (gpt_matches_reference_forward):
# GPT-2's forward written out the way HF transformers' modeling_gpt2.py computes it, in plain
# Python doubles (no torch, no numpy: run it with any python3), with the Linears in HF's Conv1D
# layout ([in, out], y = x W + b), so the test also checks the transpose gpt.h documents.
#
# Parameter k (named_parameters order) element e (row-major in loom's layout) is
# 0.3 sin(0.5 + 0.37 e + 0.013 e^2 + 1.3 k), plus 1 for LayerNorm weights; loom's Linear
# weight [out, in] element o * in + i is Conv1D's W[i][o].
import math

V, T, L, H, C = 11, 5, 2, 2, 8
D = C // H
TOKENS = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
TARGETS = [[1, 4, 1, 5, 9], [2, 6, 5, 3, 5]]


def val(k, e, ln_weight=False):
    return (1.0 if ln_weight else 0.0) + 0.3 * math.sin(0.5 + 0.37 * e + 0.013 * e * e + 1.3 * k)


k_next = 0


def take(n, ln_weight=False):
    global k_next
    v = [val(k_next, e, ln_weight) for e in range(n)]
    k_next += 1
    return v


def matrix(rows, cols):  # loom's [rows, cols], row-major
    flat = take(rows * cols)
    return [flat[r * cols:(r + 1) * cols] for r in range(rows)]


def conv1d(n_in, n_out):  # loom Linear weight [out, in] and bias, as Conv1D W [in][out], b
    w = matrix(n_out, n_in)
    return [[w[o][i] for o in range(n_out)] for i in range(n_in)], take(n_out)


def layer_norm_params():
    return take(C, True), take(C)


wte = matrix(V, C)
wpe = matrix(T, C)
blocks = []
for _ in range(L):
    b = {}
    b['ln_1'] = layer_norm_params()
    b['c_attn'] = conv1d(C, 3 * C)
    b['attn_proj'] = conv1d(C, C)
    b['ln_2'] = layer_norm_params()
    b['c_fc'] = conv1d(C, 4 * C)
    b['mlp_proj'] = conv1d(4 * C, C)
    blocks.append(b)
ln_f = layer_norm_params()


def layer_norm(x, p):
    w, b = p
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    r = 1.0 / math.sqrt(var + 1e-5)
    return [(v - mean) * r * w[i] + b[i] for i, v in enumerate(x)]


def linear(x, p):  # Conv1D: x @ W + b
    w, b = p
    return [sum(x[i] * w[i][o] for i in range(len(x))) + b[o] for o in range(len(b))]


def gelu_tanh(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def forward(tokens):
    x = [[wte[tok][c] + wpe[t][c] for c in range(C)] for t, tok in enumerate(tokens)]
    for b in blocks:
        qkv = [linear(layer_norm(xt, b['ln_1']), b['c_attn']) for xt in x]
        y = [[0.0] * C for _ in x]
        for h in range(H):
            for t in range(len(x)):
                q = qkv[t][h * D:(h + 1) * D]
                s = [sum(q[d] * qkv[u][C + h * D + d] for d in range(D)) / math.sqrt(D)
                     for u in range(t + 1)]  # keys 0..t: causal
                mx = max(s)
                e = [math.exp(v - mx) for v in s]
                z = sum(e)
                for d in range(D):
                    y[t][h * D + d] = sum(e[u] / z * qkv[u][2 * C + h * D + d] for u in range(t + 1))
        x = [[xt[c] + a[c] for c in range(C)] for xt, a in zip(x, (linear(yt, b['attn_proj']) for yt in y))]
        m = [linear([gelu_tanh(v) for v in linear(layer_norm(xt, b['ln_2']), b['c_fc'])], b['mlp_proj'])
             for xt in x]
        x = [[xt[c] + mt[c] for c in range(C)] for xt, mt in zip(x, m)]
    x = [layer_norm(xt, ln_f) for xt in x]
    return [[sum(xt[c] * wte[v][c] for c in range(C)) for v in range(V)] for xt in x]  # tied head


logits = [forward(row) for row in TOKENS]
loss, n = 0.0, 0
for row, tgt in zip(logits, TARGETS):
    for lt, y in zip(row, tgt):
        mx = max(lt)
        loss += mx + math.log(sum(math.exp(v - mx) for v in lt)) - lt[y]
        n += 1
print('/* tests/nn/gpt_ref.py: V %d, T %d, %d layers, %d heads, C %d */' % (V, T, L, H, C))
print('static const double gpt_ref_loss = %.12g;' % (loss / n))
print('static const float gpt_ref_logits[%d] = {' % (2 * T * V))
flat = [v for row in logits for lt in row for v in lt]
for i in range(0, len(flat), 6):
    print('    ' + ', '.join('%.9gf' % v for v in flat[i:i + 6]) + ',')
print('};')
