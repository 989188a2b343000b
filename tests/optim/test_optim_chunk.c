/* test_optim_chunk.c: the chunked step and caller-held state (offload). begin + chunks + end
 * equals loom_optim_step_scaled bit for bit (params and state) for every kind and flag, every
 * grad_scale, every CPU level, any split of the segments (sizes 1, 3, 15, 16, 17, random,
 * whole), in any segment order, over the optimizer's own state, over caller buffers copied in
 * and out, and over state the caller holds after release; release / restore round trips
 * continue the whole steps' bits; every error is refused with a message and changes nothing. */
#include "lt.h"
#include "optim/optim_int.h"

#include <stdlib.h>

/* Four segments: ragged lengths, an empty one, a no-decay one. */
enum { NSEG = 4, TOTAL = 37 + 0 + 301 + 150, STEPS = 3 };
static const size_t seg_n[NSEG] = {37, 0, 301, 150};
static const size_t seg_at[NSEG] = {0, 37, 37, 338};
static const unsigned seg_flags[NSEG] = {0, 0, LOOM_SEG_NO_DECAY, 0};
static const char *const seg_name[NSEG] = {"w", "empty", "b", "v"};

static uint64_t rng = 4242;
static uint64_t next(void) { /* xorshift64* */
  rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
  return rng * 2685821657736338717ull;
}
static float frand(void) { return (float)(next() >> 40) / (float)(1 << 23) - 1.0f; }

typedef struct cfg_t {
  const char *name;
  int kind; /* 0 sgd, 1 adam, 2 adamw */
  double lr, wd, momentum, dampening;
  bool nesterov, maximize;
} cfg_t;

static const cfg_t cfgs[] = {
    {"adam", 1, 1e-2, 0, 0, 0, false, false},
    {"adam l2", 1, 1e-2, 0.05, 0, 0, false, false},
    {"adam l2 maximize", 1, 1e-2, 0.05, 0, 0, false, true},
    {"adamw", 2, 1e-2, 0.05, 0, 0, false, false},
    {"adamw no decay", 2, 1e-2, 0, 0, 0, false, false},
    {"adamw maximize", 2, 1e-2, 0.05, 0, 0, false, true},
    {"sgd", 0, 0.1, 0, 0, 0, false, false},
    {"sgd wd", 0, 0.1, 0.01, 0, 0, false, false},
    {"sgd momentum", 0, 0.1, 0, 0.9, 0, false, false},
    {"sgd momentum dampening wd", 0, 0.1, 0.01, 0.9, 0.3, false, false},
    {"sgd nesterov wd", 0, 0.1, 0.01, 0.9, 0, true, false},
    {"sgd momentum maximize", 0, 0.1, 0.01, 0.8, 0, false, true},
};
#define NCFG (sizeof cfgs / sizeof *cfgs)

static int make(const cfg_t *c, float *p, const float *g, loom_optim **o) {
  loom_param_seg s[NSEG];
  for (int i = 0; i < NSEG; i++)
    s[i] = (loom_param_seg){.name = seg_name[i], .param = p + seg_at[i], .grad = g + seg_at[i],
                            .n = seg_n[i], .flags = seg_flags[i]};
  if (c->kind) {
    loom_adam_cfg a = loom_adam_cfg_default();
    a.lr = c->lr, a.weight_decay = c->wd, a.maximize = c->maximize;
    return (c->kind == 1 ? loom_optim_create_adam : loom_optim_create_adamw)(s, NSEG, &a, o);
  }
  loom_sgd_cfg a = loom_sgd_cfg_default();
  a.lr = c->lr, a.weight_decay = c->wd, a.momentum = c->momentum, a.dampening = c->dampening;
  a.nesterov = c->nesterov, a.maximize = c->maximize;
  return loom_optim_create_sgd(s, NSEG, &a, o);
}

