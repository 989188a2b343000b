/* cmd_train.c: `loom train`: the options (table-driven, cli.h), their checks, and the call of
 * the trainer (train_run). Exit codes: 0 done, 1 a failure at run time (loom's message
 * printed), 2 bad usage (a message naming the option). */
#include "cli.h"
#include "commands.h"
#include "train_api.h"

#include <loom/dist.h>
#include <loom/dist_mpi.h>

#include <stdlib.h>
#include <string.h>

static const char usage[] = "[OPTIONS]\n\n"
    "Train a classifier on Fashion-MNIST (the Debian package dataset-fashion-mnist, or --data\n"
    "DIR holding train-images-idx3-ubyte[.gz] and the three other MNIST-format files) and\n"
    "report the test accuracy after each epoch. Examples:\n"
    "  loom train --epochs 1                          # the MLP 784-1024-1024-10, AdamW, f32\n"
    "  loom train --model cnn --amp bf16 --epochs 10  # the CNN under bf16 autocast\n"
    "  loom train --amp f16 --metrics m.jsonl --save ck    # f16 with dynamic loss scaling\n"
    "  loom train --resume ck --save ck               # continue an interrupted run exactly\n"
    "  loom train --ranks 2 --strategy ddp            # 2 data-parallel ranks (threads)\n"
    "  mpirun -n 2 loom train --backend mpi --strategy ddp   # 2 ranks as MPI processes";

static const char *sizes_hidden = "1024,1024", *sizes_channels = "32,64";

/* "a,b,c" into out[0..max): positive integers. */
static int parse_sizes(const char *opt, const char *s, int64_t *out, int max, int *n) {
  *n = 0;
  const char *p = s;
  while (*p) {
    char *end;
    long long v = strtoll(p, &end, 10);
    if (end == p || v <= 0 || v > (1 << 20) || (*end && *end != ',') || *n == max) {
      fprintf(stderr, "loom train: --%s: expected up to %d positive sizes like 1024,1024, got '%s'\n",
              opt, max, s);
      return -1;
    }
    out[(*n)++] = v;
    p = *end ? end + 1 : end;
  }
  if (*n == 0) {
    fprintf(stderr, "loom train: --%s: expected at least one size, got '%s'\n", opt, s);
    return -1;
  }
  return 0;
}

