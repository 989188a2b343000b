/* train_plan.h: `loom plan`: the compute-pool memory a `loom train` run will need per rank,
 * and its process's peak (comparable to the resident set), before it starts, from the same
 * options.
 *
 * The plan is the run itself, dry: loom's dry run (loom_mem_set_dry_run, loom/alloc.h) makes
 * every allocation and free the library makes, in order, with no kernel run and no memory
 * behind the blocks, and the trainer (train_run_dry) builds the model, its DDP or FSDP, the
 * optimizer and scaler, takes two training steps and one evaluation batch on batches of zeros,
 * on the same ranks (threads). Each phase's peak per rank is read from loom's counters, with
 * what each of the trainer's tags (train_tag: the phase that allocated the bytes) held then.
 * So a new op, model or strategy is planned by running it: nothing here mirrors the library.
 * tests/train/test_train_plan.c holds the plan to the peak a real `loom train` measures. */
#ifndef LOOM_TOOLS_TRAIN_PLAN_H
#define LOOM_TOOLS_TRAIN_PLAN_H

#include "train_api.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct plan_result {
  train_dry_phase build; /* making the model, its DDP or FSDP, the optimizer and scaler */
  train_dry_phase train; /* a training step (what `loom train` reports as its peak per rank) */
  train_dry_phase eval;  /* an evaluation batch (--eval-batch) */
  size_t peak;           /* the largest of the three */
  size_t params;         /* parameter count of the model */
  size_t host_bytes;     /* FSDP offload: bytes kept in the host pool per rank */
  size_t file_bytes;     /* FSDP offload: bytes kept in the offload file per rank (tier disk) */
  uint64_t offload_read_bytes, offload_write_bytes; /* FSDP offload: one step's bytes read from
                                                     * and written to the tier per rank */
  bool widened;          /* --amp on a CPU without a native kernel: products widened to f32 */
  /* one step's collectives on a rank, by buffer bytes (train_dry_result's) */
  uint64_t gather_bytes, reduce_scatter_bytes, replica_bytes, allreduce_bytes;
  /* --hosts H --ranks-per-host R [--link GBPS]: the ranks laid out host by host (ranks
   * 0..R-1 on the first), each collective a ring in rank order; the bytes one step sends
   * through each host's link, each way, and their time at GBPS (0: not asked) */
  int hosts, ranks_per_host;
  double link_gbps, link_bytes, link_s;
  /* FSDP and HSDP with --link: the step replayed unit by unit (train_plan_comm.c): each
   * collective as long as its ring's slowest hop (the link at link_gbps; a hop between two
   * ranks of one host at intra_gbps, --intra-link or measured: intra_measured), its matrix
   * products at gflops GFLOP/s per rank (--gflops, or measured: gflops_measured); comm_s the
   * time the step's collectives run (inside hosts too), exposed_s the part of it the rank
   * waits for, beside compute_s of compute; exposed_modeled false where no timeline is made
   * (DDP, no --link, units past TRAIN_PLAN_MAX_UNITS) */
  bool exposed_modeled, gflops_measured, intra_measured;
  double gflops, intra_gbps, exposed_s, compute_s, comm_s;
  /* --link-latency-us: each exchange of a collective across the link waits this long besides
   * its bytes (an alpha-beta model: the header exchange, then each ring step; 0: none) */
  double link_latency_us;
  size_t nunits; /* the units in forward order (train_dry_result's) */
  struct train_dry_unit unit[TRAIN_PLAN_MAX_UNITS];
  /* The process (comparable to its resident set): loom's blocks at their peak, in use and in
   * the allocator's cache (loom_mem_dry_footprint_peak, every rank of the process), the data
   * every rank loads (the dataset's bytes from its headers, the text as loaded), and the
   * runtime's base (the resident set of this process when the command started: libraries,
   * OpenMP). data_samples: the training samples an epoch has (windows for the GPT; --limit). */
  size_t process_peak, loom_bytes, data_bytes, base_bytes, data_samples;
  int data_loads;        /* ranks of the process that each load the data */
  char data_note[160];   /* why data_bytes is 0 (the data could not be read), or "" */
} plan_result;

