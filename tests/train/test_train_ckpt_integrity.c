/* test_train_ckpt_integrity.c: `loom train --resume` trusts nothing in a checkpoint: a step
 * changed in the header is caught by the CRC (it used to skip steps and exit 0); a forged
 * checkpoint with a valid CRC is still refused when its counters do not fit the run or each
 * other, its scaler state is out of range (the INT64_MAX success counter, a signed
 * overflow under UBSan), or its weights and moments are not finite; and, for a sharded FSDP
 * checkpoint, rank 0's file copied over rank 1's with the index re-signed (it used to resume,
 * exit 0, with a worse model). */
#include "lt.h"
#include "train_forge.h"
#include "train_test.h"

#include <loom/fsdp.h>
#include <loom/io.h>
#include <stdlib.h>
#include <sys/stat.h>

#define RUN "--hidden 16 --limit 512 --batch 64 --epochs 2 --threads 1 --quiet" /* 8 steps/epoch */

/* A checkpoint after 2 steps (with `extra` options) in a new folder, and its bytes, so each
 * forgery can start again from them. */
typedef struct saved {
  const char *dir;
  char ck[512];
  char *good;
  size_t n;
} saved;

static void two_steps(const char *extra, saved *s) {
  s->dir = tt_tempdir();
  tt_run r = tt_train(RUN " %s --max-steps 2 --save %s", extra, s->dir);
  LT_EQ(r.rc, 0);
  if (r.rc) fprintf(stderr, "%s", r.err);
  tt_run_free(&r);
  snprintf(s->ck, sizeof s->ck, "%s/checkpoint.safetensors", s->dir);
  s->good = tt_read_file(s->ck, &s->n);
  LT_TRUE(s->good != NULL);
}

/* The checkpoint as it was written. */
static void restore(const saved *s) { LT_EQ(tt_write_file(s->ck, s->good, s->n), 0); }

static void done(saved *s) {
  free(s->good);
  tt_cleanup();
}

/* Resuming from d must fail (exit 1) with `want` in the message. */
static void refused(const char *extra, const char *d, const char *want) {
  tt_run r = tt_train(RUN " %s --max-steps 4 --resume %s", extra, d);
  LT_EQ(r.rc, 1);
  LT_TRUE(strstr(r.err, want) != NULL);
  if (r.rc != 1 || !strstr(r.err, want))
    fprintf(stderr, "want \"%s\": rc %d, stdout \"%s\", stderr \"%s\"\n", want, r.rc, r.out, r.err);
  tt_run_free(&r);
}

LT_TEST(train_resume_header_change_is_caught_by_the_crc) {
  saved s;
  two_steps("", &s);
  char *step = strstr(s.good + 8, "\"step\":\"2\"");
  LT_TRUE(step != NULL);
  step[8] = '6'; /* the edit: "resuming at step 6 ... after 6 steps", exit 0 */
  restore(&s);
  refused("", s.dir, "CRC-32 of the file is");
  done(&s);
}