/* The starting parameters and the gradients of each step (the same for every run). */
static float P0[TOTAL], G[STEPS + 2][TOTAL];
static void init_data(void) {
  static bool done;
  if (done) return;
  done = true;
  for (int i = 0; i < TOTAL; i++) P0[i] = frand();
  for (int t = 0; t < STEPS + 2; t++)
    for (int i = 0; i < TOTAL; i++) G[t][i] = frand() * 0.5f;
}

/* Copy the optimizer's state into st (kind k of segment s at st[k][seg_at[s] ...]). */
static void gather_state(const loom_optim *o, float st[2][TOTAL]) {
  size_t ns = loom_optim_state_per_segment(o);
  memset(st, 0, 2 * TOTAL * sizeof(float));
  for (int s = 0; s < NSEG; s++)
    for (size_t k = 0; k < ns; k++) {
      loom_optim_state x;
      LT_OK(loom_optim_state_at(o, (size_t)s * ns + k, &x));
      LT_EQ(x.n, seg_n[s]);
      LT_TRUE(x.data != NULL);
      memcpy(st[k] + seg_at[s], x.data, x.n * sizeof(float));
    }
}

/* The reference: STEPS whole steps_scaled(gs). */
static void run_whole(const cfg_t *c, float gs, float *p, float st[2][TOTAL]) {
  static float g[TOTAL];
  memcpy(p, P0, sizeof P0);
  loom_optim *o = NULL;
  LT_OK(make(c, p, g, &o));
  for (int t = 0; t < STEPS; t++) {
    memcpy(g, G[t], sizeof g);
    LT_OK(loom_optim_step_scaled(o, gs));
  }
  gather_state(o, st);
  loom_optim_free(o);
}

enum { SPLIT_WHOLE = 0, SPLIT_RANDOM = -1 };
static const int splits[] = {1, 3, 15, 16, 17, SPLIT_RANDOM, SPLIT_WHOLE};
#define NSPLIT (sizeof splits / sizeof *splits)

typedef enum { MODE_OWN, MODE_COPY, MODE_HELD, NMODE } mode;
static const char *const mode_name[NMODE] = {"own state in place", "caller copies",
                                              "caller-held state"};

/* A caller buffer of n floats starting one float past an allocation (unaligned for SIMD; an
 * overrun past the end is caught by ASan). */
static float *cbuf(size_t n) {
  float *b = malloc((n + 1) * sizeof(float));
  LT_TRUE(b != NULL);
  return b + 1;
}
static void cfree(float *b) { free(b - 1); }

/* One chunk [off, off + n) of segment s in mode m: MODE_OWN passes the optimizer's param
 * pointer and state == NULL; the others copy param, grad and state into separate buffers,
 * step them and copy param and state back (state from the optimizer's own buffers, or from
 * `held` once released). */
static void do_chunk(loom_optim *o, mode m, int s, size_t off, size_t n, float *p,
                     const float *g, float held[2][TOTAL]) {
  size_t at = seg_at[s] + off, ns = loom_optim_state_per_segment(o);
  if (m == MODE_OWN) {
    LT_OK(loom_optim_step_chunk(o, (size_t)s, off, n, p + at, g + at, NULL));
    return;
  }
  float *src[2] = {NULL, NULL};
  for (size_t k = 0; k < ns; k++) {
    if (m == MODE_HELD) {
      src[k] = held[k] + at;
    } else {
      loom_optim_state x;
      LT_OK(loom_optim_state_at(o, (size_t)s * ns + k, &x));
      src[k] = x.data + off;
    }
  }
  float *cp = cbuf(n), *cg = cbuf(n), *cs[2] = {cbuf(n), cbuf(n)};
  memcpy(cp, p + at, n * sizeof(float));
  memcpy(cg, g + at, n * sizeof(float));
  for (size_t k = 0; k < ns; k++) memcpy(cs[k], src[k], n * sizeof(float));
  int rc = loom_optim_step_chunk(o, (size_t)s, off, n, cp, cg, cs);
  memcpy(p + at, cp, n * sizeof(float));
  for (size_t k = 0; k < ns; k++) memcpy(src[k], cs[k], n * sizeof(float));
  cfree(cp), cfree(cg), cfree(cs[0]), cfree(cs[1]);
  LT_OK(rc);
}

