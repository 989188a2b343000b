/* fsdp_ckpt.c: sharded checkpoints. A set is a folder:
 *   dir/gen-G/rank-R-of-N.safetensors   each rank's shards: "<unit>.flat_param" (f32, the
 *                                        shard), the optimizer's state for it
 *                                        ("<unit>.flat_param.exp_avg", ...), "amp.scaler"
 *                                        (the loss scale, when there is one); metadata the
 *                                        optimizer's step count, rank, world size, generation
 *   dir/fsdp-index.safetensors          the commit point: world size, generation, optimizer
 *                                        step, every unit's name (metadata), numel and shard
 *                                        length, every rank file's size and CRC-32, the
 *                                        caller's metadata
 * All of them are loom checkpoints (checkpoint/2: a CRC over every byte, written atomically).
 * A save first removes what killed saves left (the index's temporaries, generations the index
 * does not name), writes a new generation, then the index, then removes older generations:
 * until the index is renamed into place the previous set is the one a load finds. A load reads
 * the parts of the old shards that its new shard covers, so the world size may change between
 * save and load (resharding). It checks every value first and then reads each straight to where it
 * lives (offloaded kinds through loom__fsdp_stream into their tier): no copy of a rank's state
 * is ever staged, since with offload that state may be larger than the run's memory. Each rank
 * file is checked against the index when it is opened (its CRC, size, rank, world, generation,
 * optimizer step, every unit's tensor and length), so a file of another rank or another save
 * is refused naming it and both values even when someone re-signed the index; every number in
 * the metadata is read strictly (digits only, no sign, no leading zero, in range). */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"
#include "io/io_int.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INDEX_NAME "fsdp-index.safetensors"
#define FORMAT "fsdp-sharded/1"
#define MAX_COUNT ((int64_t)1 << 53) /* a step or generation: exact in a double, never overflows */

/* Metadata `key` of fl (the file at path) as a count in [0, max]: decimal digits only, no sign
 * or leading zero, so a value is written one way. Absent: LOOM_ENOTFOUND, with no message if
 * !need (the caller has a default). */
static int meta_count(const loom_safetensors *fl, const char *path, const char *key, int64_t max,
                      bool need, int64_t *out) {
  const char *v = loom_safetensors_meta(fl, key);
  if (!v)
    return need ? loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s has no metadata %s", path, key)
                : LOOM_ENOTFOUND;
  int64_t x = 0;
  bool ok = v[0] && (v[0] != '0' || !v[1]);
  for (const char *c = v; ok && *c; c++) {
    ok = *c >= '0' && *c <= '9' && x <= (max - (*c - '0')) / 10;
    if (ok) x = 10 * x + (*c - '0');
  }
  if (!ok)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s: metadata %s = \"%.40s%s\" is not a "
                      "count from 0 to %lld", path, key, v, strlen(v) > 40 ? "..." : "",
                      (long long)max);
  *out = x;
  return LOOM_OK;
}

static void index_path(const char *dir, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", dir, INDEX_NAME);
}

static void rank_path(const char *dir, int64_t gen, int rank, int world, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/gen-%lld/rank-%d-of-%d.safetensors", dir, (long long)gen, rank, world);
}

static int make_dir(const char *path) {
  if (mkdir(path, 0777) == 0 || errno == EEXIST) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return LOOM_OK;
    return loom__fail(LOOM_EIO, "fsdp checkpoint: %s exists and is not a folder", path);
  }
  return loom__fail(LOOM_EIO, "fsdp checkpoint: cannot create folder %s: %s", path, strerror(errno));
}

/* The generation the index in dir names, 0 if there is no index. */
static int current_generation(const char *dir, int64_t *gen) {
  char path[4096];
  index_path(dir, path, sizeof path);
  *gen = 0;
  if (access(path, F_OK) != 0) return LOOM_OK;
  loom_safetensors *ix = NULL;
  int rc = loom_checkpoint_open(path, &ix);
  if (!rc) rc = meta_count(ix, path, "fsdp.generation", MAX_COUNT - 1, true, gen);
  loom_safetensors_free(ix);
  return rc;
}

