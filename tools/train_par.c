/* train_par.c: the data-parallel side of `loom train`. One process (pg NULL): nothing to do.
 * With a process group (threads or MPI): the ranks first check that they agree (the same
 * options, then the same data and start step), since ranks that disagree would diverge silently
 * or wait for each other forever; then, with --strategy ddp, the model's parameters are wrapped
 * by DDP (rank 0's initial values broadcast, gradients as bucket views reduced while backward
 * runs), or, with --strategy fsdp, the model is sharded by FSDP (--amp through the FSDP
 * mixed-precision configuration, --offload through its offload configuration:
 * train_offload.c), or, with --strategy hsdp, by FSDP within each group of --shard-size
 * consecutive ranks with the gradient shards all-reduced across the groups (the world split
 * into shard and replica groups); the training step (loom_step in train_run.c) is made over
 * that wrapper.
 * Each rank computes with its share of the machine's cores; the tool's own flags (a loss that
 * is not finite, a signal) are combined over the ranks here. */
#include "train_api.h"

#include <loom/ddp.h>
#include <loom/dist.h>
#include <loom/fsdp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct train_par {
  const train_opts *o;
  loom_pg *pg;
  int rank, size;
  loom_ddp *ddp;
  loom_fsdp *fsdp;
  loom_pg *shard, *replica; /* --strategy hsdp: the groups split from pg */
};

/* ---- ranks that must agree ---------------------------------------------------------------- */

/* One compared value: what is compared (exact), and a phrase about the rank that has it
 * ("has --lr 0.001"). */
#define AGREE_TEXT 192
typedef char agree_text[AGREE_TEXT];
typedef struct agree_entry {
  char value[sizeof ((train_fp_entry *)0)->value];
  agree_text text;
} agree_entry;

/* A compared value as whole words: its text, zero-padded. */
#define AGREE_WORDS ((sizeof ((agree_entry *)0)->value + 7) / 8)
typedef int64_t agree_value[AGREE_WORDS];

/* Compare every rank's e[0..n) with rank 0's: an all-gather of the values themselves (a few
 * hundred bytes, compared exactly); on a difference (which every rank sees alike) an
 * all-gather of the first differing entry's text, and LOOM_EINVAL on every rank naming the
 * lowest rank that differs and both phrases. */
static int agree(loom_pg *pg, const agree_entry *e, int n, const char *hint) {
  int size = loom_pg_size(pg);
  agree_value *mine = calloc((size_t)n, sizeof *mine), *all = calloc((size_t)size * n, sizeof *all);
  char *texts = NULL;
  int rc = mine && all ? LOOM_OK : train_fail(LOOM_ENOMEM, "train: out of memory");
  for (int i = 0; !rc && i < n; i++) /* the text; calloc zeroed the rest */
    memcpy(mine[i], e[i].value, strnlen(e[i].value, sizeof e[i].value));
  if (!rc && (rc = loom_pg_allgather(pg, mine, all, (size_t)n * AGREE_WORDS, LOOM_I64, NULL)))
    train_fail_loom(rc, "comparing the ranks' options");
  int bad = -1, who = -1;
  for (int i = 0; !rc && bad < 0 && i < n; i++)
    for (int r = 1; who < 0 && r < size; r++)
      if (memcmp(all[(size_t)r * n + i], all[i], sizeof *all)) bad = i, who = r;
  if (!rc && bad >= 0) {
    int64_t send[AGREE_TEXT / 8]; /* whole aligned words (the callers zero past the text) */
    memcpy(send, e[bad].text, AGREE_TEXT);
    texts = calloc((size_t)size, AGREE_TEXT);
    if (!texts) rc = train_fail(LOOM_ENOMEM, "train: out of memory");
    else if ((rc = loom_pg_allgather(pg, send, texts, AGREE_TEXT / 8, LOOM_I64, NULL)))
      train_fail_loom(rc, "comparing the ranks' options");
    else
      rc = train_fail(LOOM_EINVAL, "the ranks disagree: rank %d %.*s, rank 0 %.*s (%s)", who,
                      AGREE_TEXT, texts + (size_t)who * AGREE_TEXT, AGREE_TEXT, texts, hint);
  }
  free(texts);
  free(all);
  free(mine);
  return rc;
}

/* The resume fingerprint (the model as built, whatever the spelling of its sizes), then the
 * command line's (o->ranks_fp: every option but the rank-local ones). */
