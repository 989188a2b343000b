/* fsdp_ckpt_load.c: loading a sharded checkpoint (the set's format: fsdp_ckpt.c), onto any
 * world size: the index opened and checked, each old rank's file opened when a new shard first
 * needs it and checked against the index, every value checked before any is placed, then each
 * new shard's part of every old shard read straight to where it lives (offloaded kinds through
 * loom__fsdp_stream into their tier). Also a set's metadata (loom_fsdp_sharded_meta). */
#include "fsdp/fsdp_ckpt_int.h"
#include "fsdp/offload_store.h"
#include "io/io_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- load -------------------------------------------------------------------------------- */

typedef struct old_set {
  loom_safetensors *index;
  int world;
  int64_t gen;
  int64_t step;       /* the optimizer step every file must hold; -1 until known */
  bool has_step;      /* the index records it (and its files their generation) */
  const loom_param_seg *segs; /* the units' tensor names (the model's, matched to the index) */
  size_t nunits;
  const int64_t *units; /* numel, shard per unit */
  const int64_t *files; /* size, crc per rank */
  loom_safetensors **open; /* per old rank, opened when needed */
} old_set;

static int open_index(const char *dir, old_set *s) {
  char path[4096];
  loom__fsdp_ckpt_index_path(dir, path, sizeof path);
  int rc = loom_checkpoint_open(path, &s->index);
  if (rc) return rc;
  const char *fmt = loom_safetensors_meta(s->index, "fsdp.format");
  if (!fmt || strcmp(fmt, FSDP_CKPT_FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is not a sharded checkpoint index (%s)",
                      path, fmt ? fmt : "no fsdp.format");
  int64_t w = 0, n = 0;
  rc = loom__fsdp_ckpt_count(s->index, path, "fsdp.world", 1 << 20, true, &w);
  if (!rc)
    rc = loom__fsdp_ckpt_count(s->index, path, "fsdp.generation",
                               FSDP_CKPT_MAX_COUNT, true, &s->gen);
  if (!rc) rc = loom__fsdp_ckpt_count(s->index, path, "fsdp.units", 1 << 20, true, &n);
  s->step = -1;
  if (!rc)
    rc = loom__fsdp_ckpt_count(s->index, path, "fsdp.step", FSDP_CKPT_MAX_COUNT, false, &s->step);
  s->has_step = rc == LOOM_OK; /* absent from the sets saved before it was written */
  if (rc == LOOM_ENOTFOUND) rc = LOOM_OK;
  if (rc) return rc;
  if (w < 1)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s: world %lld out of range", path,
                      (long long)w);
  s->world = (int)w;
  s->nunits = (size_t)n;
  loom_safetensors_info ui, fi;
  rc = loom_safetensors_find(s->index, "units", &ui);
  if (!rc) rc = loom_safetensors_find(s->index, "files", &fi);
  if (rc) return rc;
  if (ui.dtype != LOOM_I64 || ui.numel != 2 * s->nunits || fi.dtype != LOOM_I64 ||
      fi.numel != 2 * (size_t)s->world)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s: its units or files table does not "
                      "match its counts", path);
  s->units = ui.data;
  s->files = fi.data;
  s->open = calloc((size_t)s->world, sizeof *s->open);
  return s->open ? LOOM_OK : loom__fail(LOOM_ENOMEM, "fsdp checkpoint: out of memory");
}

static void close_set(old_set *s) {
  for (int r = 0; s->open && r < s->world; r++) loom_safetensors_free(s->open[r]);
  free(s->open);
  loom_safetensors_free(s->index);
}

/* Rank r's file fl (at path), already the file the index names by size and CRC, checked to be
 * rank r's of this save: its rank, world, generation and optimizer step those of the index (the
 * step: the index's, or for older sets the first file's), every unit's flat parameter there as
 * f32 of the index's shard length. */
