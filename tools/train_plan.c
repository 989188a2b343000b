/* train_plan.c: the memory plan of a `loom train` run (train_plan.h). A small simulator of the
 * compute pool: values with reference counts, allocated and freed as the library's ops, the
 * autograd engine, DDP and FSDP allocate and free them, over the tool's two models (both
 * chains of layers). Each op's sequence mirrors its source (src/ops/matmul.c, op_conv2d.c,
 * pool.c, unary.c, loss.c; src/fsdp/fsdp_hooks.c), and the test holds the result to the
 * measured peak, so a change there that moves memory shows up as a failing plan. */
#include "train_plan.h"

#include <string.h>

/* ---- the simulated pool ------------------------------------------------------------------ */

#define SIM_VALUES 512

typedef struct sim_val {
  int64_t bytes;
  plan_part part;
  int refs; /* 0: free */
} sim_val;

typedef struct sim {
  sim_val v[SIM_VALUES];
  int nv;
  int64_t cur[PLAN_PARTS], total;
  plan_phase *ph; /* the phase being recorded */
} sim;

static void sim_count(sim *s, plan_part p, int64_t delta) {
  s->cur[p] += delta;
  s->total += delta;
  if (delta > 0 && s->total > s->ph->peak) {
    s->ph->peak = s->total;
    memcpy(s->ph->part, s->cur, sizeof s->cur);
  }
}

/* A new value of `bytes` (NULL for 0 bytes: nothing to count). */
static sim_val *sim_new(sim *s, plan_part p, int64_t bytes) {
  if (bytes <= 0) return NULL;
  sim_val *v = NULL;
  for (int i = 0; i < s->nv && !v; i++)
    if (s->v[i].refs == 0) v = &s->v[i];
  /* never full: the largest option set holds under 40 values at once */
  if (!v) v = s->nv < SIM_VALUES ? &s->v[s->nv++] : &s->v[SIM_VALUES - 1];
  *v = (sim_val){bytes, p, 1};
  sim_count(s, p, bytes);
  return v;
}

static sim_val *sim_ref(sim_val *v) {
  if (v) v->refs++;
  return v;
}

static void sim_drop(sim *s, sim_val *v) {
  if (!v || v->refs <= 0) return;
  if (--v->refs == 0) sim_count(s, v->part, -v->bytes);
}

/* A transient: allocated and freed at once (its peak counts). */
static void sim_blip(sim *s, plan_part p, int64_t bytes) { sim_drop(s, sim_new(s, p, bytes)); }

/* ---- the model as a chain of ops ----------------------------------------------------------- */

typedef enum op_kind { OP_LINEAR, OP_RELU, OP_CONV, OP_POOL, OP_FLATTEN } op_kind;

typedef struct op {
  op_kind kind;
  int64_t in, out;    /* features (linear) or channels (conv, pool: in = out) */
  int64_t side;       /* conv, pool: the input's height = width */
  int layer;          /* index among the layers with parameters (linear, conv), -1 otherwise */
} op;

#define MAX_OPS 32
#define MAX_UNITS 16

typedef struct net {
  op ops[MAX_OPS];
  int nops;
  int64_t in_elems;   /* per sample: 784 */
  int64_t numel[MAX_UNITS]; /* parameter elements of each layer, in order */
  int nlayers;
} net;

static void net_add(net *n, op o) {
  if (n->nops < MAX_OPS) n->ops[n->nops++] = o;
}

static int64_t layer_numel(const op *o) {
  if (o->kind == OP_LINEAR) return o->out * o->in + o->out;
  if (o->kind == OP_CONV) return o->out * o->in * 9 + o->out;
  return 0;
}

