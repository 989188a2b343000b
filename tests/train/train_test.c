/* train_test.c: the helpers of train_test.h. Output is captured by pointing stdout and stderr
 * at temporary files while cmd_train runs (it prints through those FILE pointers). */
#include "train_test.h"

#include "commands.h"
#include "lt_tree.h"

#include <loom/io.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *slurp(FILE *f) {
  fflush(f);
  long n = ftell(f);
  char *s = malloc((size_t)(n > 0 ? n : 0) + 1);
  rewind(f);
  size_t got = n > 0 ? fread(s, 1, (size_t)n, f) : 0;
  s[got] = '\0';
  fclose(f);
  return s;
}

/* Run a subcommand on the words of line, its output captured. */
static tt_run run_command(int (*cmd)(int, char **), char *line) {
  char *argv[128];
  int argc = 0;
  for (char *tok = strtok(line, " "); tok && argc < 127; tok = strtok(NULL, " ")) argv[argc++] = tok;
  argv[argc] = NULL;
  FILE *out = tmpfile(), *err = tmpfile(), *saved_out = stdout, *saved_err = stderr;
  stdout = out;
  stderr = err;
  tt_run r = {0};
  r.rc = cmd(argc, argv);
  stdout = saved_out;
  stderr = saved_err;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

/* The command line of a printf-style call, then the command. */
#define RUN_FORMATTED(cmd, fmt)                                                               \
  do {                                                                                        \
    char line[4096];                                                                          \
    va_list ap;                                                                               \
    va_start(ap, fmt);                                                                        \
    vsnprintf(line, sizeof line, fmt, ap);                                                    \
    va_end(ap);                                                                               \
    return run_command(cmd, line);                                                            \
  } while (0)

tt_run tt_train(const char *fmt, ...) { RUN_FORMATTED(cmd_train, fmt); }

tt_run tt_plan(const char *fmt, ...) { RUN_FORMATTED(cmd_plan, fmt); }

tt_run tt_generate(const char *fmt, ...) { RUN_FORMATTED(cmd_generate, fmt); }
tt_run tt_eval(const char *fmt, ...) { RUN_FORMATTED(cmd_eval, fmt); }

int tt_ended(const tt_run *r, int rc, const char *want, const char *what) {
  if (r->rc == rc && strstr(r->err, want)) return 1;
  fprintf(stderr, "%s: exit %d (want %d), stdout \"%s\", stderr \"%s\" (want \"%s\")\n", what,
          r->rc, rc, r->out, r->err, want);
  return 0;
}

void tt_run_free(tt_run *r) {
  free(r->out);
  free(r->err);
  r->out = r->err = NULL;
}

static char dirs[32][256];
static int ndirs;

const char *tt_tempdir(void) {
  const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  if (ndirs == 32) return NULL;
  snprintf(dirs[ndirs], sizeof dirs[ndirs], "%s/loom-train-XXXXXX", base);
  if (!mkdtemp(dirs[ndirs])) return NULL;
  return dirs[ndirs++];
}

void tt_cleanup(void) {
  while (ndirs > 0) lt_tree_walk(dirs[--ndirs], NULL, true);
}

char *tt_read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  rewind(f);
  char *s = malloc((size_t)n + 1);
  *size = fread(s, 1, (size_t)n, f);
  s[*size] = '\0';
  fclose(f);
  return s;
}

int tt_same_file(const char *a, const char *b) {
  size_t na = 0, nb = 0;
  char *x = tt_read_file(a, &na), *y = tt_read_file(b, &nb);
  int same = x && y && na == nb && memcmp(x, y, na) == 0;
  free(x);
  free(y);
  return same;
}

int tt_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(data, 1, n, f);
  return fclose(f) != 0 || w != n ? -1 : 0;
}

int tt_write_model_file(const char *path, const char *name, const char *const *kv, size_t n) {
  loom_safetensors_meta_kv meta[16];
  if (n > 16) return -1;
  for (size_t i = 0; i < n; i++) meta[i] = (loom_safetensors_meta_kv){kv[2 * i], kv[2 * i + 1]};
  int64_t shape[1] = {4};
  loom_tensor *t = NULL;
  int rc = loom_tensor_zeros(LOOM_F32, 1, shape, &t);
  loom_safetensors_entry e = {.name = name, .tensor = t};
  if (!rc) rc = loom_safetensors_write(path, &e, 1, meta, n);
  loom_tensor_free(t);
  return rc ? -1 : 0;
}

int tt_copy_file(const char *from, const char *to) {
  size_t n = 0;
  char *bytes = tt_read_file(from, &n);
  int rc = bytes ? tt_write_file(to, bytes, n) : -1;
  free(bytes);
  return rc;
}

double tt_model_diff(const char *a, const char *b) {
  loom_safetensors *fa = NULL, *fb = NULL;
  double worst = INFINITY;
  if (!loom_safetensors_open(a, 0, &fa) && !loom_safetensors_open(b, 0, &fb) &&
      loom_safetensors_count(fa) == loom_safetensors_count(fb)) {
    worst = 0;
    for (size_t i = 0; i < loom_safetensors_count(fa); i++) {
      loom_safetensors_info ia, ib;
      if (loom_safetensors_info_at(fa, i, &ia) || loom_safetensors_find(fb, ia.name, &ib) ||
          ia.numel != ib.numel || ia.dtype != LOOM_F32 || ib.dtype != LOOM_F32) {
        worst = INFINITY;
        break;
      }
      const float *x = ia.data, *y = ib.data;
      for (size_t k = 0; k < ia.numel; k++)
        if (fabs(x[k] - y[k]) > worst) worst = fabs(x[k] - y[k]);
    }
  }
  loom_safetensors_free(fa);
  loom_safetensors_free(fb);
  return worst;
}