static int check_rank_file(const char *path, old_set *s, int r, const loom_safetensors *fl) {
  const char *fmt = loom_safetensors_meta(fl, "fsdp.format");
  if (!fmt || strcmp(fmt, FSDP_CKPT_FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is not a sharded checkpoint's rank "
                      "file (%s)", path, fmt ? fmt : "no fsdp.format");
  int64_t rank = 0, world = 0, gen = s->gen, step = 0;
  int rc = loom__fsdp_ckpt_count(fl, path, "fsdp.rank", 1 << 20, true, &rank);
  if (!rc) rc = loom__fsdp_ckpt_count(fl, path, "fsdp.world", 1 << 20, true, &world);
  if (!rc)
    rc = loom__fsdp_ckpt_count(fl, path, "fsdp.generation", FSDP_CKPT_MAX_COUNT, s->has_step, &gen);
  if (rc == LOOM_ENOTFOUND) rc = LOOM_OK; /* an older set's file */
  if (!rc) rc = loom__fsdp_ckpt_count(fl, path, "optim.step", FSDP_CKPT_MAX_COUNT, true, &step);
  if (rc) return rc;
  if (rank != r || world != s->world)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is the file of rank %lld of %lld; the "
                      "index puts it at rank %d of %d", path, (long long)rank, (long long)world,
                      r, s->world);
  if (gen != s->gen)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s was saved as generation %lld; the index "
                      "is of generation %lld", path, (long long)gen, (long long)s->gen);
  if (s->step >= 0 && step != s->step)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is of optimizer step %lld; %s says %lld",
                      path, (long long)step, s->has_step ? "the index" : "the first rank file",
                      (long long)s->step);
  s->step = step;
  for (size_t u = 0; u < s->nunits && s->segs; u++) {
    loom_safetensors_info in = {0};
    size_t sh = (size_t)s->units[2 * u + 1];
    if (loom_safetensors_find(fl, s->segs[u].name, &in) != LOOM_OK)
      return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s has no %s (unit %zu of the index)",
                        path, s->segs[u].name, u);
    if (in.dtype != LOOM_F32 || in.numel != sh)
      return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s: %s is %s of %zu elements; the index "
                        "says f32 of %zu", path, s->segs[u].name, loom_dtype_name(in.dtype),
                        in.numel, sh);
  }
  return LOOM_OK;
}

static int old_file(const char *dir, old_set *s, int r, loom_safetensors **out) {
  if (s->open[r]) {
    *out = s->open[r];
    return LOOM_OK;
  }
  char path[4200];
  loom__fsdp_ckpt_rank_path(dir, s->gen, r, s->world, path, sizeof path);
  int64_t size = 0, crc = 0;
  loom_safetensors *fl = NULL;
  int rc = loom__fsdp_ckpt_open(path, &fl, &size, &crc);
  if (!rc && (size != s->files[2 * r] || crc != s->files[2 * r + 1]))
    rc = loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is not the file the index names (size "
                    "%lld, CRC %08llx; the index says %lld, %08llx)", path, (long long)size,
                    (unsigned long long)crc, (long long)s->files[2 * r],
                    (unsigned long long)s->files[2 * r + 1]);
  if (!rc) rc = check_rank_file(path, s, r, fl);
  if (rc) loom_safetensors_free(fl);
  else s->open[r] = fl;
  *out = s->open[r];
  return rc;
}

/* dst[0..len) = elements [lo, lo + len) of the flat tensor `name` (unit u's, padded layout),
 * read from the old ranks' files that hold them; beyond the old numel: zeros. dst == NULL
 * only checks: that each of those files is the one the index names, holds `name` as f32 of
 * the old shard's length, and (checks) that its values pass loom_safetensors_check_values. */