static void net_make(const train_opts *o, net *n) {
  memset(n, 0, sizeof *n);
  n->in_elems = 28 * 28;
  if (strcmp(o->model, "cnn") == 0) {
    int64_t c1 = o->channels[0], c2 = o->channels[1];
    net_add(n, (op){OP_CONV, 1, c1, 28, -1});
    net_add(n, (op){OP_RELU, c1, c1, 28, -1});
    net_add(n, (op){OP_POOL, c1, c1, 28, -1});
    net_add(n, (op){OP_CONV, c1, c2, 14, -1});
    net_add(n, (op){OP_RELU, c2, c2, 14, -1});
    net_add(n, (op){OP_POOL, c2, c2, 14, -1});
    net_add(n, (op){OP_FLATTEN, c2 * 49, c2 * 49, 0, -1});
    net_add(n, (op){OP_LINEAR, c2 * 49, o->fc, 0, -1});
    net_add(n, (op){OP_RELU, o->fc, o->fc, 0, -1});
    net_add(n, (op){OP_LINEAR, o->fc, 10, 0, -1});
  } else {
    int64_t in = n->in_elems;
    for (int i = 0; i < o->nhidden; i++) {
      net_add(n, (op){OP_LINEAR, in, o->hidden[i], 0, -1});
      net_add(n, (op){OP_RELU, o->hidden[i], o->hidden[i], 0, -1});
      in = o->hidden[i];
    }
    net_add(n, (op){OP_LINEAR, in, 10, 0, -1});
  }
  for (int i = 0; i < n->nops; i++)
    if (layer_numel(&n->ops[i]) && n->nlayers < MAX_UNITS) {
      n->ops[i].layer = n->nlayers;
      n->numel[n->nlayers++] = layer_numel(&n->ops[i]);
    }
}

static int64_t net_params(const net *n) {
  int64_t p = 0;
  for (int i = 0; i < n->nlayers; i++) p += n->numel[i];
  return p;
}

/* Elements per sample of an op's input and output. */
static int64_t op_in_elems(const op *o) {
  if (o->kind == OP_CONV || o->kind == OP_POOL || (o->kind == OP_RELU && o->side))
    return o->in * o->side * o->side;
  return o->in;
}

static int64_t op_out_elems(const op *o) {
  if (o->kind == OP_POOL) return o->out * (o->side / 2) * (o->side / 2);
  if (o->kind == OP_CONV || (o->kind == OP_RELU && o->side)) return o->out * o->side * o->side;
  return o->out;
}

/* ---- the run's configuration -------------------------------------------------------------- */

typedef struct run {
  sim s;
  net n;
  int64_t rows;         /* this rank's batch */
  int ranks;
  int amp_es;           /* element size under autocast: 2, or 4 without --amp */
  bool widen;           /* low-precision products widened to f32 */
  bool ddp, fsdp, reshard;
  bool fsdp_mp;         /* FSDP forward dtype is the --amp dtype */
  int gather_prefetch;
  int64_t shard[MAX_UNITS], padded[MAX_UNITS];
  int unit_of_layer[MAX_UNITS], nunits;
  bool off_params, off_grads, off_optim, disk;
  int prefetch;
  int state_kinds;      /* optimizer state buffers per element */
  int span_first[MAX_UNITS], span_last[MAX_UNITS]; /* ops a unit's forward covers */
  int first_layer_op[MAX_UNITS]; /* the first op using the unit's own parameters */
  /* FSDP state while a pass runs */
  sim_val *gathered[MAX_UNITS], *local_grad[MAX_UNITS], *ahead[MAX_UNITS];
} run;

_Static_assert(MAX_OPS >= 2 * TRAIN_MAX_HIDDEN + 1 && MAX_OPS >= 10, "an op per layer and ReLU");
_Static_assert(MAX_UNITS >= TRAIN_MAX_HIDDEN + 1, "a unit per layer");

/* Elements of this rank's shards, all units. */
static int64_t shard_total(const run *r) {
  int64_t t = 0;
  for (int u = 0; u < r->nunits; u++) t += r->shard[u];
  return t;
}


/* The op of layer l (a linear or conv). */
static const op *layer_op(const net *n, int l) {
  for (int i = 0; i < n->nops; i++)
    if (n->ops[i].layer == l) return &n->ops[i];
  return &n->ops[0]; /* not reached: every layer has its op */
}

/* FSDP's units as the library cuts these models (src/fsdp/fsdp_units.c): --wrap children, each
 * layer; --wrap size, each layer of --unit-min elements or more on its own and the rest in one
 * unit for the model (its Sequential or the root), which comes first and whose forward spans the
 * model's. A unit's flat parameter is the library's layout (loom_layout_plan) of its layers'
 * weights and biases. */