/* Remove dir/gen-K for every K but keep. */
static void remove_old_generations(const char *dir, int64_t keep) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long k;
    char tail;
    if (sscanf(e->d_name, "gen-%lld%c", &k, &tail) != 1 || k == keep) continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
    DIR *s = opendir(sub);
    if (!s) continue;
    struct dirent *f;
    while ((f = readdir(s))) {
      if (f->d_name[0] == '.') continue;
      char file[8192];
      snprintf(file, sizeof file, "%s/%s", sub, f->d_name);
      unlink(file);
    }
    closedir(s);
    rmdir(sub);
  }
  closedir(d);
}

/* What killed saves left in dir, before a new save (rank 0, before any rank writes): the
 * index's temporaries (loom_remove_stale_temporaries, the one mechanism for an atomic write's
 * leftovers) and every generation but the committed one `gen`: a generation the index does not
 * name is a save that died before its commit, whatever it holds (rank files or their
 * temporaries, of this world size or another), and the next save may reuse its number. */
static int remove_leftovers(const char *dir, int64_t gen) {
  char path[4096];
  index_path(dir, path, sizeof path);
  int rc = loom_remove_stale_temporaries(path, NULL);
  if (!rc) remove_old_generations(dir, gen);
  return rc;
}

/* Open path through the page cache (mapped: the file may be larger than the memory a run has,
 * with offload) and verify its CRC over every byte; *size and *crc are the file's. The caller
 * frees *out. */
static int open_verified(const char *path, loom_safetensors **out, int64_t *size, int64_t *crc) {
  struct stat st;
  *out = NULL;
  if (stat(path, &st) != 0)
    return loom__fail(LOOM_EIO, "fsdp checkpoint: cannot stat %s: %s", path, strerror(errno));
  *size = (int64_t)st.st_size;
  int rc = loom__checkpoint_open_flags(path, LOOM_SAFETENSORS_MMAP, out);
  const char *c = rc ? NULL : loom_safetensors_meta(*out, "loom.crc32");
  if (!rc && !c) rc = loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s has no CRC", path);
  if (!rc) *crc = (int64_t)strtoull(c, NULL, 16);
  if (rc) {
    loom_safetensors_free(*out);
    *out = NULL;
  }
  return rc;
}

static int file_size_crc(const char *path, int64_t *size, int64_t *crc) {
  loom_safetensors *f = NULL;
  int rc = open_verified(path, &f, size, crc);
  loom_safetensors_free(f);
  return rc;
}

/* ---- save -------------------------------------------------------------------------------- */

/* An entry from the kind's buffer, or (offloaded) through a reader of the tier. */
static void add_entry(fsdp_unit *u, int kind, const loom_optim *opt, const char *name, size_t len,
                      loom__fsdp_chunk_cache *cache, loom_checkpoint_entry *e, loom__reader *rd,
                      loom__fsdp_reader *ctx) {
  float *data = loom__fsdp_resident(u, kind, (loom_optim *)opt); /* read only */
  *e = (loom_checkpoint_entry){name, LOOM_F32, 1, {(int64_t)len}, data, 0};
  if (data || !len) return;
  *ctx = (loom__fsdp_reader){u, kind, cache};
  *rd = (loom__reader){loom__fsdp_read_bytes, ctx};
}

/* The rank's file: parameter shards and optimizer state from wherever they are (offloaded ones
 * are read from the tier chunk by chunk as the file is written: a save never brings a rank's
 * whole state back). */
