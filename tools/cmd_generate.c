/* cmd_generate.c: `loom generate`: sample bytes from a GPT that `loom train --model gpt --save
 * DIR` wrote. The model's shape comes from DIR/model.safetensors' metadata (train_model_meta),
 * its weights by name through the trainer's strict loader. Each new byte is one forward over
 * the last `context` bytes (no key-value cache): the last position's logits divided by the
 * temperature, all but the top-k set to -inf, softmax in double, and one draw of loom's seeded
 * generator (inverse CDF over the bytes in order), so a seed gives the same text on the same
 * machine and threads. Prints the prompt, then the continuation as it is made.
 * Exit codes: 0 done, 1 a failure at run time (the checkpoint), 2 bad usage. */
#include "cli.h"
#include "commands.h"
#include "train_api.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] = "--from DIR [--prompt TEXT] [OPTIONS]\n\n"
    "Continue a text with a GPT trained by `loom train --model gpt --save DIR`: print the\n"
    "prompt, then --tokens bytes sampled one at a time. Examples:\n"
    "  loom generate --from gpt --prompt 'The meaning of life'\n"
    "  loom generate --from gpt --prompt 'Q:' --temperature 0.5 --top-k 10 --seed 7";

typedef struct gen_opts {
  const char *from, *prompt;
  double temperature;
  long top_k, seed, tokens, threads;
} gen_opts;

/* The model of DIR/model.safetensors: its sizes from the metadata, its weights by name. */
static int load(const char *dir, train_model *m) {
  char path[4200];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  loom_safetensors *f = NULL;
  if (access(path, F_OK) != 0)
    return train_fail(LOOM_ENOTFOUND, "--from %s: no %s (`loom train --model gpt --save DIR` "
                      "writes one)", dir, path);
  int rc = loom_safetensors_open(path, 0, &f);
  if (rc) return train_fail_loom(rc, "--from");
  loom_gpt_cfg cfg;
  rc = train_model_meta_gpt(f, path, &cfg);
  loom_safetensors_free(f);
  if (rc) return rc;
  if (cfg.vocab != LOOM_TEXT_VOCAB)
    return train_fail(LOOM_EFORMAT, "%s: a vocabulary of %lld tokens; loom generate samples "
                      "bytes (a vocabulary of %d)", path, (long long)cfg.vocab, LOOM_TEXT_VOCAB);
  train_opts o = {.model = "gpt", .layers = (long)cfg.layers, .heads = (long)cfg.heads,
                  .dim = (long)cfg.dim, .context = (long)cfg.context};
  rc = train_model_create(&o, m);
  if (!rc) rc = train_model_load(m, path, LOOM_F32, "--from", NULL);
  return rc;
}

/* The next byte after window[0..n): logits of the last position, temperature, top-k, a draw. */
static int next_byte(train_model *m, const int64_t *window, int64_t n, const gen_opts *g,
                     loom_rng *rng, int *out) {
  int64_t shape[2] = {1, n};
  loom_tensor *x = NULL, *logits = NULL;
  int rc = loom_tensor_from_data(LOOM_I64, 2, shape, window, &x);
  if (!rc) rc = train_model_forward(m, x, &logits);
  float l[LOOM_TEXT_VOCAB];
  if (!rc) {
    loom_tensor *last = NULL;
    rc = loom_tensor_narrow(logits, 1, n - 1, 1, &last);
    if (!rc) rc = loom_tensor_read(last, LOOM_F32, l, sizeof l);
    loom_tensor_free(last);
  }
  loom_tensor_free(x);
  loom_tensor_free(logits);
  if (rc) return train_fail_loom(rc, "generate: forward");
  double z[LOOM_TEXT_VOCAB], most = -INFINITY, sum = 0;
  for (int v = 0; v < LOOM_TEXT_VOCAB; v++) {
    z[v] = (double)l[v] / g->temperature;
    if (!isfinite(z[v])) return train_fail(LOOM_EFORMAT, "generate: the model's logit of byte "
                                           "%d is %g (not finite)", v, (double)l[v]);
  }
  long k = g->top_k > 0 && g->top_k < LOOM_TEXT_VOCAB ? g->top_k : LOOM_TEXT_VOCAB;
  double sorted[LOOM_TEXT_VOCAB]; /* the k-th largest is the cut (ties at the cut kept) */
  memcpy(sorted, z, sizeof z);
  for (long i = 0; i < k; i++)
    for (int j = (int)i + 1; j < LOOM_TEXT_VOCAB; j++)
      if (sorted[j] > sorted[i]) {
        double s = sorted[i];
        sorted[i] = sorted[j], sorted[j] = s;
      }
  double cut = sorted[k - 1];
  for (int v = 0; v < LOOM_TEXT_VOCAB; v++)
    if (z[v] >= cut && z[v] > most) most = z[v];
  for (int v = 0; v < LOOM_TEXT_VOCAB; v++) {
    z[v] = z[v] >= cut ? exp(z[v] - most) : 0;
    sum += z[v];
  }
  double u = loom_rng_uniform_f64(rng) * sum;
  int pick = 0;
  for (int v = 0; v < LOOM_TEXT_VOCAB; v++) {
    if (z[v] == 0) continue;
    pick = v;
    if (u < z[v]) break;
    u -= z[v];
  }
  *out = pick;
  return LOOM_OK;
}