static void make_units(run *r, const train_opts *o) {
  const net *n = &r->n;
  bool by_size = strcmp(o->wrap, "size") == 0;
  int rest = -1; /* the model's unit (size policy), if some layer is below --unit-min */
  for (int l = 0; l < n->nlayers && by_size; l++)
    if (n->numel[l] < o->unit_min) rest = 0;
  size_t sizes[MAX_UNITS][2 * MAX_UNITS]; /* each unit's weights and biases, in order */
  size_t nsizes[MAX_UNITS] = {0};
  r->nunits = rest + 1;
  for (int l = 0; l < n->nlayers; l++) {
    int u = by_size && n->numel[l] < o->unit_min ? rest : r->nunits++;
    r->unit_of_layer[l] = u;
    const op *lo = layer_op(n, l);
    sizes[u][nsizes[u]++] = (size_t)(n->numel[l] - lo->out);
    sizes[u][nsizes[u]++] = (size_t)lo->out;
  }
  for (int u = 0; u < r->nunits; u++) {
    loom_layout_info li = {0};
    if (loom_layout_plan(LOOM_F32, sizes[u], nsizes[u], (size_t)r->ranks, NULL, &li)) li.shard = 0;
    r->padded[u] = (int64_t)li.padded;
    r->shard[u] = (int64_t)li.shard;
    r->span_first[u] = r->first_layer_op[u] = n->nops;
    r->span_last[u] = -1;
  }
  for (int i = 0; i < n->nops; i++) {
    int u = n->ops[i].layer < 0 ? -1 : r->unit_of_layer[n->ops[i].layer];
    if (u < 0) continue;
    if (i < r->first_layer_op[u]) r->first_layer_op[u] = r->span_first[u] = i;
    if (i > r->span_last[u]) r->span_last[u] = i;
  }
  if (rest == 0) r->span_first[0] = 0, r->span_last[0] = n->nops - 1;
}

/* ---- FSDP's gathers and unit gradients ------------------------------------------------------ */

static int unit_of_op(const run *r, const op *o) {
  return o->layer < 0 ? -1 : r->unit_of_layer[o->layer];
}

/* A unit's parameters come back: its gathered buffer (in the forward dtype), filled from this
 * rank's shard; a shard the disk tier brought ahead is then freed. */
static void gather(run *r, int u) {
  if (u < 0 || u >= r->nunits || r->gathered[u]) return;
  int es = r->fsdp_mp ? r->amp_es : 4;
  r->gathered[u] = sim_new(&r->s, PLAN_LOWP, r->padded[u] * es);
  sim_drop(&r->s, r->ahead[u]);
  r->ahead[u] = NULL;
}

/* The disk tier reads a unit's parameter shard into the compute pool ahead of its gather
 * (--prefetch); the host tier's gathers read the tier in place. */
static void param_ahead(run *r, int u) {
  if (!r->disk || !r->off_params || u < 0 || u >= r->nunits || r->gathered[u] || r->ahead[u])
    return;
  r->ahead[u] = sim_new(&r->s, PLAN_PARAMS, r->shard[u] * 4);
}

static void release_unit(run *r, int u) {
  sim_drop(&r->s, r->gathered[u]);
  r->gathered[u] = NULL;
}

/* Unit u's forward starts: it and the next --gather-prefetch units are gathered, and the disk
 * tier starts reading the --prefetch units after those. */
static void fsdp_pre_forward(run *r, int u) {
  for (int k = u; k <= u + r->gather_prefetch && k < r->nunits; k++) gather(r, k);
  for (int k = 1; k <= r->prefetch; k++) param_ahead(r, u + r->gather_prefetch + k);
}

/* Unit u's backward starts at op i: each unit whose backward is over (all its layers are past)
 * is resharded and its gradient reduce-scattered and freed; u and the --gather-prefetch units
 * before it are gathered, the disk tier reads ahead, and u's full-size gradient is made. */
static void fsdp_pre_backward(run *r, int u, int i) {
  for (int o = 0; o < r->nunits; o++)
    if (o != u && r->local_grad[o] && r->first_layer_op[o] > i) {
      release_unit(r, o);
      sim_drop(&r->s, r->local_grad[o]);
      r->local_grad[o] = NULL;
    }
  for (int k = u; k >= u - r->gather_prefetch && k >= 0; k--) gather(r, k);
  for (int k = 1; k <= r->prefetch; k++) param_ahead(r, u - r->gather_prefetch - k);
  if (!r->local_grad[u]) r->local_grad[u] = sim_new(&r->s, PLAN_GRADS, r->padded[u] * 4);
}