/* STEPS chunked steps of grad_scale gs; segments in order on even steps, reversed on odd. */
static void run_chunked(const cfg_t *c, float gs, int split, mode m, float *p,
                        float st[2][TOTAL]) {
  static float g[TOTAL], held[2][TOTAL];
  memcpy(p, P0, sizeof P0);
  loom_optim *o = NULL;
  LT_OK(make(c, p, g, &o));
  size_t ns = loom_optim_state_per_segment(o);
  if (m == MODE_HELD) {
    gather_state(o, held); /* zeros */
    if (c->kind == 0) /* SGD's buffer is not read on the first step (PyTorch's None) */
      for (int i = 0; i < TOTAL; i++) held[0][i] = 7.0f;
    for (int s = 0; s < NSEG; s++) {
      LT_OK(loom_optim_release_state(o, (size_t)s));
      LT_EQ(loom_optim_state_released(o, (size_t)s), ns > 0);
    }
  }
  uint64_t split_rng = 77;
  for (int t = 0; t < STEPS; t++) {
    memcpy(g, G[t], sizeof g);
    LT_OK(loom_optim_step_begin(o, gs));
    LT_EQ(loom_optim_step_count(o), t + 1);
    for (int j = 0; j < NSEG; j++) {
      int s = t % 2 ? NSEG - 1 - j : j;
      size_t off = 0;
      do { /* an empty segment still gets its (empty) chunk */
        size_t len = seg_n[s] - off;
        if (split > 0) len = len < (size_t)split ? len : (size_t)split;
        if (split == SPLIT_RANDOM) {
          split_rng ^= split_rng << 13, split_rng ^= split_rng >> 7, split_rng ^= split_rng << 17;
          size_t want = 1 + (size_t)(split_rng % 40);
          len = len < want ? len : want;
        }
        do_chunk(o, m, s, off, len, p, g, held);
        off += len;
      } while (off < seg_n[s]);
    }
    LT_OK(loom_optim_step_end(o, true));
    LT_EQ(loom_optim_step_count(o), t + 1);
  }
  if (m == MODE_HELD) {
    memcpy(st, held, sizeof held);
    if (ns == 0) memset(st, 0, sizeof held);
  } else {
    gather_state(o, st);
  }
  loom_optim_free(o);
}

static const float scales[] = {1.0f, 0.3f, 1.0f / 1024};
#define NSCALES (sizeof scales / sizeof *scales)

LT_TEST(chunked_step_equals_whole_step_every_level_split_and_mode) {
  static float pw[TOTAL], pc[TOTAL], sw[2][TOTAL], sc[2][TOTAL];
  init_data();
  loom_cpu_level saved = loom_cpu_level_active();
  int levels = 0;
  for (int level = 0; level < LOOM_CPU_LEVEL_COUNT; level++) {
    if (!loom_cpu_supports((loom_cpu_level)level)) continue;
    LT_OK(loom_set_cpu_level((loom_cpu_level)level));
    levels++;
    for (size_t ci = 0; ci < NCFG; ci++)
      for (size_t si = 0; si < NSCALES; si++) {
        run_whole(&cfgs[ci], scales[si], pw, sw);
        for (size_t sp = 0; sp < NSPLIT; sp++)
          for (int m = 0; m < NMODE; m++) {
            run_chunked(&cfgs[ci], scales[si], splits[sp], (mode)m, pc, sc);
            if (memcmp(pw, pc, sizeof pw) != 0 || memcmp(sw, sc, sizeof sw) != 0)
              lt_fail_at(__FILE__, __LINE__, "%s, level %s, grad_scale %g, split %d, %s: "
                         "chunked step differs from the whole step (%s)", cfgs[ci].name,
                         loom_cpu_level_name((loom_cpu_level)level), (double)scales[si],
                         splits[sp], mode_name[m],
                         memcmp(pw, pc, sizeof pw) ? "params" : "state");
          }
      }
  }
  LT_OK(loom_set_cpu_level(saved));
  LT_TRUE(levels >= 1);
}

