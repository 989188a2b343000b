/* train_api.h: the trainer behind `loom train`, one concept per file: the options (this header,
 * filled by cmd_train.c), the model (train_model.c), checkpoints (train_ckpt.c), per-step
 * metrics (train_metrics.c), the error message of a failed run (train_error.c) and the loop
 * (train_run.c).
 *
 * train_run is the core: with pg == NULL it trains in this process alone; with a process
 * group each rank trains on its shard of every global batch (global batch = ranks x batch),
 * and rank 0 alone prints, evaluates, writes metrics and checkpoints.
 *
 * Errors: every function returns a loom status; on failure train_last_error() gives the
 * message (the tool's own context, such as "--init FILE", followed by loom's detail). */
#ifndef LOOM_TOOLS_TRAIN_API_H
#define LOOM_TOOLS_TRAIN_API_H

#include <loom/loom.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define TRAIN_MAX_HIDDEN 8
#define TRAIN_MAX_RANKS 64 /* --ranks on the threads backend */
#define TRAIN_PLAN_MAX_RANKS 1024 /* loom plan --hosts H --ranks-per-host R: dry thread ranks */
#define TRAIN_PLAN_MAX_UNITS 256  /* FSDP units whose timeline loom plan replays */
#define TRAIN_CLI_KV_MAX 65 /* the recorded command line: "cli" and one entry an option */

typedef struct train_opts {
  const char *model;                   /* "mlp", "cnn" or "gpt" */
  int64_t hidden[TRAIN_MAX_HIDDEN];    /* MLP hidden widths */
  int nhidden;
  int64_t channels[2];                 /* CNN conv output channels */
  int64_t fc;                          /* CNN fully connected width */
  /* GPT (--model gpt): the sizes, the text, and its evaluation */
  long layers, heads, dim, context;
  const char *text;                    /* --text FILE; NULL: the fortunes (LOOM_FORTUNES_DIR) */
  long eval_every;                     /* validation loss every N steps too; 0: epochs' ends */
  long eval_windows;                   /* validation windows an evaluation takes; 0: all */
  bool checkpoint_activations;         /* recompute each block's forward in backward */
  bool optim_in_backward;              /* FSDP: each unit's optimizer step inside backward */
  long epochs, batch, seed;
  double lr, weight_decay, momentum, loss_scale;
  double min_lr;                       /* --min-lr: the cosine schedule's floor */
  long warmup;
  bool warmup_auto;                    /* warmup is the GPT's default: at most a tenth of the
                                        * run's steps */
  const char *optim;                   /* "sgd", "adam", "adamw" */
  const char *schedule;                /* "constant", "warmup", "cosine" */
  const char *amp;                     /* "off", "bf16", "f16" */
  const char *scaler;                  /* "dynamic", "static", "off" */
  const char *init, *metrics, *save, *resume, *data;
  bool shuffle;
  long threads;                        /* compute threads per rank; 0: the default */
  long limit;                          /* 0, or samples per epoch (and test samples); gpt:
                                        * training windows per epoch (and validation windows) */
  long max_steps;                      /* 0, or stop after this many steps in all */
  long eval_batch;
  FILE *out;                           /* progress and summary (stdout) */
  bool quiet;                          /* only the summary line */
  const char *progress;                /* "auto", "bar" or "lines" (progress.h) */
  /* data parallelism */
  long ranks;
  const char *backend;                 /* "threads" or "mpi" */
  const char *strategy;                /* "none", "ddp", "fsdp" or "hsdp" */
  long shard_size;                     /* --strategy hsdp: ranks per shard group (0: not given) */
  /* FSDP (--strategy fsdp or hsdp) */
  const char *wrap;                    /* "children" or "size" */
  long unit_min;                       /* size policy: elements a unit reaches */
  const char *reshard;                 /* "yes" or "no": reshard after forward */
  long gather_prefetch;                /* gathers in flight ahead, 0..8 */
  /* FSDP offload (--offload; train_opts_check fills the three flags from its list) */
  const char *offload;                 /* "none", "all" or a list of params,grads,optim */
  bool offload_params, offload_grads, offload_optim;
  const char *offload_tier;            /* "host" or "disk" */
  const char *offload_dir;             /* the disk tier's folder */
  long prefetch;                       /* units brought back ahead of use, 0..10 */
  long offload_io_threads;             /* transfers in flight per rank, 0..16 (0: the tier's) */
  /* the command line's fingerprint (train_cli_fingerprint), which every rank must share */
  const struct train_fp_entry *ranks_fp;
  int nranks_fp;
  /* the command line as the checkpoints record it (train_resume_record): "cli", "cli.<opt>" */
  const loom_safetensors_meta_kv *cli_kv;
  int ncli_kv;
} train_opts;

