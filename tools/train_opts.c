/* train_opts.c: the checks of `loom train`'s options that one value alone cannot make (see
 * train_opts.h): size lists, options that contradict each other or do nothing in this run,
 * bounds that depend on other options or on the machine, and the --save and --offload-dir
 * folders, tried before the first step instead of after the first epoch; and the ranks'
 * fingerprint of the command line (every option of the table but the rank-local ones, --init
 * by a digest of its file's bytes). */
#include "train_opts.h"

#include <loom/rng.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *usage_cmd = "loom train"; /* the command named in usage errors */

static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", usage_cmd);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  return -1;
}

/* "a,b,c" into out[0..max): positive integers up to TRAIN_MAX_WIDTH, digits only, one between
 * each pair of commas ("16," and "16,,8" are refused). */
static int parse_sizes(const char *opt, const char *s, const char *like, int64_t *out, int max,
                       int *n) {
  char why[96] = "";
  *n = 0;
  for (const char *p = s; !why[0];) {
    char *end = (char *)p;
    errno = 0;
    long long v = isdigit((unsigned char)*p) ? strtoll(p, &end, 10) : 0;
    if (end == p)
      snprintf(why, sizeof why, *p == ',' || !*p ? "a size is missing between commas or at an end"
                                                 : "not a list of positive integers");
    else if (*end && *end != ',')
      snprintf(why, sizeof why, "not a list of positive integers");
    else if (v == 0)
      snprintf(why, sizeof why, "a size of 0");
    else if (errno == ERANGE || v > TRAIN_MAX_WIDTH)
      snprintf(why, sizeof why, "%.*s is above the cap of %ld", (int)(end - p), p,
               TRAIN_MAX_WIDTH);
    else if (*n == max)
      snprintf(why, sizeof why, "more than %d sizes", max);
    else {
      out[(*n)++] = v;
      if (!*end) break;
      p = end + 1;
    }
  }
  if (why[0])
    return usage("--%s: expected up to %d positive sizes like %s (each at most %ld), got '%s': %s",
                 opt, max, like, TRAIN_MAX_WIDTH, s, why);
  return 0;
}

/* A folder name without trailing slashes (so that "ck/" + "/model.safetensors" has one). */
static int folder(const char *opt, const char **path, char *buf) {
  if (!*path) return 0;
  size_t n = strlen(*path);
  if (n >= PATH_MAX) return usage("--%s: the path is longer than %d bytes", opt, PATH_MAX - 1);
  memcpy(buf, *path, n + 1);
  while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
  *path = buf;
  return 0;
}

/* --offload: none, all, or a comma list of params, grads, optim (each at most once). */
static int parse_offload(train_opts *o) {
  static const char *const kinds[3] = {"params", "grads", "optim"};
  bool *flag[3] = {&o->offload_params, &o->offload_grads, &o->offload_optim};
  bool all = strcmp(o->offload, "all") == 0;
  for (int k = 0; k < 3; k++) *flag[k] = all;
  if (all || strcmp(o->offload, "none") == 0) return 0;
  for (const char *p = o->offload;; p++) {
    size_t len = strcspn(p, ",");
    int k = 0;
    while (k < 3 && !(strlen(kinds[k]) == len && strncmp(p, kinds[k], len) == 0)) k++;
    if (k == 3 || *flag[k]) {
      char why[96];
      if (len == 0) snprintf(why, sizeof why, "an item is missing between commas or at an end");
      else if (k < 3) snprintf(why, sizeof why, "%s is named twice", kinds[k]);
      else snprintf(why, sizeof why, "'%.*s' is not one of them", (int)len, p);
      return usage("--offload: expected all, none or a comma list of params,grads,optim, got "
                   "'%s': %s", o->offload, why);
    }
    *flag[k] = true;
    p += len;
    if (!*p) return 0;
  }
}

/* The offload options that go together: the tier's folder, and none of them without offload;
 * optim named in the list of a run whose optimizer keeps no state (SGD without momentum) is
 * refused, as it would move nothing (--offload all offloads what there is, and says so). */
