/* train_plan.h: `loom plan`: the compute-pool memory a `loom train` run will need per rank,
 * before it starts, from the same options.
 *
 * The plan replays the run's allocations without making them: the model's build, one training
 * step (batch, forward under autocast with what each op saves for backward, cross-entropy,
 * backward in the engine's order with each op's transients, the optimizer step) and one
 * evaluation batch, each op allocating and freeing what the library's op does, in the same
 * order (the casts autocast makes and caches, the f32 operands a GEMM or convolution widens to
 * on a CPU without a native low-precision kernel, the int64 indices of max-pooling, the
 * gradient buffers, DDP's buckets, FSDP's shards, gathered units and unit gradients, and what
 * offload moves out of the compute pool). The peak of each phase and what is live at that
 * moment, by part, come out. tests/train/test_train_plan.c holds it to the peak `loom train`
 * measures.
 *
 * Where the library's timing decides, the plan takes the highest peak a run can reach: an FSDP
 * unit's full-size gradient is counted until the next unit starts (a reduce-scatter that
 * completes at once frees it earlier).
 *
 * Not counted: oneDNN's scratchpads (under 2 MB for these models) and allocator headers. */
#ifndef LOOM_TOOLS_TRAIN_PLAN_H
#define LOOM_TOOLS_TRAIN_PLAN_H

#include "train_api.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* What the bytes are. */
typedef enum plan_part {
  PLAN_PARAMS,      /* f32 parameters (FSDP: this rank's parameter shards) */
  PLAN_GRADS,       /* parameter gradients (DDP: its buckets are views of them; FSDP: gradient
                     * shards and a unit's full gradient) */
  PLAN_OPTIM,       /* optimizer state (Adam's two moments, SGD's momentum) */
  PLAN_LOWP,        /* low-precision weight copies (autocast's casts), FSDP's gathered units */
  PLAN_BATCH,       /* the input batch and labels */
  PLAN_ACTIVATIONS, /* activations saved for backward (and live outputs) */
  PLAN_ACT_GRADS,   /* gradients of activations in flight */
  PLAN_WORKSPACE,   /* transients: f32 operands of widened kernels, staging, casts of gradients */
  PLAN_PARTS
} plan_part;

/* One phase: its peak and what was live at that moment. */
typedef struct plan_phase {
  int64_t peak;
  int64_t part[PLAN_PARTS];
} plan_phase;

typedef struct plan_result {
  plan_phase build; /* making the model, its FSDP shards and the optimizer */
  plan_phase train; /* a training step (what `loom train` reports as its peak per rank) */
  plan_phase eval;  /* an evaluation batch (--eval-batch) */
  int64_t peak;     /* the largest of the three */
  int64_t params;   /* parameter count of the model */
  int64_t host_bytes; /* FSDP offload: bytes kept in the host pool (tier host) */
  int64_t file_bytes; /* FSDP offload: bytes kept in the offload file (tier disk) */
  bool widened;     /* --amp on a CPU without a native kernel: products widened to f32 */
} plan_result;

/* The plan of the run the (checked) options describe, with `native` telling whether this CPU
 * has native kernels for the --amp dtype (loom_ops_native_dtype). The evaluation batch is
 * --eval-batch, at most the test samples (--limit, else Fashion-MNIST's 10000). Not reentrant
 * (the simulator's tables are static). */
void train_plan(const train_opts *o, bool native, plan_result *r);

/* Print the plan as a table, or as one JSON object. */
void train_plan_print(FILE *f, const train_opts *o, const plan_result *r);
void train_plan_print_json(FILE *f, const train_opts *o, const plan_result *r);

#endif
