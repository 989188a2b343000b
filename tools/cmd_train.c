/* cmd_train.c: `loom train`: the options (table-driven, cli.h, each marked with how the ranks
 * of a run compare it), their checks, the ranks' fingerprint, and the call of the trainer
 * (train_run). Exit codes: 0 done, 1 a failure at run time (loom's message
 * printed), 2 bad usage (a message naming the option). */
#include "cli.h"
#include "commands.h"
#include "train_opts.h"

#include <loom/dist.h>
#include <loom/dist_mpi.h>

#include <float.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] = "[OPTIONS]\n\n"
    "Train a classifier on Fashion-MNIST (the Debian package dataset-fashion-mnist, or --data\n"
    "DIR holding train-images-idx3-ubyte[.gz] and the three other MNIST-format files) and\n"
    "report the test accuracy after each epoch; or (--model gpt) a GPT-2 language model on the\n"
    "bytes of a text, reporting the validation loss. Examples:\n"
    "  loom train --epochs 1                          # the MLP 784-1024-1024-10, AdamW, f32\n"
    "  loom train --model cnn --amp bf16 --epochs 10  # the CNN under bf16 autocast\n"
    "  loom train --amp f16 --metrics m.jsonl --save ck    # f16 with dynamic loss scaling\n"
    "  loom train --resume ck                         # continue the run in ck, its options recorded\n"
    "  loom train --resume ck --epochs 20             # extend a finished run\n"
    "  loom train --ranks 2 --strategy ddp            # 2 data-parallel ranks (threads)\n"
    "  loom train --ranks 2 --strategy fsdp --amp bf16   # sharded over 2 ranks, bf16 forward\n"
    "  loom train --ranks 2 --strategy fsdp --offload all --offload-tier disk --offload-dir /scratch\n"
    "  loom train --ranks 4 --strategy hsdp --shard-size 2   # sharded in pairs, 2 replicas\n"
    "  mpirun -n 2 loom train --backend mpi --strategy ddp   # 2 ranks as MPI processes\n"
    "  loom train --model gpt --max-steps 500 --save gpt   # a small GPT on the fortunes\n"
    "  loom generate --from gpt --prompt 'The '        # then sample from it";

/* ---- running on ranks --------------------------------------------------------------------- */

typedef struct rank_run {
  const train_opts *o;
  char message[TRAIN_MAX_RANKS][512];
} rank_run;

static int rank_main(loom_pg *pg, void *arg) {
  rank_run *r = arg;
  int rc = train_run(r->o, pg), rank = loom_pg_rank(pg);
  if (rc && rank < TRAIN_MAX_RANKS)
    snprintf(r->message[rank], sizeof r->message[rank], "%s", train_last_error());
  return rc;
}

/* Train on --ranks threads (each a rank of a threads process group); the lowest failing
 * rank's message is printed. */
static int run_threads(const train_opts *o, const loom_pg_cfg *cfg) {
  rank_run *r = calloc(1, sizeof *r);
  if (!r) return train_fail(LOOM_ENOMEM, "train: out of memory");
  r->o = o;
  for (int p = 0; p < LOOM_POOL_COUNT; p++) loom_mem_reset_peak((loom_pool)p); /* this run's */
  int rc = loom_threads_run((int)o->ranks, cfg, rank_main, r);
  if (rc) {
    int worst = 0;
    while (worst < TRAIN_MAX_RANKS - 1 && !r->message[worst][0]) worst++;
    if (r->message[worst][0]) train_fail(rc, "rank %d: %s", worst, r->message[worst]);
    else train_fail(rc, "%s", loom_last_error());
  }
  free(r);
  return rc;
}

/* The exit code of a run that returned rc, after its message. */
static int finish(int rc) {
  if (!rc) return 0;
  fflush(stdout); /* what was printed before the failure comes before its message */
  fprintf(stderr, "loom train: %s\n", train_last_error());
  if (train_signal_pending()) return 128 + train_signal_pending(); /* 130, 143, 129: a clean stop */
  const char *hint = train_error_hint(train_last_error());
  if (hint) fprintf(stderr, "loom train: %s\n", hint);
  return 1;
}

