/* cmd_plan.c: `loom plan`: the compute-pool memory a `loom train` run with the same options
 * will need per rank, and its process's peak (train_plan.h), as a table or JSON, and the
 * largest batch or hidden width that fits in a given amount of memory. Exit codes: 0 done, 1 nothing fits, 2 bad usage. */
#include "cli.h"
#include "commands.h"
#include "train_opts.h"
#include "train_plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] = "[OPTIONS]\n\n"
    "The memory a `loom train` run with the same options needs per rank, before it starts:\n"
    "parameters, gradients, optimizer state, buckets, low-precision copies and FSDP units,\n"
    "batch, activations and workspace, at the peak of building, of a training step and of an\n"
    "evaluation batch. Examples:\n"
    "  loom plan --hidden 4096,4096 --amp bf16\n"
    "  loom plan --ranks 2 --strategy fsdp --json\n"
    "  loom plan --model cnn --fit-memory 2GiB --fit batch   # the largest --batch that fits\n"
    "  loom plan --strategy hsdp --shard-size 4 --hosts 2 --ranks-per-host 4 --link 1\n"
    "A run under mpirun (--backend mpi) has one process per rank: give --ranks N for its N ranks\n"
    "(or --hosts H --ranks-per-host R: then the plan adds each step's bytes through each host's\n"
    "link, each collective a ring in rank order, and with --link GBPS their time; for FSDP and\n"
    "HSDP also the part of the step's communication its compute cannot hide, the compute timed\n"
    "at --gflops and each hop between two ranks of one host at --intra-link).\n"
    "Besides the compute pool per rank, the plan gives the process's peak, comparable to its\n"
    "resident set: loom's blocks in use and in the allocation cache, the data (each rank of the\n"
    "process loads its own), and the runtime (libraries, OpenMP) as this process measures it.\n"
    "Only the options that change a plan are listed below, with loom train's defaults; the\n"
    "others of loom train are accepted and change nothing (--lr, --epochs, --seed, ...), except\n"
    "those only a run uses, which are refused (plan would ignore them): --save, --overwrite,\n"
    "--resume, --metrics, --init (the memory does not depend on the weights' values; plan the\n"
    "run without it) and --timeout.";

/* The options of `loom train` that only a run uses, and why plan has no use for them: given to
 * plan, they are refused rather than ignored. */
static const struct {
  const char *name, *why;
} run_only[] = {
    {"save", "plan writes no checkpoint"},
    {"overwrite", "plan writes no checkpoint"},
    {"resume", "plan reads no checkpoint (a resumed run needs what the same options without "
               "--resume need)"},
    {"metrics", "plan's steps are dry (no kernel runs), so it writes no metrics"},
    {"init", "plan reads no weights (the memory does not depend on their values)"},
    {"timeout", "plan's ranks run dry in this process, and a timeout changes no figure of it"},
};
#define NRUN_ONLY (sizeof run_only / sizeof run_only[0])

/* The options of `loom train` that change a plan (its sizes, precision, strategy, offload,
 * batches, data), and plan's own: the only ones --help shows. The others are accepted, so that
 * a train command line plans as it is, and change nothing (the run-only ones are refused,
 * above). */
static const char *const plan_changing[] = {
    "model", "hidden", "channels", "fc", "layers", "heads", "dim", "context", "text",
    "checkpoint-activations", "eval-windows", "batch", "optim", "momentum", "amp", "scaler",
    "data", "limit", "eval-batch", "ranks", "backend", "strategy", "wrap", "unit-min",
    "reshard-after-forward", "gather-prefetch", "offload", "offload-tier", "offload-dir",
    "optim-in-backward", "prefetch", "json", "fit-memory", "fit", "hosts", "ranks-per-host", "link",
    "intra-link", "link-latency-us", "gflops", NULL};

/* Point the run-only options of table at given[] (set by cli_parse when one is given). */
static void watch_run_only(cli_option *table, bool *given) {
  for (cli_option *t = table; t->name; t++)
    for (size_t k = 0; k < NRUN_ONLY; k++)
      if (strcmp(t->name, run_only[k].name) == 0) t->seen = &given[k];
}

/* 0, or 2 after a message naming the first run-only option given. */
static int refuse_run_only(const bool *given) {
  for (size_t k = 0; k < NRUN_ONLY; k++)
    if (given[k]) {
      fprintf(stderr, "loom plan: --%s: %s; it is an option of loom train: drop it here\n",
              run_only[k].name, run_only[k].why);
      return 2;
    }
  return 0;
}