/* The rates the timeline runs at: a rank's matrix products, GFLOP/s, and a hop between two
 * ranks of one host, Gbit/s each way; each given (--gflops, --intra-link) or measured here
 * (the flags say which); and the link's latency, microseconds an exchange (given, or 0). */
typedef struct plan_rates {
  double gflops, intra_gbps;
  bool gflops_measured, intra_measured;
  double link_latency_us; /* --link-latency-us (0: not modelled) */
} plan_rates;

/* Fill r's link figures for hosts x ranks_per_host (their product the run's ranks) and a link
 * of gbps Gbit/s (0: bytes only), from r's step bytes and the options' strategy; with a link,
 * FSDP's and HSDP's exposed time at `rates`. */
void train_plan_links(const train_opts *o, int hosts, int ranks_per_host, double gbps,
                      const plan_rates *rates, plan_result *r);

/* The matrix-multiply rate one rank of the run achieves here, GFLOP/s: a 256x1024 by 1024x1024
 * product in the run's forward dtype (--amp, else f32) on `threads` threads, timed by the wall
 * clock (what a step waits for), the median of 5 after one to warm up. Sets loom's thread
 * count. 0 if the product fails. */
double train_plan_gemm_gflops(const train_opts *o, int threads);

/* The rate of a hop between two ranks of one machine, Gbit/s: this process's memcpy of 32 MiB
 * (one copy a hop, as MPI's shared memory with a single-copy transport such as Linux's CMA
 * moves a large message), the median of 5 after one to warm up. 0 if it cannot allocate. */
double train_plan_intra_gbps(void);

/* One step of FSDP replayed on the rank's compute clock and its collectives' clocks: per unit
 * (forward order) the seconds of one all-gather, of its gradient's reduce-scatter and (HSDP)
 * of its shard's all-reduce over the replicas (0: none), whether the gather and reduce-scatter
 * (group_link) and the replica all-reduce (replica_link) use the link between hosts, its
 * forward's compute seconds (backward: that for the weights' gradient, then that again for the
 * input's, none for the first unit), and whether it stays gathered from forward to backward.
 * The schedule is loom's FSDP's (fsdp_hooks.c): a unit's gather issued at its start with the
 * next `prefetch` units' (forward: the following ones; backward: the preceding ones), waited
 * for before its compute; its reduce-scatter issued once its weights' gradient is made and
 * waited for before the next unit's backward (limit_reduce_scatters); the replica all-reduce
 * issued as that reduce-scatter ends (on the replica group, so in series with it) and waited
 * for only at the end of backward, unless the unit's shard is reduced in place into its local
 * gradient (`replica_holds_local`: gradients offloaded), when the next unit's backward waits
 * for it too. Each group runs
 * its collectives one at a time, in issue order (the gathers and reduce-scatters on the
 * group's, the replica all-reduces on the replica group's), and the link carries one
 * collective at a time. comm_s: the collectives' total time; exposed_s: the time the compute
 * waited. */
typedef struct plan_unit_time {
  double gather_s, reduce_s, replica_s, forward_s;
  bool kept, group_link, replica_link, replica_holds_local;
} plan_unit_time;
typedef struct plan_timeline {
  double comm_s, exposed_s, compute_s;
} plan_timeline;
void plan_step_timeline(const plan_unit_time *u, size_t n, int prefetch, plan_timeline *out);

/* The runtime's base: this process's resident set now, noted by the `loom` command at start
 * (loom.c), before anything of loom ran; a process that did not note it measures it when it
 * first plans. */
void train_plan_note_base(void);

/* The plan of the run the (checked) options describe: the largest figure of any rank for each
 * phase. Returns a loom status; on failure train_last_error() says why (what `loom train`
 * would have said at the same point, such as a --warmup longer than the run). */
int train_plan(const train_opts *o, plan_result *r);

/* The training samples an epoch of these options has (windows for the GPT), what the most a
 * --batch x --ranks may be: --limit, else the data's count (from its headers, or the text),
 * else the dry run's nominal epoch (60000 images; 1 MiB of text) when the data cannot be read. */
size_t train_plan_epoch_samples(const train_opts *o);

/* Print the plan as a table, or as one JSON object. */
void train_plan_print(FILE *f, const train_opts *o, const plan_result *r);
void train_plan_print_json(FILE *f, const train_opts *o, const plan_result *r);

#endif