static int offload_options(const train_opts *o, const train_cmdline *c) {
  if (o->offload_optim && !train_offload_has_state(o) && strcmp(o->offload, "all") != 0)
    return usage("--offload %s: --optim sgd with --momentum 0 keeps no optimizer state, so "
                 "optim would offload nothing; drop optim from the list (or give SGD a "
                 "momentum)", o->offload);
  bool on = o->offload_params || o->offload_grads || o->offload_optim;
  bool disk = strcmp(o->offload_tier, "disk") == 0;
  const char *needs = c->seen_offload_tier ? "offload-tier" : c->seen_offload_dir ? "offload-dir"
                      : c->seen_offload_io_threads ? "offload-io-threads"
                      : c->seen_prefetch ? "prefetch" : NULL;
  if (!on && needs)
    return usage("--%s: offload is off in this run (--offload none); give --offload all or a "
                 "list of params,grads,optim", needs);
  if (disk && !o->offload_dir)
    return usage("--offload-tier disk: the disk tier needs --offload-dir DIR, an existing folder "
                 "for its files");
  if (!disk && o->offload_dir)
    return usage("--offload-dir: only for --offload-tier disk; the host tier (this run's) keeps "
                 "the offloaded bytes in memory");
  return 0;
}

/* --model gpt: its defaults where they differ from the MLP's, its sizes against each other,
 * and the options of one kind of model given to the other. */
static int gpt_options(train_opts *o, const train_cmdline *c) {
  bool gpt = strcmp(o->model, "gpt") == 0;
  const char *gpt_only = c->seen_layers ? "layers" : c->seen_heads ? "heads"
                         : c->seen_dim ? "dim" : c->seen_context ? "context"
                         : c->seen_text ? "text" : c->seen_eval_every ? "eval-every"
                         : c->seen_eval_windows ? "eval-windows"
                         : c->seen_checkpoint_activations ? "checkpoint-activations" : NULL;
  if (!gpt && gpt_only)
    return usage("--%s: a GPT option; it needs --model gpt (this run trains --model %s)",
                 gpt_only, o->model);
  if (!gpt) return 0;
  const char *image_only = c->seen_hidden ? "hidden" : c->seen_channels ? "channels"
                           : c->seen_fc ? "fc" : o->data ? "data" : NULL;
  if (image_only)
    return usage("--%s: an option of the Fashion-MNIST models (mlp, cnn); --model gpt is sized "
                 "by --layers --heads --dim --context and reads --text FILE", image_only);
  if (o->dim % o->heads != 0)
    return usage("--heads %ld: the heads must divide --dim %ld (each head takes dim / heads "
                 "columns)", o->heads, o->dim);
  if (!c->seen_batch) o->batch = TRAIN_GPT_BATCH;
  if (!c->seen_epochs) o->epochs = TRAIN_GPT_EPOCHS;
  if (!c->seen_eval_batch) o->eval_batch = TRAIN_GPT_EVAL_BATCH;
  if (!c->seen_warmup && strcmp(o->schedule, "constant") != 0) {
    o->warmup = TRAIN_GPT_WARMUP;
    o->warmup_auto = true;
  }
  if (!c->seen_min_lr && strcmp(o->schedule, "cosine") == 0)
    o->min_lr = o->lr * TRAIN_GPT_MIN_LR_FRAC;
  return 0;
}