/* Checks across options; a message naming the option and -1 on a fault. */
static int check(train_opts *o, bool no_shuffle) {
  int n = 0;
  if (parse_sizes("hidden", sizes_hidden, o->hidden, TRAIN_MAX_HIDDEN, &o->nhidden)) return -1;
  if (parse_sizes("channels", sizes_channels, o->channels, 2, &n)) return -1;
  if (n != 2) {
    fprintf(stderr, "loom train: --channels: expected two sizes (C1,C2), got '%s'\n",
            sizes_channels);
    return -1;
  }
  o->shuffle = !no_shuffle;
  if (!o->scaler) o->scaler = strcmp(o->amp, "f16") == 0 ? "dynamic" : "off";
  const struct { const char *name; long v, min; } nonneg[] = {
      {"threads", o->threads, 0}, {"limit", o->limit, 0}, {"max-steps", o->max_steps, 0},
      {"warmup", o->warmup, 0}, {"ranks", o->ranks, 1}};
  for (size_t i = 0; i < sizeof nonneg / sizeof nonneg[0]; i++)
    if (nonneg[i].v < nonneg[i].min) {
      fprintf(stderr, "loom train: --%s: expected an integer >= %ld, got %ld\n", nonneg[i].name,
              nonneg[i].min, nonneg[i].v);
      return -1;
    }
  if (o->lr < 0) {
    fprintf(stderr, "loom train: --lr: expected a number >= 0, got %g\n", o->lr);
    return -1;
  }
  if (o->weight_decay < 0 || o->momentum < 0) {
    fprintf(stderr, "loom train: --%s: expected a number >= 0, got %g\n",
            o->weight_decay < 0 ? "weight-decay" : "momentum",
            o->weight_decay < 0 ? o->weight_decay : o->momentum);
    return -1;
  }
  if (o->loss_scale > 16777216.0 || o->loss_scale < 1) {
    fprintf(stderr, "loom train: --loss-scale: expected a number in [1, 2^24], got %g\n",
            o->loss_scale);
    return -1;
  }
  bool ddp = strcmp(o->strategy, "ddp") == 0, mpi = strcmp(o->backend, "mpi") == 0;
  if (!ddp && (o->ranks > 1 || mpi)) {
    fprintf(stderr, "loom train: --%s: more than one rank needs --strategy ddp\n",
            mpi ? "backend mpi" : "ranks");
    return -1;
  }
  if (o->ranks > TRAIN_MAX_RANKS) {
    fprintf(stderr, "loom train: --ranks: expected at most %d, got %ld\n", TRAIN_MAX_RANKS,
            o->ranks);
    return -1;
  }
  if (mpi && o->ranks > 1) {
    fprintf(stderr, "loom train: --ranks: with --backend mpi the ranks are the MPI processes "
                    "(mpirun -n N loom train ...)\n");
    return -1;
  }
  return 0;
}

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
static int run_threads(const train_opts *o) {
  rank_run *r = calloc(1, sizeof *r);
  if (!r) return train_fail(LOOM_ENOMEM, "train: out of memory");
  r->o = o;
  int rc = loom_threads_run((int)o->ranks, NULL, rank_main, r);
  if (rc) {
    int worst = 0;
    while (worst < TRAIN_MAX_RANKS - 1 && !r->message[worst][0]) worst++;
    if (r->message[worst][0]) train_fail(rc, "rank %d: %s", worst, r->message[worst]);
    else train_fail(rc, "%s", loom_last_error());
  }
  free(r);
  return rc;
}

/* Train as one rank of MPI_COMM_WORLD (under mpirun). */
static int run_mpi(const train_opts *o) {
  loom_pg *pg = NULL;
  int rc = loom_mpi_pg_create(NULL, NULL, &pg);
  if (rc) {
    train_fail_loom(rc, "--backend mpi");
    loom_mpi_finalize();
    return rc;
  }
  int rank = loom_pg_rank(pg);
  rc = train_run(o, pg);
  if (rc) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", train_last_error());
    train_fail(rc, "rank %d: %s", rank, msg);
    loom_pg_abort(pg); /* the peers fail at once instead of timing out */
  }
  loom_pg_free(pg);
  loom_mpi_finalize();
  return rc;
}

