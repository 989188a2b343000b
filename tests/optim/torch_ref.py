# torch_ref.py: prints the PyTorch 1.13 reference values pasted into test_optim_torch.c
# (run with /usr/bin/python3; torch is a reference only, never a dependency of loom).
import torch
torch.set_num_threads(1)
P0 = [0.5, -1.25, 2.0, -0.75, 0.125]
G = [[0.1, -0.2, 0.3, 0.4, -0.5],
     [-0.25, 0.5, 0.125, -1.0, 2.0],
     [1.5, 0.0, -0.3, 0.7, 0.05]]
def run(cls, **kw):
    p = torch.tensor(P0, dtype=torch.float32, requires_grad=True)
    opt = cls([p], **kw)
    out = []
    for g in G:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        out.append(p.detach().clone().tolist())
    st = opt.state[p]
    return out, {k: (v.tolist() if torch.is_tensor(v) and v.numel() > 1 else (None if v is None else float(v))) for k, v in st.items()}
cases = {
 'sgd_momentum_wd': (torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
 'sgd_nesterov': (torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True)),
 'sgd_dampening_maximize': (torch.optim.SGD, dict(lr=0.1, momentum=0.5, dampening=0.25, maximize=True)),
 'sgd_plain': (torch.optim.SGD, dict(lr=0.2)),
 'adam_l2': (torch.optim.Adam, dict(lr=0.01, weight_decay=0.1)),
 'adam_default': (torch.optim.Adam, dict()),
 'adamw': (torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)),
 'adamw_betas': (torch.optim.AdamW, dict(lr=0.05, betas=(0.5, 0.75), eps=1e-3)),
}
def fl(v): return ', '.join('%.9gf' % x for x in v)
for name, (cls, kw) in cases.items():
    out, st = run(cls, **kw)
    print('/* %s: %s(%s) */' % (name, cls.__name__, kw))
    print('static const float %s_p[3][5] = {%s};' % (name, ', '.join('{%s}' % fl(o) for o in out)))
    for k, v in st.items():
        if isinstance(v, list): print('static const float %s_%s[5] = {%s};' % (name, k, fl(v)))
# clipping
a = torch.tensor([3.0, -4.0, 1.0], requires_grad=True); b = torch.tensor([0.5, 2.0], requires_grad=True)
a.grad = torch.tensor([3.0, -4.0, 1.0]); b.grad = torch.tensor([0.5, 2.0])
n = torch.nn.utils.clip_grad_norm_([a, b], 2.0)
print('/* clip_grad_norm_([a,b], 2.0): norm %.9g */' % n.item())
print('static const float clip_norm = %.9gf;' % n.item())
print('static const float clip_a[3] = {%s};' % fl(a.grad.tolist()))
print('static const float clip_b[2] = {%s};' % fl(b.grad.tolist()))