static int agree_options(loom_pg *pg, const train_opts *o, const train_model *m) {
  train_fp_entry fp[TRAIN_FP_MAX];
  int nfp = train_ckpt_fingerprint(o, m, fp), n = nfp + o->nranks_fp;
  agree_entry *e = calloc((size_t)n, sizeof *e);
  if (!e) return train_fail(LOOM_ENOMEM, "train: out of memory");
  for (int i = 0; i < n; i++) {
    const train_fp_entry *f = i < nfp ? &fp[i] : &o->ranks_fp[i - nfp];
    memcpy(e[i].value, f->value, sizeof e[i].value);
    snprintf(e[i].text, sizeof e[i].text, "has %s", f->shown);
  }
  int rc = agree(pg, e, n, "every rank must be started with the same options");
  free(e);
  return rc;
}

int train_par_check_start(train_par *p, int64_t steps_per_epoch, int64_t step) {
  if (!p->pg) return LOOM_OK;
  agree_entry e[2];
  memset(e, 0, sizeof e);
  snprintf(e[0].value, sizeof e[0].value, "%lld", (long long)steps_per_epoch);
  snprintf(e[0].text, sizeof e[0].text, "has %lld steps per epoch", (long long)steps_per_epoch);
  snprintf(e[1].value, sizeof e[1].value, "%lld", (long long)step);
  snprintf(e[1].text, sizeof e[1].text, "starts at step %lld", (long long)step);
  return agree(p->pg, e, 2,
               "every rank must read the same data (--data) and resume from the same "
               "checkpoint (--resume)");
}

/* ---- the group ------------------------------------------------------------------------------ */

int train_par_cfg(const train_opts *o, double timeout, loom_pg_cfg *cfg) {
  *cfg = loom_pg_cfg_default();
  bool group = strcmp(o->strategy, "none") != 0 || strcmp(o->backend, "mpi") == 0;
  if (!group) {
    if (timeout > 0) {
      fprintf(stderr, "loom train: --timeout: only for ranks that wait for each other "
                      "(--strategy ddp or fsdp)\n");
      return -1;
    }
    return 0;
  }
  if (timeout > 0) cfg->timeout_s = timeout;
  if (loom_pg_cfg_validate(cfg)) {
    fprintf(stderr, "loom train: %s\n", loom_last_error());
    return -1;
  }
  return 0;
}

/* FSDP over the model with the options' policy, resharding, prefetch and offload; --amp bf16|f16 is the
 * specification's mixed precision for that dtype (bf16 without loss scaling, f16 with the
 * dynamic scale starting at --loss-scale; --scaler off turns it off). */
static int make_fsdp(loom_pg *pg, loom_pg *replica, const train_opts *o, train_model *m,
                     loom_fsdp **out) {
  loom_fsdp_cfg c = loom_fsdp_cfg_default();
  c.replica_pg = replica;
  c.wrap = strcmp(o->wrap, "size") == 0 ? LOOM_FSDP_WRAP_SIZE : LOOM_FSDP_WRAP_CHILDREN;
  c.min_unit_numel = (size_t)o->unit_min;
  c.reshard_after_forward = strcmp(o->reshard, "yes") == 0;
  c.forward_prefetch = c.backward_prefetch = (int)o->gather_prefetch;
  train_offload_cfg(o, &c.offload);
  c.optim_in_backward = o->optim_in_backward;
  loom_dtype dt = LOOM_F32;
  if (strcmp(o->amp, "off") != 0 && loom_dtype_parse(o->amp, &dt) == LOOM_OK) {
    c.mp = loom_fsdp_mp_cfg_for(dt);
    c.mp.use_loss_scaling = strcmp(o->scaler, "dynamic") == 0;
    if (c.mp.use_loss_scaling) {
      c.mp.initial_loss_scale = (float)o->loss_scale;
      if (c.mp.max_loss_scale < c.mp.initial_loss_scale) c.mp.max_loss_scale = c.mp.initial_loss_scale;
    }
  }
  int rc = loom_fsdp_create(pg, m->root, &c, out);
  return rc ? train_fail_loom(rc, replica ? "--strategy hsdp" : "--strategy fsdp") : LOOM_OK;
}

/* --strategy hsdp: the shard groups (ranks r with the same r / shard_size) and the replica
 * groups (the same r % shard_size) split from the world. */
static int make_hsdp_groups(train_par *p) {
  long n = p->o->shard_size;
  if (p->size % n)
    return train_fail(LOOM_EINVAL, "--shard-size %ld: it must divide the %d ranks (every shard "
                      "group has the same size)", n, p->size);
  int rc = loom_pg_split(p->pg, (int)(p->rank / n), p->rank, &p->shard);
  if (!rc) rc = loom_pg_split(p->pg, (int)(p->rank % n), p->rank, &p->replica);
  return rc ? train_fail_loom(rc, "--strategy hsdp: making the shard and replica groups") : 0;
}