int cmd_train(int argc, char **argv) {
  train_opts o = {.model = "mlp", .epochs = 10, .batch = 256, .lr = 1e-3, .weight_decay = 0.01,
                  .momentum = 0.9, .loss_scale = 65536, .optim = "adamw",
                  .schedule = "cosine", .amp = "off", .scaler = NULL, .fc = 128,
                  .eval_batch = 1000, .out = stdout, .ranks = 1, .backend = "threads",
                  .strategy = "none"};
  bool no_shuffle = false;
  sizes_hidden = "1024,1024", sizes_channels = "32,64";
  const cli_option table[] = {
      {"model", CLI_CHOICE, &o.model, NULL, "the network", "mlp|cnn"},
      {"hidden", CLI_STRING, &sizes_hidden, "N,N,...", "MLP hidden layer widths", NULL},
      {"channels", CLI_STRING, &sizes_channels, "C1,C2", "CNN conv channels (3x3, pad 1, each + ReLU + 2x2 max-pool)", NULL},
      {"fc", CLI_POS_INT, &o.fc, "N", "CNN fully connected width", NULL},
      {"epochs", CLI_POS_INT, &o.epochs, "N", "passes over the training set", NULL},
      {"batch", CLI_POS_INT, &o.batch, "N", "samples per step (per rank)", NULL},
      {"optim", CLI_CHOICE, &o.optim, NULL, "optimizer (PyTorch's formulas)", "sgd|adam|adamw"},
      {"lr", CLI_DOUBLE, &o.lr, "X", "peak learning rate", NULL},
      {"schedule", CLI_CHOICE, &o.schedule, NULL, "learning-rate schedule over all the epochs' steps", "constant|warmup|cosine"},
      {"warmup", CLI_INT, &o.warmup, "N", "linear warmup steps (warmup, cosine)", NULL},
      {"weight-decay", CLI_DOUBLE, &o.weight_decay, "X", "weight decay (AdamW decoupled, SGD/Adam L2)", NULL},
      {"momentum", CLI_DOUBLE, &o.momentum, "X", "SGD momentum", NULL},
      {"amp", CLI_CHOICE, &o.amp, NULL, "autocast: matmul/conv in bf16 or f16, f32 master weights", "off|bf16|f16"},
      {"scaler", CLI_CHOICE, &o.scaler, NULL, "loss scaling (default dynamic for --amp f16, else off)", "dynamic|static|off"},
      {"loss-scale", CLI_POS_DOUBLE, &o.loss_scale, "X", "static scale / dynamic initial scale", NULL},
      {"seed", CLI_INT, &o.seed, "N", "seed of the initial weights and the data order", NULL},
      {"init", CLI_STRING, &o.init, "FILE", "initial weights from a safetensors file, by PyTorch name", NULL},
      {"no-shuffle", CLI_FLAG, &no_shuffle, NULL, "batches in file order", NULL},
      {"data", CLI_STRING, &o.data, "DIR", "MNIST-format dataset folder (default " LOOM_FASHION_MNIST_DIR ")", NULL},
      {"limit", CLI_INT, &o.limit, "N", "use only N training samples per epoch (whole batches) and N test samples; 0: all", NULL},
      {"max-steps", CLI_INT, &o.max_steps, "N", "stop after N steps in all (as if interrupted); 0: no limit", NULL},
      {"metrics", CLI_STRING, &o.metrics, "FILE", "one JSON object per step (loss, lr, scale, overflow, samples/s, memory)", NULL},
      {"save", CLI_STRING, &o.save, "DIR", "write DIR/checkpoint.safetensors and DIR/model.safetensors after each epoch and at the end", NULL},
      {"resume", CLI_STRING, &o.resume, "DIR", "continue from DIR/checkpoint.safetensors (same options)", NULL},
      {"threads", CLI_INT, &o.threads, "N", "compute threads (per rank); 0: OpenMP's default", NULL},
      {"eval-batch", CLI_POS_INT, &o.eval_batch, "N", "samples per evaluation batch", NULL},
      {"quiet", CLI_FLAG, &o.quiet, NULL, "print only the summary line", NULL},
      {"ranks", CLI_POS_INT, &o.ranks, "N", "data-parallel ranks (threads backend; each gets --batch samples of every step)", NULL},
      {"backend", CLI_CHOICE, &o.backend, NULL, "process groups: ranks as threads, or MPI processes (mpirun -n N loom train --backend mpi ...)", "threads|mpi"},
      {"strategy", CLI_CHOICE, &o.strategy, NULL, "data parallelism: none, or DDP (bucketed all-reduce overlapped with backward)", "none|ddp"},
      {0}};
  int rc = cli_parse("loom train", table, argc, argv, NULL, 0, NULL);
  if (rc == 1) {
    cli_help(stdout, "loom train", usage, table);
    return 0;
  }
  if (rc < 0 || check(&o, no_shuffle)) return 2;
  if (strcmp(o.backend, "mpi") == 0) rc = run_mpi(&o);
  else if (strcmp(o.strategy, "ddp") == 0) rc = run_threads(&o);
  else rc = train_run(&o, NULL);
  if (rc) {
    fflush(stdout); /* what was printed before the failure comes before its message */
    fprintf(stderr, "loom train: %s\n", train_last_error());
    const char *hint = train_error_hint(train_last_error());
    if (hint) fprintf(stderr, "loom train: %s\n", hint);
    return 1;
  }
  return 0;
}
