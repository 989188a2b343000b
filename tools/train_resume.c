/* train_resume.c: `loom train --resume DIR` continues with the options of the run it continues.
 * A checkpoint records its run's command line as metadata: "cli" (how many options) and
 * "cli.<option>" = the value as the user wrote it ("" for a flag), for every option given but
 * those that belong to one invocation (not_recorded: where it saves, its metrics, threads,
 * timeout, --max-steps, ...). A resumed run starts from the recorded options; on its command
 * line the options that may change (may_change) replace them, and any other must give the
 * recorded value again, or the run is refused naming the option. A checkpoint without the
 * record (written before it existed) resumes as before: every option given again, compared
 * by the checkpoint's fingerprint (train_ckpt.c). */
#include "train_opts.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Options of one invocation, not recorded: --save, --metrics and --offload-dir name this
 * machine's paths (and the offload options go with the folder: they change no result),
 * --max-steps interrupts (a resume alone runs to the end), --init is replaced by the
 * checkpoint, and the rest change nothing a step computes. */
static const char *const not_recorded[] = {"resume", "save", "overwrite", "init", "max-steps",
                                           "metrics", "quiet", "progress", "threads", "timeout",
                                           "backend", "offload", "offload-tier", "offload-dir",
                                           "offload-io-threads", "prefetch", NULL};
/* Options a resumed run may give with another value: the above, more (or fewer) --epochs, the
 * rank count with --batch (the checkpoint's check keeps ranks x --batch), the FSDP offload
 * options (bit-identical results), and FSDP <-> HSDP with its shard size (a sharded set
 * reshards; the checkpoint's own check refuses what cannot resume). */
static const char *const may_change[] = {"epochs", "ranks", "batch", "gather-prefetch",
                                         "shard-size", NULL};

/* --strategy may change between the two sharded ones only (their checkpoints are one format). */
static bool sharded_switch(const char *was, const char *now) {
  bool a = !strcmp(was, "fsdp") || !strcmp(was, "hsdp"), b = !strcmp(now, "fsdp") || !strcmp(now, "hsdp");
  return a && b;
}

static bool listed(const char *const *list, const char *name) {
  for (; *list; list++)
    if (strcmp(*list, name) == 0) return true;
  return false;
}

const char *train_resume_changeable =
    "--epochs, --max-steps, --save, --metrics, --quiet, --threads, --timeout, --ranks with "
    "--batch (keeping ranks x --batch), --strategy fsdp|hsdp with --shard-size, and the FSDP "
    "offload options";

/* The recorded options of DIR's checkpoint (checkpoint.safetensors, or FSDP's index) as argv
 * ("--lr", "1e-3", "--no-shuffle") into out (static storage); -1 when there is no record (no
 * readable checkpoint: the run says why when it loads it; or one written before the record). */
static int recorded(const char *dir, const cli_option *table, char **out) {
  static char text[TRAIN_CLI_MAX][PATH_MAX], names[TRAIN_CLI_MAX][48];
  static const char *const files[] = {"checkpoint.safetensors", "fsdp/fsdp-index.safetensors"};
  loom_safetensors *f = NULL;
  for (int i = 0; i < 2 && !f; i++) {
    char path[PATH_MAX + 64];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (stat(path, &st) != 0 || loom_checkpoint_open(path, &f) != LOOM_OK) f = NULL;
  }
  if (!f || !loom_safetensors_meta(f, "cli")) {
    loom_safetensors_free(f);
    return -1;
  }
  int n = 0;
  for (size_t i = 0; table[i].name && i < TRAIN_CLI_MAX; i++) {
    char key[64];
    snprintf(key, sizeof key, "cli.%s", table[i].name);
    const char *v = loom_safetensors_meta(f, key);
    if (!v || listed(not_recorded, table[i].name)) continue;
    snprintf(names[i], sizeof names[i], "--%s", table[i].name);
    out[n++] = names[i];
    if (table[i].kind != CLI_FLAG) {
      snprintf(text[i], sizeof text[i], "%s", v);
      out[n++] = text[i];
    }
  }
  loom_safetensors_free(f);
  return n;
}

/* An option given now that is not the recorded one: the message naming it. */
static int refuse(const cli_option *was, const char *was_text, const char *now_text,
                  const char *dir) {
  char def[128] = "";
  const char *name = was->name;
  if (was->kind == CLI_FLAG)
    fprintf(stderr, "loom train: --%s: the run in %s was trained without --%s", name, dir, name);
  else {
    if (!was_text) cli_value_text(was, def, sizeof def);
    fprintf(stderr, "loom train: --%s %s: the run in %s was trained with --%s %s%s", name,
            now_text, dir, name, was_text ? was_text : def, was_text ? "" : " (the default)");
  }
  fprintf(stderr, " (its checkpoint records its options), and a resumed run keeps them: drop "
          "--%s to continue it. Only %s may change\n", name, train_resume_changeable);
  return 2;
}