int train_par_create(loom_pg *pg, const train_opts *o, train_model *m, train_par **out) {
  *out = NULL;
  train_par *p = calloc(1, sizeof *p);
  if (!p) return train_fail(LOOM_ENOMEM, "train: out of memory");
  p->o = o;
  p->size = 1;
  if (pg) {
    p->pg = pg;
    p->rank = loom_pg_rank(pg);
    p->size = loom_pg_size(pg);
    int rc = agree_options(pg, o, m);
    if (rc) {
      free(p);
      return rc;
    }
    if (o->threads <= 0) loom_set_num_threads(loom_pg_compute_threads(pg));
    bool hsdp = strcmp(o->strategy, "hsdp") == 0;
    if (hsdp || strcmp(o->strategy, "fsdp") == 0) {
      if ((hsdp && (rc = make_hsdp_groups(p))) ||
          (rc = make_fsdp(hsdp ? p->shard : pg, p->replica, o, m, &p->fsdp))) {
        train_par_free(p);
        return rc;
      }
      *out = p;
      return LOOM_OK;
    }
    loom_tensor **params = calloc(m->nparams ? m->nparams : 1, sizeof *params);
    const char **names = calloc(m->nparams ? m->nparams : 1, sizeof *names);
    rc = params && names ? LOOM_OK : LOOM_ENOMEM;
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
  loom_fsdp_free(p->fsdp);
  loom_ddp_free(p->ddp);
  loom_pg_free(p->replica);
  loom_pg_free(p->shard);
  free(p);
}

int train_par_rank(const train_par *p) { return p->rank; }
int train_par_size(const train_par *p) { return p->size; }

loom_ddp *train_par_ddp(const train_par *p) { return p ? p->ddp : NULL; }
loom_fsdp *train_par_fsdp(const train_par *p) { return p ? p->fsdp : NULL; }

int train_par_any(train_par *p, bool local, bool *global) {
  if (p->fsdp) return loom_fsdp_any(p->fsdp, local, global);
  if (p->ddp) return loom_ddp_any(p->ddp, local, global);
  *global = local;
  return LOOM_OK;
}

void train_par_json(const train_par *p, char *buf, size_t cap) {
  if (cap) buf[0] = '\0';
  loom_pool_stats mem = {0};
  int n = 0;
  if (p->pg && !loom_mem_account_stats(loom_mem_account(), LOOM_POOL_COMPUTE, &mem))
    n = snprintf(buf, cap, "\"rank_compute_bytes\": %zu, \"rank_compute_peak_bytes\": %zu",
                 mem.current_bytes, mem.peak_bytes);
  if (n < 0 || (size_t)n >= cap) return;
  const char *sep = n ? ", " : "";
  loom_fsdp_stats f;
  if (p->fsdp && !loom_fsdp_stats_get(p->fsdp, &f)) {
    int m = snprintf(buf + n, cap - (size_t)n,
             "%s\"fsdp_units\": %zu, \"fsdp_shard_elements\": %zu, \"fsdp_gathers\": %llu, "
             "\"fsdp_reduce_scatters\": %llu, \"fsdp_gather_bytes\": %llu, "
             "\"fsdp_reduce_bytes\": %llu, \"fsdp_comm_s\": %.6f, \"fsdp_exposed_s\": %.6f, "
             "\"fsdp_exposed_gather_s\": %.6f, \"fsdp_exposed_end_s\": %.6f",
             sep, f.units, f.shard_numel, (unsigned long long)f.gathers,
             (unsigned long long)f.reduce_scatters, (unsigned long long)f.gather_bytes,
             (unsigned long long)f.reduce_bytes, f.comm_s, f.exposed_s, f.exposed_gather_s,
             f.exposed_end_s);
    size_t used = (size_t)n + (size_t)(m > 0 ? m : 0);
    if (m > 0 && used < cap && p->replica) {
      int k = snprintf(buf + used, cap - used, ", \"hsdp_replica_reduces\": %llu, "
                       "\"hsdp_replica_bytes\": %llu", (unsigned long long)f.replica_reduces,
                       (unsigned long long)f.replica_bytes);
      if (k > 0) used += (size_t)k;
    }
    if (m > 0 && used < cap) train_offload_json(p->o, &f, buf + used, cap - used);
    return;
  }
  loom_ddp_stats s;
  if (!p->ddp || loom_ddp_stats_get(p->ddp, &s)) return;
  snprintf(buf + n, cap - (size_t)n,
           "%s\"ddp_buckets\": %zu, \"ddp_collectives\": %llu, \"ddp_bytes\": %llu, "
           "\"ddp_comm_s\": %.6f, \"ddp_exposed_s\": %.6f, \"ddp_last_exposed_s\": %.6f",
           sep, s.buckets, (unsigned long long)s.collectives, (unsigned long long)s.bytes, s.comm_s,
           s.exposed_s, s.last_exposed_s);
}
