/* fsdp_ckpt.c: sharded checkpoints, and saving them (loading: fsdp_ckpt_load.c; what both
 * share: fsdp_ckpt_int.h). A set is a folder:
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

int loom__fsdp_ckpt_count(const loom_safetensors *fl, const char *path, const char *key,
                          int64_t max, bool need, int64_t *out) {
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

void loom__fsdp_ckpt_index_path(const char *dir, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/%s", dir, FSDP_CKPT_INDEX);
}

void loom__fsdp_ckpt_rank_path(const char *dir, int64_t gen, int rank, int world, char *buf,
                               size_t cap) {
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
  loom__fsdp_ckpt_index_path(dir, path, sizeof path);
  *gen = 0;
  if (access(path, F_OK) != 0) return LOOM_OK;
  loom_safetensors *ix = NULL;
  int rc = loom_checkpoint_open(path, &ix);
  if (!rc)
    rc = loom__fsdp_ckpt_count(ix, path, "fsdp.generation", FSDP_CKPT_MAX_COUNT - 1, true, gen);
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
  loom__fsdp_ckpt_index_path(dir, path, sizeof path);
  int rc = loom_remove_stale_temporaries(path, NULL);
  if (!rc) remove_old_generations(dir, gen);
  return rc;
}

int loom__fsdp_ckpt_open(const char *path, loom_safetensors **out, int64_t *size, int64_t *crc) {
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
  int rc = loom__fsdp_ckpt_open(path, &f, size, crc);
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
  loom_safetensors_meta_kv meta[] = {{"fsdp.format", FSDP_CKPT_FORMAT}, {"fsdp.rank", rank},
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
  meta[k++] = (loom_safetensors_meta_kv){"fsdp.format", FSDP_CKPT_FORMAT};
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
  loom__fsdp_ckpt_index_path(dir, path, sizeof path);
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
  int rc_step = loom__fsdp_step_join(f); /* the last optimizer step, whole, or its failure */
  if (rc_step) return rc_step;
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
  loom__fsdp_ckpt_rank_path(dir, gen, f->rank, f->world, path, sizeof path);
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