/* Compare o's params and state with the reference optimizer r's (params pr vs po). */
static void same(const loom_optim *r, const float *pr, const loom_optim *o, const float *po,
                 const char *what, const char *cfg) {
  static float sr[2][TOTAL], so[2][TOTAL];
  gather_state(r, sr);
  gather_state(o, so);
  if (memcmp(pr, po, TOTAL * sizeof(float)) != 0 || memcmp(sr, so, sizeof sr) != 0)
    lt_fail_at(__FILE__, __LINE__, "%s, %s: differs from whole steps", cfg, what);
  LT_EQ(loom_optim_step_count(r), loom_optim_step_count(o));
}

/* Whole steps, then state saved and released (segments 0 and 2; 1 and 3 stay the optimizer's),
 * chunked steps over the caller's copy, restore and copy back, whole steps again: the same
 * bits as whole steps throughout. */
LT_TEST(release_restore_round_trip_continues_whole_steps) {
  static float pr[TOTAL], po[TOTAL], g[TOTAL], held[2][TOTAL];
  init_data();
  for (size_t ci = 0; ci < NCFG; ci++) {
    const cfg_t *c = &cfgs[ci];
    memcpy(pr, P0, sizeof P0), memcpy(po, P0, sizeof P0);
    loom_optim *r = NULL, *o = NULL;
    LT_OK(make(c, pr, g, &r));
    LT_OK(make(c, po, g, &o));
    size_t ns = loom_optim_state_per_segment(o);
    int t = 0;
    for (; t < 2; t++) {
      memcpy(g, G[t], sizeof g);
      LT_OK(loom_optim_step(r));
      LT_OK(loom_optim_step(o));
    }
    same(r, pr, o, po, "before release", c->name);
    gather_state(o, held);
    const size_t rel[2] = {0, 2};
    for (int i = 0; i < 2; i++) {
      LT_OK(loom_optim_release_state(o, rel[i]));
      LT_OK(loom_optim_release_state(o, rel[i])); /* again: a no-op */
      LT_EQ(loom_optim_state_released(o, rel[i]), ns > 0);
    }
    LT_TRUE(!loom_optim_state_released(o, 1) && !loom_optim_state_released(o, 3));
    for (size_t k = 0; k < ns; k++) { /* released: data NULL, n kept; others unchanged */
      loom_optim_state x;
      LT_OK(loom_optim_state_at(o, 2 * ns + k, &x));
      LT_TRUE(x.data == NULL);
      LT_EQ(x.n, seg_n[2]);
      char name[32];
      snprintf(name, sizeof name, "w.%s", k ? "exp_avg_sq" : ns == 1 ? "momentum_buffer"
                                                                     : "exp_avg");
      LT_OK(loom_optim_state_find(o, name, &x));
      LT_TRUE(x.data == NULL);
      LT_EQ(x.n, seg_n[0]);
      LT_OK(loom_optim_state_at(o, 3 * ns + k, &x));
      LT_TRUE(x.data != NULL);
    }
    for (; t < 4; t++) {
      memcpy(g, G[t], sizeof g);
      LT_OK(loom_optim_step(r));
      LT_OK(loom_optim_step_begin(o, 1.0f));
      for (int s = NSEG - 1; s >= 0; s--) {
        bool own = s == 1 || s == 3;
        for (size_t off = 0; off < seg_n[s]; off += 16) {
          size_t n = seg_n[s] - off < 16 ? seg_n[s] - off : 16;
          float *st[2] = {held[0] + seg_at[s] + off, held[1] + seg_at[s] + off};
          LT_OK(loom_optim_step_chunk(o, (size_t)s, off, n, po + seg_at[s] + off,
                                      g + seg_at[s] + off, own ? NULL : st));
        }
      }
      LT_OK(loom_optim_step_end(o, true));
    }
    for (int i = 0; i < 2; i++) {
      LT_OK(loom_optim_restore_state(o, rel[i]));
      LT_OK(loom_optim_restore_state(o, rel[i])); /* again: a no-op, keeps the buffers */
      LT_TRUE(!loom_optim_state_released(o, rel[i]));
      for (size_t k = 0; k < ns; k++) {
        loom_optim_state x;
        LT_OK(loom_optim_state_at(o, rel[i] * ns + k, &x));
        LT_TRUE(x.data != NULL);
        for (size_t j = 0; j < x.n; j++) LT_TRUE(x.data[j] == 0.0f); /* restored zeroed */
        memcpy(x.data, held[k] + seg_at[rel[i]], x.n * sizeof(float));
      }
    }
    same(r, pr, o, po, "after chunked steps over released state", c->name);
    for (; t < STEPS + 2; t++) {
      memcpy(g, G[t], sizeof g);
      LT_OK(loom_optim_step(r));
      LT_OK(loom_optim_step(o));
    }
    same(r, pr, o, po, "after restore and whole steps", c->name);
    loom_optim_free(r);
    loom_optim_free(o);
  }
}