/* The progress display o->progress asks for (train_run.c). */
int train_progress_mode(const train_opts *o);

/* Train as the options say. pg == NULL: one process. Returns a loom status; on failure
 * train_last_error() says why. */
int train_run(const train_opts *o, loom_pg *pg);

/* A dry run of the same options (loom's dry run, loom/alloc.h: every allocation made, no
 * kernel run, no data read, nothing printed or written): setup, two training steps and one
 * evaluation batch, with this rank's compute-pool peak in each (its account's with ranks as
 * threads, the process's alone). `loom plan` (train_plan.c) is built on it; call with the dry
 * run on. */
/* What the trainer tags its allocations with (loom_mem_set_tag), by phase. */
typedef enum train_tag {
  TRAIN_TAG_OTHER = 0,  /* untagged: helper threads, anything outside the phases */
  TRAIN_TAG_MODEL,      /* building: parameters, gradients, DDP's buckets, FSDP's shards */
  TRAIN_TAG_OPTIM,      /* the optimizer's state */
  TRAIN_TAG_BATCH,      /* the input batch and labels */
  TRAIN_TAG_FORWARD,    /* forward: activations saved for backward, autocast's casts, gathers */
  TRAIN_TAG_BACKWARD,   /* backward: gradients in flight, reductions, workspace */
  TRAIN_TAG_UPDATE,     /* unscale, clipping, the optimizer step */
  TRAIN_TAG_EVAL,       /* evaluation batches */
  TRAIN_TAGS
} train_tag;
_Static_assert(TRAIN_TAGS <= LOOM_MEM_TAGS, "a loom memory tag per phase");

typedef struct train_dry_phase {
  size_t peak;               /* compute-pool peak, bytes */
  size_t tag[LOOM_MEM_TAGS]; /* bytes live at the peak, by train_tag */
} train_dry_phase;

typedef struct train_dry_result {
  train_dry_phase build, train, eval;
  size_t params;             /* parameters of the model */
  size_t host_bytes, file_bytes; /* FSDP offload: this rank's host and file pools after the
                                  * steps: what offload keeps */
  /* one training step's collectives on this rank, each by the size of its whole buffer (the
   * second step's: the library's own counters, loom_fsdp_stats / loom_ddp_stats): FSDP's
   * all-gathers (gathered dtype) and reduce-scatters (f32), HSDP's replica all-reduces of
   * shards, DDP's bucket all-reduces */
  uint64_t gather_bytes, reduce_scatter_bytes, replica_bytes, allreduce_bytes;
  /* FSDP and HSDP: the units in forward order (their index order), each with its elements,
   * padded and per shard, and whether it stays gathered from its forward to its backward (the
   * root unit, the last one, or every one with reshard-after-forward off); nunits 0 past
   * TRAIN_PLAN_MAX_UNITS (the plan then gives no exposed time) */
  size_t nunits;
  struct train_dry_unit {
    size_t numel, padded, shard;
    bool kept;
  } unit[TRAIN_PLAN_MAX_UNITS];
  /* FSDP offload: the second step's bytes read from and written to the tier on this rank
   * (loom_fsdp_stats' offload_from_bytes, offload_to_bytes) */
  uint64_t offload_read_bytes, offload_write_bytes;
} train_dry_result;
int train_run_dry(const train_opts *o, loom_pg *pg, train_dry_result *r);

/* The process's peak resident set so far, bytes: this image's own (VmHWM, not what a parent
 * it was forked from held), getrusage's where /proc is not there (train_offload.c). */
size_t train_peak_rss(void);

/* ---- errors ---------------------------------------------------------------------------- */

/* Record a failure message for this thread (printf-style) and return code. */
int train_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Record loom_last_error() behind a prefix ("--init m.safetensors") and return code. */
int train_fail_loom(int code, const char *prefix);
/* This thread's last train_fail message ("" if none). */
const char *train_last_error(void);
/* SIGINT / SIGTERM / SIGHUP (train_signal.c): install the handlers (the first signal sets a
 * flag, a second ends the process), and the signal received so far (0: none). */
