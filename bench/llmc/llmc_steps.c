/* llmc_steps.c: llm.c's CPU trainer (train_gpt2.c, karpathy/llm.c) timed at a given shape, for
 * bench/llmc_side_by_side.sh. Not part of loom and never built by its CMake: the script compiles
 * it in a scratch folder beside a copy of llm.c, with the flags of llm.c's `make train_gpt2`.
 *
 * train_gpt2.c's own main() fixes B = 4, T = 64, its file names and 40 steps, with a validation
 * pass every 10 steps and sampling every 20; this file includes train_gpt2.c unchanged (its
 * main() renamed away) and runs main()'s training step as it is written there, at B and T
 * given on the command line, with nothing else in the loop:
 *   dataloader_next_batch; gpt2_forward; gpt2_zero_grad; gpt2_backward; gpt2_update
 * timed with CLOCK_MONOTONIC around those five calls, as main() times them.
 * Usage: llmc_steps CHECKPOINT TOKENS B T STEPS
 * Prints "step N: train loss X (took Y ms)" per step, as main() does. */
#define main llmc_train_gpt2_main
#include "train_gpt2.c"
#undef main

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: llmc_steps CHECKPOINT TOKENS B T STEPS\n");
    return 2;
  }
  int B = atoi(argv[3]), T = atoi(argv[4]), steps = atoi(argv[5]);
  GPT2 model;
  gpt2_build_from_checkpoint(&model, argv[1]);
  DataLoader train_loader;
  dataloader_init(&train_loader, argv[2], B, T, 0, 1, 1);
#ifdef OMP
  printf("omp threads: %d\n", omp_get_max_threads());
#endif
  struct timespec start, end;
  for (int step = 0; step < steps; step++) {
    clock_gettime(CLOCK_MONOTONIC, &start);
    dataloader_next_batch(&train_loader);
    gpt2_forward(&model, train_loader.inputs, train_loader.targets, B, T);
    gpt2_zero_grad(&model);
    gpt2_backward(&model);
    gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
    clock_gettime(CLOCK_MONOTONIC, &end);
    double time_elapsed_s = (end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9;
    printf("step %d: train loss %f (took %f ms)\n", step, model.mean_loss, time_elapsed_s * 1000);
    fflush(stdout);
  }
  dataloader_free(&train_loader);
  gpt2_free(&model);
  return 0;
}
