/* train_par.c: the data-parallel side of `loom train`'s step. One process (pg NULL): nothing to
 * do. Process groups and DDP are not in this build yet: a group is refused with LOOM_ENOSYS. */
#include "train_api.h"

#include <stdlib.h>

struct train_par {
  int rank, size;
};

int train_par_create(loom_pg *pg, const train_opts *o, train_model *m, train_par **out) {
  (void)o, (void)m;
  *out = NULL;
  if (pg) return train_fail(LOOM_ENOSYS, "--ranks: data parallelism is not in this build");
  train_par *p = calloc(1, sizeof *p);
  if (!p) return train_fail(LOOM_ENOMEM, "train: out of memory");
  p->size = 1;
  *out = p;
  return LOOM_OK;
}

void train_par_free(train_par *p) { free(p); }
int train_par_rank(const train_par *p) { return p->rank; }
int train_par_size(const train_par *p) { return p->size; }
int train_par_finish(train_par *p) { return (void)p, LOOM_OK; }

int train_par_any(train_par *p, bool local, bool *global) {
  (void)p;
  *global = local;
  return LOOM_OK;
}

void train_par_json(const train_par *p, char *buf, size_t cap) {
  (void)p;
  if (cap) buf[0] = '\0';
}
