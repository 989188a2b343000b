/* nn_int.h: the module struct shared by the nn files (private to loom). A module has local
 * parameters (name, value, gradient), named children and a forward function. The root module
 * owns the flat arenas (one value and one gradient buffer per dtype) that every parameter in
 * the tree is a view of; packing builds them. */
#ifndef LOOM_NN_INT_H
#define LOOM_NN_INT_H

#include "core/tensor_int.h"
#include "loom/autograd.h"
#include "loom/nn.h"
#include "loom/rng.h"

#define LOOM__NN_MAX_PARAMS 4

/* A parameter's initialiser (its recipe, init.c): element i of the parameter is a pure
 * function of (seed, stream, i) through loom_rng_at_uniform / _normal, so any slice of it can
 * be made alone (FSDP's shards). Zeroed: every element 0. */
typedef enum loom__init_kind {
  LOOM__INIT_FILL = 0, /* every element a */
  LOOM__INIT_UNIFORM,  /* U[-a, a): -a + 2a u */
  LOOM__INIT_NORMAL,   /* N(a, b^2): a + b z */
} loom__init_kind;

typedef struct loom__init {
  loom__init_kind kind;
  double a, b;
  uint64_t seed, stream;
} loom__init;

typedef struct loom__param {
  const char *name; /* local name, static ("weight") */
  loom_tensor *value, *grad;
  char *full; /* dotted name in the root's tree, set by packing */
  size_t offset;
  loom__init init; /* its values when it is given memory without data to copy */
} loom__param;

/* Forward hooks (FSDP's unit boundaries): pre runs before the module's forward; once pre has
 * succeeded, post runs after the forward whatever happened, with the forward's status `rc` and
 * its output (borrowed; NULL when rc != 0). An error from pre, or from post after a forward
 * that succeeded, fails the forward. */
typedef struct loom__module_hooks {
  int (*pre)(loom_module *m, void *ctx);
  int (*post)(loom_module *m, loom_tensor *out, int rc, void *ctx);
} loom__module_hooks;

struct loom_module {
  const char *type;
  int (*forward)(loom_module *m, loom_tensor *x, loom_tensor **out);
  loom__param params[LOOM__NN_MAX_PARAMS];
  int n_params;
  loom_module **children;
  char **child_names;
  int n_children;
  loom_module *parent;
  bool training;
  bool checkpoint; /* loom_module_set_checkpoint: forward recomputed in backward */
  int64_t cfg[8]; /* per type: sizes, strides, activation, ... */
  double fcfg[2];
  uint64_t seed, calls;
  const loom__module_hooks *hooks; /* NULL: none */
  void *hooks_ctx;
  /* root only */
  loom_tensor *arena[LOOM_DTYPE_COUNT], *grad_arena[LOOM_DTYPE_COUNT];
  size_t arena_numel[LOOM_DTYPE_COUNT];
  loom__param **flat; /* every parameter of the tree, in order */
  size_t n_flat;
  bool deferred; /* packed without arenas (loom_nn_set_deferred_init): parameters are shells */
  void *sharded_by; /* the FSDP wrapper holding the parameters since its arenas were given
                       back (a loom_fsdp *, set and cleared by FSDP), or NULL */
};

/* A new module of `type` with forward fn (zeroed, training). */
int loom__module_new(const char *type, int (*forward)(loom_module *, loom_tensor *, loom_tensor **),
                     loom_module **out);
/* Add a local parameter with initial values (takes the reference to value). */
int loom__module_add_param(loom_module *m, const char *name, loom_tensor *value);
/* Add a local parameter of this shape and dtype without memory (a shell, loom__tensor_shell)
 * and its initialiser: packing gives it its values. */
int loom__module_add_init(loom_module *m, const char *name, loom_dtype dt, int ndim,
                          const int64_t *shape, loom__init init);
/* Make children[0..n) m's children, named names[i] (NULL: "0", "1", ...), dropping their
 * own arenas (pack m, or its root, afterwards). m must have no children yet. Takes the
 * children: on failure they are freed, or owned by m (freed with it). */
int loom__module_adopt(loom_module *m, loom_module **children, size_t n,
                       const char *const *names);
/* A new module of `type` (loom__module_new) with children[0..n) adopted under names; not packed.
 * Takes the children, even on failure. */
int loom__module_compose(const char *type,
                         int (*forward)(loom_module *, loom_tensor *, loom_tensor **),
                         loom_module **children, size_t n, const char *const *names,
                         loom_module **out);
/* Free the arenas and full names a root holds (when it becomes a child, or is freed). */
void loom__module_drop_arenas(loom_module *m);
/* Lay out every parameter of the tree rooted at m in fresh arenas and point the parameters at
 * views of them, with gradients in the gradient arenas: a parameter with data is copied in, a
 * shell gets its initialiser's values. With deferred initialisation on for this thread
 * (loom_nn_set_deferred_init) and no parameter holding data, only names and offsets are set:
 * no arenas, the parameters stay shells, m->deferred. */
int loom__module_pack(loom_module *m);
/* The same, deferring when `defer` (and nothing has data) whatever the thread's setting. */
int loom__module_pack_as(loom_module *m, bool defer);

/* Elements [lo, hi) of p's initial values (its initialiser), as f32 (init.c). */
void loom__init_values(const loom__init *in, size_t lo, size_t hi, float *dst);
/* Elements [lo, hi) of p's initial values into dst, of dtype dt (rounded to nearest even). */
int loom__param_init_into(const loom__param *p, size_t lo, size_t hi, void *dst, loom_dtype dt);
/* A 64-bit hash of the initialisers of root's parameters (every rank's must agree). */
uint64_t loom__module_init_hash(const loom_module *root);

/* Run m's forward with its hooks: what loom_module_forward and containers call for a child. */
int loom__module_run(loom_module *m, loom_tensor *x, loom_tensor **out);
/* Install (hooks NULL: remove) m's forward hooks. */
void loom__module_set_hooks(loom_module *m, const loom__module_hooks *hooks, void *ctx);
/* Give the root's arenas back (FSDP keeps shards instead): every parameter is released
 * (loom__tensor_rebind, no data) and has no gradient; names, offsets and the flat list stay,
 * so parameters can later be pointed at gathered buffers at their offsets. */
void loom__module_release_arenas(loom_module *root);

/* Bare parts of a model: f32 parameters of zeros (to be initialised by the model) and no arenas
 * (the model's root packs them). Linear with bias; LayerNorm over one dim of `dim` with weight
 * and bias; Embedding [num, dim]; Sequential of n children named "0", "1", ... (taken, even on
 * failure, as loom__module_adopt). */
int loom__linear_bare(int64_t in, int64_t out, loom_module **m);
int loom__layer_norm_bare(int64_t dim, double eps, loom_module **m);
int loom__embedding_bare(int64_t num, int64_t dim, loom_module **m);
int loom__sequential_bare(loom_module **children, size_t n, loom_module **m);

/* A GPT-2 block of width dim with `heads` heads (gpt_block.c), not packed: its parameters get
 * their values and arenas from the model that adopts it (gpt.c). */
int loom__gpt_block_create(int64_t dim, int64_t heads, loom_module **out);


#endif