static int read_range(const char *dir, old_set *s, size_t u, const char *name, size_t lo,
                      size_t len, float *dst, unsigned checks) {
  size_t numel = (size_t)s->units[2 * u], sh = (size_t)s->units[2 * u + 1];
  if (dst) memset(dst, 0, len * sizeof *dst);
  size_t hi = lo + len < numel ? lo + len : numel;
  for (size_t at = lo; at < hi;) {
    int r = (int)(at / sh);
    size_t end = ((size_t)r + 1) * sh < hi ? ((size_t)r + 1) * sh : hi;
    loom_safetensors *fl = NULL;
    int rc = old_file(dir, s, r, &fl);
    loom_safetensors_info in = {0};
    if (!rc) rc = loom_safetensors_find(fl, name, &in);
    if (!rc && (in.dtype != LOOM_F32 || in.numel != sh))
      rc = loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s in rank %d's file is %s of %zu "
                      "elements, expected f32 of %zu", name, r, loom_dtype_name(in.dtype),
                      in.numel, sh);
    if (!rc && checks) rc = loom_safetensors_check_values(fl, name, checks);
    if (rc) return rc;
    if (dst)
      memcpy(dst + (at - lo), (const float *)in.data + (at - (size_t)r * sh),
             (end - at) * sizeof(float));
    at = end;
  }
  return LOOM_OK;
}

/* The unit of optimizer state i (the order loom_fsdp_segments gives: per states for each
 * segment), checked against its name and length. */
static int state_unit(const loom_fsdp *f, const loom_optim *opt, size_t i, loom_optim_state *st,
                      size_t *unit) {
  int rc = loom_optim_state_at(opt, i, st);
  if (rc) return rc;
  size_t u = f->nunits;
  for (size_t k = 0; k < f->nunits && u == f->nunits; k++) {
    size_t L = strlen(f->segs[k].name);
    if (strncmp(st->name, f->segs[k].name, L) == 0 && st->name[L] == '.') u = k;
  }
  if (u == f->nunits || st->n != f->units[u].shard)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_load_sharded: optimizer state %s is not over this "
                      "FSDP's segments", st->name);
  *unit = u;
  return LOOM_OK;
}

/* Every value this rank will read, checked before anything changes: the files, the names,
 * the lengths and the values (finite; second moments not negative). */
static int check_all(const char *dir, old_set *s, const loom_fsdp *f, const loom_optim *opt) {
  int rc = LOOM_OK;
  for (size_t u = 0; u < f->nunits && !rc; u++)
    rc = read_range(dir, s, u, f->segs[u].name, (size_t)f->rank * f->units[u].shard,
                    f->units[u].shard, NULL, LOOM_CHECK_FINITE);
  size_t nstate = opt ? loom_optim_state_count(opt) : 0;
  for (size_t i = 0; i < nstate && !rc; i++) {
    loom_optim_state st;
    size_t u = 0;
    if ((rc = state_unit(f, opt, i, &st, &u))) break;
    unsigned checks = LOOM_CHECK_FINITE;
    if (strstr(st.name, "exp_avg_sq")) checks |= LOOM_CHECK_NONNEG;
    rc = read_range(dir, s, u, st.name, (size_t)f->rank * st.n, st.n, NULL, checks);
  }
  return rc;
}

/* The commit, after check_all: every value read straight into where it lives. */
typedef struct load_ctx {
  const char *dir;
  old_set *s;
  const loom_fsdp *f;
  const loom_optim *opt;
} load_ctx;

/* Elements [at, at + n) of unit u's shard: each kind the pass writes (k[kind] not NULL). */
static int load_chunk(void *ctx, fsdp_unit *u, size_t at, size_t n, float *k[OFF_KINDS]) {
  load_ctx *c = ctx;
  size_t lo = (size_t)c->f->rank * u->shard + at;
  int rc = LOOM_OK;
  if (k[OFF_PARAM])
    rc = read_range(c->dir, c->s, u->index, c->f->segs[u->index].name, lo, n, k[OFF_PARAM], 0);
  size_t per = c->opt ? loom_optim_state_per_segment(c->opt) : 0;
  for (size_t j = 0; j < per && !rc; j++) { /* the optimizer is over loom_fsdp_segments here */
    loom_optim_state st;
    if (!k[OFF_STATE + (int)j]) continue;
    rc = loom_optim_state_at(c->opt, u->index * per + j, &st);
    if (!rc) rc = read_range(c->dir, c->s, u->index, st.name, lo, n, k[OFF_STATE + (int)j], 0);
  }
  return rc;
}