static int write_rank_file(loom_fsdp *f, const char *path, int64_t gen, const loom_optim *opt) {
  size_t nstate = opt ? loom_optim_state_count(opt) : 0;
  size_t per = opt ? loom_optim_state_per_segment(opt) : 0;
  size_t cap = f->nunits + nstate + 1;
  loom_checkpoint_entry *e = loom__calloc(LOOM_POOL_META, cap, sizeof *e);
  loom__reader *rd = loom__calloc(LOOM_POOL_META, cap, sizeof *rd);
  loom__fsdp_reader *ctx = loom__calloc(LOOM_POOL_META, cap, sizeof *ctx);
  loom__fsdp_chunk_cache cache = {NULL, SIZE_MAX, 0, 0};
  int rc = !e || !rd || !ctx ? loom__fail(LOOM_ENOMEM, "fsdp checkpoint: out of memory") : LOOM_OK;
  if (!rc && f->store && !(cache.buf = loom__malloc(LOOM_POOL_COMPUTE, f->chunk * sizeof(float))))
    rc = loom__fail(LOOM_ENOMEM, "fsdp checkpoint: out of memory for a chunk buffer");
  size_t n = 0;
  for (size_t u = 0; u < f->nunits && !rc; u++)
    add_entry(&f->units[u], OFF_PARAM, opt, f->segs[u].name, f->units[u].shard, &cache, &e[n],
              &rd[n], &ctx[n]), n++;
  for (size_t i = 0; i < nstate && !rc; i++) {
    loom_optim_state s;
    if (!(rc = loom_optim_state_at(opt, i, &s)))
      add_entry(&f->units[i / per], OFF_STATE + (int)(i % per), opt, s.name, s.n, &cache, &e[n],
                &rd[n], &ctx[n]), n++;
  }
  int64_t words[LOOM_SCALER_STATE_WORDS];
  loom_scaler *sc = f->mp ? loom_fsdp_mp_scaler(f->mp) : NULL;
  if (!rc && sc) {
    loom_scaler_state st;
    rc = loom_scaler_save(sc, &st);
    if (!rc) rc = loom_scaler_state_pack(&st, words);
    if (!rc) e[n++] = (loom_checkpoint_entry){"amp.scaler", LOOM_I64, 1, {LOOM_SCALER_STATE_WORDS}, words, 0};
  }
  char step[32], rank[16], world[16], g[32];
  snprintf(step, sizeof step, "%lld", (long long)(opt ? loom_optim_step_count(opt) : 0));
  snprintf(rank, sizeof rank, "%d", f->rank);
  snprintf(world, sizeof world, "%d", f->world);
  snprintf(g, sizeof g, "%lld", (long long)gen);
  loom_safetensors_meta_kv meta[] = {{"fsdp.format", FORMAT}, {"fsdp.rank", rank},
                                     {"fsdp.world", world}, {"fsdp.generation", g},
                                     {"optim.step", step}};
  if (!rc) rc = loom__checkpoint_save_read(path, e, rd, n, meta, sizeof meta / sizeof *meta);
  loom__free(cache.buf);
  loom__free(ctx);
  loom__free(rd);
  loom__free(e);
  return rc;
}

static int write_index(loom_fsdp *f, const char *dir, int64_t gen, int64_t ostep,
                       const int64_t *files, const loom_safetensors_meta_kv *umeta,
                       size_t numeta) {
  size_t nu = f->nunits, nm = 5 + nu + numeta;
  int64_t *units = loom__calloc(LOOM_POOL_META, 2 * (nu ? nu : 1), sizeof *units);
  loom_safetensors_meta_kv *meta = loom__calloc(LOOM_POOL_META, nm, sizeof *meta);
  char *keys = loom__calloc(LOOM_POOL_META, nu ? nu : 1, 32);
  if (!units || !meta || !keys) {
    loom__free(units);
    loom__free(meta);
    loom__free(keys);
    return loom__fail(LOOM_ENOMEM, "fsdp checkpoint: out of memory");
  }
  for (size_t u = 0; u < nu; u++) {
    units[2 * u] = (int64_t)f->units[u].numel;
    units[2 * u + 1] = (int64_t)f->units[u].shard;
  }
  char world[16], g[32], count[32], step[32];
  snprintf(world, sizeof world, "%d", f->world);
  snprintf(g, sizeof g, "%lld", (long long)gen);
  snprintf(step, sizeof step, "%lld", (long long)ostep);
  snprintf(count, sizeof count, "%zu", nu);
  size_t k = 0;
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.format", FORMAT};
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.world", world};
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.generation", g};
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.step", step};
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.units", count};
  for (size_t u = 0; u < nu; u++) {
    snprintf(keys + 32 * u, 32, "fsdp.unit.%zu", u);
    meta[k++] = (loom_safetensors_meta_kv){keys + 32 * u, f->units[u].name};
  }
  for (size_t i = 0; i < numeta; i++) meta[k++] = umeta[i];
  loom_checkpoint_entry e[2] = {
      {"units", LOOM_I64, 2, {(int64_t)nu, 2}, units, 0},
      {"files", LOOM_I64, 2, {(int64_t)f->world, 2}, (void *)files, 0},
  };
  char path[4096];
  index_path(dir, path, sizeof path);
  int rc = loom_checkpoint_save(path, e, 2, meta, k);
  loom__free(units);
  loom__free(meta);
  loom__free(keys);
  return rc;
}