/* The units whose forward starts at op i, in order. */
static void fsdp_forward_starts(run *r, int i) {
  for (int u = 0; u < r->nunits; u++)
    if (r->span_first[u] == i) fsdp_pre_forward(r, u);
}

/* After op i: the units whose forward ends there are resharded (with --reshard-after-forward). */
static void fsdp_forward_ends(run *r, int i, bool reshard) {
  for (int u = 0; u < r->nunits; u++)
    if (r->span_last[u] == i && reshard) release_unit(r, u);
}

/* ---- forward ---------------------------------------------------------------------------- */

typedef struct act {
  sim_val *v;
  int es; /* element size of the activation: 4 (f32) or 2 */
} act;

/* Saved for backward per op: up to three values. */
typedef struct saved {
  sim_val *v[3];
} saved;

static void save(saved *sv, sim_val *v) {
  for (int i = 0; i < 3; i++)
    if (!sv->v[i]) {
      sv->v[i] = sim_ref(v);
      return;
    }
}

static void spend(sim *s, saved *sv) {
  for (int i = 0; i < 3; i++) {
    sim_drop(s, sv->v[i]);
    sv->v[i] = NULL;
  }
}

/* The weight a linear or conv runs with: autocast's cached cast (held until autocast exits),
 * FSDP's gathered unit, or the f32 parameter (nothing new). */
static sim_val *weight_cast(run *r, const op *o, sim_val **cache) {
  int64_t w = o->kind == OP_LINEAR ? o->out * o->in : o->out * o->in * 9;
  if (r->amp_es == 4 || r->fsdp_mp) return NULL;
  cache[0] = sim_new(&r->s, PLAN_LOWP, w * r->amp_es);
  cache[1] = sim_new(&r->s, PLAN_LOWP, o->out * r->amp_es); /* the bias */
  return cache[0];
}

/* One op forward: x -> y; with `sv` (training) what backward needs is saved. */
static act op_forward(run *r, const op *o, act x, saved *sv, sim_val **cache) {
  sim *s = &r->s;
  int64_t R = r->rows, nin = R * op_in_elems(o), nout = R * op_out_elems(o);
  act y = {NULL, x.es};
  switch (o->kind) {
  case OP_LINEAR:
  case OP_CONV: {
    int64_t w = o->kind == OP_LINEAR ? o->out * o->in : o->out * o->in * 9;
    bool lowp = r->amp_es == 2;
    sim_val *cx = lowp && x.es == 4 ? sim_new(s, PLAN_ACTIVATIONS, nin * 2) : sim_ref(x.v);
    sim_val *cw = weight_cast(r, o, cache);
    y.es = lowp ? 2 : 4;
    y.v = sim_new(s, PLAN_ACTIVATIONS, nout * y.es);
    if (lowp && r->widen) { /* the f32 operands and result of the widened product */
      sim_val *a = sim_new(s, PLAN_WORKSPACE, nin * 4), *b = sim_new(s, PLAN_WORKSPACE, w * 4),
              *c = sim_new(s, PLAN_WORKSPACE, nout * 4);
      sim_drop(s, a), sim_drop(s, b), sim_drop(s, c);
    }
    if (sv) save(sv, cx), save(sv, cw);
    sim_drop(s, cx);
    break;
  }
  case OP_RELU:
    y.v = sim_new(s, PLAN_ACTIVATIONS, nout * x.es);
    if (sv) save(sv, y.v);
    break;
  case OP_POOL: {
    sim_val *in32 = x.es != 4 ? sim_new(s, PLAN_WORKSPACE, nin * 4) : NULL;
    y.v = sim_new(s, PLAN_ACTIVATIONS, nout * x.es);
    sim_val *out32 = x.es != 4 ? sim_new(s, PLAN_WORKSPACE, nout * 4) : NULL;
    sim_val *idx = sim_new(s, PLAN_ACTIVATIONS, nout * 8); /* also without autograd */
    sim_drop(s, out32), sim_drop(s, in32);
    if (sv) save(sv, x.v), save(sv, idx);
    sim_drop(s, idx);
    break;
  }
  case OP_FLATTEN:
    y.v = sim_ref(x.v);
    break;
  }
  return y;
}