/* "8GiB", "512MiB", "100MB", "1e9": whole bytes in [1, 2^63); -1 if not such a size. */
static double parse_size(const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s) return -1;
  static const struct {
    const char *suffix;
    double scale;
  } units[] = {{"", 1}, {"B", 1}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
               {"TiB", 1099511627776.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (strcmp(end, units[i].suffix) == 0) {
      double b = floor(v * units[i].scale);
      return isfinite(b) && b >= 1 && b < 9.2e18 ? b : -1;
    }
  return -1;
}

/* The plan, or -1 after the message (a run of these options would fail as it says). */
static int plan_of(const train_opts *o, plan_result *r) {
  if (!train_plan(o, r)) return 0;
  fprintf(stderr, "loom plan: %s\n", train_last_error());
  return -1;
}

/* What --fit searches: the batch, or one width for every hidden layer (the CNN's --fc). */
static void set_knob(train_opts *o, bool batch, long v) {
  if (batch) {
    o->batch = v;
    return;
  }
  for (int i = 0; i < o->nhidden; i++) o->hidden[i] = v;
  if (strcmp(o->model, "cnn") == 0) o->fc = v;
}

/* The largest value in [1, hi] whose plan's peak is at most limit (0: none), by bisection: the
 * peak grows with the batch and the width (with --wrap size it can dip where a layer crosses
 * --unit-min, so the answer fits but a larger one might too). A value whose run would fail
 * (a batch larger than an epoch) counts as not fitting. o is left as it was. */
static long largest_fit(train_opts *o, bool batch, long hi, double limit) {
  train_opts keep = *o;
  long lo = 0;
  plan_result r;
  while (lo < hi) {
    long mid = lo + (hi - lo + 1) / 2;
    set_knob(o, batch, mid);
    if (!train_plan(o, &r) && (double)r.peak <= limit) lo = mid;
    else hi = mid - 1;
  }
  *o = keep;
  return lo;
}

int cmd_plan(int argc, char **argv) {
  train_opts o;
  static train_cmdline c;
  train_cli_defaults(&o, &c);
  c.cmd = "loom plan";
  double timeout = 0;
  bool timeout_seen = false, json = false, fit_seen = false;
  const char *fit_memory = NULL, *fit = "batch";
  long hosts = 0, per_host = 0;
  double link = 0, gflops = 0, intra = 0, latency = 0;
  bool hosts_seen = false, per_host_seen = false, link_seen = false, gflops_seen = false,
       intra_seen = false, latency_seen = false;
  cli_option table[TRAIN_CLI_MAX + 10];
  size_t n = train_cli_table(&o, &c, &timeout, &timeout_seen, table, TRAIN_CLI_MAX);
  table[n++] = (cli_option){"json", CLI_FLAG, &json, NULL, "print the plan as one JSON object", NULL, 0, 0, NULL, CLI_RANKS_SAME};
  table[n++] = (cli_option){"fit-memory", CLI_STRING, &fit_memory, "SIZE", "find the largest --fit value whose peak per rank fits in SIZE (8GiB, 512MiB, 1e9)", NULL, 0, 0, NULL, CLI_RANKS_SAME};
  table[n++] = (cli_option){"fit", CLI_CHOICE, &fit, NULL, "what --fit-memory searches: --batch, or one width for every hidden layer (the CNN's --fc)", "batch|hidden", 0, 0, &fit_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"hosts", CLI_POS_INT, &hosts, "H", "machines the run spans (with --ranks-per-host): the plan adds each step's bytes through each machine's link", NULL, 1, 1 << 20, &hosts_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"ranks-per-host", CLI_POS_INT, &per_host, "R", "ranks on each machine (consecutive ranks, as mpirun places them); the run has H x R ranks", NULL, 1, 1 << 20, &per_host_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"link", CLI_POS_DOUBLE, &link, "GBPS", "each machine's link in Gbit/s (each way; the rate it achieves: TCP filled 93-95% of a capped link): the plan adds the step's communication time through it", NULL, 1e-6, 1e6, &link_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"gflops", CLI_POS_DOUBLE, &gflops, "G", "with --link: the matrix-multiply rate one rank achieves, GFLOP/s, for the compute that hides FSDP's and HSDP's communication; not given: measured here at start (a 256x1024x1024 product in the run's dtype on a rank's threads)", NULL, 1e-6, 1e9, &gflops_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"intra-link", CLI_POS_DOUBLE, &intra, "GBPS", "with --link: the rate of a hop between two ranks of one machine, Gbit/s each way, for the collectives inside a machine (HSDP's shard group; FSDP's ring hops between a machine's ranks); not given: measured here at start as a memcpy (MPI's shared memory with a single-copy transport)", NULL, 1e-6, 1e9, &intra_seen, CLI_RANKS_SAME};
  table[n++] = (cli_option){"link-latency-us", CLI_DOUBLE, &latency, "US", "with --link: the time each exchange of a collective across the link waits besides its bytes, microseconds (measure it as a small all-reduce across two hosts: bench/hsdp_hosts.sh does); each collective across the link pays it for its header exchange and for each ring step (an alpha-beta model); default 0: the bytes alone", NULL, 0, 1e7, &latency_seen, CLI_RANKS_SAME};
  table[n] = (cli_option){0};
  bool given[NRUN_ONLY] = {false};
  watch_run_only(table, given);
  int rc = cli_parse("loom plan", table, argc, argv, NULL, 0, NULL);
  if (rc == 1) {
    cli_help_only(stdout, "loom plan", usage, table, plan_changing);
    return 0;
  }
  /* under mpirun each rank is a process with the same pools as a thread rank: --ranks N says
   * how many processes the run will have */
  if (rc == 0 && strcmp(o.backend, "mpi") == 0) o.backend = "threads";
  if (rc == 0 && (gflops_seen || intra_seen || latency_seen) && !hosts_seen && !per_host_seen &&
      !link_seen) {
    fprintf(stderr, "loom plan: --%s: it times the step beside --link's (with --hosts H "
            "--ranks-per-host R --link GBPS)\n",
            gflops_seen ? "gflops" : intra_seen ? "intra-link" : "link-latency-us");
    return 2;
  }
  if (rc == 0 && (hosts_seen || per_host_seen || link_seen)) {
    const char *bad = NULL;
    if (hosts_seen != per_host_seen) bad = "--hosts and --ranks-per-host go together";
    else if (!hosts_seen) bad = "--link: it needs --hosts H --ranks-per-host R";
    else if (gflops_seen && !link_seen) bad = "--gflops: it times the compute beside --link's";
    else if (intra_seen && !link_seen)
      bad = "--intra-link: it times the collectives inside a machine beside --link's";
    else if (latency_seen && !link_seen)
      bad = "--link-latency-us: it times the collectives across the link beside --link's bytes";
    else if (hosts * per_host > TRAIN_PLAN_MAX_RANKS)
      bad = "--hosts x --ranks-per-host: more than 1024 ranks (the dry run's thread ranks)";
    else if (o.ranks != 1 && o.ranks != hosts * per_host)
      bad = "--ranks: with --hosts and --ranks-per-host the ranks are their product";
    if (bad) {
      fprintf(stderr, "loom plan: %s\n", bad);
      return 2;
    }
    o.ranks = hosts * per_host;
  }
  if (rc < 0 || refuse_run_only(given) || train_opts_check(&o, &c)) return 2;
  double limit = fit_memory ? parse_size(fit_memory) : 0;
  if (fit_memory && limit <= 0) {
    fprintf(stderr, "loom plan: --fit-memory: expected a size from 1 byte to 8 EiB such as 8GiB, "
            "512MiB or 1e9, got '%s'\n", fit_memory);
    return 2;
  }
  if (fit_seen && !fit_memory) {
    fprintf(stderr, "loom plan: --fit: it says what --fit-memory searches; give --fit-memory\n");
    return 2;
  }
  plan_result r;
  if (!fit_memory) {
    if (plan_of(&o, &r)) return 1;
    if (hosts_seen) {
      /* the rates, measured only where a timeline needs them: a rank's threads are --threads,
       * or this machine's CPUs shared by the ranks of a host */
      bool sharded = strcmp(o.strategy, "fsdp") == 0 || strcmp(o.strategy, "hsdp") == 0;
      plan_rates rates = {gflops, intra, !gflops_seen, !intra_seen, latency};
      if (link_seen && sharded && !gflops_seen) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        long th = o.threads > 0 ? o.threads : cpus > per_host ? cpus / per_host : 1;
        rates.gflops = train_plan_gemm_gflops(&o, (int)th);
      }
      if (link_seen && sharded && !intra_seen) rates.intra_gbps = train_plan_intra_gbps();
      train_plan_links(&o, (int)hosts, (int)per_host, link, &rates, &r);
    }
    if (json) train_plan_print_json(stdout, &o, &r);
    else train_plan_print(stdout, &o, &r);
    return 0;
  }
  bool by_batch = strcmp(fit, "batch") == 0;
  /* a batch (x the ranks) no larger than the samples an epoch has (the data's, or --limit) */
  long hi = by_batch ? TRAIN_MAX_BATCH : TRAIN_MAX_WIDTH;
  size_t epoch = train_plan_epoch_samples(&o);
  if (by_batch && epoch / (size_t)o.ranks < (size_t)hi) hi = (long)(epoch / (size_t)o.ranks);
  long best = hi > 0 ? largest_fit(&o, by_batch, hi, limit) : 0;
  if (best > 0) {
    set_knob(&o, by_batch, best);
    if (plan_of(&o, &r)) return 1;
  }
  const char *what = by_batch ? "--batch" : strcmp(o.model, "cnn") == 0 ? "--fc" : "hidden width";
  if (json) {
    printf("{\"fit\": \"%s\", \"memory_bytes\": %.0f, \"largest\": %ld, \"at_most\": %ld, "
           "\"peak_bytes\": %lld}\n", fit, limit, best, hi, best > 0 ? (long long)r.peak : 0LL);
  } else if (best > 0) {
    printf("largest %s that fits in %s per rank: %ld (peak %.1f MiB)%s\n", what, fit_memory, best,
           (double)r.peak / 1048576.0,
           best < hi ? "" : by_batch ? ", all the samples an epoch has (x the ranks): a larger "
                                       "batch would be more than an epoch"
                                     : ", the most the option allows");
  } else {
    printf("nothing fits in %s per rank: even %s 1 needs more\n", fit_memory, what);
  }
  return best > 0 ? 0 : 1;
}
