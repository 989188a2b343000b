/* train_plan.c: `loom plan` (train_plan.h): the run, dry, on its ranks, and its figures
 * printed as a table or JSON. */
#include "train_plan.h"

#include <stdlib.h>
#include <string.h>

typedef struct dry_ranks {
  const train_opts *o;
  train_dry_result r[TRAIN_PLAN_MAX_RANKS];
  char message[TRAIN_PLAN_MAX_RANKS][384]; /* each failing rank's, written by that rank only */
} dry_ranks;

static int dry_rank(loom_pg *pg, void *arg) {
  dry_ranks *d = arg;
  int rank = loom_pg_rank(pg);
  int rc = train_run_dry(d->o, pg, &d->r[rank]);
  if (rc) snprintf(d->message[rank], sizeof d->message[rank], "%s", train_last_error());
  return rc;
}

/* The message of a failed dry run: the lowest failing rank's (the ranks fail in any order; the
 * lowest one, as `loom train` on threads reports, so the same plan fails the same way). */
static int dry_fail(const dry_ranks *d, int n, int rc) {
  for (int k = 0; k < n; k++)
    if (d->message[k][0]) return train_fail(rc, "rank %d: %s", k, d->message[k]);
  return train_fail(rc, "%s", loom_last_error());
}

/* The phase of the rank with the highest peak. */
static void take_max(train_dry_phase *into, const train_dry_phase *p) {
  if (p->peak > into->peak) *into = *p;
}

static size_t noted_base;

static void read_data(const train_opts *o, plan_result *r);

void train_plan_note_base(void) { noted_base = train_peak_rss(); }

/* The data a rank of the run loads (r->data_bytes: what its loading adds to the meta pool)
 * and the training samples of an epoch, read for real (outside the dry run): the dataset's
 * headers, or the text. A failure leaves them 0 with a note: the plan of the step stands. The
 * last answer is kept for the same data (--fit-memory plans many batches of one run). */
static void plan_data(const train_opts *o, plan_result *r) {
  static struct {
    bool valid;
    char key[8200];
    size_t bytes, samples;
    char note[160];
  } last;
  char key[8200];
  snprintf(key, sizeof key, "%s|%s|%s|%ld", o->model, o->data ? o->data : "",
           o->text ? o->text : "", strcmp(o->model, "gpt") == 0 ? o->context : 0);
  if (last.valid && strcmp(key, last.key) == 0) {
    r->data_bytes = last.bytes, r->data_samples = last.samples;
    snprintf(r->data_note, sizeof r->data_note, "%s", last.note);
  } else {
    read_data(o, r);
    last.valid = true;
    snprintf(last.key, sizeof last.key, "%s", key);
    last.bytes = r->data_bytes, last.samples = r->data_samples;
    snprintf(last.note, sizeof last.note, "%s", r->data_note);
  }
  if (o->limit > 0 && (size_t)o->limit < r->data_samples) r->data_samples = (size_t)o->limit;
}

size_t train_plan_epoch_samples(const train_opts *o) {
  plan_result r;
  memset(&r, 0, sizeof r);
  plan_data(o, &r);
  if (r.data_samples) return r.data_samples;
  bool gpt = strcmp(o->model, "gpt") == 0; /* train_data.c's dry_data */
  size_t nominal = gpt ? ((size_t)1 << 20) / (size_t)o->context : 60000;
  return o->limit > 0 && (size_t)o->limit < nominal ? (size_t)o->limit : nominal;
}

