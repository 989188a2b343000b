/* train_par.c: the data-parallel side of `loom train`'s step. One process (pg NULL): nothing to
 * do. With a process group and --strategy ddp: the model's parameters are wrapped by DDP
 * (rank 0's initial values broadcast, gradients as bucket views reduced while backward runs),
 * each rank computes with its share of the machine's cores, and the AMP overflow flag is
 * combined over the ranks. */
#include "train_api.h"

#include <loom/ddp.h>
#include <loom/dist.h>
#include <stdlib.h>
#include <string.h>

struct train_par {
  int rank, size;
  loom_ddp *ddp;
};

int train_par_create(loom_pg *pg, const train_opts *o, train_model *m, train_par **out) {
  *out = NULL;
  train_par *p = calloc(1, sizeof *p);
  if (!p) return train_fail(LOOM_ENOMEM, "train: out of memory");
  p->size = 1;
  if (pg) {
    p->rank = loom_pg_rank(pg);
    p->size = loom_pg_size(pg);
    if (o->threads <= 0) loom_set_num_threads(loom_pg_compute_threads(pg));
    loom_tensor **params = calloc(m->nparams ? m->nparams : 1, sizeof *params);
    const char **names = calloc(m->nparams ? m->nparams : 1, sizeof *names);
    int rc = params && names ? LOOM_OK : LOOM_ENOMEM;
    for (size_t i = 0; !rc && i < m->nparams; i++) {
      params[i] = m->params[i].value;
      names[i] = m->params[i].name;
    }
    if (!rc) rc = loom_ddp_create(pg, params, names, m->nparams, NULL, &p->ddp);
    free(params);
    free(names);
    if (rc) {
      free(p);
      return train_fail_loom(rc, "--strategy ddp");
    }
  }
  *out = p;
  return LOOM_OK;
}

void train_par_free(train_par *p) {
  if (!p) return;
  loom_ddp_free(p->ddp);
  free(p);
}

int train_par_rank(const train_par *p) { return p->rank; }
int train_par_size(const train_par *p) { return p->size; }

int train_par_finish(train_par *p) { return p->ddp ? loom_ddp_finish(p->ddp) : LOOM_OK; }

int train_par_any(train_par *p, bool local, bool *global) {
  if (p->ddp) return loom_ddp_any(p->ddp, local, global);
  *global = local;
  return LOOM_OK;
}

void train_par_json(const train_par *p, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  loom_ddp_stats s;
  if (!p->ddp || loom_ddp_stats_get(p->ddp, &s)) return;
  snprintf(buf, cap,
           "\"ddp_buckets\": %zu, \"ddp_collectives\": %llu, \"ddp_bytes\": %llu, "
           "\"ddp_comm_s\": %.6f, \"ddp_exposed_s\": %.6f, \"ddp_last_exposed_s\": %.6f",
           s.buckets, (unsigned long long)s.collectives, (unsigned long long)s.bytes, s.comm_s,
           s.exposed_s, s.last_exposed_s);
}