/* A step refused for a released segment (the last one: a step that updated segments as it
 * went would already have moved the others) changes no param, no state and no count. */
LT_TEST(step_on_released_segment_changes_nothing) {
  static float p[TOTAL], g[TOTAL], keep_p[TOTAL], keep_s[2][TOTAL], now_s[2][TOTAL];
  init_data();
  for (size_t ci = 0; ci < NCFG; ci++) {
    const cfg_t *c = &cfgs[ci];
    memcpy(p, P0, sizeof P0), memcpy(g, G[0], sizeof g);
    loom_optim *o = NULL;
    LT_OK(make(c, p, g, &o));
    LT_OK(loom_optim_step(o));
    LT_OK(loom_optim_release_state(o, 3));
    if (loom_optim_state_per_segment(o) == 0) { /* plain SGD: nothing to release */
      LT_TRUE(!loom_optim_state_released(o, 3));
      LT_OK(loom_optim_step(o));
      LT_EQ(loom_optim_step_count(o), 2);
      loom_optim_free(o);
      continue;
    }
    LT_OK(loom_optim_release_state(o, 1)); /* the empty one too */
    LT_TRUE(loom_optim_state_released(o, 1));
    memcpy(keep_p, p, sizeof p);
    size_t ns = loom_optim_state_per_segment(o);
    memset(keep_s, 0, sizeof keep_s);
    for (int s = 0; s < 3; s += 2)
      for (size_t k = 0; k < ns; k++) {
        loom_optim_state x;
        LT_OK(loom_optim_state_at(o, (size_t)s * ns + k, &x));
        memcpy(keep_s[k] + seg_at[s], x.data, x.n * sizeof(float));
      }
    LT_ERR(loom_optim_step(o), LOOM_EMISUSE, "loom_optim_step: segment 1 (empty) has its state "
           "released");
    LT_ERR(loom_optim_step_scaled(o, 0.5f), LOOM_EMISUSE, "segment 1 (empty)");
    LT_OK(loom_optim_restore_state(o, 1));
    LT_ERR(loom_optim_step(o), LOOM_EMISUSE, "segment 3 (v) has its state released");
    LT_ERR(loom_optim_step_scaled(o, 2.0f), LOOM_EMISUSE, "segment 3 (v)");
    LT_EQ(loom_optim_step_count(o), 1);
    LT_TRUE(memcmp(p, keep_p, sizeof p) == 0);
    memset(now_s, 0, sizeof now_s);
    for (int s = 0; s < 3; s += 2)
      for (size_t k = 0; k < ns; k++) {
        loom_optim_state x;
        LT_OK(loom_optim_state_at(o, (size_t)s * ns + k, &x));
        memcpy(now_s[k] + seg_at[s], x.data, x.n * sizeof(float));
      }
    LT_TRUE(memcmp(keep_s, now_s, sizeof now_s) == 0);
    LT_OK(loom_optim_restore_state(o, 3)); /* zeroed: steps again */
    LT_OK(loom_optim_step(o));
    LT_EQ(loom_optim_step_count(o), 2);
    loom_optim_free(o);
  }
}