static void read_data(const train_opts *o, plan_result *r) {
  int rc;
  if (strcmp(o->model, "gpt") == 0) {
    loom_pool_stats before, after;
    loom_mem_stats(LOOM_POOL_META, &before);
    loom_mem_reset_peak(LOOM_POOL_META);
    loom_text *t = NULL;
    rc = loom_text_load(o->text, &t);
    loom_mem_stats(LOOM_POOL_META, &after);
    if (!rc) {
      r->data_bytes = after.peak_bytes - before.current_bytes;
      r->data_samples = loom_text_size(t, LOOM_SPLIT_TRAIN) / (size_t)o->context;
    }
    loom_text_free(t);
  } else {
    size_t n_train = 0, n_test = 0, b_train = 0, b_test = 0;
    rc = loom_mnist_bytes(o->data, LOOM_SPLIT_TRAIN, &n_train, &b_train);
    if (!rc) rc = loom_mnist_bytes(o->data, LOOM_SPLIT_TEST, &n_test, &b_test);
    if (!rc) r->data_bytes = b_train + b_test, r->data_samples = n_train;
  }
  if (rc) snprintf(r->data_note, sizeof r->data_note, "%.150s", loom_last_error());
}

int train_plan(const train_opts *o, plan_result *r) {
  memset(r, 0, sizeof *r);
  loom_dtype amp = LOOM_F32;
  if (strcmp(o->amp, "off") != 0) loom_dtype_parse(o->amp, &amp);
  r->widened = !loom_ops_native_dtype(amp);
  dry_ranks *d = calloc(1, sizeof *d);
  if (!d) return train_fail(LOOM_ENOMEM, "plan: out of memory");
  d->o = o;
  int n = 1, rc;
  loom_mem_set_dry_run(true);
  if (o->ranks == 1 && strcmp(o->strategy, "none") == 0) {
    rc = train_run_dry(o, NULL, &d->r[0]);
  } else {
    loom_pg_cfg cfg = loom_pg_cfg_default();
    n = (int)o->ranks;
    rc = loom_threads_run(n, &cfg, dry_rank, d);
    if (rc) dry_fail(d, n, rc);
  }
  r->loom_bytes = loom_mem_dry_footprint_peak();
  loom_mem_set_dry_run(false);
  /* ranks past 63 have no memory account of their own (loom/alloc.h): by symmetry (equal
   * shards, batches and buckets) their figures are those of the ranks that do */
  for (int k = 0; k < n && k < LOOM_MEM_ACCOUNTS - 1 && !rc; k++) {
    const train_dry_result *x = &d->r[k];
    take_max(&r->build, &x->build);
    take_max(&r->train, &x->train);
    take_max(&r->eval, &x->eval);
    if (x->params > r->params) r->params = x->params;
    if (x->host_bytes > r->host_bytes) r->host_bytes = x->host_bytes;
    if (x->file_bytes > r->file_bytes) r->file_bytes = x->file_bytes;
    if (x->offload_read_bytes > r->offload_read_bytes) r->offload_read_bytes = x->offload_read_bytes;
    if (x->offload_write_bytes > r->offload_write_bytes)
      r->offload_write_bytes = x->offload_write_bytes;
  }
  if (!rc) { /* every rank issues the same collectives: rank 0's */
    r->gather_bytes = d->r[0].gather_bytes;
    r->reduce_scatter_bytes = d->r[0].reduce_scatter_bytes;
    r->replica_bytes = d->r[0].replica_bytes;
    r->allreduce_bytes = d->r[0].allreduce_bytes;
    r->nunits = d->r[0].nunits;
    memcpy(r->unit, d->r[0].unit, r->nunits * sizeof r->unit[0]);
  }
  free(d);
  r->peak = r->build.peak > r->train.peak ? r->build.peak : r->train.peak;
  if (r->eval.peak > r->peak) r->peak = r->eval.peak;
  if (rc) return rc;
  plan_data(o, r);
  r->data_loads = n; /* every rank (a thread of this process) loads its own copy */
  if (!noted_base) noted_base = train_peak_rss(); /* a library caller's: its first plan's */
  r->base_bytes = noted_base;
  r->process_peak = r->loom_bytes + r->data_bytes * (size_t)n + r->base_bytes;
  return rc;
}

/* ---- printing --------------------------------------------------------------------------- */

static const char *const tag_names[TRAIN_TAGS] = {
    "other", "model and strategy", "optimizer state", "batch", "forward", "backward",
    "update", "evaluation"};
static const char *const tag_keys[TRAIN_TAGS] = {
    "other", "model", "optimizer_state", "batch_data", "forward", "backward", "update",
    "evaluation"};

