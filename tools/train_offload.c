/* train_offload.c: FSDP offload in `loom train` (--offload, --offload-tier, --offload-dir,
 * --offload-io-threads, --prefetch): the library's offload configuration made from the options, and what the run
 * reports about it: the bytes in the tier, the rank's host-pool and file-pool bytes (its memory
 * account; the host pool counts offloaded bytes and nothing else, loom/alloc.h), the
 * process's peak RSS, and the bytes moved to and from the tier with the time spent moving them
 * and the part of it the compute waited for. Offload moves bytes only (the results are
 * bit-identical without it), so none of this enters the resume fingerprint. */
#include "progress.h"
#include "train_api.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static bool offload_on(const train_opts *o) {
  return o->offload_params || o->offload_grads || o->offload_optim;
}

void train_offload_cfg(const train_opts *o, loom_fsdp_offload_cfg *c) {
  *c = loom_fsdp_offload_cfg_default();
  c->enabled = offload_on(o);
  if (!c->enabled) return;
  c->offload_parameters = o->offload_params;
  c->offload_gradients = o->offload_grads;
  c->offload_optimizer_states = o->offload_optim;
  c->prefetch_steps = (int)o->prefetch;
  c->tier = strcmp(o->offload_tier, "disk") == 0 ? LOOM_FSDP_TIER_DISK : LOOM_FSDP_TIER_HOST;
  c->dir = c->tier == LOOM_FSDP_TIER_DISK ? o->offload_dir : NULL;
  c->io_threads = (int)o->offload_io_threads;
}

bool train_offload_has_state(const train_opts *o) {
  return strcmp(o->optim, "sgd") != 0 || o->momentum != 0;
}

loom_pool train_offload_state_pool(const train_opts *o) {
  return o->offload_optim ? LOOM_POOL_HOST : LOOM_POOL_COMPUTE;
}

/* "params,grads,optim" (the kinds offloaded). */
static void kinds(const train_opts *o, char *buf, size_t cap) {
  snprintf(buf, cap, "%s%s%s%s%s", o->offload_params ? "params" : "",
           o->offload_params && (o->offload_grads || o->offload_optim) ? "," : "",
           o->offload_grads ? "grads" : "", o->offload_grads && o->offload_optim ? "," : "",
           !o->offload_optim ? "" : train_offload_has_state(o) ? "optim"
           : "optim (none: SGD without momentum keeps no state)");
}

void train_offload_describe(const train_opts *o, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  if (!offload_on(o)) return;
  char k[96];
  kinds(o, k, sizeof k);
  char io[48] = "";
  if (o->offload_io_threads)
    snprintf(io, sizeof io, ", %ld I/O thread%s", o->offload_io_threads,
             o->offload_io_threads == 1 ? "" : "s");
  snprintf(buf, cap, ", offload %s to the %s tier (prefetch %ld%s)", k, o->offload_tier,
           o->prefetch, io);
}

/* VmHWM, the high-water mark of this process image's own resident set: getrusage's
 * ru_maxrss also keeps the largest image the process had before its exec, and a process
 * forked from a large one (a test, a Python script) starts as a copy of its resident set. */
size_t train_peak_rss(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kib = 0;
  bool found = false;
  while (f && !found && fgets(line, sizeof line, f))
    found = sscanf(line, "VmHWM: %llu kB", &kib) == 1;
  if (f) fclose(f);
  if (found) return (size_t)kib * 1024;
  struct rusage ru; /* ru_maxrss is in KiB on Linux */
  return getrusage(RUSAGE_SELF, &ru) == 0 ? (size_t)ru.ru_maxrss * 1024 : 0;
}

/* This rank's pool counters (its account: a rank's own with ranks as threads, the process's
 * under MPI). */
static loom_pool_stats rank_pool(loom_pool pool) {
  loom_pool_stats ps = {0};
  loom_mem_account_stats(loom_mem_account(), pool, &ps);
  return ps;
}

void train_offload_json(const train_opts *o, const loom_fsdp_stats *s, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  if (!offload_on(o)) return;
  loom_pool_stats host = rank_pool(LOOM_POOL_HOST), file = rank_pool(LOOM_POOL_FILE);
  snprintf(buf, cap,
           ", \"rank_host_bytes\": %zu, \"rank_host_peak_bytes\": %zu, \"rank_file_bytes\": %zu, "
           "\"rank_file_peak_bytes\": %zu, \"peak_rss_bytes\": %zu, \"fsdp_offload_bytes\": %zu, "
           "\"fsdp_offload_to_bytes\": %llu, \"fsdp_offload_from_bytes\": %llu, "
           "\"fsdp_offload_transfer_s\": %.6f, \"fsdp_offload_wait_s\": %.6f",
           host.current_bytes, host.peak_bytes, file.current_bytes, file.peak_bytes, train_peak_rss(),
           s->offload_bytes, (unsigned long long)s->offload_to_bytes,
           (unsigned long long)s->offload_from_bytes, s->offload_transfer_s, s->offload_wait_s);
}

void train_offload_summary(const train_opts *o, loom_fsdp *f, FILE *out) {
  loom_fsdp_stats s;
  if (!offload_on(o) || loom_fsdp_stats_get(f, &s)) return;
  char moved[32], held[32], host[32], file[32], rss[32];
  progress_bytes(moved, sizeof moved, (size_t)(s.offload_to_bytes + s.offload_from_bytes));
  progress_bytes(held, sizeof held, s.offload_bytes);
  progress_bytes(host, sizeof host, rank_pool(LOOM_POOL_HOST).peak_bytes);
  progress_bytes(file, sizeof file, rank_pool(LOOM_POOL_FILE).peak_bytes);
  progress_bytes(rss, sizeof rss, train_peak_rss());
  fprintf(out, "loom train: offload: %s tier, %s offloaded, %s moved, exposed wait %.2f s of "
          "%.2f s transfer, host pool peak %s, file pool peak %s (rank 0); peak RSS %s\n",
          o->offload_tier, held, moved, s.offload_wait_s, s.offload_transfer_s, host, file, rss);
}
