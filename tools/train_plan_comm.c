/* train_plan_comm.c: `loom plan --hosts H --ranks-per-host R [--link GBPS] [--intra-link GBPS]
 * [--gflops G]` (train_plan.h): the bytes one step sends through each host's link, each
 * collective a ring in rank order; their time at the link's rate; and, for FSDP and HSDP, the
 * part of the step's communication its compute cannot hide (exposed), from the step replayed
 * unit by unit (plan_step_timeline): each collective as long as its ring's slowest hop (the
 * link between hosts, or a hop between two ranks of one host at the intra-host rate), the
 * group's collectives one at a time and HSDP's replica all-reduces on their own group, the
 * compute timed from each unit's multiply-adds at a measured matrix-multiply rate
 * (train_plan_gemm_gflops) and the intra-host rate measured as this machine's memcpy
 * (train_plan_intra_gbps) unless given. */
#include "progress.h"
#include "train_plan.h"

#include <stdlib.h>
#include <string.h>

/* The link between hosts and a hop inside one: bytes a second each way, and the link's
 * latency, seconds an exchange (--link-latency-us). */
typedef struct plan_link {
  double bps, intra_bps, latency_s;
} plan_link;

/* Bytes a kind of collective sends into host 0 through its link per step (the same out of it,
 * and for every host, by symmetry). Its groups are `size` consecutive ranks (stride 1) or the
 * ranks s, s + stride, ... (size = world / stride); each runs as a ring in rank order, which
 * enters a host it shares with other hosts once, carrying `factor` x (M-1)/M of the buffer
 * (M = size; factor 1 for an all-gather or a reduce-scatter, 2 for an all-reduce: its
 * reduce-scatter and all-gather). `bytes` is one rank's buffer bytes of that kind per step. */
static double ring_into_host0(int world, int per_host, int size, int stride, double factor,
                              double bytes) {
  if (size < 2 || bytes <= 0) return 0;
  double total = 0;
  int groups = world / size;
  for (int g = 0; g < groups; g++) {
    bool on = false, off = false;
    for (int k = 0; k < size; k++) {
      int r = stride == 1 ? g * size + k : g + k * stride;
      if (r / per_host == 0) on = true;
      else off = true;
    }
    if (on && off) total += factor * (double)(size - 1) / size * bytes;
  }
  return total;
}

/* Whether the ring of rank 0's group (its `size` members 0, stride, 2 x stride, ... in rank
 * order, the last back to the first) has a hop between two ranks of one host. */
static bool ring_has_local_hop(int per_host, int size, int stride) {
  if (size < 2) return false;
  for (int k = 0; k < size; k++) {
    int a = k * stride, b = ((k + 1) % size) * stride;
    if (a / per_host == b / per_host) return true;
  }
  return false;
}

/* One collective of rank 0's group, seconds: its ring moves factor x (size-1)/size of `bytes`
 * through every hop, and runs at its slowest hop's pace. Into host 0 through the link go the
 * bytes of every group whose ring crosses it (all of them run at once); a hop inside a host
 * goes at the intra-host rate, each pair of ranks at once. A ring that crosses the link also
 * waits link_latency_s for each of its exchanges in turn: the header exchange every collective
 * of the mpi backend begins with, then its factor x (size-1) ring steps, each of which starts
 * only once the previous one's data has come (pg_mpi.c, ring_mpi.c). *link says whether it
 * uses the link between hosts. */
static double ring_seconds(int world, int per_host, int size, int stride, double factor,
                           double bytes, const plan_link *l, bool *link) {
  double across = ring_into_host0(world, per_host, size, stride, factor, bytes) / l->bps;
  double inside = 0;
  if (size >= 2 && bytes > 0 && ring_has_local_hop(per_host, size, stride))
    inside = factor * (double)(size - 1) / size * bytes / l->intra_bps;
  *link = across > 0;
  if (across > 0) across += l->latency_s * (1 + factor * (double)(size - 1));
  return across > inside ? across : inside;
}

/* ---- the step's timeline ------------------------------------------------------------------ */

typedef struct clocks {
  double t;     /* the rank's compute */
  double q[2];  /* when each group is free (0: the group's own, 1: HSDP's replica group): a
                 * group runs its collectives one at a time, in issue order */
  double link;  /* when the link between hosts is free: one collective on it at a time */
  double comm, exposed;
} clocks;

/* A collective of dur seconds on group queue q (holding the link if `link`) issued at `at` (no
 * earlier than the compute clock): when it completes. One of 0 s completes as issued. */
static double issue_at(clocks *c, int q, double at, double dur, bool link) {
  if (dur <= 0) return at;
  double s = c->q[q] > at ? c->q[q] : at;
  if (link && c->link > s) s = c->link;
  c->q[q] = s + dur;
  if (link) c->link = s + dur;
  c->comm += dur;
  return s + dur;
}