/* ---- backward --------------------------------------------------------------------------- */

/* One op backward: g (f32, the gradient of its output) -> the gradient of its input (NULL for
 * the first op, whose input needs none). */
static sim_val *op_backward(run *r, const op *o, sim_val *g, bool first, saved *sv) {
  sim *s = &r->s;
  int64_t R = r->rows, nin = R * op_in_elems(o), nout = R * op_out_elems(o);
  sim_val *gx = NULL;
  bool lowp = r->amp_es == 2;
  switch (o->kind) {
  case OP_LINEAR: {
    int64_t w = o->out * o->in;
    sim_val *gd = lowp ? sim_new(s, PLAN_WORKSPACE, nout * 2) : NULL;
    if (lowp && r->widen) { /* gW = G^T X */
      sim_val *a = sim_new(s, PLAN_WORKSPACE, nout * 4), *b = sim_new(s, PLAN_WORKSPACE, nin * 4);
      sim_drop(s, a), sim_drop(s, b);
    }
    if (!first) {
      gx = sim_new(s, PLAN_ACT_GRADS, nin * 4);
      if (lowp && r->widen) { /* gX = G W */
        sim_val *a = sim_new(s, PLAN_WORKSPACE, nout * 4), *b = sim_new(s, PLAN_WORKSPACE, w * 4);
        sim_drop(s, a), sim_drop(s, b);
      }
    }
    sim_drop(s, gd);
    break;
  }
  case OP_CONV: {
    int64_t w = o->out * o->in * 9;
    if (!lowp) {
      if (!first) gx = sim_new(s, PLAN_ACT_GRADS, nin * 4);
      sim_val *gw = sim_new(s, PLAN_WORKSPACE, w * 4);
      sim_drop(s, gw);
      break;
    }
    sim_val *gd = sim_new(s, PLAN_WORKSPACE, nout * 2);
    sim_val *gx16 = first ? NULL : sim_new(s, PLAN_WORKSPACE, nin * 2);
    sim_val *gw16 = sim_new(s, PLAN_WORKSPACE, w * 2);
    if (r->widen) {
      if (!first) { /* backward data: G, W and gX in f32 */
        sim_val *a = sim_new(s, PLAN_WORKSPACE, nout * 4), *b = sim_new(s, PLAN_WORKSPACE, w * 4),
                *c = sim_new(s, PLAN_WORKSPACE, nin * 4);
        sim_drop(s, a), sim_drop(s, b), sim_drop(s, c);
      }
      sim_val *a = sim_new(s, PLAN_WORKSPACE, nin * 4), *b = sim_new(s, PLAN_WORKSPACE, nout * 4),
              *c = sim_new(s, PLAN_WORKSPACE, w * 4); /* backward weights */
      sim_drop(s, a), sim_drop(s, b), sim_drop(s, c);
    }
    if (!first) gx = sim_new(s, PLAN_ACT_GRADS, nin * 4); /* the f32 gradient */
    sim_val *gw = sim_new(s, PLAN_WORKSPACE, w * 4);
    sim_drop(s, gd), sim_drop(s, gx16), sim_drop(s, gw16), sim_drop(s, gw);
    break;
  }
  case OP_RELU: /* in place on the incoming gradient */
    spend(s, sv);
    return sim_ref(g);
  case OP_POOL:
    gx = sim_new(s, PLAN_ACT_GRADS, nin * 4);
    break;
  case OP_FLATTEN:
    return sim_ref(g);
  }
  spend(s, sv);
  return gx;
}

/* ---- phases ----------------------------------------------------------------------------- */

/* What lives through a step: parameters, gradients (DDP's buckets are views of them),
 * optimizer state, shards. */
static void persistent(run *r) {
  sim *s = &r->s;
  int64_t P = net_params(&r->n);
  if (r->fsdp) {
    int64_t shards = shard_total(r);
    if (!r->off_params) sim_new(s, PLAN_PARAMS, shards * 4);
    if (!r->off_grads) sim_new(s, PLAN_GRADS, shards * 4);
    if (!r->off_optim) sim_new(s, PLAN_OPTIM, shards * 4 * r->state_kinds);
    return;
  }
  sim_new(s, PLAN_PARAMS, P * 4);
  sim_new(s, PLAN_GRADS, P * 4);
  sim_new(s, PLAN_OPTIM, P * 4 * r->state_kinds);
}