void train_signal_install(void);
int train_signal_pending(void);
/* What to do about a failure whose message is `message`, when the tool knows (a CPU that lacks
 * a kernel, memory); NULL otherwise. A static string. */
const char *train_error_hint(const char *message);

/* ---- the model ------------------------------------------------------------------------- */

typedef struct train_model {
  loom_module *root;
  bool cnn;
  bool gpt;                     /* --model gpt: token windows in, logits [B, T, 256] out */
  loom_gpt_cfg gpt_cfg;
  size_t nparams;
  loom_param *params;           /* nparams entries, PyTorch names */
} train_model;

/* The parameters (values) of the model the options name, without building it. */
uint64_t train_model_numel(const train_opts *o);
/* Build the model the options name (PyTorch's default init from --seed). */
int train_model_create(const train_opts *o, train_model *m);
void train_model_free(train_model *m);
/* Logits [B, 10] of a batch (MLP: x [B, 784]; CNN: x [B, 1, 28, 28]; GPT: tokens [B, T] to
 * logits [B, T, 256]). */
int train_model_forward(train_model *m, loom_tensor *x, loom_tensor **logits);
/* Whether the model takes flattened images. */
bool train_model_flat_input(const train_model *m);
/* Set every parameter from a safetensors file by name (messages begin with opt, "--init"): each must be there with dtype F32, the
 * parameter's shape and finite values, and the file must hold nothing else (PyTorch's strict
 * loading). With forward F16 or BF16 (--amp), a value above that dtype's largest finite value
 * (65504 for f16) is refused too, naming the tensor and the value: the forward's cast would
 * make it inf. With fsdp (NULL: none), the model is sharded by it (built deferred): the file is
 * mapped and each rank copies only its shards' parts (loom_fsdp_load_full_state). */
int train_model_load(train_model *m, const char *path, loom_dtype forward, const char *opt,
                     loom_fsdp *fsdp);
/* Write the parameters (by name) and metadata (NULL, 0: none) to a safetensors file,
 * atomically. */
int train_model_save(const train_model *m, const char *path, const loom_safetensors_meta_kv *meta,
                     size_t nmeta);
/* The loss of a batch's logits against its labels (next tokens for the GPT): mean cross
 * entropy. */
int train_model_loss(const train_model *m, loom_tensor *logits, loom_tensor *y, loom_tensor **out);
/* What DIR/model.safetensors records of the model besides its tensors, so that a reader can
 * rebuild and feed it without the training command (`loom generate`, `loom eval`): for the GPT
 * "model" = "gpt" and "gpt.vocab", "gpt.context", "gpt.layers", "gpt.heads", "gpt.dim"; for the
 * image classifiers "model" = "mlp" with "mlp.sizes" ("784,1024,1024,10"), or "cnn" with
 * "cnn.channels" ("32,64") and "cnn.fc" ("128"), then "classes" ("10"), "input.shape" ("784"
 * flattened row by row, or "1,28,28"), the normalisation "input.mean" and "input.std" (a pixel
 * x of 0..255 is fed as (x / 255 - mean) / std), "input" (that rule in words) and "amp" (the
 * autocast of the run's evaluations: off, bf16, f16). */
#define TRAIN_MODEL_META 10
typedef struct train_model_meta {
  char value[TRAIN_MODEL_META][160];
  loom_safetensors_meta_kv kv[TRAIN_MODEL_META];
  size_t n;
} train_model_meta;
void train_model_meta_make(const train_model *m, const train_opts *o, train_model_meta *out);
/* An image classifier's options from a model file's metadata (train_model_meta_make's keys):
 * o->model, hidden/nhidden or channels/fc, and *amp; *mean and *std the normalisation.
 * LOOM_EFORMAT naming the file and the key when one is missing or malformed, or when the
 * file's tensors hold fewer values than that model has parameters; LOOM_EINVAL when the file
 * is a GPT's or records no model (written before the record). */
int train_model_meta_image(const loom_safetensors *f, const char *path, train_opts *o,
                           float *mean, float *std);
/* A GPT's configuration from a model file's metadata (train_model_meta_make's keys):
 * LOOM_EFORMAT naming the file and the key when one is missing or is not a size, or when the
 * file's tensors hold fewer values than that GPT has parameters; LOOM_EINVAL when the file is
 * not a GPT's (no "model" = "gpt"). */