static void wait_until(clocks *c, double done) {
  if (done <= c->t) return;
  c->exposed += done - c->t;
  c->t = done;
}

enum { RESHARDED, GATHERING, GATHERED };

void plan_step_timeline(const plan_unit_time *u, size_t n, int prefetch, plan_timeline *out) {
  memset(out, 0, sizeof *out);
  if (!n) return;
  clocks c = {0, {0, 0}, 0, 0, 0};
  int *st = calloc(n, sizeof *st);
  double *gdone = calloc(n, sizeof *gdone), *rdone = calloc(n, sizeof *rdone);
  double *ldone = calloc(n, sizeof *ldone); /* when the unit's local gradient may go */
  bool *rpending = calloc(n, sizeof *rpending);
  if (!st || !gdone || !rdone || !ldone || !rpending) goto done;
  /* forward, unit by unit: its gather (unless prefetched), the next units', wait, compute */
  for (size_t i = 0; i < n; i++) {
    for (size_t k = 0; k <= (size_t)prefetch && i + k < n; k++)
      if (st[i + k] == RESHARDED) {
        gdone[i + k] = issue_at(&c, 0, c.t, u[i + k].gather_s, u[i + k].group_link);
        st[i + k] = GATHERING;
      }
    wait_until(&c, gdone[i]);
    c.t += u[i].forward_s;
    out->compute_s += u[i].forward_s;
    st[i] = u[i].kept ? GATHERED : RESHARDED;
  }
  /* backward, in reverse: gather (and prefetch the units before), wait for it and for the
   * reduce-scatters still running (not for HSDP's replica all-reduces after them, unless they
   * hold the local gradient), the weights' gradient, its reduce-scatter (and replica
   * all-reduce), the input's gradient; at the end, every replica all-reduce */
  for (size_t i = n; i-- > 0;) {
    for (size_t k = 0; k <= (size_t)prefetch && k <= i; k++)
      if (st[i - k] == RESHARDED) {
        gdone[i - k] = issue_at(&c, 0, c.t, u[i - k].gather_s, u[i - k].group_link);
        st[i - k] = GATHERING;
      }
    wait_until(&c, gdone[i]);
    st[i] = GATHERED;
    for (size_t j = 0; j < n; j++)
      if (rpending[j]) {
        wait_until(&c, ldone[j]);
        ldone[j] = 0;
      }
    c.t += u[i].forward_s;
    double rs = issue_at(&c, 0, c.t, u[i].reduce_s, u[i].group_link);
    rdone[i] = issue_at(&c, 1, rs, u[i].replica_s, u[i].replica_link);
    ldone[i] = u[i].replica_holds_local ? rdone[i] : rs;
    rpending[i] = true;
    double dx = i > 0 ? u[i].forward_s : 0;
    c.t += dx;
    out->compute_s += u[i].forward_s + dx;
  }
  for (size_t j = 0; j < n; j++)
    if (rpending[j]) wait_until(&c, rdone[j]);
  out->comm_s = c.comm;
  out->exposed_s = c.exposed;
done:
  free(st);
  free(gdone);
  free(rdone);
  free(ldone);
  free(rpending);
}

/* ---- the compute's and the host's rates --------------------------------------------------- */

/* The median of t[1..5] (t[0], the warm-up, left out); sorts them. */
static double median_after_first(double t[6]) {
  double *s = t + 1;
  for (int i = 1; i < 5; i++)
    for (int j = i; j > 0 && s[j] < s[j - 1]; j--) {
      double x = s[j];
      s[j] = s[j - 1];
      s[j - 1] = x;
    }
  return s[2];
}

double train_plan_gemm_gflops(const train_opts *o, int threads) {
  loom_dtype dt = LOOM_F32;
  if (strcmp(o->amp, "off") != 0) loom_dtype_parse(o->amp, &dt);
  if (loom_set_num_threads(threads > 0 ? threads : 1)) return 0;
  const int64_t m = 256, k = 1024, nn = 1024;
  int64_t sa[2] = {m, k}, sb[2] = {k, nn};
  loom_tensor *a = NULL, *b = NULL;
  double t[6], rate = 0;
  int rc = loom_tensor_zeros(dt, 2, sa, &a);
  if (!rc) rc = loom_tensor_zeros(dt, 2, sb, &b);
  for (int rep = 0; rep < 6 && !rc; rep++) {
    loom_tensor *c = NULL;
    double t0 = progress_now();
    rc = loom_matmul(a, b, &c);
    t[rep] = progress_now() - t0;
    loom_tensor_free(c);
  }
  if (!rc) {
    double med = median_after_first(t);
    if (med > 0) rate = 2.0 * (double)(m * k * nn) / med / 1e9;
  }
  loom_tensor_free(a);
  loom_tensor_free(b);
  return rate;
}