LT_TEST(chunk_errors) {
  float p[8] = {1, 2, 3, 4, 5, 6, 7, 8}, g[8] = {1, 1, 1, 1, 1, 1, 1, 1}, keep[8];
  float m[8] = {0}, v[8] = {0};
  loom_param_seg s[2] = {{.name = "a", .param = p, .grad = g, .n = 5},
                         {.name = "b", .param = p + 5, .grad = g + 5, .n = 3}};
  loom_adam_cfg c = loom_adam_cfg_default();
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_adam(s, 2, &c, &o));
  memcpy(keep, p, sizeof p);
  float *st[2] = {m, v}, *half[2] = {m, NULL};

  /* nothing open */
  LT_ERR(loom_optim_step_chunk(o, 0, 0, 1, p, g, NULL), LOOM_EMISUSE,
         "loom_optim_step_chunk: no chunked step is open");
  LT_ERR(loom_optim_step_end(o, true), LOOM_EMISUSE, "loom_optim_step_end: no chunked step");
  /* bad grad_scale: refused, nothing opened or counted */
  LT_ERR(loom_optim_step_begin(o, NAN), LOOM_EINVAL, "loom_optim_step_begin: grad_scale = nan");
  LT_ERR(loom_optim_step_begin(o, INFINITY), LOOM_EINVAL, "grad_scale = inf");
  LT_ERR(loom_optim_step_begin(o, -0.5f), LOOM_EINVAL, "grad_scale = -0.5");
  LT_EQ(loom_optim_step_count(o), 0);
  LT_ERR(loom_optim_step_chunk(o, 0, 0, 1, p, g, NULL), LOOM_EMISUSE, "no chunked step");

  LT_OK(loom_optim_step_begin(o, 1.0f));
  LT_EQ(loom_optim_step_count(o), 1);
  LT_ERR(loom_optim_step_begin(o, 1.0f), LOOM_EMISUSE, "a chunked step is already open");
  LT_ERR(loom_optim_step(o), LOOM_EMISUSE, "loom_optim_step: a chunked step is open");
  LT_ERR(loom_optim_step_scaled(o, 1.0f), LOOM_EMISUSE, "a chunked step is open");
  LT_ERR(loom_optim_set_step_count(o, 5), LOOM_EMISUSE,
         "loom_optim_set_step_count: a chunked step is open");
  LT_ERR(loom_optim_release_state(o, 0), LOOM_EMISUSE,
         "loom_optim_release_state: a chunked step is open");
  LT_ERR(loom_optim_restore_state(o, 0), LOOM_EMISUSE,
         "loom_optim_restore_state: a chunked step is open");
  LT_EQ(loom_optim_step_count(o), 1);
  LT_TRUE(!loom_optim_state_released(o, 0));
  LT_ERR(loom_optim_step_chunk(o, 2, 0, 1, p, g, NULL), LOOM_EINVAL,
         "segment 2 out of range (2 segments)");
  LT_ERR(loom_optim_step_chunk(o, 0, 5, 1, p, g, NULL), LOOM_EINVAL,
         "elements [5, 5 + 1) are beyond segment 0 (a) of 5 elements");
  LT_ERR(loom_optim_step_chunk(o, 0, 3, 3, p, g, NULL), LOOM_EINVAL, "beyond segment 0");
  LT_ERR(loom_optim_step_chunk(o, 1, 1, SIZE_MAX, p, g, NULL), LOOM_EINVAL,
         "beyond segment 1"); /* offset + n wraps around */
  LT_ERR(loom_optim_step_chunk(o, 1, SIZE_MAX, 2, p, g, NULL), LOOM_EINVAL, "beyond segment 1");
  LT_ERR(loom_optim_step_chunk(o, 0, 6, 0, p, g, NULL), LOOM_EINVAL, "beyond segment 0");
  LT_ERR(loom_optim_step_chunk(o, 0, 0, 2, NULL, g, NULL), LOOM_EINVAL,
         "segment 0: NULL param buffer for 2 elements");
  LT_ERR(loom_optim_step_chunk(o, 0, 0, 2, p, NULL, st), LOOM_EINVAL, "NULL grad buffer");
  LT_ERR(loom_optim_step_chunk(o, 1, 0, 2, p, g, half), LOOM_EINVAL,
         "segment 1: state[1] (exp_avg_sq) is NULL");
  LT_TRUE(memcmp(p, keep, sizeof p) == 0); /* every refused chunk changed nothing */
  for (int i = 0; i < 8; i++) LT_TRUE(m[i] == 0 && v[i] == 0);
  /* n == 0: a no-op, NULL buffers allowed, offset may be the segment's end */
  LT_OK(loom_optim_step_chunk(o, 0, 5, 0, NULL, NULL, NULL));
  LT_OK(loom_optim_step_chunk(o, 1, 0, 0, NULL, NULL, half));
  LT_TRUE(memcmp(p, keep, sizeof p) == 0);
  /* a chunk that fails mid-way: the caller gives the step back and restores its values */
  LT_OK(loom_optim_step_chunk(o, 0, 0, 5, p, g, NULL));
  LT_TRUE(p[0] != keep[0]);
  LT_OK(loom_optim_step_end(o, false));
  LT_EQ(loom_optim_step_count(o), 0);
  LT_ERR(loom_optim_step_end(o, false), LOOM_EMISUSE, "no chunked step is open");
  LT_EQ(loom_optim_step_count(o), 0);

  /* released: the optimizer's own state cannot be used */
  LT_OK(loom_optim_release_state(o, 1));
  LT_OK(loom_optim_step_begin(o, 1.0f));
  LT_ERR(loom_optim_step_chunk(o, 1, 0, 3, p + 5, g + 5, NULL), LOOM_EMISUSE,
         "segment 1 (b) has its state released to the caller; pass the state buffers");
  LT_OK(loom_optim_step_chunk(o, 1, 0, 3, p + 5, g + 5, st));
  LT_OK(loom_optim_step_end(o, true));
  LT_EQ(loom_optim_step_count(o), 1);
  LT_ERR(loom_optim_release_state(o, 2), LOOM_EINVAL,
         "loom_optim_release_state: segment 2 out of range");
  LT_ERR(loom_optim_restore_state(o, 9), LOOM_EINVAL,
         "loom_optim_restore_state: segment 9 out of range");
  LT_TRUE(!loom_optim_state_released(o, 9));
  LT_TRUE(!loom_optim_state_released(NULL, 0));

  /* NULL optimizer */
  LT_ERR(loom_optim_step_begin(NULL, 1.0f), LOOM_EINVAL,
         "loom_optim_step_begin: optimizer is NULL");
  LT_ERR(loom_optim_step_chunk(NULL, 0, 0, 0, NULL, NULL, NULL), LOOM_EINVAL, "optimizer is NULL");
  LT_ERR(loom_optim_step_end(NULL, true), LOOM_EINVAL, "optimizer is NULL");
  LT_ERR(loom_optim_release_state(NULL, 0), LOOM_EINVAL, "optimizer is NULL");
  LT_ERR(loom_optim_restore_state(NULL, 0), LOOM_EINVAL, "optimizer is NULL");
  LT_EQ(loom_optim_state_per_segment(NULL), 0);
  loom_optim_free(o); /* frees with a segment released */
}