static int save_group(loom_fsdp *f, const char *dir, const loom_optim *opt,
                      const loom_safetensors_meta_kv *meta, size_t nmeta);

int loom_fsdp_save_sharded(loom_fsdp *f, const char *dir, const loom_optim *opt,
                           const loom_safetensors_meta_kv *meta, size_t nmeta) {
  static const char *who = "loom_fsdp_save_sharded";
  if (!f || !dir || (!meta && nmeta)) return loom__fail(LOOM_EINVAL, "%s: NULL argument", who);
  if (f->in_step) return loom__fail(LOOM_EMISUSE, "%s: a backward is running", who);
  for (size_t i = 0; i < nmeta; i++)
    if (!meta[i].key || strncmp(meta[i].key, "fsdp.", 5) == 0)
      return loom__fail(LOOM_EINVAL, "%s: metadata key %zu is NULL or reserved ('fsdp.')", who, i);
  if (!f->replica) return save_group(f, dir, opt, meta, nmeta);
  /* hybrid sharding: replica 0's shard group writes the set (every copy holds the same
   * shards); each replica group then learns its replica 0's outcome */
  int rc = f->replica_rank == 0 ? save_group(f, dir, opt, meta, nmeta) : LOOM_OK;
  int64_t out = rc;
  int rc2 = loom_pg_broadcast(f->replica, &out, &out, 1, LOOM_I64, 0, NULL);
  if (rc) return rc;
  if (rc2) return rc2;
  if (out != LOOM_OK)
    return loom__fail((int)out, "%s: replica 0 (the ranks that write the set) failed to save "
                      "%s: %s", who, dir, loom_strerror((int)out));
  return LOOM_OK;
}