/* Options that would be accepted and then do nothing in this run. */
static int unused(const train_opts *o, const train_cmdline *c) {
  bool cnn = strcmp(o->model, "cnn") == 0;
  if (cnn && c->seen_hidden)
    return usage("--hidden: the CNN has no hidden layers (it is sized by --channels and --fc); "
                 "--hidden is for --model mlp");
  if (!cnn && (c->seen_channels || c->seen_fc))
    return usage("--%s: the MLP has no convolutions (it is sized by --hidden); --%s is for "
                 "--model cnn", c->seen_channels ? "channels" : "fc",
                 c->seen_channels ? "channels" : "fc");
  if (c->seen_momentum && strcmp(o->optim, "sgd") != 0)
    return usage("--momentum: --optim %s has no momentum (its moments follow its betas); "
                 "--momentum is for --optim sgd", o->optim);
  if (c->seen_warmup && strcmp(o->schedule, "constant") == 0)
    return usage("--warmup: --schedule constant has no warmup; use --schedule warmup or cosine");
  if (c->seen_min_lr && strcmp(o->schedule, "cosine") != 0)
    return usage("--min-lr: --schedule %s does not decay; --min-lr is cosine's floor",
                 o->schedule);
  if (c->seen_min_lr && o->min_lr > o->lr)
    return usage("--min-lr %g: above --lr %g (the cosine decay ends at --min-lr)", o->min_lr,
                 o->lr);
  if (strcmp(o->amp, "off") == 0 && strcmp(o->scaler, "off") != 0)
    return usage("--scaler %s: loss scaling is for reduced-precision gradients: it needs --amp "
                 "f16 (or bf16)", o->scaler);
  if (c->seen_loss_scale && strcmp(o->scaler, "off") == 0)
    return usage("--loss-scale: this run has no loss scaler (--amp %s, --scaler off); a scale "
                 "needs --amp f16, or --amp bf16 with --scaler static|dynamic", o->amp);
  if (o->init && o->resume)
    return usage("--init: a resumed run takes its weights from the checkpoint of --resume %s; "
                 "drop --init", o->resume);
  if (c->overwrite && !o->save)
    return usage("--overwrite: only with --save DIR (it allows replacing DIR's checkpoint)");
  bool hsdp = strcmp(o->strategy, "hsdp") == 0, fsdp = hsdp || strcmp(o->strategy, "fsdp") == 0;
  if (c->seen_shard_size && !hsdp)
    return usage("--shard-size: the shard group of --strategy hsdp; this run has --strategy %s",
                 o->strategy);
  if (hsdp && !c->seen_shard_size)
    return usage("--strategy hsdp: give --shard-size N, the ranks that share one copy of the "
                 "model (e.g. the ranks of one machine)");
  if (hsdp && strcmp(o->backend, "mpi") != 0 && o->ranks % o->shard_size)
    return usage("--shard-size %ld: it must divide --ranks %ld (every shard group has the same "
                 "size)", o->shard_size, o->ranks);
  const char *fsdp_only = c->seen_wrap ? "wrap" : c->seen_unit_min ? "unit-min"
                          : c->seen_reshard ? "reshard-after-forward"
                          : c->seen_gather_prefetch ? "gather-prefetch"
                          : c->seen_offload ? "offload" : c->seen_offload_tier ? "offload-tier"
                          : c->seen_offload_dir ? "offload-dir"
                          : c->seen_offload_io_threads ? "offload-io-threads"
                          : c->seen_optim_in_backward ? "optim-in-backward"
                          : c->seen_prefetch ? "prefetch" : NULL;
  if (fsdp_only && !fsdp)
    return usage("--%s: an FSDP option; it needs --strategy fsdp (or hsdp)", fsdp_only);
  if (c->seen_unit_min && strcmp(o->wrap, "size") != 0)
    return usage("--unit-min: the size of a unit under --wrap size; this run has --wrap %s",
                 o->wrap);
  if (o->optim_in_backward && strcmp(o->scaler, "dynamic") == 0)
    return usage("--optim-in-backward: each unit steps as soon as its gradient is reduced, and "
                 "--scaler dynamic%s needs every gradient checked for inf and NaN first; give "
                 "--scaler off or drop --optim-in-backward",
                 strcmp(o->amp, "f16") == 0 ? " (--amp f16's default)" : "");
  if (fsdp && strcmp(o->scaler, "static") == 0)
    return usage("--scaler static: FSDP's mixed precision scales the loss dynamically (its "
                 "specification's scaler); use --scaler dynamic or off");
  return 0;
}