LT_TEST(state_per_segment_and_plain_sgd) {
  float p[3] = {1, 2, 3}, g[3] = {0.5f, 0.5f, 0.5f};
  loom_param_seg s = {.param = p, .grad = g, .n = 3};
  loom_optim *o = NULL;
  loom_sgd_cfg c = loom_sgd_cfg_default();
  c.lr = 0.5;
  LT_OK(loom_optim_create_sgd(&s, 1, &c, &o));
  LT_EQ(loom_optim_state_per_segment(o), 0);
  LT_OK(loom_optim_release_state(o, 0)); /* no state: a no-op */
  LT_TRUE(!loom_optim_state_released(o, 0));
  LT_OK(loom_optim_restore_state(o, 0));
  LT_OK(loom_optim_step_begin(o, 2.0f));
  LT_OK(loom_optim_step_chunk(o, 0, 1, 2, p + 1, g + 1, NULL)); /* no state to give */
  float *none[1] = {NULL};
  LT_OK(loom_optim_step_chunk(o, 0, 0, 1, p, g, none)); /* entries beyond the count unread */
  LT_OK(loom_optim_step_end(o, true));
  LT_NEAR(p[0], 0.5, 0);
  LT_NEAR(p[2], 2.5, 0);
  loom_optim_free(o);
  c.momentum = 0.9;
  LT_OK(loom_optim_create_sgd(&s, 1, &c, &o));
  LT_EQ(loom_optim_state_per_segment(o), 1);
  loom_optim_free(o);
  loom_adam_cfg a = loom_adamw_cfg_default();
  LT_OK(loom_optim_create_adamw(&s, 1, &a, &o));
  LT_EQ(loom_optim_state_per_segment(o), 2);
  loom_optim_free(o);
}