/* The kinds offloaded go first, through loom__fsdp_stream chunk by chunk into the tier (each
 * unit's bytes are sent out to it beforehand, so the pass writes nothing in place but the host
 * tier's own buffers; the disk tier's writes go to the other slot set, switched only once every
 * chunk is in); the optimizer must then be over every segment, as its step needs. Then the
 * kinds that stay in memory (no offload, or that kind's flag off), straight into the shards and
 * the optimizer's buffers (it may cover only some of the segments): after check_all, those
 * reads cannot fail, so a failure leaves everything as it was. */
static int commit_all(const char *dir, old_set *s, loom_fsdp *f, loom_optim *opt) {
  load_ctx c = {dir, s, f, opt};
  size_t per = opt ? loom_optim_state_per_segment(opt) : 0;
  unsigned states = per == 2 ? 3u << OFF_STATE : per == 1 ? 1u << OFF_STATE : 0, tier = 0;
  if (loom__fsdp_offloading(f, OFF_PARAM)) tier |= 1u << OFF_PARAM;
  if (loom__fsdp_offloading(f, OFF_STATE)) tier |= states;
  int rc = LOOM_OK;
  if (tier && !(rc = loom__fsdp_settle_all(f)) && !(rc = loom__fsdp_offload_all(f, opt, false)))
    rc = loom__fsdp_stream(f, opt, 0, tier, load_chunk, &c);
  for (size_t u = 0; u < f->nunits && !rc && !(tier & (1u << OFF_PARAM)); u++)
    rc = read_range(dir, s, u, f->segs[u].name, (size_t)f->rank * f->units[u].shard,
                    f->units[u].shard, f->units[u].param_shard, 0);
  size_t nstate = opt && !(tier & states) ? loom_optim_state_count(opt) : 0;
  for (size_t i = 0; i < nstate && !rc; i++) {
    loom_optim_state st;
    size_t u = 0;
    if (!(rc = state_unit(f, opt, i, &st, &u)))
      rc = read_range(dir, s, u, st.name, (size_t)f->rank * st.n, st.n, st.data, 0);
  }
  return rc;
}