static void mib(char *buf, size_t cap, size_t b) {
  snprintf(buf, cap, "%.1f MiB", (double)b / (1024.0 * 1024.0));
}

void train_plan_print(FILE *f, const train_opts *o, const plan_result *r) {
  const train_dry_phase *ph[3] = {&r->build, &r->train, &r->eval};
  fprintf(f, "compute pool per rank at each phase's peak, by what allocated the bytes:\n");
  fprintf(f, "  %-22s %14s %14s %14s\n", "", "build", "train step", "evaluation");
  char c[3][32];
  for (int t = 1; t <= TRAIN_TAGS; t++) {
    int tag = t % TRAIN_TAGS; /* "other" last */
    if (!ph[0]->tag[tag] && !ph[1]->tag[tag] && !ph[2]->tag[tag]) continue;
    for (int k = 0; k < 3; k++) mib(c[k], sizeof c[k], ph[k]->tag[tag]);
    fprintf(f, "  %-22s %14s %14s %14s\n", tag_names[tag], c[0], c[1], c[2]);
  }
  for (int k = 0; k < 3; k++) mib(c[k], sizeof c[k], ph[k]->peak);
  fprintf(f, "  %-22s %14s %14s %14s\n", "peak", c[0], c[1], c[2]);
  char pk[32];
  mib(pk, sizeof pk, r->peak);
  fprintf(f, "peak per rank: %s (%zu parameters, %ld rank%s, batch %ld per rank%s)\n", pk,
          r->params, o->ranks, o->ranks > 1 ? "s" : "", o->batch,
          r->widened ? "; low-precision products widened to f32 on this CPU" : "");
  char lb[32], db[32], bb[32];
  mib(pk, sizeof pk, r->process_peak);
  mib(lb, sizeof lb, r->loom_bytes);
  mib(db, sizeof db, r->data_bytes * (size_t)r->data_loads);
  mib(bb, sizeof bb, r->base_bytes);
  fprintf(f, "process peak: %s, comparable to its resident set (loom's blocks %s in use and "
          "cached, data %s%s, runtime %s)\n", pk, lb, db,
          r->data_loads > 1 ? " (a copy per rank)" : "", bb);
  if (r->data_note[0]) fprintf(f, "  the data could not be read, so it is not counted: %s\n",
                               r->data_note);
  char file[32];
  mib(pk, sizeof pk, r->host_bytes);
  mib(file, sizeof file, r->file_bytes);
  if (r->file_bytes)
    fprintf(f, "offloaded per rank: %s in the offload file, %s in the host pool\n", file, pk);
  else if (r->host_bytes)
    fprintf(f, "offloaded per rank: %s in the host pool\n", pk);
  if (r->offload_read_bytes || r->offload_write_bytes) {
    char rd[32], wr[32];
    mib(rd, sizeof rd, (size_t)r->offload_read_bytes);
    mib(wr, sizeof wr, (size_t)r->offload_write_bytes);
    fprintf(f, "offload traffic per step and rank: %s read from the tier, %s written to it\n",
            rd, wr);
  }
  if (!r->hosts) return;
  double mb = 1e6;
  fprintf(f, "communication per step: %.2f MB each way through each host's link (%d host%s x %d "
          "rank%s; per rank: all-gathers %.2f MB, reduce-scatters %.2f MB, all-reduces %.2f MB, "
          "each collective a ring in rank order)", r->link_bytes / mb, r->hosts,
          r->hosts > 1 ? "s" : "", r->ranks_per_host, r->ranks_per_host > 1 ? "s" : "",
          (double)r->gather_bytes / mb, (double)r->reduce_scatter_bytes / mb,
          (double)(r->replica_bytes + r->allreduce_bytes) / mb);
  if (r->link_gbps > 0)
    fprintf(f, ": %.1f ms at %g Gbit/s", r->link_s * 1e3, r->link_gbps);
  fputc('\n', f);
  char lat[96] = "the link's bytes alone (--link-latency-us to add its latency)";
  if (r->link_latency_us > 0)
    snprintf(lat, sizeof lat, "%g us an exchange across the link, --link-latency-us",
             r->link_latency_us);
  if (r->exposed_modeled)
    fprintf(f, "exposed communication per step: %.1f ms of the %.1f ms the step's collectives "
            "run (the rest hidden behind %.1f ms of compute: the units' matrix products at %.3g "
            "GFLOP/s per rank, %s; a hop inside a host at %.3g Gbit/s, %s; gathers prefetched, "
            "each reduce-scatter beside its unit's input gradient%s; %s)\n", r->exposed_s * 1e3,
            r->comm_s * 1e3, r->compute_s * 1e3, r->gflops,
            r->gflops_measured ? "measured here (--gflops to give yours)" : "--gflops",
            r->intra_gbps, r->intra_measured ? "a memcpy measured here (--intra-link to give "
            "yours)" : "--intra-link",
            r->replica_bytes ? ", each replica all-reduce beside the rest of backward" : "",
            lat);
}