/* Train as one rank of MPI_COMM_WORLD (under mpirun); rank 0, the one that writes, checks the
 * --save folder first and every rank its --offload-dir (the peers fail at once if one cannot
 * be used). A rank that fails says
 * why, then ends the job (MPI_Abort), a second after telling its peers (loom_pg_abort), so
 * they can say theirs: a peer not waiting in a collective would wait for it forever.
 * Returns the exit code. */
static int run_mpi(const train_opts *o, bool overwrite, const loom_pg_cfg *cfg) {
  loom_pg *pg = NULL;
  int rc = loom_mpi_pg_create(NULL, cfg, &pg);
  if (rc) {
    train_fail_loom(rc, "--backend mpi");
    loom_mpi_finalize();
    return finish(rc);
  }
  int rank = loom_pg_rank(pg), code = rank == 0 ? train_resume_dir_check(o) : 0;
  if (!code && rank == 0) code = train_save_check(o, overwrite);
  train_opts mo = *o;
  mo.ranks = loom_pg_size(pg); /* the ranks of the run (its checkpoints record them) */
  if (rank == 0) train_warn_oversubscribed(o); /* this process's threads on its machine */
  if (!code) code = train_offload_dir_check(o);
  if (code) {
    loom_pg_abort(pg);
  } else if ((rc = train_run(&mo, pg))) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", train_last_error());
    train_fail(rc, "rank %d: %s", rank, msg);
    /* the message first (stderr is unbuffered), before anything that may wait on a peer */
    code = loom_pg_size(pg) > 1 ? finish(rc) : 0;
    loom_pg_abort(pg); /* the peers fail at once instead of timing out */
  }
  if ((code || rc) && loom_pg_size(pg) > 1) {
    sleep(1);
    loom_mpi_abort(code); /* ends the process, within 5 s even with a machine unreachable */
  }
  loom_pg_free(pg);
  code = code ? code : finish(rc);
  /* MPI_Finalize bounded: a rank whose finalise hangs (MPICH with UCX, loom/dist_mpi.h) ends
   * after a line on stderr with the run's exit code */
  loom_mpi_finalize_within(LOOM_MPI_FINALIZE_S, code);
  return code;
}

void train_cli_defaults(train_opts *o, train_cmdline *c) {
  *o = (train_opts){.model = "mlp", .epochs = 10, .batch = 256, .lr = 1e-3, .weight_decay = 0.01,
                  .momentum = 0.9, .loss_scale = 65536, .optim = "adamw",
                  .schedule = "cosine", .amp = "off", .scaler = NULL, .fc = 128,
                  .eval_batch = 1000, .out = stdout, .ranks = 1, .backend = "threads",
                  .strategy = "none", .wrap = "children", .progress = "auto", .unit_min = 100000000,
                  .reshard = "yes", .gather_prefetch = 1, .offload = "none",
                  .offload_tier = "host", .prefetch = 1, .layers = 4, .heads = 4,
                  .dim = 128, .context = 128, .eval_windows = 64};
  *c = (train_cmdline){.hidden = "1024,1024", .channels = "32,64"};
}

