/* fsdp_int.h: the FSDP wrapper's structs, shared by the fsdp files (private to loom):
 * fsdp.c (create, free, configuration, peers, segments, statistics), fsdp_units.c (wrap
 * policies and flat layouts), fsdp_gather.c (gather, reshard, the parameters' views),
 * fsdp_hooks.c (forward and backward hooks, reduce-scatter, finish, no_sync), fsdp_amp.c (the
 * specification's integration: overflow, loss scale), fsdp_state.c (full state dict) and
 * fsdp_ckpt.c (sharded checkpoints). */
#ifndef LOOM_FSDP_INT_H
#define LOOM_FSDP_INT_H

#include "autograd/autograd_int.h"
#include "core/tensor_int.h"
#include "loom/autograd.h"
#include "loom/fsdp.h"
#include "nn/nn_int.h"

typedef enum unit_state { UNIT_RESHARDED = 0, UNIT_GATHERING = 1, UNIT_GATHERED = 2 } unit_state;

typedef struct fsdp_unit fsdp_unit;

/* A parameter of a unit: the module's parameter and where it sits in the unit's flat layout. */
typedef struct fsdp_param {
  loom__param *p;    /* the module's parameter (value retained by the fsdp) */
  size_t offset;     /* element offset in the unit's flat parameter (16-element aligned) */
  size_t numel;
  size_t index;      /* position in the module's parameter list */
  fsdp_unit *unit;
  int hook_id;
  bool ready;        /* its gradient is complete in this backward */
} fsdp_param;

struct fsdp_unit {
  loom_fsdp *f;
  size_t index;
  loom_module *module;   /* borrowed */
  char *name;            /* dotted module name ("" for the root) */
  fsdp_param *params;
  size_t nparams;
  size_t numel, padded, shard; /* flat elements, padded to the world size, per rank */
  float *param_shard;    /* shard elements, this rank's part (compute pool) */
  float *grad_shard;
  /* gathering */
  unit_state state;
  loom_dtype gathered_dtype;
  loom_tensor *gathered; /* padded elements of gathered_dtype, while gathered */
  void *send;            /* the cast shard on loan to the all-gather (NULL when f32) */
  loom_work *gather_work;
  double gather_issued;
  /* backward */
  bool in_backward;      /* its pre-backward ran in this backward */
  bool reduced;          /* its reduce-scatter was issued (or, with sync off, the gradient kept) */
  size_t pending;        /* parameters whose gradient is not complete yet */
  loom_tensor *full_grad; /* padded f32: the local gradient, while it exists */
  loom_work *rs_work;
  double rs_issued;
  loom_autocast_token autocast; /* the unit's own autocast region in forward (mixed precision) */
  bool autocast_on;
};

struct loom_fsdp {
  loom_pg *pg;
  int rank, world;
  loom_module *root;
  loom_fsdp_cfg cfg;
  char **unit_names;     /* cfg.unit_names copied */
  fsdp_unit *units;
  size_t nunits;
  fsdp_param **by_index; /* the module's parameter i -> its fsdp_param */
  size_t nparams;
  loom_param_seg *segs;
  char **seg_names;
  loom_fsdp_mp *mp;      /* NULL without mixed precision */
  loom_dtype fwd_dtype;  /* the dtype units are gathered in for forward and backward */
  size_t *order;         /* units in the order they finished forward (backward runs it back) */
  size_t n_order;
  bool order_closed;     /* a backward began since: the next forward records afresh */
  size_t cache_reserved; /* bytes this wrapper added to the allocator cache's limit */
  bool sync;
  bool in_step;
  int step_status;
  loom_fsdp_stats stats;
};

/* fsdp_units.c: cut the module into units by cfg's policy and lay out each unit's flat
 * parameter; fills f->units, f->nunits, f->by_index, f->nparams. */
int loom__fsdp_make_units(loom_fsdp *f);
void loom__fsdp_free_units(loom_fsdp *f);

/* fsdp_gather.c */
int loom__fsdp_issue_gather(fsdp_unit *u, loom_dtype dt);
int loom__fsdp_wait_gather(fsdp_unit *u);
int loom__fsdp_reshard(fsdp_unit *u);
/* The unit's parameters as views of the gathered buffer. */
int loom__fsdp_bind_params(fsdp_unit *u);

/* fsdp_hooks.c */
int loom__fsdp_install_hooks(loom_fsdp *f);
void loom__fsdp_remove_hooks(loom_fsdp *f);
/* Wait for the unit's reduce-scatter and drop its local gradient. */
int loom__fsdp_reap(fsdp_unit *u);

double loom__fsdp_now(void);

#endif
