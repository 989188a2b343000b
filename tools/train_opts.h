/* train_opts.h: the checks of `loom train`'s options that go beyond one value (train_opts.c):
 * the size lists, options that contradict each other or would do nothing in this run, bounds
 * that depend on other options or on the machine, folder names, and the --save and
 * --offload-dir folders before a run starts, and the fingerprint the ranks of a run compare.
 * Each failure prints one message naming the option ("loom train: --hidden: ...") to stderr. */
#ifndef LOOM_TOOLS_TRAIN_OPTS_H
#define LOOM_TOOLS_TRAIN_OPTS_H

#include "cli.h"
#include "train_api.h"

#include <limits.h>
#include <stdbool.h>

/* What the command line said besides the values: the options given explicitly, and the text
 * of the size lists. */
typedef struct train_cmdline {
  const char *cmd;                /* named in the messages: "loom train" (NULL) or "loom plan" */
  const char *hidden, *channels;  /* "1024,1024", "32,64" */
  bool no_shuffle, overwrite;
  bool seen_hidden, seen_channels, seen_fc, seen_momentum, seen_loss_scale, seen_scaler,
      seen_warmup, seen_wrap, seen_unit_min, seen_reshard, seen_gather_prefetch, seen_offload,
      seen_offload_tier, seen_offload_dir, seen_offload_io_threads, seen_prefetch, seen_backend, seen_shard_size,
      seen_min_lr;
  /* --model gpt: its options, and the ones whose default differs for it */
  bool seen_layers, seen_heads, seen_dim, seen_context, seen_text, seen_eval_every,
      seen_eval_windows, seen_batch, seen_epochs, seen_eval_batch, seen_checkpoint_activations,
      seen_optim_in_backward;
  char dirs[3][PATH_MAX];         /* --save, --resume, --data without trailing slashes */
  /* the options recorded in the run's checkpoints (train_resume_record): "cli" = the count,
   * then "cli.<option>" = the value as written */
  loom_safetensors_meta_kv cli_kv[TRAIN_CLI_KV_MAX];
  char cli_keys[TRAIN_CLI_KV_MAX][48], cli_count[16];
  bool save_into_resume; /* --resume DIR of a recorded run without --save: it saves into DIR */
} train_cmdline;

/* The options of `loom train`, which `loom plan` takes too (cmd_train.c): the defaults into o
 * and c, and the option table (pointing into o, c, *timeout and *timeout_seen) into out[0..cap),
 * ending with a zeroed entry; returns the number of options. TRAIN_CLI_MAX holds them all. */
#define TRAIN_CLI_MAX 64
void train_cli_defaults(train_opts *o, train_cmdline *c);
size_t train_cli_table(train_opts *o, train_cmdline *c, double *timeout, bool *timeout_seen,
                       cli_option *out, size_t cap);

/* --resume DIR (train_resume.c): when DIR's checkpoint records its run's options, the run
 * continues with them. The recorded options go before argv[0..*argc) (*argv and *argc are
 * replaced by the merged command line, *merged is that array, to free after the run; NULL when
 * nothing was merged); o, c, *timeout and table are parsed again from it. An option given with
 * another value than the recorded one is refused naming it, but those a resumed run may change
 * (train_resume_changeable); without --save the run saves into DIR again. Returns 0, or 2
 * after the message. */
extern const char *train_resume_changeable;
int train_resume_prepare(train_opts *o, train_cmdline *c, double *timeout, bool *timeout_seen,
                         cli_option *table, int *argc, char ***argv, char ***merged);
/* The options argv gives, as the run's checkpoints record them (those of the invocation alone
 * left out), into c->cli_kv; returns the number of entries. */
int train_resume_record(const cli_option *table, int argc, char **argv, train_cmdline *c);

/* The run's fingerprint for its ranks (train_par.c compares it, on every rank, before the
 * first step): one entry per option of table (ending with a zeroed entry) not marked
 * CLI_RANKS_LOCAL, in table order, into out[0..cap): the value compared ("0.001"; "given" for
 * an option compared by presence; a digest of the named file's bytes, or of a text too long
 * for an entry) and the option as a user reads it ("--lr 0.001", "no --save", "--no-shuffle").
 * Returns the number of entries. */
int train_cli_fingerprint(const cli_option *table, train_fp_entry *out, int cap);

/* The largest --batch and --eval-batch. */
#define TRAIN_MAX_BATCH (1L << 24)
/* The largest width of a layer (--hidden, --channels, --fc). */
#define TRAIN_MAX_WIDTH (1L << 20)
/* --model gpt's defaults where they differ from the MLP's: a small model that trains in a
 * minute on two cores (--layers 4 --heads 4 --dim 128 --context 128), 8 windows a step, one
 * epoch, evaluation batches of 32 windows (and --eval-windows 64). */
#define TRAIN_GPT_BATCH 8
#define TRAIN_GPT_EPOCHS 1
#define TRAIN_GPT_EVAL_BATCH 32
/* The GPT's learning-rate schedule when --warmup / --min-lr are not given (nanoGPT's for its
 * character-level GPT of this shape: lr 1e-3, 100 warmup steps, cosine down to lr / 10): 100
 * linear warmup steps (at most a tenth of the run's steps) with warmup or cosine, and cosine's
 * floor a tenth of --lr. Without warmup, lr 1e-3 spiked the loss of the 6-layer, 384-wide
 * model at step 22 (BENCHMARKS.md). */
#define TRAIN_GPT_WARMUP 100
#define TRAIN_GPT_MIN_LR_FRAC 0.1

/* Fill the sizes, the scaler default, the offload flags and the normalised folders of o from
 * c, and check the options against each other. 0, or -1 after the message (a usage error:
 * exit 2). */
int train_opts_check(train_opts *o, train_cmdline *c);

/* Before a run: one warning on stderr if its compute threads (--ranks x --threads, a thread a
 * rank at least with --threads 0, which divides the CPUs among the ranks) are more than the
 * online CPUs ("--ranks 64 x --threads 8 = 512 compute threads on 2 online CPUs"); the run
 * goes on, slower. */
void train_warn_oversubscribed(const train_opts *o);

/* Before a run that saves: DIR is created if missing and must take a file (a probe is written
 * and removed), and must not hold a checkpoint of another run unless --overwrite (or --resume
 * of the same folder) is given. Returns the exit code: 0, 1 (the folder cannot be used) or 2
 * (an existing checkpoint), after the message. */
int train_save_check(const train_opts *o, bool overwrite);

/* Before a run with --resume DIR (rank 0's, under MPI): DIR must be a folder that holds a
 * checkpoint (checkpoint.safetensors, or FSDP's fsdp/fsdp-index.safetensors); whether it is
 * sound is for its load to say. Returns the exit code: 0, or 1 after the message saying what
 * DIR is instead (missing, a file, a folder without a checkpoint). */
int train_resume_dir_check(const train_opts *o);

/* Before a run with --offload-dir DIR (on every process: the folder may be a node's own): DIR
 * must be an existing folder this process can make and write a file in (a probe, written and
 * removed: the offload files are made there; /proc, say, is a folder that takes no files).
 * Returns the exit code: 0, or 1 after the message naming the option and the path. */
int train_offload_dir_check(const train_opts *o);

#endif