/* The cross-entropy of logits (f32, or cast to f32 under autocast): its saved values. */
static void loss_forward(run *r, act logits, saved *sv) {
  sim_val *l32 = logits.es != 4 ? sim_new(&r->s, PLAN_ACTIVATIONS, r->rows * 10 * 4)
                                : sim_ref(logits.v);
  save(sv, l32);
  sim_drop(&r->s, l32);
}

static void train_step(run *r) {
  sim *s = &r->s;
  const net *n = &r->n;
  int64_t global = r->rows * r->ranks;
  sim_val *x = sim_new(s, PLAN_BATCH, global * n->in_elems * 4);
  sim_val *y = sim_new(s, PLAN_BATCH, global * 8);
  static saved sv[MAX_OPS + 1];
  memset(sv, 0, sizeof sv);
  act a[MAX_OPS + 1];
  a[0] = (act){x, 4};
  sim_val *cache[MAX_OPS][2];
  memset(cache, 0, sizeof cache);
  for (int u = 0; r->fsdp && u < r->gather_prefetch + r->prefetch; u++)
    param_ahead(r, u); /* what the last step's end brought back for this forward */
  for (int i = 0; i < n->nops; i++) {
    if (r->fsdp) fsdp_forward_starts(r, i);
    a[i + 1] = op_forward(r, &n->ops[i], a[i], &sv[i], cache[i]);
    if (r->fsdp) fsdp_forward_ends(r, i, r->reshard);
    if (i > 0) sim_drop(s, a[i].v); /* the caller drops its input (the batch: after the loss) */
  }
  loss_forward(r, a[n->nops], &sv[n->nops]);
  save(&sv[n->nops], y);
  sim_drop(s, a[n->nops].v);
  for (int i = 0; i < n->nops; i++) /* autocast exits: its cache of weight casts goes */
    sim_drop(s, cache[i][0]), sim_drop(s, cache[i][1]);
  sim_drop(s, x), sim_drop(s, y);
  /* backward: the loss's gradient, then each op in reverse */
  sim_val *g = sim_new(s, PLAN_ACT_GRADS, r->rows * 10 * 4);
  spend(s, &sv[n->nops]);
  if (a[n->nops].es != 4) { /* autocast's cast node: the gradient copied */
    sim_val *g2 = sim_new(s, PLAN_ACT_GRADS, r->rows * 10 * 4);
    sim_drop(s, g);
    g = g2;
  }
  for (int i = n->nops - 1; i >= 0; i--) {
    const op *o = &n->ops[i];
    int u = r->fsdp ? unit_of_op(r, o) : -1;
    if (u >= 0) fsdp_pre_backward(r, u, i);
    sim_val *gx = op_backward(r, o, g, i == 0, &sv[i]);
    sim_drop(s, g);
    g = gx;
  }
  sim_drop(s, g);
  for (int u = 0; u < r->nunits; u++) {
    sim_drop(s, r->local_grad[u]);
    r->local_grad[u] = NULL;
    release_unit(r, u);
  }
  /* the optimizer step on the disk tier streams every kind it touches (parameters, gradients,
   * state) through chunk buffers: three sets with prefetch, else one; a chunk is 4 MiB or the
   * largest shard when that is smaller (src/fsdp/fsdp_stream.c) */
  if (r->fsdp && r->disk && (r->off_params || r->off_grads || r->off_optim)) {
    int64_t ring = 0, chunk = (4 << 20) / 4;
    for (int u = 0; u < r->nunits; u++) ring = r->shard[u] > ring ? r->shard[u] : ring;
    if (ring > chunk) ring = chunk;
    int64_t sets = r->prefetch > 0 ? 3 : 1;
    sim_blip(s, PLAN_WORKSPACE, sets * (2 + r->state_kinds) * ring * 4);
  }
}