int loom_fsdp_load_sharded(loom_fsdp *f, const char *dir, loom_optim *opt) {
  static const char *who = "loom_fsdp_load_sharded";
  if (!f || !dir) return loom__fail(LOOM_EINVAL, "%s: fsdp or dir is NULL", who);
  if (f->in_step) return loom__fail(LOOM_EMISUSE, "%s: a backward is running", who);
  int rc_step = loom__fsdp_step_join(f); /* the last optimizer step, whole, or its failure */
  if (rc_step) return rc_step;
  if (opt && loom__fsdp_offloading(f, OFF_STATE)) { /* its state streams unit by unit */
    int rc = loom__fsdp_check_optim(f, opt, who);
    if (rc) return rc;
  }
  old_set s = {0};
  int rc = open_index(dir, &s);
  /* unit by unit, so that the message names the first unit that differs, even when the
   * counts differ too (another wrap policy) */
  size_t common = s.nunits < f->nunits ? s.nunits : f->nunits;
  for (size_t u = 0; u <= common && !rc; u++) {
    char key[32];
    const char *name = NULL;
    if (u < s.nunits) {
      snprintf(key, sizeof key, "fsdp.unit.%zu", u);
      name = loom_safetensors_meta(s.index, key);
    }
    if (u == common) {
      if (s.nunits != f->nunits)
        rc = loom__fail(LOOM_EINVAL, "%s: the checkpoint in %s has %zu unit%s, this model %zu: "
                        "unit %zu is '%s' %s", who, dir, s.nunits, loom__fsdp_plural(s.nunits),
                        f->nunits, u,
                        u < s.nunits ? (name ? loom__fsdp_unit_shown(name) : "?")
                                     : loom__fsdp_unit_shown(f->units[u].name),
                        u < s.nunits ? "in the checkpoint only" : "in this model only");
    } else if (!name || strcmp(name, f->units[u].name) != 0 ||
               (size_t)s.units[2 * u] != f->units[u].numel) {
      rc = loom__fail(LOOM_EINVAL, "%s: unit %zu is '%s' of %zu elements here, '%s' of %lld in "
                      "the checkpoint%s", who, u, loom__fsdp_unit_shown(f->units[u].name),
                      f->units[u].numel, name ? loom__fsdp_unit_shown(name) : "?", (long long)s.units[2 * u],
                      s.nunits != f->nunits ? " (which has another number of units: is the "
                                              "wrap policy the same?)" : "");
    } else if (s.units[2 * u + 1] < 0 || (s.units[2 * u + 1] == 0 && f->units[u].numel) ||
               (size_t)s.units[2 * u + 1] * (size_t)s.world < f->units[u].numel) {
      rc = loom__fail(LOOM_EFORMAT, "%s: unit %zu's shard length %lld in the index is wrong",
                      who, u, (long long)s.units[2 * u + 1]);
    }
  }
  /* check everything, then commit: nothing changes unless all of it reads. No copy of the
   * rank's state is staged (the files are mapped, and with offload that state may be larger
   * than the memory the run has). Rank 0's file first: it holds the step and the scaler. */
  s.segs = f->segs;
  loom_safetensors *f0 = NULL;
  if (!rc) rc = old_file(dir, &s, 0, &f0);
  if (!rc) rc = check_all(dir, &s, f, opt);
  int64_t step = opt ? s.step : 0;
  loom_scaler_state sst, before;
  loom_scaler *sc = f->mp ? loom_fsdp_mp_scaler(f->mp) : NULL;
  if (!rc && sc) {
    int64_t words[LOOM_SCALER_STATE_WORDS];
    int64_t shape = LOOM_SCALER_STATE_WORDS;
    rc = loom_safetensors_read(f0, "amp.scaler", LOOM_I64, 1, &shape, words);
    if (!rc) rc = loom_scaler_state_unpack(words, &sst);
  }
  /* commit: the scaler first (it may refuse the state; it is put back should the shards fail
   * to go in), then the shards, which fail as a whole or not at all */
  int64_t old_step = opt ? loom_optim_step_count(opt) : 0;
  if (!rc && opt) rc = loom_optim_set_step_count(opt, step);
  if (!rc && sc && !(rc = loom_scaler_save(sc, &before))) rc = loom_scaler_restore(sc, &sst);
  if (rc && opt) (void)loom_optim_set_step_count(opt, old_step);
  if (!rc) {
    rc = commit_all(dir, &s, f, opt);
    if (rc && opt) (void)loom_optim_set_step_count(opt, old_step);
    if (rc && sc) {
      loom__fsdp_err e;
      loom__fsdp_err_save(&e, rc);
      (void)loom_scaler_restore(sc, &before); /* a state it held: accepted */
      rc = loom__fsdp_err_restore(&e);
    }
  }
  close_set(&s);
  return rc;
}

int loom_fsdp_sharded_meta(const char *dir, const char *key, char *buf, size_t cap) {
  if (!dir || !key || !buf || !cap)
    return loom__fail(LOOM_EINVAL, "loom_fsdp_sharded_meta: NULL argument");
  char path[4096];
  loom__fsdp_ckpt_index_path(dir, path, sizeof path);
  loom_safetensors *ix = NULL;
  int rc = loom_checkpoint_open(path, &ix);
  const char *v = rc ? NULL : loom_safetensors_meta(ix, key);
  if (!rc && !v) rc = loom__fail(LOOM_ENOTFOUND, "%s has no metadata '%s'", path, key);
  if (!rc && strlen(v) >= cap) rc = loom__fail(LOOM_EINVAL, "%s: metadata '%s' is longer than "
                                               "the buffer", path, key);
  if (!rc) snprintf(buf, cap, "%s", v);
  loom_safetensors_free(ix);
  return rc;
}
