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
  /* The process (comparable to its resident set): loom's blocks at their peak, in use and in
   * the allocator's cache (loom_mem_dry_footprint_peak, every rank of the process), the data
   * every rank loads (the dataset's bytes from its headers, the text as loaded), and the
   * runtime's base (the resident set of this process when the command started: libraries,
   * OpenMP). data_samples: the training samples an epoch has (windows for the GPT; --limit). */
  size_t process_peak, loom_bytes, data_bytes, base_bytes, data_samples;
  int data_loads;        /* ranks of the process that each load the data */
  char data_note[160];   /* why data_bytes is 0 (the data could not be read), or "" */
} plan_result;

/* Fill r's link figures for hosts x ranks_per_host (their product the run's ranks) and a link
 * of gbps Gbit/s (0: bytes only), from r's step bytes and the options' strategy. */
void train_plan_links(const train_opts *o, int hosts, int ranks_per_host, double gbps,
                      plan_result *r);

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