int train_model_meta_gpt(const loom_safetensors *f, const char *path, loom_gpt_cfg *cfg);
/* A short description ("mlp 784-1024-1024-10", "cnn 1-32-64/3136-128-10",
 * "gpt 4 layers, 4 heads, 128 wide, context 128, vocab 256"). */
void train_model_describe(const train_model *m, const train_opts *o, char *buf, size_t cap);

/* ---- data parallelism ------------------------------------------------------------------ */

/* The data-parallel side of a run (train_par.c). pg NULL: one process, every call a no-op.
 * Otherwise create first compares the options of every rank (train_ckpt_fingerprint and
 * o->ranks_fp: every option of the command line but the rank-local ones; LOOM_EINVAL on every rank, naming the option, a rank that differs from rank
 * 0 and both values), then, with --strategy ddp, the parameters are wrapped by DDP, which
 * points each one's gradient at a view of its bucket: take gradients from
 * loom_tensor_grad(param) after create, never from the module's gradient arena. */
typedef struct train_par train_par;
int train_par_create(loom_pg *pg, const train_opts *o, train_model *m, train_par **out);
/* The process group's configuration for this run: loom_pg_cfg_default (LOOM_TIMEOUT or 300
 * s) with --timeout SECONDS (timeout > 0) over it. -1, after a message on stderr naming
 * --timeout or LOOM_TIMEOUT, for a bad value or --timeout without ranks (a usage error). */
int train_par_cfg(const train_opts *o, double timeout, loom_pg_cfg *cfg);
/* Once the data is loaded and a checkpoint restored: every rank must have the same steps per
 * epoch (the same data) and start at the same step (the same --resume); LOOM_EINVAL on every
 * rank otherwise, as for the options. */
int train_par_check_start(train_par *p, int64_t steps_per_epoch, int64_t step);
void train_par_free(train_par *p);
int train_par_rank(const train_par *p);
int train_par_size(const train_par *p);
/* The DDP wrapper of a run over ranks without FSDP (NULL for one process, or with FSDP): the
 * training step (loom_step) is made over it. */
loom_ddp *train_par_ddp(const train_par *p);
/* The FSDP wrapper of a --strategy fsdp run (NULL otherwise): its segments feed the optimizer,
 * the step is made over it (its mixed precision's scaler replaces the trainer's), and
 * evaluation and checkpoints run on every rank (they gather the units). */
loom_fsdp *train_par_fsdp(const train_par *p);
/* A flag true on any rank (the stop check: every rank stops at the same step). */
int train_par_any(train_par *p, bool local, bool *global);
/* The data-parallel statistics as JSON members for the metrics ("" for one process). */
void train_par_json(const train_par *p, char *buf, size_t cap);

/* ---- FSDP offload (train_offload.c) ------------------------------------------------------ */

/* The offload configuration of the options: on when --offload names some kind of bytes, with
 * --offload-tier, --offload-dir and --prefetch; the library's defaults otherwise. */
void train_offload_cfg(const train_opts *o, loom_fsdp_offload_cfg *c);
/* Where the optimizer keeps its state: the host pool when it is offloaded (so it never passes
 * through the compute pool on its way to the tier), the compute pool otherwise. */
loom_pool train_offload_state_pool(const train_opts *o);
/* Whether the optimizer keeps state that --offload optim would move: not SGD without
 * momentum. */
bool train_offload_has_state(const train_opts *o);
/* Offload's part of the FSDP header line: "" without offload, else such as ", offload
 * params,grads,optim to the host tier (prefetch 1)" (", 16 I/O threads" after the prefetch
 * where --offload-io-threads was given); optim, when the optimizer keeps no state,
 * as "optim (none: SGD without momentum keeps no state)". */
void train_offload_describe(const train_opts *o, char *buf, size_t cap);
/* JSON members for the metrics, each after ", " (nothing without offload): this rank's
 * host-pool and file-pool bytes (its account), the process's peak RSS and the FSDP stats'
 * offload figures (fsdp_offload_*). */
void train_offload_json(const train_opts *o, const loom_fsdp_stats *s, char *buf, size_t cap);
/* The summary's offload line on out (nothing without offload). */
void train_offload_summary(const train_opts *o, loom_fsdp *f, FILE *out);

/* ---- checkpoints ----------------------------------------------------------------------- */

/* Where a run stands: `step` steps done (epoch = step / steps_per_epoch). */
typedef struct train_state {
  int64_t step;
  int64_t steps_per_epoch;
  int64_t model_step; /* after train_ckpt_load: the step DIR/model.safetensors holds, -1 if none */
  int64_t from_ranks, from_batch; /* after a load at another rank count: the checkpoint's, else 0 */
} train_state;