/* An evaluation batch: forward without autograd (nothing saved). */
static void eval_batch(run *r, int64_t rows) {
  sim *s = &r->s;
  const net *n = &r->n;
  int64_t keep = r->rows;
  r->rows = rows;
  sim_val *x = sim_new(s, PLAN_BATCH, rows * n->in_elems * 4);
  sim_val *y = sim_new(s, PLAN_BATCH, rows * 8);
  act a = {x, 4};
  sim_val *cache[MAX_OPS][2];
  memset(cache, 0, sizeof cache);
  for (int u = 0; r->fsdp && u < r->gather_prefetch + r->prefetch; u++) param_ahead(r, u);
  for (int i = 0; i < n->nops; i++) {
    const op *o = &n->ops[i];
    if (r->fsdp) fsdp_forward_starts(r, i);
    act b = op_forward(r, o, a, NULL, cache[i]);
    if (r->fsdp) fsdp_forward_ends(r, i, true);
    if (i > 0) sim_drop(s, a.v);
    a = b;
  }
  sim_drop(s, a.v);
  for (int i = 0; i < n->nops; i++) sim_drop(s, cache[i][0]), sim_drop(s, cache[i][1]);
  for (int u = 0; u < r->nunits; u++) release_unit(r, u);
  sim_drop(s, x), sim_drop(s, y);
  r->rows = keep;
}

/* Building: the layers' parameters and gradients, packed into the model's arenas (two copies
 * at once), then FSDP's shards from them (the model's parameters then freed) or the
 * optimizer's state. */
static void build(run *r) {
  sim *s = &r->s;
  int64_t P = net_params(&r->n);
  sim_val *p1 = sim_new(s, PLAN_PARAMS, P * 4), *g1 = sim_new(s, PLAN_GRADS, P * 4);
  sim_val *p2 = sim_new(s, PLAN_PARAMS, P * 4), *g2 = sim_new(s, PLAN_GRADS, P * 4);
  sim_drop(s, p1), sim_drop(s, g1);
  if (r->fsdp) {
    int64_t shards = shard_total(r);
    sim_val *ps = r->off_params ? NULL : sim_new(s, PLAN_PARAMS, shards * 4);
    sim_val *gs = r->off_grads ? NULL : sim_new(s, PLAN_GRADS, shards * 4);
    sim_drop(s, p2), sim_drop(s, g2);
    sim_val *st = r->off_optim ? NULL : sim_new(s, PLAN_OPTIM, shards * 4 * r->state_kinds);
    sim_drop(s, ps), sim_drop(s, gs), sim_drop(s, st);
    return;
  }
  sim_val *st = sim_new(s, PLAN_OPTIM, P * 4 * r->state_kinds);
  sim_drop(s, p2), sim_drop(s, g2), sim_drop(s, st);
}

static void phase(run *r, plan_phase *ph, void (*fn)(run *), int64_t eval_rows) {
  memset(&r->s, 0, sizeof r->s);
  memset(r->gathered, 0, sizeof r->gathered);
  memset(r->local_grad, 0, sizeof r->local_grad);
  memset(r->ahead, 0, sizeof r->ahead);
  memset(ph, 0, sizeof *ph);
  r->s.ph = ph;
  if (fn == build) {
    build(r);
    return;
  }
  persistent(r);
  if (fn) fn(r);
  else eval_batch(r, eval_rows);
}

void train_plan(const train_opts *o, bool native, plan_result *out) {
  static run r; /* large: the simulator's values */
  memset(&r, 0, sizeof r);
  memset(out, 0, sizeof *out);
  net_make(o, &r.n);
  r.ranks = (int)(o->ranks > 0 ? o->ranks : 1);
  r.rows = o->batch;
  bool amp = strcmp(o->amp, "off") != 0;
  r.amp_es = amp ? 2 : 4;
  r.widen = amp && !native;
  r.ddp = strcmp(o->strategy, "ddp") == 0;
  r.fsdp = strcmp(o->strategy, "fsdp") == 0;
  r.reshard = strcmp(o->reshard, "no") != 0;
  r.gather_prefetch = (int)o->gather_prefetch;
  r.fsdp_mp = r.fsdp && amp;
  r.off_params = r.fsdp && o->offload_params;
  r.off_grads = r.fsdp && o->offload_grads;
  r.off_optim = r.fsdp && o->offload_optim;
  r.disk = strcmp(o->offload_tier, "disk") == 0;
  r.prefetch = (int)o->prefetch;
  r.state_kinds = strcmp(o->optim, "sgd") == 0 ? (o->momentum != 0) : 2;
  if (r.fsdp) make_units(&r, o);
  phase(&r, &out->build, build, 0);
  phase(&r, &out->train, train_step, 0);
  int64_t test_n = o->limit > 0 ? o->limit : 10000; /* the loader yields no more */
  phase(&r, &out->eval, NULL, o->eval_batch < test_n ? o->eval_batch : test_n);
  out->peak = out->build.peak;
  if (out->train.peak > out->peak) out->peak = out->train.peak;
  if (out->eval.peak > out->peak) out->peak = out->eval.peak;
  out->params = net_params(&r.n);
  out->widened = r.widen;
  if (r.fsdp) {
    int64_t off = shard_total(&r) * 4 * (r.off_params + r.off_grads + (r.off_optim ? r.state_kinds : 0));
    if (r.disk) out->file_bytes = off;
    else out->host_bytes = off;
  }
}