int train_opts_check(train_opts *o, train_cmdline *c) {
  usage_cmd = c->cmd ? c->cmd : "loom train";
  if (folder("save", &o->save, c->dirs[0]) || folder("resume", &o->resume, c->dirs[1]) ||
      folder("data", &o->data, c->dirs[2]))
    return -1;
  int n = 0;
  if (parse_sizes("hidden", c->hidden, "1024,1024", o->hidden, TRAIN_MAX_HIDDEN, &o->nhidden) ||
      parse_sizes("channels", c->channels, "32,64", o->channels, 2, &n))
    return -1;
  if (n != 2) return usage("--channels: expected two sizes (C1,C2), got '%s'", c->channels);
  o->shuffle = !c->no_shuffle;
  if (!o->scaler) o->scaler = strcmp(o->amp, "f16") == 0 ? "dynamic" : "off";
  if (o->loss_scale > 16777216.0 || o->loss_scale < 1)
    return usage("--loss-scale: expected a number in [1, 2^24], got %g", o->loss_scale);
  if (gpt_options(o, c) || parse_offload(o) || unused(o, c) || offload_options(o, c)) return -1;
  int most = loom_max_num_threads();
  if (o->threads > most)
    return usage("--threads: expected at most %d (4 per online CPU, this machine has %ld, and "
                 "1024 in all), got %ld", most, sysconf(_SC_NPROCESSORS_ONLN), o->threads);
  bool ddp = strcmp(o->strategy, "none") != 0, mpi = strcmp(o->backend, "mpi") == 0;
  if (mpi && !ddp)
    return usage("--backend mpi: the MPI processes are data-parallel ranks: give --strategy ddp "
                 "or fsdp and start them with mpirun (mpirun -n N loom train --backend mpi "
                 "--strategy ddp ...)");
  if (o->ranks > 1 && !ddp)
    return usage("--ranks: more than one rank needs --strategy ddp, fsdp or hsdp");
  if (mpi && o->ranks > 1)
    return usage("--ranks: with --backend mpi the ranks are the MPI processes (mpirun -n N loom "
                 "train ...)");
  if (o->limit > 0 && o->batch * o->ranks > o->limit)
    return usage("--batch: %ld samples per step%s is more than the %ld samples per epoch of "
                 "--limit %ld", o->batch * o->ranks, o->ranks > 1 ? " (all ranks)" : "",
                 o->limit, o->limit);
  return 0;
}

void train_warn_oversubscribed(const train_opts *o) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN), ranks = o->ranks;
  long threads = ranks * (o->threads > 0 ? o->threads : 1);
  if (cpus <= 0 || threads <= cpus) return;
  if (o->threads > 0)
    fprintf(stderr, "loom train: warning: --ranks %ld x --threads %ld = %ld compute threads on "
            "%ld online CPUs: they will take turns on the CPUs and run slower%s\n", ranks,
            o->threads, threads, cpus,
            ranks <= cpus ? " (--threads 0 divides the CPUs among the ranks)" : "");
  else
    fprintf(stderr, "loom train: warning: --ranks %ld, a compute thread each at least, on %ld "
            "online CPUs: the ranks will take turns on the CPUs and run slower\n", ranks, cpus);
}

static int cannot(const char *opt, const char *dir, const char *what) {
  fprintf(stderr, "loom train: --%s %s: %s: %s\n", opt, dir, what, strerror(errno));
  return 1;
}

/* Whether a file can be made and written in folder d (a probe, written and removed): 0, or 1
 * after the message naming the option, the folder and the errno text. A folder that exists but
 * takes no regular files (/proc says ENOENT) is said to be one, not a missing folder. */
static int probe_write(const char *opt, const char *d) {
  char p[PATH_MAX + 64];
  snprintf(p, sizeof p, "%s/.loom-write-test-XXXXXX", d);
  int fd = mkstemp(p), e = fd < 0 ? errno : 0;
  if (fd >= 0) {
    ssize_t w = write(fd, "loom", 4);
    e = w == 4 ? 0 : w < 0 ? errno : ENOSPC;
    if (close(fd) != 0 && !e) e = errno;
    unlink(p);
  }
  errno = e;
  if (!e) return 0;
  if (e == ENOENT)
    return cannot(opt, d, "the folder takes no regular files (a pseudo-filesystem such as "
                          "/proc?): creating one failed");
  return cannot(opt, d, "cannot write in the folder");
}