int train_resume_prepare(train_opts *o, train_cmdline *c, double *timeout, bool *timeout_seen,
                         cli_option *table, int *argc, char ***argv, char ***merged) {
  *merged = NULL;
  if (!o->resume) return 0;
  char *stored[2 * TRAIN_CLI_MAX];
  int ns = recorded(o->resume, table, stored);
  if (ns < 0) return 0;
  /* a --strategy given again comes with its own --shard-size (HSDP's), not the recorded one */
  const char *given[TRAIN_CLI_MAX];
  cli_given(table, *argc, *argv, given);
  size_t is = 0;
  while (table[is].name && strcmp(table[is].name, "strategy") != 0) is++;
  for (int i = 0; table[is].name && given[is] && i + 1 < ns; i++)
    if (strcmp(stored[i], "--shard-size") == 0) {
      memmove(&stored[i], &stored[i + 2], sizeof *stored * (size_t)(ns - i - 2));
      ns -= 2;
      break;
    }
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", o->resume);
  /* the recorded run alone */
  static train_opts so;
  static train_cmdline sc;
  static cli_option st[TRAIN_CLI_MAX];
  double stimeout = *timeout;
  bool sseen = false;
  train_cli_defaults(&so, &sc);
  train_cli_table(&so, &sc, &stimeout, &sseen, st, TRAIN_CLI_MAX);
  if (cli_parse("loom train: --resume: the checkpoint's options", st, ns, stored, NULL, 0, NULL))
    return 2;
  /* the recorded options, then this command line's */
  char **m = malloc(sizeof *m * (size_t)(ns + *argc + 1));
  if (!m) {
    fprintf(stderr, "loom train: out of memory\n");
    return 2;
  }
  memcpy(m, stored, sizeof *m * (size_t)ns);
  memcpy(m + ns, *argv, sizeof *m * (size_t)*argc);
  m[ns + *argc] = NULL;
  const char *was[TRAIN_CLI_MAX], *now[TRAIN_CLI_MAX];
  cli_given(st, ns, stored, was);
  cli_given(table, *argc, *argv, now);
  train_cli_defaults(o, c);
  *timeout_seen = false;
  train_cli_table(o, c, timeout, timeout_seen, table, TRAIN_CLI_MAX);
  if (cli_parse("loom train", table, ns + *argc, m, NULL, 0, NULL)) {
    free(m);
    return 2;
  }
  for (size_t i = 0; table[i].name; i++) {
    if (!now[i] || listed(not_recorded, table[i].name) || listed(may_change, table[i].name))
      continue;
    char a[PATH_MAX], b[PATH_MAX];
    cli_value_text(&st[i], a, sizeof a);
    cli_value_text(&table[i], b, sizeof b);
    if (strcmp(a, b) != 0 && !(!strcmp(table[i].name, "strategy") && sharded_switch(a, b))) {
      free(m);
      return refuse(&st[i], was[i], now[i], dir);
    }
  }
  c->save_into_resume = !o->save; /* the run continues in its folder (cmd_train.c) */
  char a[64], b[64];
  size_t ie = 0;
  while (strcmp(table[ie].name, "epochs") != 0) ie++;
  cli_value_text(&st[ie], a, sizeof a);
  cli_value_text(&table[ie], b, sizeof b);
  if (strcmp(a, b) != 0 && strcmp(o->schedule, "cosine") == 0)
    fprintf(stderr, "loom train: note: --epochs %s: the cosine schedule now spans %s epochs "
            "instead of %s, so the learning rates from the checkpoint on are those of a run "
            "of %s epochs (--schedule constant or warmup would not change them)\n",
            b, b, a, b);
  *argc += ns;
  *argv = m;
  *merged = m;
  return 0;
}

int train_resume_record(const cli_option *table, int argc, char **argv, train_cmdline *c) {
  const char *given[TRAIN_CLI_MAX];
  cli_given(table, argc, argv, given);
  int n = 1;
  for (size_t i = 0; table[i].name && i < TRAIN_CLI_MAX; i++) {
    if (!given[i] || listed(not_recorded, table[i].name)) continue;
    snprintf(c->cli_keys[i], sizeof c->cli_keys[i], "cli.%s", table[i].name);
    c->cli_kv[n++] = (loom_safetensors_meta_kv){c->cli_keys[i], given[i]};
  }
  snprintf(c->cli_count, sizeof c->cli_count, "%d", n - 1);
  c->cli_kv[0] = (loom_safetensors_meta_kv){"cli", c->cli_count};
  return n;
}

int train_resume_dir_check(const train_opts *o) {
  if (!o->resume) return 0;
  const char *dir = o->resume;
  static const char *const files[] = {"checkpoint.safetensors", "fsdp/fsdp-index.safetensors"};
  struct stat st;
  if (stat(dir, &st) != 0) {
    fprintf(stderr, "loom train: --resume %s: %s, so no %s/%s to resume from (give the folder "
            "a run's --save wrote)\n", dir, strerror(errno), dir, files[0]);
    return 1;
  }
  if (!S_ISDIR(st.st_mode)) {
    fprintf(stderr, "loom train: --resume %s: not a folder (give the folder a run's --save "
            "wrote, not a file in it)\n", dir);
    return 1;
  }
  for (int i = 0; i < 2; i++) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/%s", dir, files[i]);
    if (stat(path, &st) == 0) return 0;
  }
  fprintf(stderr, "loom train: --resume %s: no checkpoint in this folder (neither %s/%s nor "
          "%s/%s; a run writes them with --save DIR)\n", dir, dir, files[0], dir, files[1]);
  return 1;
}