double train_plan_intra_gbps(void) {
  const size_t len = (size_t)32 << 20;
  char *src = malloc(len), *dst = malloc(len);
  double t[6], rate = 0;
  if (src && dst) {
    memset(src, 1, len);
    memset(dst, 0, len);
    for (int rep = 0; rep < 6; rep++) {
      double t0 = progress_now();
      memcpy(dst, src, len);
      t[rep] = progress_now() - t0;
      src[rep] = dst[len - 1 - (size_t)rep]; /* the copies are used: none is left out */
    }
    double med = median_after_first(t);
    if (med > 0) rate = (double)len * 8 / med / 1e9;
  }
  free(src);
  free(dst);
  return rate;
}

/* ---- the plan's figures ------------------------------------------------------------------- */

/* Tokens a rank's step multiplies each weight by: its batch, or its batch's windows' tokens
 * (GPT). A convolution uses each weight at every position too, which this leaves out: for
 * the CNN the compute is a lower bound and the exposed time an upper one (README). */
static double step_tokens(const train_opts *o) {
  return (double)o->batch * (strcmp(o->model, "gpt") == 0 ? (double)o->context : 1.0);
}

/* The exposed time of FSDP or HSDP: each unit's collectives through its rings (ring_seconds:
 * the link at bps, a hop inside a host at intra_bps), each unit's compute from its
 * multiply-adds (2 FLOPs an element a token) at gflops. */
static void exposed(const train_opts *o, int w, int per_host, const plan_link *l,
                    plan_result *r) {
  bool hybrid = strcmp(o->strategy, "hsdp") == 0;
  int n = hybrid ? (int)o->shard_size : w;
  double gsize = strcmp(o->amp, "off") != 0 ? 2 : 4; /* gathered in the forward dtype */
  double flop_s = r->gflops * 1e9, tokens = step_tokens(o);
  plan_unit_time *u = calloc(r->nunits ? r->nunits : 1, sizeof *u);
  if (!u || !r->nunits || flop_s <= 0 || l->intra_bps <= 0) {
    free(u);
    return;
  }
  for (size_t i = 0; i < r->nunits; i++) {
    const struct train_dry_unit *x = &r->unit[i];
    u[i].gather_s = ring_seconds(w, per_host, n, 1, 1, (double)x->padded * gsize, l,
                                 &u[i].group_link);
    u[i].reduce_s = ring_seconds(w, per_host, n, 1, 1, (double)x->padded * 4, l,
                                 &u[i].group_link);
    if (hybrid)
      u[i].replica_s = ring_seconds(w, per_host, w / n, n, 2, (double)x->shard * 4, l,
                                    &u[i].replica_link);
    u[i].forward_s = 2.0 * tokens * (double)x->numel / flop_s;
    u[i].kept = x->kept;
    u[i].replica_holds_local = o->offload_grads; /* reduced in place (fsdp_offload.c) */
  }
  plan_timeline tl;
  plan_step_timeline(u, r->nunits, (int)o->gather_prefetch, &tl);
  free(u);
  r->exposed_modeled = true;
  r->exposed_s = tl.exposed_s;
  r->compute_s = tl.compute_s;
  r->comm_s = tl.comm_s;
}

void train_plan_links(const train_opts *o, int hosts, int ranks_per_host, double gbps,
                      const plan_rates *rates, plan_result *r) {
  int w = hosts * ranks_per_host;
  double b = 0;
  r->hosts = hosts;
  r->ranks_per_host = ranks_per_host;
  r->link_gbps = gbps;
  if (hosts > 1 && strcmp(o->strategy, "ddp") == 0)
    b = ring_into_host0(w, ranks_per_host, w, 1, 2, (double)r->allreduce_bytes);
  if (hosts > 1 && strcmp(o->strategy, "fsdp") == 0)
    b = ring_into_host0(w, ranks_per_host, w, 1, 1,
                        (double)(r->gather_bytes + r->reduce_scatter_bytes));
  if (hosts > 1 && strcmp(o->strategy, "hsdp") == 0) {
    int n = (int)o->shard_size;
    b = ring_into_host0(w, ranks_per_host, n, 1, 1,
                        (double)(r->gather_bytes + r->reduce_scatter_bytes)) +
        ring_into_host0(w, ranks_per_host, w / n, n, 2, (double)r->replica_bytes);
  }
  r->link_bytes = b;
  r->link_s = gbps > 0 ? b / (gbps * 1e9 / 8) : 0;
  r->exposed_modeled = false;
  r->gflops = rates->gflops;
  r->gflops_measured = rates->gflops_measured;
  r->intra_gbps = rates->intra_gbps;
  r->intra_measured = rates->intra_measured;
  r->link_latency_us = rates->link_latency_us;
  bool sharded = strcmp(o->strategy, "fsdp") == 0 || strcmp(o->strategy, "hsdp") == 0;
  plan_link l = {gbps * 1e9 / 8, rates->intra_gbps * 1e9 / 8, rates->link_latency_us * 1e-6};
  if (gbps > 0 && sharded) exposed(o, w, ranks_per_host, &l, r);
}