static void json_phase(FILE *f, const char *name, const train_dry_phase *ph) {
  fprintf(f, "\"%s\": {\"peak_bytes\": %zu", name, ph->peak);
  for (int t = 0; t < TRAIN_TAGS; t++) fprintf(f, ", \"%s\": %zu", tag_keys[t], ph->tag[t]);
  fputc('}', f);
}

void train_plan_print_json(FILE *f, const train_opts *o, const plan_result *r) {
  fprintf(f, "{\"model\": \"%s\", \"parameters\": %zu, \"ranks\": %ld, \"batch\": %ld, "
          "\"amp\": \"%s\", \"strategy\": \"%s\", \"widened\": %s, \"peak_bytes\": %zu, "
          "\"host_bytes\": %zu, \"file_bytes\": %zu, \"process_peak_bytes\": %zu, "
          "\"loom_footprint_bytes\": %zu, \"data_bytes\": %zu, \"data_loads\": %d, "
          "\"runtime_base_bytes\": %zu, \"epoch_samples\": %zu, ",
          o->model, r->params, o->ranks, o->batch, o->amp, o->strategy,
          r->widened ? "true" : "false", r->peak, r->host_bytes, r->file_bytes, r->process_peak,
          r->loom_bytes, r->data_bytes, r->data_loads, r->base_bytes, r->data_samples);
  json_phase(f, "build", &r->build);
  fputs(", ", f);
  json_phase(f, "train", &r->train);
  fputs(", ", f);
  json_phase(f, "eval", &r->eval);
  fprintf(f, ", \"step_gather_bytes\": %llu, \"step_reduce_scatter_bytes\": %llu, "
          "\"step_replica_allreduce_bytes\": %llu, \"step_allreduce_bytes\": %llu, "
          "\"step_offload_read_bytes\": %llu, \"step_offload_write_bytes\": %llu",
          (unsigned long long)r->gather_bytes, (unsigned long long)r->reduce_scatter_bytes,
          (unsigned long long)r->replica_bytes, (unsigned long long)r->allreduce_bytes,
          (unsigned long long)r->offload_read_bytes, (unsigned long long)r->offload_write_bytes);
  if (r->hosts)
    fprintf(f, ", \"hosts\": %d, \"ranks_per_host\": %d, \"link_gbps\": %g, "
            "\"link_bytes\": %.0f, \"link_seconds\": %.6f", r->hosts, r->ranks_per_host,
            r->link_gbps, r->link_bytes, r->link_s);
  if (r->exposed_modeled)
    fprintf(f, ", \"exposed_seconds\": %.6f, \"comm_seconds\": %.6f, \"compute_seconds\": %.6f, "
            "\"gflops\": %.6g, \"gflops_measured\": %s, \"intra_link_gbps\": %.6g, "
            "\"intra_link_measured\": %s, \"link_latency_us\": %.6g", r->exposed_s, r->comm_s,
            r->compute_s, r->gflops, r->gflops_measured ? "true" : "false", r->intra_gbps,
            r->intra_measured ? "true" : "false", r->link_latency_us);
  fputs("}\n", f);
}
