/* fsdp_ckpt_sets.c: the sets of fsdp_ckpt_sets.h. */
#include "lt.h"
#include "fsdp_ckpt_sets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- helpers ------------------------------------------------------------------------------ */

size_t ck_numel(void) {
  return (size_t)FM_IN * FM_H1 + FM_H1 + (size_t)FM_H1 * FM_H2 + FM_H2 + (size_t)FM_H2 * FM_OUT +
         FM_OUT;
}

void ck_tmp_dir(char *dir, size_t cap) {
  snprintf(dir, cap, "/tmp/loom_fsdp_ckpt_XXXXXX");
  if (!mkdtemp(dir)) dir[0] = 0;
  LT_TRUE(dir[0] != 0);
}

unsigned char *ck_read_all(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc((size_t)len + 1);
  *n = fread(b, 1, (size_t)len, f);
  fclose(f);
  return b;
}

void ck_write_all(const char *path, const void *b, size_t n) {
  FILE *f = fopen(path, "wb");
  LT_TRUE(f != NULL);
  LT_EQ(fwrite(b, 1, n, f), n);
  fclose(f);
}

void ck_rank_file(char *buf, size_t cap, const char *dir, long long gen, int r, int w) {
  snprintf(buf, cap, "%s/gen-%lld/rank-%d-of-%d.safetensors", dir, gen, r, w);
}

/* One rank's training step on rows [s * GB + rank * GB / world, + GB / world): forward (under
 * f16 autocast with mixed precision), loss x the manager's scale, backward, finish, the global
 * overflow check, the optimizer step unless it overflowed. */
int ck_train_step(loom_module *m, loom_fsdp *f, loom_optim *opt, int s, int rank, int world) {
  loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
  float scale = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
  int64_t rows = GB / world;
  int rc = fm_backward(m, (int64_t)s * GB + rank * rows, rows,
                       mp ? LOOM_AUTOCAST_F16 : LOOM_AUTOCAST_OFF, scale, NULL);
  bool overflow = false;
  if (!rc) rc = loom_fsdp_finish(f);
  if (!rc) rc = loom_fsdp_check_overflow(f, &overflow);
  if (!rc && !overflow) rc = loom_optim_step(opt);
  return rc;
}

/* The fsdp's full state into out (rank 0; a collective). */
int ck_full_state(loom_fsdp *f, float *out) {
  loom_named_tensor *st = NULL;
  size_t n = 0;
  int rc = loom_fsdp_full_state(f, &st, &n);
  if (!rc && st && out) fm_flatten_state(st, n, out);
  loom_fsdp_state_free(st, n);
  return rc;
}

void ck_mp_cfg(loom_fsdp_cfg *c, bool f16) {
  *c = loom_fsdp_cfg_default();
  if (!f16) return;
  c->mp = loom_fsdp_mp_cfg_for(LOOM_F16);
  /* growth every 2 clean steps: the saved state has grown once and counted one clean step,
   * so both the scale and the counter must come back for the scales to match step by step */
  c->mp.loss_scale_steps = 2;
}

/* ---- a run: create, [load], [train, save], train ------------------------------------------ */

