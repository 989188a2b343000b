/* fsdp_model.h: the FSDP tests' model and data: an MLP IN-H1-H2-OUT (loom_nn_mlp_create, ReLU,
 * PyTorch names "layers.0.weight", ...), rows of seeded data with class labels, and one
 * training step (forward under autocast, cross-entropy mean, backward of loss x scale). The
 * same functions drive one process with N x B rows and N ranks with B rows each. */
#ifndef LOOM_TESTS_FSDP_MODEL_H
#define LOOM_TESTS_FSDP_MODEL_H

#include "loom/ddp.h"
#include "loom/fsdp.h"
#include "loom/loom.h"

enum { FM_IN = 12, FM_H1 = 40, FM_H2 = 24, FM_OUT = 5 };

/* The model, seeded (PyTorch's default init from the seed). */
int fm_create(uint64_t seed, loom_module **out);
/* Rows [row0, row0 + rows) of the data set. */
int fm_batch(int64_t row0, int64_t rows, loom_tensor **x, loom_tensor **y);
/* The same data for another model: `width` inputs a row, labels 0..classes-1 (fm_batch is
 * fm_batch_of with FM_IN, FM_OUT). */
int fm_batch_of(int64_t row0, int64_t rows, int width, int classes, loom_tensor **x,
                loom_tensor **y);
/* Forward under autocast `amp`, cross-entropy (mean), backward of loss x scale. *loss_value
 * (may be NULL) gets the unscaled loss. */
int fm_backward(loom_module *m, int64_t row0, int64_t rows, loom_autocast_mode amp, float scale,
                double *loss_value);
/* fm_backward on fm_batch_of(width, classes) data. */
int fm_backward_of(loom_module *m, int64_t row0, int64_t rows, int width, int classes,
                   loom_autocast_mode amp, float scale, double *loss_value);
/* AdamW used by every test (eps 1e-4: a gradient near zero whose sign two summation orders
 * could disagree on moves a weight by lr x g / (|g| + eps), not by lr). */
loom_adam_cfg fm_adam(void);
/* The model seeded with `seed`, its FSDP wrapper with `cfg` and fm_adam over its segments with
 * its state in `state_pool`. On failure what was made is left in *m, *f, *opt for the caller
 * to free. */
int fm_setup(loom_pg *pg, uint64_t seed, const loom_fsdp_cfg *cfg, loom_pool state_pool,
             loom_module **m, loom_fsdp **f, loom_optim **opt);
/* The same for a model the caller made (any model: the GPT tests use it too). */
int fm_wrap(loom_pg *pg, loom_module *m, const loom_fsdp_cfg *cfg, loom_pool state_pool,
            loom_fsdp **f, loom_optim **opt);
/* The largest |a[i] - b[i]| over n elements (a NaN difference counts as the worst: infinity). */
double fm_max_diff(const float *a, const float *b, size_t n);
/* Every parameter of `src` (by its name) loaded into f as the full state
 * (loom_fsdp_load_full_state, a collective). */
int fm_load_module(loom_fsdp *f, loom_module *src);
/* DDP (default config) over every parameter of m (a root module), named as m names them, and
 * fm_adam over m's f32 arena (DDP's buckets are views of its gradient arena). */
int fm_ddp_wrap(loom_pg *pg, loom_module *m, loom_ddp **d, loom_optim **opt);
/* DDP training from fm_create(seed): `steps` steps of `rows` rows per rank (step s on rank r
 * takes rows from (s x ranks + r) x rows), fm_adam over the arena; rank 0's final weights
 * flattened into out (fm_flatten_module). */
int fm_ddp_run(loom_pg *pg, uint64_t seed, int steps, int64_t rows, loom_autocast_mode amp,
               float *out);
/* fm_adam over the whole f32 arena of m (a root module). */
int fm_arena_adamw(loom_module *m, loom_optim **opt);
/* Every parameter of a module with its own arena, in order, into out (loom_module_numel). */
void fm_flatten_module(loom_module *m, float *out);
/* The same from an FSDP full state (rank 0). */
void fm_flatten_state(const loom_named_tensor *st, size_t n, float *out);
/* The full state of f (a collective) flattened into out on rank 0 (fm_flatten_state). */
int fm_full_state_flat(loom_fsdp *f, float *out);

/* Whether two files hold the same bytes (false if either cannot be read). */
bool fm_same_file(const char *a, const char *b);
/* Remove a folder and what it holds (files and sub-folders); NULL or "" does nothing. */
void fm_rm_tree(const char *dir);

#endif