static bool same_folder(const char *a, const char *b) {
  struct stat sa, sb;
  return a && stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

int train_save_check(const train_opts *o, bool overwrite) {
  const char *d = o->save;
  if (!d) return 0;
  struct stat st;
  if (mkdir(d, 0777) != 0 && errno != EEXIST) return cannot("save", d, "cannot create the folder");
  if (stat(d, &st) != 0) return cannot("save", d, "cannot use the folder");
  if (!S_ISDIR(st.st_mode)) {
    fprintf(stderr, "loom train: --save %s: not a folder\n", d);
    return 1;
  }
  static const char *const files[] = {"checkpoint.safetensors", "model.safetensors",
                                      "fsdp/fsdp-index.safetensors"};
  char p[PATH_MAX + 64];
  for (int i = 0; i < 3 && !overwrite && !same_folder(o->resume, d); i++) {
    snprintf(p, sizeof p, "%s/%s", d, files[i]);
    if (lstat(p, &st) == 0 && !S_ISDIR(st.st_mode)) {
      fprintf(stderr, "loom train: --save %s: the folder already holds %s of another run: give "
              "--overwrite to replace it, or --resume %s to continue that run\n", d, files[i], d);
      return 2;
    }
  }
  return probe_write("save", d);
}

int train_offload_dir_check(const train_opts *o) {
  const char *d = o->offload_dir;
  struct stat st;
  if (!d) return 0;
  if (stat(d, &st) != 0) return cannot("offload-dir", d, "cannot use the folder");
  if (!S_ISDIR(st.st_mode)) {
    fprintf(stderr, "loom train: --offload-dir %s: not a folder\n", d);
    return 1;
  }
  return probe_write("offload-dir", d);
}

/* ---- the ranks' fingerprint ---------------------------------------------------------------- */

/* The one digest of the ranks' fingerprint: the library's public mixer (loom_rng_hash) over
 * n bytes taken as 8-byte words numbered from word (so a file digests block by block), from h
 * (the length), so equal bytes give equal digests on every rank. */
static uint64_t digest_bytes(const unsigned char *p, size_t n, uint64_t word, uint64_t h) {
  for (size_t i = 0; i < n; i += 8) {
    uint64_t w = 0;
    memcpy(&w, p + i, n - i < 8 ? n - i : 8);
    h = loom_rng_hash(h ^ w, word + i / 8);
  }
  return h;
}

/* The digest of a regular file's bytes (read in blocks) as "bytes N, digest HEX", or
 * "unreadable" (then the run fails where the file is read, with that message); opened without
 * blocking, so a FIFO is never waited on. */
static void digest_file(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0) close(fd);
    snprintf(buf, cap, "unreadable");
    return;
  }
  static unsigned char block[1 << 16]; /* a multiple of 8: the words line up across blocks */
  uint64_t h = (uint64_t)st.st_size, total = 0;
  ssize_t got = 1;
  while (got > 0) {
    size_t have = 0; /* a whole block before it is digested: the same words whatever the reads */
    while (have < sizeof block && (got = read(fd, block + have, sizeof block - have)) != 0)
      if (got > 0) have += (size_t)got;
      else if (errno != EINTR) break;
    h = digest_bytes(block, have, total / 8, h);
    total += have;
  }
  bool bad = got < 0;
  close(fd);
  if (bad) snprintf(buf, cap, "unreadable");
  else snprintf(buf, cap, "bytes %llu, digest %016llx", (unsigned long long)total,
                (unsigned long long)h);
}

int train_cli_fingerprint(const cli_option *table, train_fp_entry *out, int cap) {
  int n = 0;
  for (const cli_option *t = table; t->name && n < cap; t++) {
    if (t->ranks == CLI_RANKS_LOCAL) continue;
    train_fp_entry *e = &out[n++];
    char text[PATH_MAX + 32];
    cli_value_text(t, text, sizeof text);
    bool given = t->kind == CLI_FLAG ? strcmp(text, "yes") == 0 : text[0] != '\0';
    if (t->kind == CLI_FLAG) {
      snprintf(e->value, sizeof e->value, "%s", text);
      snprintf(e->shown, sizeof e->shown, "%s--%s", given ? "" : "no ", t->name);
    } else if (!given) { /* value "": a given string is never empty (cli_parse) */
      e->value[0] = '\0';
      snprintf(e->shown, sizeof e->shown, "no --%s", t->name);
    } else if (t->ranks == CLI_RANKS_PRESENCE) {
      snprintf(e->value, sizeof e->value, "given");
      snprintf(e->shown, sizeof e->shown, "--%s %.120s", t->name, text);
    } else if (t->ranks == CLI_RANKS_CONTENTS) {
      digest_file(text, e->value, sizeof e->value);
      snprintf(e->shown, sizeof e->shown, "--%s %.60s (%.40s)", t->name, text, e->value);
    } else {
      size_t len = strlen(text);
      if (len < sizeof e->value)
        snprintf(e->value, sizeof e->value, "%s", text);
      else
        snprintf(e->value, sizeof e->value, "%zu bytes, digest %016llx", len,
                 (unsigned long long)digest_bytes((const unsigned char *)text, len, 0, len));
      snprintf(e->shown, sizeof e->shown, "--%s %.140s", t->name, text);
    }
  }
  return n;
}