size_t train_cli_table(train_opts *o, train_cmdline *c, double *timeout, bool *timeout_seen,
                       cli_option *out, size_t cap) {
  /* Bounds: every product the trainer forms fits in 64 bits (epochs x steps per epoch, batch x
   * ranks, --limit + batch); the data's own limits (batch <= samples, warmup <= steps) are
   * checked once the data is loaded. */
  const double steps_max = 1e15, batch_max = TRAIN_MAX_BATCH;
  /* The ranks of a run compare every option (train_cli_fingerprint) but these, marked in the
   * last field: rank-local, since they change nothing any rank computes and may name a rank's
   * own place: --quiet (what a rank prints), --metrics (where a rank writes its own records),
   * --offload-dir (a folder on the rank's own node: offload never changes a value),
   * --offload-io-threads (what the rank's own disk takes in flight; no value changes). Compared by
   * presence alone: --save and --resume (the folder may be a node's own path; the checkpoint's
   * start step is compared once read, train_par_check_start). By contents: --init (the file's
   * bytes, whatever its path). */
  const cli_option table[] = {
      {"model", CLI_CHOICE, &o->model, NULL, "the network: Fashion-MNIST's MLP or CNN, or a GPT-2 language model on bytes of text", "mlp|cnn|gpt", 0, 0, NULL, CLI_RANKS_SAME},
      {"hidden", CLI_STRING, &c->hidden, "N,N,...", "MLP hidden layer widths", NULL, 0, 0, &c->seen_hidden, CLI_RANKS_SAME},
      {"channels", CLI_STRING, &c->channels, "C1,C2", "CNN conv channels (3x3, pad 1, each + ReLU + 2x2 max-pool)", NULL, 0, 0, &c->seen_channels, CLI_RANKS_SAME},
      {"fc", CLI_POS_INT, &o->fc, "N", "CNN fully connected width", NULL, 1, TRAIN_MAX_WIDTH, &c->seen_fc, CLI_RANKS_SAME},
      {"layers", CLI_POS_INT, &o->layers, "N", "GPT transformer blocks", NULL, 1, 65536, &c->seen_layers, CLI_RANKS_SAME},
      {"heads", CLI_POS_INT, &o->heads, "N", "GPT attention heads (dividing --dim)", NULL, 1, TRAIN_MAX_WIDTH, &c->seen_heads, CLI_RANKS_SAME},
      {"dim", CLI_POS_INT, &o->dim, "N", "GPT width", NULL, 1, TRAIN_MAX_WIDTH, &c->seen_dim, CLI_RANKS_SAME},
      {"context", CLI_POS_INT, &o->context, "N", "GPT context: tokens (bytes) a window holds", NULL, 1, 1 << 20, &c->seen_context, CLI_RANKS_SAME},
      {"text", CLI_STRING, &o->text, "FILE", "GPT: the text to learn, as bytes (default the English fortunes of Debian's fortunes package, " LOOM_FORTUNES_DIR "); the last tenth is the validation text", NULL, 0, 0, &c->seen_text, CLI_RANKS_CONTENTS},
      {"checkpoint-activations", CLI_FLAG, &o->checkpoint_activations, NULL, "GPT: keep only each block's input in forward and recompute the block in backward (less memory, more time; PyTorch's checkpoint_wrapper)", NULL, 0, 0, &c->seen_checkpoint_activations, CLI_RANKS_SAME},
      {"eval-every", CLI_INT, &o->eval_every, "N", "GPT: validation loss every N steps too; 0: at each epoch's end only", NULL, 0, steps_max, &c->seen_eval_every, CLI_RANKS_SAME},
      {"eval-windows", CLI_INT, &o->eval_windows, "N", "GPT: validation windows an evaluation takes, spread over the validation text; 0: all of them", NULL, 0, 1e9, &c->seen_eval_windows, CLI_RANKS_SAME},
      {"epochs", CLI_POS_INT, &o->epochs, "N", "passes over the training set (the GPT's epoch: as many tokens as the training text holds) (default {default}; gpt: 1)", NULL, 1, 1e6, &c->seen_epochs, CLI_RANKS_SAME},
      {"batch", CLI_POS_INT, &o->batch, "N", "samples per step, per rank (gpt: windows of --context tokens) (default {default}; gpt: 8)", NULL, 1, batch_max, &c->seen_batch, CLI_RANKS_SAME},
      {"optim", CLI_CHOICE, &o->optim, NULL, "optimizer (PyTorch's formulas)", "sgd|adam|adamw", 0, 0, NULL, CLI_RANKS_SAME},
      {"lr", CLI_F32, &o->lr, "X", "peak learning rate", NULL, 0, FLT_MAX, NULL, CLI_RANKS_SAME},
      {"schedule", CLI_CHOICE, &o->schedule, NULL, "learning-rate schedule over all the epochs' steps", "constant|warmup|cosine", 0, 0, NULL, CLI_RANKS_SAME},
      {"warmup", CLI_INT, &o->warmup, "N", "linear warmup steps (--schedule warmup, cosine) (default {default}; gpt: 100, at most a tenth of the run)", NULL, 0, steps_max, &c->seen_warmup, CLI_RANKS_SAME},
      {"min-lr", CLI_F32, &o->min_lr, "X", "cosine: the rate the decay ends at, at most --lr (default {default}; gpt: --lr / 10)", NULL, 0, FLT_MAX, &c->seen_min_lr, CLI_RANKS_SAME},
      {"weight-decay", CLI_F32, &o->weight_decay, "X", "weight decay (AdamW decoupled, SGD/Adam L2)", NULL, 0, FLT_MAX, NULL, CLI_RANKS_SAME},
      {"momentum", CLI_F32, &o->momentum, "X", "SGD momentum", NULL, 0, FLT_MAX, &c->seen_momentum, CLI_RANKS_SAME},
      {"amp", CLI_CHOICE, &o->amp, NULL, "autocast: matmul/conv in bf16 or f16, f32 master weights", "off|bf16|f16", 0, 0, NULL, CLI_RANKS_SAME},
      {"scaler", CLI_CHOICE, &o->scaler, NULL, "loss scaling (default dynamic for --amp f16, else off; static|dynamic also with bf16)", "dynamic|static|off", 0, 0, &c->seen_scaler, CLI_RANKS_SAME},
      {"loss-scale", CLI_POS_DOUBLE, &o->loss_scale, "X", "static scale / dynamic initial scale", NULL, 0, 0, &c->seen_loss_scale, CLI_RANKS_SAME},
      {"seed", CLI_INT, &o->seed, "N", "seed of the initial weights and the data order", NULL, 0, 0, NULL, CLI_RANKS_SAME},
      {"init", CLI_STRING, &o->init, "FILE", "initial weights from a safetensors file, by PyTorch name", NULL, 0, 0, NULL, CLI_RANKS_CONTENTS},
      {"no-shuffle", CLI_FLAG, &c->no_shuffle, NULL, "batches in file order", NULL, 0, 0, NULL, CLI_RANKS_SAME},
      {"data", CLI_STRING, &o->data, "DIR", "MNIST-format dataset folder (default " LOOM_FASHION_MNIST_DIR ")", NULL, 0, 0, NULL, CLI_RANKS_SAME},
      {"limit", CLI_INT, &o->limit, "N", "use only N training samples per epoch (whole batches) and N test samples; 0: all (gpt: N training windows per epoch, at most N validation windows)", NULL, 0, 4294967296.0, NULL, CLI_RANKS_SAME},
      {"max-steps", CLI_INT, &o->max_steps, "N", "stop after N steps in all (as if interrupted); 0: no limit", NULL, 0, steps_max, NULL, CLI_RANKS_SAME},
      {"metrics", CLI_STRING, &o->metrics, "FILE", "one JSON object per step (loss, lr, scale, overflow, samples/s, memory); a FIFO or pipe is never waited on: one with no reader is refused, records a slow reader has no room for are dropped and counted", NULL, 0, 0, NULL, CLI_RANKS_LOCAL},
      {"save", CLI_STRING, &o->save, "DIR", "write DIR/checkpoint.safetensors and DIR/model.safetensors after each epoch and at the end", NULL, 0, 0, NULL, CLI_RANKS_PRESENCE},
      {"overwrite", CLI_FLAG, &c->overwrite, NULL, "let --save replace a checkpoint already in DIR (not needed with --resume DIR)", NULL, 0, 0, NULL, CLI_RANKS_SAME},
      {"resume", CLI_STRING, &o->resume, "DIR", "continue from DIR/checkpoint.safetensors with the options it records, saving into DIR (unless --save); may change --epochs, --max-steps, --save, --metrics, --quiet, --threads, --timeout, the offload options, and the rank count keeping ranks x --batch", NULL, 0, 0, NULL, CLI_RANKS_PRESENCE},
      {"threads", CLI_INT, &o->threads, "N", "compute threads per rank (at most 4 per online CPU, 1024 in all); 0: OpenMP's default", NULL, 0, (double)LONG_MAX, NULL, CLI_RANKS_SAME},
      {"eval-batch", CLI_POS_INT, &o->eval_batch, "N", "samples per evaluation batch (gpt: windows) (default {default}; gpt: 32)", NULL, 1, batch_max, &c->seen_eval_batch, CLI_RANKS_SAME},
      {"quiet", CLI_FLAG, &o->quiet, NULL, "print only the summary line", NULL, 0, 0, NULL, CLI_RANKS_LOCAL},
      {"progress", CLI_CHOICE, &o->progress, NULL, "progress display: one line redrawn to the terminal's width where standard output is a terminal (not under mpirun, whose ranks' output is the launcher's), else plain lines (auto); always redrawn (bar); plain lines (lines)", "auto|bar|lines", 0, 0, NULL, CLI_RANKS_LOCAL},
      {"ranks", CLI_POS_INT, &o->ranks, "N", "data-parallel ranks (threads backend; each gets --batch samples of every step)", NULL, 1, TRAIN_MAX_RANKS, NULL, CLI_RANKS_SAME},
      {"backend", CLI_CHOICE, &o->backend, NULL, "process groups: ranks as threads, or MPI processes (the default under mpirun / mpiexec: mpirun -n N loom train ...)", "threads|mpi", 0, 0, &c->seen_backend, CLI_RANKS_SAME},
      {"timeout", CLI_POS_DOUBLE, timeout, "SECONDS", "seconds a rank waits for its peers before it fails (LOOM_TIMEOUT sets the default)", NULL, 1e-3, 1e9, timeout_seen, CLI_RANKS_SAME},
      {"strategy", CLI_CHOICE, &o->strategy, NULL, "data parallelism: none, DDP (bucketed all-reduce overlapped with backward), FSDP (parameters, gradients and optimizer state sharded over the ranks) or HSDP (FSDP within groups of --shard-size ranks, e.g. one machine's, replicated across the groups: PyTorch's HYBRID_SHARD)", "none|ddp|fsdp|hsdp", 0, 0, NULL, CLI_RANKS_SAME},
      {"shard-size", CLI_POS_INT, &o->shard_size, "N", "HSDP: ranks that share one copy of the model (consecutive ranks: 0..N-1, N..2N-1, ...; typically one machine's ranks); it divides the rank count", NULL, 1, TRAIN_MAX_RANKS, &c->seen_shard_size, CLI_RANKS_SAME},
      {"wrap", CLI_CHOICE, &o->wrap, NULL, "FSDP units: each layer of the model, or layers grouped until --unit-min elements", "children|size", 0, 0, &c->seen_wrap, CLI_RANKS_SAME},
      {"unit-min", CLI_POS_INT, &o->unit_min, "N", "FSDP --wrap size: parameter elements a unit reaches", NULL, 1, 1e15, &c->seen_unit_min, CLI_RANKS_SAME},
      {"reshard-after-forward", CLI_CHOICE, &o->reshard, NULL, "FSDP: free each unit's gathered parameters after its forward (yes), or keep them until its backward (no: ZeRO-2)", "yes|no", 0, 0, &c->seen_reshard, CLI_RANKS_SAME},
      {"gather-prefetch", CLI_INT, &o->gather_prefetch, "N", "FSDP: all-gathers issued ahead of the running unit", NULL, 0, 8, &c->seen_gather_prefetch, CLI_RANKS_SAME},
      {"offload", CLI_STRING, &o->offload, "LIST", "FSDP: keep these shards out of the compute pool between uses: a comma list of params,grads,optim, or all, or none (results are bit-identical)", NULL, 0, 0, &c->seen_offload, CLI_RANKS_SAME},
      {"offload-tier", CLI_CHOICE, &o->offload_tier, NULL, "FSDP --offload: where the offloaded bytes live: host memory, or one file per rank in --offload-dir", "host|disk", 0, 0, &c->seen_offload_tier, CLI_RANKS_SAME},
      {"offload-dir", CLI_STRING, &o->offload_dir, "DIR", "FSDP --offload-tier disk: an existing folder for the offload files (removed at the end)", NULL, 0, 0, &c->seen_offload_dir, CLI_RANKS_LOCAL},
      {"offload-io-threads", CLI_INT, &o->offload_io_threads, "N", "FSDP --offload: transfers to and from the tier in flight at once per rank, each on an I/O thread of its own (0: the tier's default, 4 on the disk, 1 on the host; results are bit-identical)", NULL, 0, 16, &c->seen_offload_io_threads, CLI_RANKS_LOCAL},
      {"optim-in-backward", CLI_FLAG, &o->optim_in_backward, NULL, "FSDP: run each unit's optimizer step inside backward, as soon as its gradient is reduced (PyTorch's optimizer-in-backward): no gradient waits for the others or goes to the offload tier and back; not with --scaler dynamic (the default of --amp f16), which needs every gradient first (results are bit-identical)", NULL, 0, 0, &c->seen_optim_in_backward, CLI_RANKS_SAME},
      {"prefetch", CLI_INT, &o->prefetch, "N", "FSDP --offload: units whose offloaded bytes are brought back ahead of use (0: each waits when needed; host-tier parameters are read in place)", NULL, 0, 10, &c->seen_prefetch, CLI_RANKS_SAME},
      {0}};
  size_t n = 0;
  while (table[n].name && n + 1 < cap) {
    out[n] = table[n];
    n++;
  }
  out[n] = (cli_option){0};
  return n;
}