static int generate(const gen_opts *g) {
  train_model m;
  memset(&m, 0, sizeof m);
  int rc = g->threads > 0 ? loom_set_num_threads((int)g->threads) : LOOM_OK;
  if (rc) return train_fail_loom(rc, "--threads");
  if ((rc = load(g->from, &m))) return rc;
  int64_t ctx = m.gpt_cfg.context, n = 0;
  size_t plen = strlen(g->prompt), skip = plen > (size_t)ctx ? plen - (size_t)ctx : 0;
  if (skip)
    fprintf(stderr, "loom generate: note: the prompt has %zu bytes, more than the model's "
            "context of %lld: the model sees its last %lld\n", plen, (long long)ctx,
            (long long)ctx);
  int64_t *window = calloc((size_t)ctx + 1, sizeof *window);
  if (!window) {
    train_model_free(&m);
    return train_fail(LOOM_ENOMEM, "generate: out of memory");
  }
  for (size_t i = skip; i < plen; i++) window[n++] = (unsigned char)g->prompt[i];
  if (n == 0) window[n++] = '\n'; /* an empty prompt: start as a new line would */
  fputs(g->prompt, stdout);
  fflush(stdout);
  loom_rng rng;
  loom_rng_seed(&rng, (uint64_t)g->seed);
  loom_no_grad_enter();
  loom_module_set_training(m.root, false);
  for (long i = 0; i < g->tokens && !rc; i++) {
    int b = 0;
    rc = next_byte(&m, window, n, g, &rng, &b);
    if (rc) break;
    putchar(b);
    fflush(stdout);
    if (n == ctx) memmove(window, window + 1, (size_t)(ctx - 1) * sizeof *window), n--;
    window[n++] = b;
  }
  loom_no_grad_exit();
  if (!rc) putchar('\n');
  fflush(stdout);
  free(window);
  train_model_free(&m);
  return rc;
}

int cmd_generate(int argc, char **argv) {
  gen_opts g = {.prompt = NULL, .temperature = 0.8, .top_k = 40, .tokens = 200};
  const cli_option table[] = {
      {"from", CLI_STRING, &g.from, "DIR", "the folder of a `loom train --model gpt --save DIR` run (its model.safetensors)", NULL, 0, 0, NULL, 0},
      {"prompt", CLI_STRING, &g.prompt, "TEXT", "the text to continue (its last context bytes are what the model sees; without it the model starts from a new line)", NULL, 0, 0, NULL, 0},
      {"tokens", CLI_POS_INT, &g.tokens, "N", "bytes to generate", NULL, 1, 1e7, NULL, 0},
      {"temperature", CLI_POS_DOUBLE, &g.temperature, "X", "divides the logits: below 1 surer, above 1 wilder", NULL, 1e-3, 100, NULL, 0},
      {"top-k", CLI_INT, &g.top_k, "N", "sample among the N likeliest bytes; 0: all 256", NULL, 0, LOOM_TEXT_VOCAB, NULL, 0},
      {"seed", CLI_INT, &g.seed, "N", "seed of the sampling", NULL, 0, 0, NULL, 0},
      {"threads", CLI_INT, &g.threads, "N", "compute threads; 0: OpenMP's default", NULL, 0, 1024, NULL, 0},
      {0}};
  int rc = cli_parse("loom generate", table, argc, argv, NULL, 0, NULL);
  if (rc == 1) {
    cli_help(stdout, "loom generate", usage, table);
    return 0;
  }
  if (rc < 0) return 2;
  if (!g.from) {
    fprintf(stderr, "loom generate: --from DIR is needed: the folder a `loom train --model gpt "
            "--save DIR` run wrote\n");
    return 2;
  }
  if (!g.prompt) g.prompt = "";
  rc = generate(&g);
  if (!rc) return 0;
  fflush(stdout);
  fprintf(stderr, "loom generate: %s\n", train_last_error());
  return 1;
}