int ck_job_rank(loom_pg *pg, void *arg) {
  ck_job *j = arg;
  int rank = loom_pg_rank(pg), world = loom_pg_size(pg);
  loom_fsdp_cfg cfg;
  ck_mp_cfg(&cfg, j->f16);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  int rc = fm_setup(pg, j->seed + (uint64_t)rank, &cfg, fm_adam().state_pool, &m, &f, &opt);
  int s = j->first_step;
  if (!rc && j->load_dir) rc = loom_fsdp_load_sharded(f, j->load_dir, opt);
  for (int k = 0; k < j->pre_steps && !rc; k++) rc = ck_train_step(m, f, opt, s++, rank, world);
  if (!rc && j->save_dir) rc = loom_fsdp_save_sharded(f, j->save_dir, opt, j->meta, j->nmeta);
  if (!rc && (j->save_dir || j->load_dir)) {
    rc = ck_full_state(f, rank == 0 ? j->mid : NULL);
    if (rank == 0) {
      j->step_count = loom_optim_step_count(opt);
      loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
      j->scale_mid = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
    }
  }
  for (int k = 0; k < j->post_steps && !rc; k++) {
    rc = ck_train_step(m, f, opt, s++, rank, world);
    loom_fsdp_mp *mp = loom_fsdp_mp_manager(f);
    if (rank == 0 && k < MAXSTEPS) j->scales[k] = mp ? loom_fsdp_mp_current_loss_scale(mp) : 1.0f;
  }
  if (!rc && j->end) rc = ck_full_state(f, rank == 0 ? j->end : NULL);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

float *ck_fbuf(void) { return calloc(ck_numel(), sizeof(float)); }


int ck_loader_rank(loom_pg *pg, void *arg) {
  ck_loader *l = arg;
  int rank = loom_pg_rank(pg), world = loom_pg_size(pg);
  loom_fsdp_cfg cfg = loom_fsdp_cfg_default();
  if (l->list) {
    cfg.wrap = LOOM_FSDP_WRAP_LIST;
    cfg.unit_names = l->list;
    cfg.n_unit_names = l->nlist;
  }
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  int rc = l->sizes ? loom_nn_mlp_create(l->sizes, 4, LOOM_ACT_RELU, LOOM_F32, 9 + rank, &m)
                    : fm_create(9 + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, &cfg, &f);
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs, nseg, &ac, &opt);
  if (!rc && !l->sizes) rc = ck_train_step(m, f, opt, 50, rank, world);
  if (!rc && !l->sizes) rc = ck_full_state(f, rank == 0 ? l->before : NULL);
  if (rc) goto out;
  /* a copy of everything the load may write */
  size_t total = 0, nst = loom_optim_state_count(opt);
  for (size_t u = 0; u < nseg; u++) total += 3 * segs[u].n;
  float *copy = malloc(total * sizeof(float)), *at = copy;
  for (size_t u = 0; u < nseg; u++) {
    memcpy(at, segs[u].param, segs[u].n * sizeof(float));
    at += segs[u].n;
  }
  for (size_t i = 0; i < nst; i++) {
    loom_optim_state st;
    loom_optim_state_at(opt, i, &st);
    memcpy(at, st.data, st.n * sizeof(float));
    at += st.n;
  }
  int64_t steps = loom_optim_step_count(opt);
  loom_clear_error();
  l->rc[rank] = loom_fsdp_load_sharded(f, l->dir, opt);
  snprintf(l->msg[rank], MSG, "%s", loom_last_error());
  bool same = loom_optim_step_count(opt) == steps;
  at = copy;
  for (size_t u = 0; u < nseg; u++) {
    same = same && memcmp(at, segs[u].param, segs[u].n * sizeof(float)) == 0;
    at += segs[u].n;
  }
  for (size_t i = 0; i < nst; i++) {
    loom_optim_state st;
    loom_optim_state_at(opt, i, &st);
    same = same && memcmp(at, st.data, st.n * sizeof(float)) == 0;
    at += st.n;
  }
  l->untouched[rank] = same;
  free(copy);
  if (!l->sizes) rc = ck_full_state(f, rank == 0 ? l->after : NULL);
out:
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

/* Load dir at `world` ranks with the fm model: every rank in `failing` (a bit mask) must fail
 * with `code` (or LOOM_EIO, for `alt_eio`) and a message containing `needle`, its state
 * untouched; returns the ck_loader (caller frees before/after). */
ck_loader ck_try_load(const char *dir, int world, unsigned failing, int code, const char *needle) {
  ck_loader l = {.dir = dir, .before = ck_fbuf(), .after = ck_fbuf()};
  LT_OK(loom_threads_run(world, NULL, ck_loader_rank, &l));
  for (int r = 0; r < world; r++) {
    if (!(failing >> r & 1)) continue;
    if (l.rc[r] != code)
      lt_fail_at(__FILE__, __LINE__, "rank %d of %d: %s, expected %s (%s)", r, world,
                 loom_status_name(l.rc[r]), loom_status_name(code), l.msg[r]);
    else if (!strstr(l.msg[r], needle))
      lt_fail_at(__FILE__, __LINE__, "rank %d of %d: message \"%s\" lacks \"%s\"", r, world,
                 l.msg[r], needle);
    if (!l.untouched[r])
      lt_fail_at(__FILE__, __LINE__, "rank %d of %d: a failed load changed the state", r, world);
  }
  if (failing == (1u << world) - 1 &&
      memcmp(l.before, l.after, ck_numel() * sizeof(float)) != 0)
    lt_fail_at(__FILE__, __LINE__, "%d ranks: the full state changed after a failed load", world);
  return l;
}

void ck_loader_free(ck_loader *l) {
  free(l->before);
  free(l->after);
}

/* Rewrite the checkpoint at path (a valid CRC) with tensor `name`'s element `at` set to v (f32
 * or i64 tensors), or (name NULL) the metadata `key` set to `value`. */
void ck_rewrite(const char *path, const char *name, size_t at, double v, const char *key,
                const char *value) {
  loom_safetensors *f = NULL;
  LT_OK(loom_checkpoint_open(path, &f));
  size_t nt = loom_safetensors_count(f), nm = loom_safetensors_meta_count(f);
  loom_checkpoint_entry *e = calloc(nt, sizeof *e);
  loom_safetensors_meta_kv *kv = calloc(nm, sizeof *kv);
  size_t nkv = 0;
  for (size_t i = 0; i < nt; i++) {
    loom_safetensors_info in;
    LT_OK(loom_safetensors_info_at(f, i, &in));
    e[i] = (loom_checkpoint_entry){.name = in.name, .dtype = in.dtype, .ndim = in.ndim};
    for (int d = 0; d < in.ndim; d++) e[i].shape[d] = in.shape[d];
    e[i].data = malloc(in.nbytes ? in.nbytes : 1);
    memcpy(e[i].data, in.data, in.nbytes);
    if (name && strcmp(in.name, name) == 0 && in.dtype == LOOM_I64) ((int64_t *)e[i].data)[at] = (int64_t)v;
    else if (name && strcmp(in.name, name) == 0) ((float *)e[i].data)[at] = (float)v;
  }
  for (size_t i = 0; i < nm; i++) {
    const char *k, *val;
    LT_OK(loom_safetensors_meta_at(f, i, &k, &val));
    if (strncmp(k, "loom.", 5) == 0) continue;
    kv[nkv++] = (loom_safetensors_meta_kv){k, key && strcmp(k, key) == 0 ? value : val};
  }
  LT_OK(loom_checkpoint_save(path, e, nt, kv, nkv));
  for (size_t i = 0; i < nt; i++) free(e[i].data);
  free(e);
  free(kv);
  loom_safetensors_free(f);
}

void ck_resign(const char *dir, const char *path, int rank) {
  struct stat st;
  LT_TRUE(stat(path, &st) == 0);
  loom_safetensors *nf = NULL;
  LT_OK(loom_checkpoint_open(path, &nf));
  double crc = (double)strtoull(loom_safetensors_meta(nf, "loom.crc32"), NULL, 16);
  loom_safetensors_free(nf);
  char ix[160];
  snprintf(ix, sizeof ix, "%s/fsdp-index.safetensors", dir);
  ck_rewrite(ix, "files", 2 * (size_t)rank, (double)st.st_size, NULL, NULL);
  ck_rewrite(ix, "files", 2 * (size_t)rank + 1, crc, NULL, NULL);
}

void ck_rewrite_rank_file(const char *dir, const char *path, int rank, const char *name,
                          size_t at, float v, const char *key, const char *value) {
  ck_rewrite(path, name, at, v, key, value);
  ck_resign(dir, path, rank);
}