/* The sharded save by the group f->pg. */
static int save_group(loom_fsdp *f, const char *dir, const loom_optim *opt,
                      const loom_safetensors_meta_kv *meta, size_t nmeta) {
  static const char *who = "loom_fsdp_save_sharded";
  /* rank 0 picks the next generation; a failure on any rank fails every rank (the flags go
   * through the same collectives on every rank, never a hang) */
  int64_t gen = 0;
  int rc = f->rank == 0 ? make_dir(dir) : LOOM_OK;
  if (!rc && f->rank == 0) rc = current_generation(dir, &gen);
  if (!rc && f->rank == 0) rc = remove_leftovers(dir, gen);
  int64_t g2[2] = {rc ? -1 : gen + 1, rc};
  int rcb = loom_pg_broadcast(f->pg, g2, g2, 2, LOOM_I64, 0, NULL);
  if (rcb) return rcb;
  if (g2[0] < 0) return rc ? rc : loom__fail(LOOM_EIO, "%s: rank 0 could not prepare %s", who, dir);
  gen = g2[0];
  char sub[4096], path[4200];
  snprintf(sub, sizeof sub, "%s/gen-%lld", dir, (long long)gen);
  rc = make_dir(sub);
  rank_path(dir, gen, f->rank, f->world, path, sizeof path);
  if (!rc) rc = loom__fsdp_settle_all(f); /* transfers in flight land first */
  if (!rc) rc = write_rank_file(f, path, gen, opt);
  int64_t mine[2] = {-1, 0};
  if (!rc) rc = file_size_crc(path, &mine[0], &mine[1]);
  if (rc) mine[0] = -1;
  int64_t *files = loom__calloc(LOOM_POOL_META, 2 * (size_t)f->world, sizeof *files);
  if (!files) return loom__fail(LOOM_ENOMEM, "%s: out of memory", who);
  int rc2 = loom_pg_allgather(f->pg, mine, files, 2, LOOM_I64, NULL);
  int bad = -1;
  for (int r = 0; r < f->world && !rc2; r++)
    if (files[2 * r] < 0 && bad < 0) bad = r;
  if (!rc && !rc2 && bad >= 0)
    rc = loom__fail(LOOM_EIO, "%s: rank %d could not write its shard file; the previous set "
                    "in %s is kept", who, bad, dir);
  if (!rc) rc = rc2;
  /* rank 0 commits; every rank learns the outcome */
  int64_t ok = 0;
  if (!rc && f->rank == 0) {
    rc = write_index(f, dir, gen, opt ? loom_optim_step_count(opt) : 0, files, meta, nmeta);
    ok = rc ? 0 : 1;
  }
  loom__free(files);
  if (rc2) return rc2;
  rc2 = loom_pg_broadcast(f->pg, &ok, &ok, 1, LOOM_I64, 0, NULL);
  if (rc2) return rc ? rc : rc2;
  if (!ok && !rc) rc = loom__fail(LOOM_EIO, "%s: rank 0 could not write the index of %s; the "
                                  "previous set is kept", who, dir);
  if (!rc && f->rank == 0) remove_old_generations(dir, gen);
  return rc;
}

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
  index_path(dir, path, sizeof path);
  int rc = loom_checkpoint_open(path, &s->index);
  if (rc) return rc;
  const char *fmt = loom_safetensors_meta(s->index, "fsdp.format");
  if (!fmt || strcmp(fmt, FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is not a sharded checkpoint index (%s)",
                      path, fmt ? fmt : "no fsdp.format");
  int64_t w = 0, n = 0;
  rc = meta_count(s->index, path, "fsdp.world", 1 << 20, true, &w);
  if (!rc) rc = meta_count(s->index, path, "fsdp.generation", MAX_COUNT, true, &s->gen);
  if (!rc) rc = meta_count(s->index, path, "fsdp.units", 1 << 20, true, &n);
  s->step = -1;
  if (!rc) rc = meta_count(s->index, path, "fsdp.step", MAX_COUNT, false, &s->step);
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
  if (!fmt || strcmp(fmt, FORMAT) != 0)
    return loom__fail(LOOM_EFORMAT, "fsdp checkpoint: %s is not a sharded checkpoint's rank "
                      "file (%s)", path, fmt ? fmt : "no fsdp.format");
  int64_t rank = 0, world = 0, gen = s->gen, step = 0;
  int rc = meta_count(fl, path, "fsdp.rank", 1 << 20, true, &rank);
  if (!rc) rc = meta_count(fl, path, "fsdp.world", 1 << 20, true, &world);
  if (!rc) rc = meta_count(fl, path, "fsdp.generation", MAX_COUNT, s->has_step, &gen);
  if (rc == LOOM_ENOTFOUND) rc = LOOM_OK; /* an older set's file */
  if (!rc) rc = meta_count(fl, path, "optim.step", MAX_COUNT, true, &step);
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
  rank_path(dir, s->gen, r, s->world, path, sizeof path);
  int64_t size = 0, crc = 0;
  loom_safetensors *fl = NULL;
  int rc = open_verified(path, &fl, &size, &crc);
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
  index_path(dir, path, sizeof path);
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