/* How many processes a launcher started this one among (mpirun / mpiexec: Open MPI's
 * OMPI_COMM_WORLD_SIZE, MPICH's and PMI launchers' PMI_SIZE), with the variable that says so;
 * 1 when none does. */
static long launcher_size(const char **var) {
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    char *end = NULL;
    long n = v ? strtol(v, &end, 10) : 0;
    if (v && end != v && *end == '\0' && n > 1) {
      *var = vars[i];
      return n;
    }
  }
  return 1;
}

/* Under a launcher that started several processes, the ranks are those processes: --backend
 * mpi is the default there, and --backend threads (each process training alone, all writing
 * the same files) is refused. Returns 0, or 2 after the message. */
static int read_launcher(train_opts *o, const train_cmdline *c) {
  const char *var = NULL;
  long n = launcher_size(&var);
  if (n <= 1 || strcmp(o->backend, "mpi") == 0) return 0;
  if (!c->seen_backend) {
    o->backend = "mpi";
    return 0;
  }
  fprintf(stderr, "loom train: --backend threads: this process is one of %ld a launcher started "
          "(%s=%ld), and each would train alone; give --backend mpi (or leave --backend out) to "
          "make them the ranks of one run, or start one process with --ranks N\n", n, var, n);
  return 2;
}