static size_t pool_bytes(void) {
  size_t sum = 0;
  for (int p = 0; p < LOOM_POOL_COUNT; p++) {
    loom_pool_stats s;
    loom_mem_stats((loom_pool)p, &s);
    sum += s.current_bytes;
  }
  return sum;
}

/* restore out of memory (either of Adam's two buffers): LOOM_ENOMEM, still released, nothing
 * leaked; then it succeeds. */
LT_TEST(restore_state_out_of_memory) {
  float p[4] = {0}, g[4] = {0};
  loom_param_seg s = {.name = "w", .param = p, .grad = g, .n = 4};
  loom_adam_cfg c = loom_adam_cfg_default();
  loom_optim *o = NULL;
  LT_OK(loom_optim_create_adam(&s, 1, &c, &o));
  LT_OK(loom_optim_release_state(o, 0));
  for (uint64_t n = 1; n <= 2; n++) {
    size_t before = pool_bytes();
    loom_alloc_fail_nth(n);
    int rc = loom_optim_restore_state(o, 0);
    loom_alloc_fail_nth(0);
    LT_EQ(rc, LOOM_ENOMEM);
    LT_TRUE(strstr(loom_last_error(), "loom_optim_restore_state: out of memory") != NULL);
    LT_TRUE(loom_optim_state_released(o, 0));
    LT_EQ(pool_bytes(), before);
    LT_ERR(loom_optim_step(o), LOOM_EMISUSE, "segment 0 (w)");
  }
  LT_OK(loom_optim_restore_state(o, 0));
  LT_TRUE(!loom_optim_state_released(o, 0));
  LT_OK(loom_optim_step(o));
  loom_optim_free(o);
}
