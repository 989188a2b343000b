/* test_train_options.c: `loom train` refuses, with exit 2 and a message naming the option and
 * why, every value out of its bound (so that no product of options overflows: UBSan found
 * four), values that are not finite as an f32, size lists that are not exactly a list, and
 * options that would do nothing in this run; the combinations that do something still run. */
#include "lt.h"
#include "train_test.h"

#define RUN "--limit 128 --batch 64 --epochs 1 --max-steps 1 --threads 1 --quiet"

typedef struct usage_case {
  const char *args, *want;
} usage_case;

/* Each case after the options of a short run (so that a case accepted by mistake ends soon). */
static void refused(const usage_case *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    tt_run r = tt_train(RUN " %s", cases[i].args);
    if (r.rc != 2 || !strstr(r.err, cases[i].want))
      fprintf(stderr, "case '%s': rc %d, stderr \"%s\" (want \"%s\")\n", cases[i].args, r.rc,
              r.err, cases[i].want);
    LT_EQ(r.rc, 2);
    LT_TRUE(strstr(r.err, cases[i].want) != NULL);
    tt_run_free(&r);
  }
}

static void accepted(const char *args) {
  tt_run r = tt_train(RUN " %s", args);
  if (r.rc) fprintf(stderr, "'%s': rc %d, stderr \"%s\"\n", args, r.rc, r.err);
  LT_EQ(r.rc, 0);
  tt_run_free(&r);
}

LT_TEST(train_numeric_options_are_bounded) {
  const usage_case cases[] = {
      {"--epochs 4611686018427387904", "--epochs: expected at most 1000000, got '4611686018427387904'"},
      {"--epochs 99999999999999999999999", "--epochs: expected at most 1000000"},
      {"--batch 4611686018427387904 --ranks 2 --strategy ddp", "--batch: expected at most 16777216"},
      {"--batch 9223372036854775807", "--batch: expected at most 16777216"},
      {"--limit 9223372036854775807", "--limit: expected at most 4294967296"},
      {"--warmup 9223372036854775807", "--warmup: expected at most 1000000000000000"},
      {"--max-steps 9223372036854775807", "--max-steps: expected at most 1000000000000000"},
      {"--eval-batch 9223372036854775807", "--eval-batch: expected at most 16777216"},
      {"--model cnn --fc 99999999999", "--fc: expected at most 1048576, got '99999999999'"},
      {"--hidden 99999999", "(each at most 1048576), got '99999999': 99999999 is above the cap of 1048576"},
      {"--model cnn --channels 4,99999999", "--channels: expected up to 2 positive sizes like 32,64 (each at most 1048576)"},
      {"--ranks 65 --strategy ddp", "--ranks: expected at most 64, got '65'"},
      {"--threads -1", "--threads: expected an integer >= 0, got '-1'"},
  };
  refused(cases, sizeof cases / sizeof cases[0]);
  accepted("--hidden 8 --epochs 1000000"); /* the bounds themselves run */
}

LT_TEST(train_f32_options_must_fit_an_f32) {
  const usage_case cases[] = {
      {"--lr 1e300", "--lr: expected a finite number within the f32 range (magnitude at most 3.40282347e+38), got '1e300'"},
      {"--lr 1e39", "--lr: expected a finite number within the f32 range"},
      {"--lr inf", "--lr: expected a finite number within the f32 range"},
      {"--lr 1e400", "--lr: expected a finite number within the f32 range"},
      {"--lr 1e-320", "--lr: '1e-320' is too small for an f32: it would round to 0"},
      {"--weight-decay 1e39", "--weight-decay: expected a finite number"},
      {"--optim sgd --momentum inf", "--momentum: expected a finite number"},
  };
  refused(cases, sizeof cases / sizeof cases[0]);
  accepted("--hidden 8 --lr 1e-45"); /* an f32 subnormal is an f32 */
}

LT_TEST(train_size_lists_are_strict) {
  const usage_case cases[] = {
      {"--hidden 16,", "--hidden: expected up to 8 positive sizes like 1024,1024 (each at most 1048576), got '16,': a size is missing"},
      {"--hidden ,16", "got ',16': a size is missing"},
      {"--hidden 16,,8", "got '16,,8': a size is missing"},
      {"--hidden +16", "got '+16': not a list of positive integers"},
      {"--hidden 16,0", "got '16,0': a size of 0"},
      {"--hidden 1,2,3,4,5,6,7,8,9", "more than 8 sizes"},
      {"--model cnn --channels 4,8,", "--channels: expected up to 2 positive sizes"},
  };
  refused(cases, sizeof cases / sizeof cases[0]);
}

LT_TEST(train_options_that_do_nothing_are_refused) {
  const usage_case cases[] = {
      {"--model cnn --hidden 64", "--hidden: the CNN has no hidden layers"},
      {"--channels 4,8", "--channels: the MLP has no convolutions"},
      {"--fc 64", "--fc: the MLP has no convolutions"},
      {"--momentum 0.5", "--momentum: --optim adamw has no momentum"},
      {"--optim adam --momentum 0.9", "--momentum: --optim adam has no momentum"},
      {"--scaler static", "--scaler static: loss scaling is for reduced-precision gradients"},
      {"--scaler dynamic --amp off", "--scaler dynamic: loss scaling"},
      {"--loss-scale 1024", "--loss-scale: this run has no loss scaler (--amp off, --scaler off)"},
      {"--amp bf16 --loss-scale 1024", "--loss-scale: this run has no loss scaler (--amp bf16"},
      {"--amp f16 --scaler off --loss-scale 1024", "--loss-scale: this run has no loss scaler"},
      {"--init w.safetensors --resume ck", "--init: a resumed run takes its weights from the checkpoint"},
      {"--schedule constant --warmup 5", "--warmup: --schedule constant has no warmup"},
      {"--schedule warmup --min-lr 0.0001", "--min-lr: --schedule warmup does not decay; --min-lr is cosine's floor"},
      {"--lr 0.001 --min-lr 0.01", "--min-lr 0.01: above --lr 0.001"},
      {"--overwrite", "--overwrite: only with --save DIR"},
      {"--backend mpi", "--backend mpi: the MPI processes are data-parallel ranks: give --strategy ddp or fsdp and start them with mpirun"},
  };
  refused(cases, sizeof cases / sizeof cases[0]);
  /* what each of them is for still runs */
  accepted("--hidden 8 --optim sgd --momentum 0.5");
  accepted("--hidden 8 --amp bf16 --scaler static --loss-scale 128");
  accepted("--hidden 8 --amp f16 --loss-scale 1024");
  accepted("--hidden 8 --scaler off");
  accepted("--model cnn --channels 2,4 --fc 8");
  accepted("--hidden 8 --schedule warmup --warmup 1");
  accepted("--hidden 8 --min-lr 0.0001");
}