/* ---- output ----------------------------------------------------------------------------- */

static const char *const part_names[PLAN_PARTS] = {
    "parameters", "gradients", "optimizer state", "low-precision copies",
    "batch", "activations", "activation gradients", "workspace"};
static const char *const part_keys[PLAN_PARTS] = {
    "parameters", "gradients", "optimizer_state", "low_precision", "batch",
    "activations", "activation_grads", "workspace"};

static void mib(char *buf, size_t cap, int64_t b) {
  snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

void train_plan_print(FILE *f, const train_opts *o, const plan_result *r) {
  const plan_phase *ph[3] = {&r->build, &r->train, &r->eval};
  fprintf(f, "compute pool per rank (bytes live at each phase's peak):\n");
  fprintf(f, "  %-22s %14s %14s %14s\n", "", "build", "train step", "evaluation");
  char c[3][32];
  for (int p = 0; p < PLAN_PARTS; p++) {
    if (!ph[0]->part[p] && !ph[1]->part[p] && !ph[2]->part[p]) continue;
    for (int k = 0; k < 3; k++) mib(c[k], sizeof c[k], ph[k]->part[p]);
    fprintf(f, "  %-22s %14s %14s %14s\n", part_names[p], c[0], c[1], c[2]);
  }
  for (int k = 0; k < 3; k++) mib(c[k], sizeof c[k], ph[k]->peak);
  fprintf(f, "  %-22s %14s %14s %14s\n", "peak", c[0], c[1], c[2]);
  char pk[32];
  mib(pk, sizeof pk, r->peak);
  fprintf(f, "peak per rank: %s (%lld parameters, %ld rank%s, batch %ld per rank%s)\n", pk,
          (long long)r->params, o->ranks, o->ranks > 1 ? "s" : "", o->batch,
          r->widened ? "; low-precision products widened to f32 on this CPU" : "");
  if (r->host_bytes || r->file_bytes) {
    mib(pk, sizeof pk, r->host_bytes ? r->host_bytes : r->file_bytes);
    fprintf(f, "offloaded per rank: %s in the %s\n", pk, r->host_bytes ? "host pool" : "offload file");
  }
}

static void json_phase(FILE *f, const char *name, const plan_phase *ph) {
  fprintf(f, "\"%s\": {\"peak_bytes\": %lld", name, (long long)ph->peak);
  for (int p = 0; p < PLAN_PARTS; p++) fprintf(f, ", \"%s\": %lld", part_keys[p], (long long)ph->part[p]);
  fputc('}', f);
}

void train_plan_print_json(FILE *f, const train_opts *o, const plan_result *r) {
  fprintf(f, "{\"model\": \"%s\", \"parameters\": %lld, \"ranks\": %ld, \"batch\": %ld, "
          "\"amp\": \"%s\", \"strategy\": \"%s\", \"widened\": %s, \"peak_bytes\": %lld, "
          "\"host_bytes\": %lld, \"file_bytes\": %lld, ",
          o->model, (long long)r->params, o->ranks, o->batch, o->amp, o->strategy,
          r->widened ? "true" : "false", (long long)r->peak, (long long)r->host_bytes,
          (long long)r->file_bytes);
  json_phase(f, "build", &r->build);
  fputs(", ", f);
  json_phase(f, "train", &r->train);
  fputs(", ", f);
  json_phase(f, "eval", &r->eval);
  fputs("}\n", f);
}