/* cmd_train once the command line is parsed into o and c (which table points into). */
static int run_parsed(train_opts *o, train_cmdline *c, double timeout, bool timeout_seen,
                      const cli_option *table) {
  loom_pg_cfg cfg;
  if (read_launcher(o, c) || train_opts_check(o, c) ||
      train_par_cfg(o, timeout_seen ? timeout : 0, &cfg))
    return 2;
  static train_fp_entry fp[TRAIN_CLI_MAX]; /* what every rank must share (one process: none) */
  if (strcmp(o->strategy, "none") != 0 || strcmp(o->backend, "mpi") == 0) {
    o->nranks_fp = train_cli_fingerprint(table, fp, TRAIN_CLI_MAX);
    o->ranks_fp = fp;
  }
  if (c->save_into_resume) o->save = o->resume; /* after the ranks' fingerprint, so that a
                                                  * rank without --resume is named as such */
  train_signal_install();
  if (strcmp(o->backend, "mpi") == 0) return run_mpi(o, c->overwrite, &cfg);
  int code = train_resume_dir_check(o); /* before --save, which may be the same folder */
  if (!code) code = train_save_check(o, c->overwrite);
  if (!code) code = train_offload_dir_check(o);
  if (code) return code;
  train_warn_oversubscribed(o);
  return finish(strcmp(o->strategy, "none") != 0 ? run_threads(o, &cfg) : train_run(o, NULL));
}

int cmd_train(int argc, char **argv) {
  train_opts o;
  static train_cmdline c; /* its folder buffers are large */
  train_cli_defaults(&o, &c);
  double timeout = loom_pg_cfg_default().timeout_s; /* LOOM_TIMEOUT or 300 */
  bool timeout_seen = false;
  cli_option table[TRAIN_CLI_MAX];
  train_cli_table(&o, &c, &timeout, &timeout_seen, table, TRAIN_CLI_MAX);
  int rc = cli_parse("loom train", table, argc, argv, NULL, 0, NULL);
  if (rc == 1) {
    cli_help(stdout, "loom train", usage, table);
    return 0;
  }
  char **merged = NULL; /* --resume: the recorded options, then argv */
  if (rc < 0 || train_resume_prepare(&o, &c, &timeout, &timeout_seen, table, &argc, &argv, &merged))
    return 2;
  o.ncli_kv = train_resume_record(table, argc, argv, &c);
  o.cli_kv = c.cli_kv;
  rc = run_parsed(&o, &c, timeout, timeout_seen, table);
  free(merged);
  return rc;
}