LT_TEST(train_resume_refuses_forged_counters) {
  saved s;
  two_steps("", &s);
  const struct { const char *key, *value, *want; } cases[] = {
      {"step", "1000000000000000", "step 1000000000000000 is past this run's 16 steps (--epochs 2 x 8)"},
      {"step", "9223372036854775807", "is past this run's 16 steps"},
      {"step", "-1", "the checkpoint's 'step' is missing or not a whole number"},
      {"step", "6", "epoch 0 and batch 2 do not match its step 6 (8 steps per epoch)"},
      {"epoch", "1", "epoch 1 and batch 2 do not match its step 2"},
      {"steps_per_epoch", "4", "the checkpoint has 4 steps per epoch, this run 8"},
      {"optim_steps", "3", "optimizer step count 3 is above its step 2"},
      {"optim_steps", "1", "optimizer step count 1 is not its step 2 less the 0 skipped"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    restore(&s);
    LT_EQ(tf_set_meta(s.ck, cases[i].key, cases[i].value), 0);
    refused("", s.dir, cases[i].want);
  }
  /* the untouched checkpoint still resumes */
  restore(&s);
  tt_run r = tt_train(RUN " --max-steps 4 --resume %s", s.dir);
  LT_EQ(r.rc, 0);
  LT_TRUE(strstr(r.out, "after 4 steps") != NULL);
  tt_run_free(&r);
  done(&s);
}

LT_TEST(train_resume_refuses_a_forged_scaler_state) {
  saved s;
  two_steps("--amp f16", &s);
  const struct { size_t word; int64_t v; const char *want; } cases[] = {
      /* total_successful_iterations: the signed overflow in scaler.c under UBSan */
      {12, INT64_MAX, "total_successful_iterations 9223372036854775807 is above 2^62"},
      /* total_overflows: in range for the scaler, but not for 2 steps */
      {11, 5, "the scaler counted 5 overflows and 2 successful steps, but the checkpoint is at "
              "step 2"},
      {9, 0x7fc00000, "scale nan is outside"}, /* the scale's f32 bits: NaN */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    restore(&s);
    LT_EQ(tf_set_i64(s.ck, "amp.scaler", cases[i].word, cases[i].v), 0);
    refused("--amp f16", s.dir, cases[i].want);
  }
  done(&s);
}

LT_TEST(train_resume_refuses_nonfinite_weights_and_moments) {
  saved s;
  two_steps("", &s);
  const struct { const char *tensor; size_t at; float v; const char *want; } cases[] = {
      {"model.layers.0.weight", 3, NAN, "tensor \"model.layers.0.weight\" holds nan at element 3"},
      {"model.layers.2.bias", 1, -INFINITY, "tensor \"model.layers.2.bias\" holds -inf"},
      {"optim.layers.0.bias.exp_avg", 0, INFINITY, "\"optim.layers.0.bias.exp_avg\" holds inf"},
      {"optim.layers.0.weight.exp_avg_sq", 7, -1e-3f,
       "\"optim.layers.0.weight.exp_avg_sq\" holds -0.001 at element 7: its values must be "
       "finite and >= 0"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    restore(&s);
    LT_EQ(tf_set_f32(s.ck, cases[i].tensor, cases[i].at, cases[i].v), 0);
    refused("", s.dir, cases[i].want);
  }
  done(&s);
}

LT_TEST(train_resume_refuses_a_rank_file_of_another_rank) {
  const char *d = tt_tempdir();
  const char *fsdp = "--ranks 2 --strategy fsdp";
  tt_run r = tt_train(RUN " %s --max-steps 2 --save %s", fsdp, d);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
  char set[512], gen[32], f0[600], f1[600], ix[600];
  snprintf(set, sizeof set, "%s/fsdp", d);
  LT_OK(loom_fsdp_sharded_meta(set, "fsdp.generation", gen, sizeof gen));
  snprintf(f0, sizeof f0, "%s/gen-%s/rank-0-of-2.safetensors", set, gen);
  snprintf(f1, sizeof f1, "%s/gen-%s/rank-1-of-2.safetensors", set, gen);
  snprintf(ix, sizeof ix, "%s/fsdp-index.safetensors", set);
  LT_EQ(tt_copy_file(f0, f1), 0);
  /* the index re-signed to name the copy: its size and CRC as rank 1's */
  struct stat st;
  loom_safetensors *f = NULL;
  LT_TRUE(stat(f1, &st) == 0);
  LT_OK(loom_checkpoint_open(f1, &f));
  int64_t crc = (int64_t)strtoull(loom_safetensors_meta(f, "loom.crc32"), NULL, 16);
  loom_safetensors_free(f);
  LT_EQ(tf_set_i64(ix, "files", 2, (int64_t)st.st_size), 0);
  LT_EQ(tf_set_i64(ix, "files", 3, crc), 0);
  refused(fsdp, d, "rank-1-of-2.safetensors is the file of rank 0 of 2; the index puts it at "
                   "rank 1 of 2");
  tt_cleanup();
}