/* DIR/model.safetensors (parameters, step and epoch, for --init and other tools), then
 * DIR/checkpoint.safetensors (model, optimizer state, scaler, step, epoch and the options a
 * resumed run must share), each written atomically, so the checkpoint is never ahead of the
 * model file; DIR is created if missing, and temporaries a killed save left are removed. */
int train_ckpt_save(const char *dir, const train_opts *o, const train_model *m,
                    const loom_optim *opt, const loom_scaler *scaler, const train_state *st);
/* Restore all of it from DIR/checkpoint.safetensors. Refuses (LOOM_EINVAL, naming the
 * option) a checkpoint written with a different model, optimizer, AMP, seed, data order or
 * global batch (ranks x --batch), since the resumed run could not match an uninterrupted one
 * (another rank count with the same global batch is accepted: st->from_ranks and from_batch
 * then say what wrote it); and
 * (LOOM_EFORMAT, naming the value) a corrupt file, counters that do not fit this run or each
 * other, a scaler state out of range, and weights or moments that are not finite. */
int train_ckpt_load(const char *dir, const train_opts *o, train_model *m, loom_optim *opt,
                    loom_scaler *scaler, train_state *st);
/* The same for a --strategy fsdp run (a collective: every rank calls them): DIR/model.safetensors
 * from the full state gathered to rank 0, and the sharded set DIR/fsdp (loom_fsdp_save_sharded:
 * each rank's shards, optimizer state and loss scale, with the counters and fingerprint in the
 * index). Load restores this rank's shards and checks the index as train_ckpt_load does. */
int train_ckpt_save_fsdp(const char *dir, const train_opts *o, const train_model *m,
                         loom_fsdp *fsdp, const loom_optim *opt, const train_state *st);
int train_ckpt_load_fsdp(const char *dir, const train_opts *o, const train_model *m,
                         loom_fsdp *fsdp, loom_optim *opt, train_state *st);
/* The options a resumed run must share with the run that wrote the checkpoint (the
 * checkpoint's fingerprint), which every rank of a run must share too: fills out[0..n) with
 * each option's value as the checkpoint records it (exact: compare these) and the option as a
 * user writes it ("--lr 0.001", "--no-shuffle", "--model (and its sizes) mlp 784-32-10");
 * returns n (<= TRAIN_FP_MAX). */
#define TRAIN_FP_MAX 24
typedef struct train_fp_entry {
  char value[96];
  char shown[160];
} train_fp_entry;
int train_ckpt_fingerprint(const train_opts *o, const train_model *m, train_fp_entry *out);

/* ---- metrics --------------------------------------------------------------------------- */

typedef struct train_record {
  int64_t step, epoch;
  double loss, lr, scale;
  bool overflow;
  double samples_per_s;
  const char *extra; /* more JSON members ("\"ddp_bytes\": 12, ...") or NULL */
  bool has_val;      /* an evaluation ran after this step: the GPT's validation loss, or the
                      * classifier's test loss and accuracy (%) */
  double val_loss, test_accuracy;
  double epochs;     /* epochs done after this step (2, or 0.75 within the first) */
  int64_t samples;   /* global samples trained up to this step (windows for the GPT) */
  bool classifier;   /* has_val names test_loss and test_accuracy (else val_loss) */
} train_record;

/* Metrics never wait (train_metrics.c): a regular file is written as a log is; a FIFO, pipe or
 * terminal is written without waiting, so training and SIGINT / SIGTERM / SIGHUP never wait on
 * a reader. A FIFO with no reader is refused at open (LOOM_EIO: "start the reader first"), a
 * record a full pipe has no room for is dropped, a reader that goes away ends the records (the
 * run goes on), and close says on stderr how many were dropped. A block device, socket or
 * folder is refused. */
typedef struct train_metrics train_metrics;
/* Open FILE.jsonl for writing (append: after a resume, the records continue the file). */
int train_metrics_open(const char *path, bool append, train_metrics **out);
/* One JSON object on one line: the record and each memory pool's current and peak bytes.
 * Fails only for a write error (a full disk), which fails the run. */
int train_metrics_write(train_metrics *mt, const train_record *r);
/* Close, noting dropped records on stderr; the status of the first failed write (NULL ok). */
int train_metrics_close(train_metrics *mt);

#endif
