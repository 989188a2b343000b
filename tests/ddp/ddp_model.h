/* ddp_model.h: a small two-layer MLP built from loom's ops, for the DDP tests: deterministic
 * initialisation and data, an MSE loss over a slice of a global batch, and a plain SGD step. */
#ifndef LOOM_TEST_DDP_MODEL_H
#define LOOM_TEST_DDP_MODEL_H

#include "loom/loom.h"
#include "loom/autograd.h"
#include "loom/ops.h"

enum { MODEL_IN = 12, MODEL_HIDDEN = 40, MODEL_OUT = 5, MODEL_NPARAMS = 4 };

typedef struct model {
  loom_tensor *p[MODEL_NPARAMS]; /* fc1.weight, fc1.bias, fc2.weight, fc2.bias */
} model;

extern const char *const model_names[MODEL_NPARAMS];

/* Parameters from `seed` (the same seed gives the same values). */
int model_init(model *m, uint64_t seed);
void model_free(model *m);
/* Forward rows [row0, row0 + rows) of the deterministic data set and backward the mean MSE
 * (scaled by loss_scale; 1 for none). */
int model_backward(model *m, int64_t row0, int64_t rows, float loss_scale);
/* The same with the forward under autocast in `mode` (LOOM_AUTOCAST_OFF: none). */
int model_backward_amp(model *m, int64_t row0, int64_t rows, float loss_scale,
                       loom_autocast_mode mode);
/* p -= lr * grad; then zero the gradients. */
void model_sgd(model *m, float lr);
/* All parameters (or gradients) as one flat f32 array of model_numel() values. */
size_t model_numel(void);
void model_flatten(const model *m, float *out, bool grads);

#endif
