/* test_fsdp_ckpt.c: FSDP checkpoints on the threads backend. Sharded save and resume (f32, and
 * f16 mixed precision with its loss scale) ending bit for bit where the uninterrupted run ends;
 * resharding (saved by 2 ranks, loaded by 1, 3 and 4, and 2 -> 3 -> 2); the index's metadata,
 * reserved keys and generations; what a killed save left, removed by the next save; a flipped
 * byte, a truncated or swapped rank file, a save that died before its index, a model with other
 * units, each refused with a named error and leaving the fsdp's shards and optimizer state
 * untouched; and the full state dict (rank 0's values
 * after create, PyTorch names in a safetensors file, loading one back, wrong name and shape).
 *
 * Tolerance. Everything is bit for bit except one comparison: the continuation of a 2-rank
 * checkpoint at 1, 3 or 4 ranks against the 2-rank continuation. The data are the same global
 * rows (GB a step, split evenly over the ranks) and the restored state is identical, but the
 * gradient averaged over 3 ranks sums in another f32 order (relative ~1e-7); AdamW with
 * eps 1e-4 (fm_adam) turns that into at most lr x 1e-7 x |g| / eps a step, so after 2 steps at
 * lr 1e-2 the weights agree to 1e-5 (an optimizer state lost or misplaced moves them by ~1e-2).
 * A 2 -> 3 -> 2 round trip moves only bytes, so it continues bit for bit. */
#include "lt.h"
#include "fsdp_ckpt_sets.h"
#include "lt_tree.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------ */

/* The gen-* folders of dir: count, and the number of the last one found. */
static int count_generations(const char *dir, long long *last) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long k;
    char tail;
    if (sscanf(e->d_name, "gen-%lld%c", &k, &tail) == 1) {
      n++;
      if (last) *last = k;
    }
  }
  closedir(d);
  return n;
}

static double max_diff(const float *a, const float *b, size_t n) {
  double w = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs((double)a[i] - (double)b[i]);
    if (!(e <= w)) w = e;
  }
  return w;
}

/* ---- 1. save + resume is bit-identical ---------------------------------------------------- */

LT_TEST(fsdp_ckpt_sharded_resume_is_bit_identical_f32_and_f16) {
  for (int f16 = 0; f16 <= 1; f16++) {
    char dir[64];
    ck_tmp_dir(dir, sizeof dir);
    size_t np = ck_numel();
    /* A: 3 steps, save, 2 more */
    ck_job a = {.world = 2, .f16 = f16, .seed = 1, .pre_steps = 3, .save_dir = dir,
             .post_steps = 2, .mid = ck_fbuf(), .end = ck_fbuf()};
    LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
    LT_EQ(a.step_count, 3);
    if (f16) LT_NEAR(a.scale_mid, 4.0, 0); /* grown once (2 clean steps), one step counted */
    /* B: other seeds, load, the same 2 steps */
    ck_job b = {.world = 2, .f16 = f16, .seed = 100, .load_dir = dir, .first_step = 3,
             .post_steps = 2, .mid = ck_fbuf(), .end = ck_fbuf()};
    LT_OK(loom_threads_run(2, NULL, ck_job_rank, &b));
    LT_TRUE(memcmp(b.mid, a.mid, np * sizeof(float)) == 0);
    LT_EQ(b.step_count, 3);
    LT_TRUE(memcmp(b.end, a.end, np * sizeof(float)) == 0);
    LT_TRUE(memcmp(b.end, a.mid, np * sizeof(float)) != 0); /* it did train */
    LT_TRUE(b.scale_mid == a.scale_mid);
    for (int k = 0; k < 2; k++) LT_TRUE(b.scales[k] == a.scales[k]);
    if (f16) {
      LT_NEAR(a.scales[0], 8.0, 0); /* the saved clean step + this one: growth */
      LT_NEAR(a.scales[1], 8.0, 0);
    }
    free(a.mid), free(a.end), free(b.mid), free(b.end);
    fm_rm_tree(dir);
  }
}

/* ---- 2. resharding ------------------------------------------------------------------------ */

LT_TEST(fsdp_ckpt_saved_by_2_ranks_loads_at_1_3_and_4) {
  char dir[64], dir3[64];
  ck_tmp_dir(dir, sizeof dir);
  ck_tmp_dir(dir3, sizeof dir3);
  size_t np = ck_numel();
  ck_job a = {.world = 2, .seed = 1, .pre_steps = 2, .save_dir = dir, .post_steps = 2,
           .mid = ck_fbuf(), .end = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
  for (int w = 1; w <= 4; w += 1 + (w == 1)) { /* 1, 3, 4 */
    ck_job b = {.world = w, .seed = 40, .load_dir = dir, .first_step = 2, .post_steps = 2,
             .mid = ck_fbuf(), .end = ck_fbuf()};
    LT_OK(loom_threads_run(w, NULL, ck_job_rank, &b));
    LT_TRUE(memcmp(b.mid, a.mid, np * sizeof(float)) == 0); /* resharded exactly */
    LT_EQ(b.step_count, 2);
    double d = max_diff(b.end, a.end, np);
    if (!(d <= 1e-5)) lt_fail_at(__FILE__, __LINE__, "%d ranks: %g from 2 ranks (tol 1e-5)", w, d);
    free(b.mid), free(b.end);
  }
  /* 2 -> 3 -> 2: the optimizer state too goes through 3 ranks' shards and comes back exact */
  ck_job c = {.world = 3, .seed = 60, .load_dir = dir, .save_dir = dir3, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(3, NULL, ck_job_rank, &c));
  LT_TRUE(memcmp(c.mid, a.mid, np * sizeof(float)) == 0);
  ck_job d = {.world = 2, .seed = 80, .load_dir = dir3, .first_step = 2, .post_steps = 2,
           .mid = ck_fbuf(), .end = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &d));
  LT_EQ(d.step_count, 2);
  LT_TRUE(memcmp(d.end, a.end, np * sizeof(float)) == 0);
  free(a.mid), free(a.end), free(c.mid), free(d.mid), free(d.end);
  fm_rm_tree(dir);
  fm_rm_tree(dir3);
}

/* ---- 3. metadata and generations ---------------------------------------------------------- */

typedef struct meta_job {
  const char *dir;
  bool plain; /* one save without metadata, nothing else */
  int reserved_rc[MAXW];
  char reserved_msg[MAXW][MSG];
} meta_job;

static int meta_rank(loom_pg *pg, void *arg) {
  meta_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = fm_create(1, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  const loom_safetensors_meta_kv bad[] = {{"epoch", "1"}, {"fsdp.x", "2"}};
  if (!rc && j->plain) {
    rc = loom_fsdp_save_sharded(f, j->dir, NULL, NULL, 0);
    goto out;
  }
  if (!rc) {
    loom_clear_error();
    j->reserved_rc[rank] = loom_fsdp_save_sharded(f, j->dir, NULL, bad, 2);
    snprintf(j->reserved_msg[rank], MSG, "%s", loom_last_error());
  }
  const loom_safetensors_meta_kv meta[] = {{"epoch", "7"}, {"run", "fsdp ckpt test"}};
  if (!rc) rc = loom_fsdp_save_sharded(f, j->dir, NULL, meta, 2);
  if (!rc) rc = loom_fsdp_save_sharded(f, j->dir, NULL, meta, 1); /* a second generation */
out:
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_ckpt_metadata_reserved_keys_and_generations) {
  char dir[64], sub[128];
  ck_tmp_dir(dir, sizeof dir);
  snprintf(sub, sizeof sub, "%s/ckpt", dir); /* a folder the save must create */
  meta_job j = {.dir = sub};
  LT_OK(loom_threads_run(2, NULL, meta_rank, &j));
  for (int r = 0; r < 2; r++) {
    LT_EQ(j.reserved_rc[r], LOOM_EINVAL);
    LT_TRUE(strstr(j.reserved_msg[r], "reserved") != NULL);
  }
  char buf[64];
  LT_OK(loom_fsdp_sharded_meta(sub, "epoch", buf, sizeof buf));
  LT_STREQ(buf, "7");
  /* the second save had one key only: the index is the newest one's */
  LT_ERR(loom_fsdp_sharded_meta(sub, "run", buf, sizeof buf), LOOM_ENOTFOUND, "run");
  LT_OK(loom_fsdp_sharded_meta(sub, "fsdp.generation", buf, sizeof buf));
  LT_STREQ(buf, "2");
  LT_OK(loom_fsdp_sharded_meta(sub, "fsdp.world", buf, sizeof buf));
  LT_STREQ(buf, "2");
  LT_ERR(loom_fsdp_sharded_meta(sub, "epoch", buf, 1), LOOM_EINVAL, "longer");
  LT_ERR(loom_fsdp_sharded_meta(sub, NULL, buf, sizeof buf), LOOM_EINVAL, "NULL");
  char none[160];
  snprintf(none, sizeof none, "%s/none", dir);
  LT_TRUE(loom_fsdp_sharded_meta(none, "epoch", buf, sizeof buf) != LOOM_OK);
  long long last = -1;
  LT_EQ(count_generations(sub, &last), 1);
  LT_EQ(last, 2);
  char path[256];
  ck_rank_file(path, sizeof path, sub, 2, 1, 2);
  LT_TRUE(access(path, F_OK) == 0);
  fm_rm_tree(dir);
}

/* What a kill -9 during a save leaves, planted by hand: the index's temporary, rank-file
 * temporaries in the generation the next save reuses (this world and another) and in a
 * generation the index does not name, and a complete rank file of a save that never committed.
 * The next save removes all of them, whatever their generation, and nothing else. */
LT_TEST(fsdp_ckpt_next_save_removes_what_a_killed_save_left) {
  char dir[64], path[256];
  ck_tmp_dir(dir, sizeof dir);
  meta_job j = {.dir = dir, .plain = true};
  LT_OK(loom_threads_run(2, NULL, meta_rank, &j)); /* generation 1, committed */
  const char *planted[] = {"fsdp-index.safetensors.tmp.AbC123",
                           "gen-2/rank-0-of-2.safetensors.tmp.Xy12Zq",
                           "gen-2/rank-3-of-4.safetensors.tmp.Qq11Ww",
                           "gen-2/rank-1-of-2.safetensors",
                           "gen-7/rank-1-of-2.safetensors.tmp.AAAAAA"};
  snprintf(path, sizeof path, "%s/gen-2", dir);
  LT_EQ(mkdir(path, 0777), 0);
  snprintf(path, sizeof path, "%s/gen-7", dir);
  LT_EQ(mkdir(path, 0777), 0);
  for (size_t i = 0; i < sizeof planted / sizeof *planted; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, planted[i]);
    ck_write_all(path, "torn", 4);
  }
  const char *kept = "fsdp-index.safetensors.tmp.notmine"; /* not the writer's pattern */
  snprintf(path, sizeof path, "%s/%s", dir, kept);
  ck_write_all(path, "mine", 4);
  LT_EQ(lt_tree_walk(dir, ".tmp.", false), 5);
  LT_OK(loom_threads_run(2, NULL, meta_rank, &j)); /* generation 2 */
  LT_TRUE(access(path, F_OK) == 0);
  LT_EQ(remove(path), 0);
  LT_EQ(lt_tree_walk(dir, ".tmp.", false), 0);
  long long last = -1;
  LT_EQ(count_generations(dir, &last), 1);
  LT_EQ(last, 2);
  ck_rank_file(path, sizeof path, dir, 2, 1, 2);
  size_t n = 0;
  unsigned char *b = ck_read_all(path, &n);
  LT_TRUE(b && n > 4); /* this save's file, not the planted one */
  free(b);
  LT_OK(loom_threads_run(2, NULL, meta_rank, &j)); /* a third save over a clean set */
  LT_EQ(lt_tree_walk(dir, ".tmp.", false), 0);
  fm_rm_tree(dir);
}

/* ---- 4. corruption and atomicity ---------------------------------------------------------- */

LT_TEST(fsdp_ckpt_corrupt_truncated_swapped_and_crashed_sets) {
  char dir[64], other[64], path0[256], path1[256];
  ck_tmp_dir(dir, sizeof dir);
  ck_tmp_dir(other, sizeof other);
  size_t np = ck_numel();
  ck_job a = {.world = 2, .seed = 1, .pre_steps = 2, .save_dir = dir, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
  ck_job o = {.world = 2, .seed = 5, .pre_steps = 1, .save_dir = other, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &o));
  ck_rank_file(path0, sizeof path0, dir, 1, 0, 2);
  ck_rank_file(path1, sizeof path1, dir, 1, 1, 2);
  size_t n0 = 0, n1 = 0;
  unsigned char *good0 = ck_read_all(path0, &n0), *good1 = ck_read_all(path1, &n1);
  LT_TRUE(good0 && good1 && n0 > 200 && n1 > 200);

  /* the good set loads, at 2 ranks */
  ck_loader l = ck_try_load(dir, 2, 0, LOOM_OK, "");
  LT_EQ(l.rc[0], LOOM_OK);
  LT_EQ(l.rc[1], LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, np * sizeof(float)) == 0);
  ck_loader_free(&l);

  /* (a) one flipped byte in rank 0's file (every rank reads it: the step count is there), then
   * in rank 1's (the rank that reads it, and a 1-rank load that reads both) */
  unsigned char *bad = malloc(n0 > n1 ? n0 : n1);
  memcpy(bad, good0, n0);
  bad[n0 / 2] ^= 0x10;
  ck_write_all(path0, bad, n0);
  l = ck_try_load(dir, 2, 3, LOOM_EFORMAT, "rank-0-of-2.safetensors");
  ck_loader_free(&l);
  ck_write_all(path0, good0, n0);
  memcpy(bad, good1, n1);
  bad[n1 - 9] ^= 0x01; /* near the end: the data of the last tensor */
  ck_write_all(path1, bad, n1);
  l = ck_try_load(dir, 2, 2, LOOM_EFORMAT, "rank-1-of-2.safetensors");
  ck_loader_free(&l);
  l = ck_try_load(dir, 1, 1, LOOM_EFORMAT, "rank-1-of-2.safetensors");
  ck_loader_free(&l);
  ck_write_all(path1, good1, n1);

  /* (b) a truncated rank file: named (EFORMAT or EIO both tell the truth) */
  ck_write_all(path1, good1, n1 - 64);
  l = (ck_loader){.dir = dir, .before = ck_fbuf(), .after = ck_fbuf()};
  LT_OK(loom_threads_run(1, NULL, ck_loader_rank, &l));
  LT_TRUE(l.rc[0] == LOOM_EFORMAT || l.rc[0] == LOOM_EIO);
  LT_TRUE(strstr(l.msg[0], "rank-1-of-2.safetensors") != NULL);
  LT_TRUE(l.untouched[0]);
  LT_TRUE(memcmp(l.before, l.after, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  ck_write_all(path1, good1, n1);

  /* a valid rank file of another save in place of rank 0's: not the file the index names */
  char opath[256];
  ck_rank_file(opath, sizeof opath, other, 1, 0, 2);
  size_t no = 0;
  unsigned char *ob = ck_read_all(opath, &no);
  LT_TRUE(ob != NULL);
  ck_write_all(path0, ob, no);
  l = ck_try_load(dir, 2, 3, LOOM_EFORMAT, "rank-0-of-2.safetensors");
  LT_TRUE(strstr(l.msg[0], "not the file the index names") != NULL);
  ck_loader_free(&l);
  free(ob);
  ck_write_all(path0, good0, n0);

  /* a missing rank file */
  LT_TRUE(unlink(path1) == 0);
  l = ck_try_load(dir, 2, 2, LOOM_EIO, "rank-1-of-2.safetensors");
  ck_loader_free(&l);
  ck_write_all(path1, good1, n1);

  /* (c) a save that died before its index: a newer generation with garbage files; the index
   * still names generation 1, which loads exactly */
  char gen2[128], g0[256], g1[256];
  snprintf(gen2, sizeof gen2, "%s/gen-2", dir);
  LT_TRUE(mkdir(gen2, 0777) == 0);
  ck_rank_file(g0, sizeof g0, dir, 2, 0, 2);
  ck_rank_file(g1, sizeof g1, dir, 2, 1, 2);
  ck_write_all(g0, "garbage, not a checkpoint", 25);
  memcpy(bad, good1, n1);
  bad[100] ^= 0xff;
  ck_write_all(g1, bad, n1 / 2);
  l = ck_try_load(dir, 2, 0, LOOM_OK, "");
  LT_EQ(l.rc[0], LOOM_OK);
  LT_EQ(l.rc[1], LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  l = ck_try_load(dir, 3, 0, LOOM_OK, "");
  LT_TRUE(l.rc[0] == LOOM_OK && l.rc[1] == LOOM_OK && l.rc[2] == LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  /* the next save goes over the dead generation and leaves one complete set */
  ck_job b = {.world = 2, .seed = 1, .load_dir = dir, .save_dir = dir, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &b));
  long long last = -1;
  LT_EQ(count_generations(dir, &last), 1);
  LT_EQ(last, 2);
  l = ck_try_load(dir, 2, 0, LOOM_OK, "");
  LT_TRUE(l.rc[0] == LOOM_OK && l.rc[1] == LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  free(b.mid);

  /* (d) other units: another hidden size (unit 1's length), another wrap policy (unit 0 is
   * the root unit then), fewer units */
  static const int64_t sizes[4] = {FM_IN, FM_H1, FM_H2 + 1, FM_OUT};
  ck_loader d = {.dir = dir, .sizes = sizes};
  LT_OK(loom_threads_run(2, NULL, ck_loader_rank, &d));
  for (int r = 0; r < 2; r++) {
    LT_EQ(d.rc[r], LOOM_EINVAL);
    LT_TRUE(strstr(d.msg[r], "'layers.2'") != NULL);
    LT_TRUE(d.untouched[r]);
  }
  static const char *const two[] = {"layers.0", "layers.2"}; /* + a root unit for layers.4 */
  l = (ck_loader){.dir = dir, .list = two, .nlist = 2, .before = ck_fbuf(), .after = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_loader_rank, &l));
  for (int r = 0; r < 2; r++) {
    LT_EQ(l.rc[r], LOOM_EINVAL);
    LT_TRUE(strstr(l.msg[r], "unit 0") != NULL && strstr(l.msg[r], "'layers.0'") != NULL);
    LT_TRUE(l.untouched[r]);
  }
  LT_TRUE(memcmp(l.before, l.after, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  static const char *const one[] = {"layers.4"}; /* 2 units: the root and layers.4 */
  l = (ck_loader){.dir = dir, .list = one, .nlist = 1, .before = ck_fbuf(), .after = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_loader_rank, &l));
  for (int r = 0; r < 2; r++) {
    LT_EQ(l.rc[r], LOOM_EINVAL);
    /* the count, and the first unit that differs */
    if (!strstr(l.msg[r], "units") || !strstr(l.msg[r], "'layers.0'"))
      lt_fail_at(__FILE__, __LINE__, "rank %d: \"%s\" names no unit", r, l.msg[r]);
    LT_TRUE(l.untouched[r]);
  }
  ck_loader_free(&l);

  free(bad);
  free(good0);
  free(good1);
  free(a.mid);
  free(o.mid);
  fm_rm_tree(dir);
  fm_rm_tree(other);
}

/* ---- 5. the full state dict --------------------------------------------------------------- */

typedef struct full_job {
  const char *path;    /* rank 0 writes the state there */
  loom_module *plain;  /* a plain module whose values to load (load test) */
  int wrong_name_rc[MAXW], wrong_shape_rc[MAXW], wrong_count_rc[MAXW];
  char wrong_name_msg[MAXW][MSG], wrong_shape_msg[MAXW][MSG];
  bool untouched[MAXW];
  float *first, *loaded, *shuffled; /* rank 0 */
  bool names_ok;
} full_job;

static int full_create_rank(loom_pg *pg, void *arg) {
  full_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL, *ref = NULL;
  loom_fsdp *f = NULL;
  loom_named_tensor *st = NULL;
  size_t n = 0;
  int rc = fm_create(1 + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  if (!rc) rc = loom_fsdp_full_state(f, &st, &n);
  if (!rc && rank != 0 && (st || n)) rc = LOOM_EINVAL; /* others get nothing */
  if (!rc && rank == 0) {
    rc = fm_create(1, &ref);
    bool ok = !rc && n == loom_module_param_count(ref);
    for (size_t i = 0; ok && i < n; i++) {
      loom_param p;
      loom_module_param(ref, i, &p);
      const loom_named_tensor *e = NULL;
      for (size_t k = 0; k < n && !e; k++)
        if (st[k].name && strcmp(st[k].name, p.name) == 0) e = &st[k];
      ok = e && loom_tensor_dtype(e->tensor) == LOOM_F32 && loom_tensor_same_shape(e->tensor, p.value) &&
           memcmp(loom_tensor_data(e->tensor), loom_tensor_data(p.value), p.numel * sizeof(float)) == 0;
    }
    j->names_ok = ok;
    loom_safetensors_entry es[8];
    for (size_t i = 0; i < n && i < 8; i++) es[i] = (loom_safetensors_entry){.name = st[i].name, .tensor = st[i].tensor};
    if (!rc) rc = loom_safetensors_write(j->path, es, n, NULL, 0);
  }
  loom_fsdp_state_free(st, n);
  loom_fsdp_free(f);
  loom_module_free(m);
  loom_module_free(ref);
  return rc;
}

/* A named state over a plain module's parameters (names and tensors borrowed). */
static void plain_state(loom_module *p, loom_named_tensor *st, size_t *n) {
  *n = loom_module_param_count(p);
  for (size_t i = 0; i < *n; i++) {
    loom_param q;
    loom_module_param(p, i, &q);
    st[i] = (loom_named_tensor){q.name, q.value};
  }
}

static int full_load_rank(loom_pg *pg, void *arg) {
  full_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_tensor *wrong = NULL;
  int rc = fm_create(3 + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  loom_named_tensor st[8], bad[8];
  size_t n = 0;
  plain_state(j->plain, st, &n);
  if (!rc) rc = loom_fsdp_load_full_state(f, st, n);
  if (!rc) rc = ck_full_state(f, rank == 0 ? j->loaded : NULL);
  /* by name: the order of the entries does not matter */
  for (size_t i = 0; i < n; i++) bad[i] = st[n - 1 - i];
  if (!rc) rc = loom_fsdp_load_full_state(f, bad, n);
  if (!rc) rc = ck_full_state(f, rank == 0 ? j->shuffled : NULL);
  if (rc) goto out;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_fsdp_segments(f, &segs, &nseg);
  size_t total = 0;
  for (size_t u = 0; u < nseg; u++) total += segs[u].n;
  float *copy = malloc(total * sizeof(float)), *at = copy;
  for (size_t u = 0; u < nseg; u++) {
    memcpy(at, segs[u].param, segs[u].n * sizeof(float));
    at += segs[u].n;
  }
  /* a wrong name */
  memcpy(bad, st, n * sizeof *st);
  bad[3].name = "layers.2.bias_typo";
  loom_clear_error();
  j->wrong_name_rc[rank] = loom_fsdp_load_full_state(f, bad, n);
  snprintf(j->wrong_name_msg[rank], MSG, "%s", loom_last_error());
  /* a wrong shape: layers.2.weight transposed (same element count) */
  memcpy(bad, st, n * sizeof *st);
  int64_t shape[2] = {FM_H1, FM_H2};
  rc = loom_tensor_zeros(LOOM_F32, 2, shape, &wrong);
  bad[2].tensor = wrong;
  loom_clear_error();
  j->wrong_shape_rc[rank] = loom_fsdp_load_full_state(f, bad, n);
  snprintf(j->wrong_shape_msg[rank], MSG, "%s", loom_last_error());
  j->wrong_count_rc[rank] = loom_fsdp_load_full_state(f, st, n - 1);
  bool same = true;
  at = copy;
  for (size_t u = 0; u < nseg; u++) {
    same = same && memcmp(at, segs[u].param, segs[u].n * sizeof(float)) == 0;
    at += segs[u].n;
  }
  j->untouched[rank] = same;
  free(copy);
out:
  loom_tensor_free(wrong);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_ckpt_full_state_dict_names_values_and_loading) {
  char dir[64], path[128];
  ck_tmp_dir(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  full_job j = {.path = path};
  LT_OK(loom_threads_run(3, NULL, full_create_rank, &j));
  LT_TRUE(j.names_ok);
  /* the file has PyTorch's names, shapes and rank 0's values */
  loom_module *ref = NULL;
  LT_OK(fm_create(1, &ref));
  loom_safetensors *sf = NULL;
  LT_OK(loom_safetensors_open(path, 0, &sf));
  LT_EQ(loom_safetensors_count(sf), 6);
  static const char *const names[] = {"layers.0.weight", "layers.0.bias", "layers.2.weight",
                                      "layers.2.bias",   "layers.4.weight", "layers.4.bias"};
  for (size_t i = 0; i < 6; i++) {
    loom_param p;
    LT_OK(loom_module_param(ref, i, &p));
    LT_STREQ(p.name, names[i]);
    loom_safetensors_info in;
    LT_OK(loom_safetensors_find(sf, names[i], &in));
    LT_EQ(in.dtype, LOOM_F32);
    LT_EQ(in.ndim, loom_tensor_ndim(p.value));
    for (int d = 0; d < in.ndim; d++) LT_EQ(in.shape[d], loom_tensor_shape(p.value)[d]);
    LT_TRUE(memcmp(in.data, loom_tensor_data(p.value), p.numel * sizeof(float)) == 0);
  }
  loom_safetensors_free(sf);
  loom_module_free(ref);

  /* loading a full state at 2 ranks gives it back bit for bit; bad states change nothing */
  size_t np = ck_numel();
  loom_module *plain = NULL;
  LT_OK(fm_create(77, &plain));
  float *want = ck_fbuf();
  fm_flatten_module(plain, want);
  full_job k = {.plain = plain, .loaded = ck_fbuf(), .shuffled = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, full_load_rank, &k));
  LT_TRUE(memcmp(k.loaded, want, np * sizeof(float)) == 0);
  LT_TRUE(memcmp(k.shuffled, want, np * sizeof(float)) == 0);
  for (int r = 0; r < 2; r++) {
    LT_EQ(k.wrong_name_rc[r], LOOM_ENOTFOUND);
    LT_TRUE(strstr(k.wrong_name_msg[r], "layers.2.bias") != NULL);
    LT_EQ(k.wrong_shape_rc[r], LOOM_ESHAPE);
    LT_TRUE(strstr(k.wrong_shape_msg[r], "layers.2.weight") != NULL);
    LT_EQ(k.wrong_count_rc[r], LOOM_EINVAL);
    LT_TRUE(k.untouched[r]);
  }
  free(want);
  free(k.loaded);
  free(k.shuffled);
  loom_module_free(plain);
  fm_rm_tree(dir);
}

/* ---- an optimizer over some of the units (a frozen layer) ------------------------------- */

typedef struct frozen_job {
  const char *save_dir, *load_dir;
  uint64_t seed;
  int first_step, pre_steps, post_steps;
  float *end;
  bool skip_first;
} frozen_job;

/* AdamW over units 0 and 1 only (the last layer frozen), or over 1 and 2 (skip_first: the first
 * frozen); momentum SGD would be the same: fewer state buffers than units x 2. */
static int frozen_rank(loom_pg *pg, void *arg) {
  frozen_job *j = arg;
  int rank = loom_pg_rank(pg), world = loom_pg_size(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  const loom_param_seg *segs = NULL;
  size_t nseg = 0;
  loom_adam_cfg ac = fm_adam();
  int rc = fm_create(j->seed + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  if (!rc) rc = loom_fsdp_segments(f, &segs, &nseg);
  if (!rc) rc = loom_optim_create_adamw(segs + (j->skip_first ? 1 : 0), nseg - 1, &ac, &opt);
  int s = j->first_step;
  if (!rc && j->load_dir) rc = loom_fsdp_load_sharded(f, j->load_dir, opt);
  for (int k = 0; k < j->pre_steps && !rc; k++) rc = ck_train_step(m, f, opt, s++, rank, world);
  if (!rc && j->save_dir) rc = loom_fsdp_save_sharded(f, j->save_dir, opt, NULL, 0);
  for (int k = 0; k < j->post_steps && !rc; k++) rc = ck_train_step(m, f, opt, s++, rank, world);
  if (!rc) rc = ck_full_state(f, rank == 0 ? j->end : NULL);
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_ckpt_optimizer_over_some_units_resumes_bit_identical) {
  char dir[64];
  ck_tmp_dir(dir, sizeof dir);
  size_t np = ck_numel();
  for (int w = 1; w <= 2; w++) {
    frozen_job a = {.save_dir = dir, .seed = 1, .pre_steps = 2, .post_steps = 2, .end = ck_fbuf()};
    LT_OK(loom_threads_run(w, NULL, frozen_rank, &a));
    frozen_job b = {.load_dir = dir, .seed = 30, .first_step = 2, .post_steps = 2, .end = ck_fbuf()};
    LT_OK(loom_threads_run(w, NULL, frozen_rank, &b));
    LT_TRUE(memcmp(a.end, b.end, np * sizeof(float)) == 0);
    free(a.end), free(b.end);
  }
  fm_rm_tree(dir);
}

/* ---- a save that fails on one rank; a broken index ----------------------------------------- */

typedef struct save_fail_job {
  const char *dir;
  int rc[MAXW];
  char msg[MAXW][MSG];
} save_fail_job;

static int save_fail_rank(loom_pg *pg, void *arg) {
  save_fail_job *j = arg;
  int rank = loom_pg_rank(pg);
  loom_module *m = NULL;
  loom_fsdp *f = NULL;
  int rc = fm_create(70 + (uint64_t)rank, &m);
  if (!rc) rc = loom_fsdp_create(pg, m, NULL, &f);
  if (!rc) {
    loom_clear_error();
    j->rc[rank] = loom_fsdp_save_sharded(f, j->dir, NULL, NULL, 0);
    snprintf(j->msg[rank], MSG, "%s", loom_last_error());
  }
  loom_fsdp_free(f);
  loom_module_free(m);
  return rc;
}

LT_TEST(fsdp_ckpt_failed_save_fails_every_rank_and_keeps_the_previous_set) {
  char dir[64], path[256];
  ck_tmp_dir(dir, sizeof dir);
  size_t np = ck_numel();
  ck_job a = {.world = 2, .seed = 1, .pre_steps = 1, .save_dir = dir, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
  /* rank 1's file of the next generation cannot be written: a folder is in its place */
  char gen2[128];
  snprintf(gen2, sizeof gen2, "%s/gen-2", dir);
  LT_TRUE(mkdir(gen2, 0777) == 0);
  ck_rank_file(path, sizeof path, dir, 2, 1, 2);
  LT_TRUE(mkdir(path, 0777) == 0);
  save_fail_job s = {.dir = dir};
  LT_OK(loom_threads_run(2, NULL, save_fail_rank, &s));
  for (int r = 0; r < 2; r++) {
    LT_EQ(s.rc[r], LOOM_EIO);
    LT_TRUE(strstr(s.msg[r], r == 1 ? "rank-1-of-2" : "rank 1") != NULL);
  }
  char buf[32];
  LT_OK(loom_fsdp_sharded_meta(dir, "fsdp.generation", buf, sizeof buf));
  LT_STREQ(buf, "1");
  ck_loader l = ck_try_load(dir, 2, 0, LOOM_OK, "");
  LT_TRUE(l.rc[0] == LOOM_OK && l.rc[1] == LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, np * sizeof(float)) == 0);
  ck_loader_free(&l);
  /* without the obstacle the next save goes through and replaces the set */
  LT_TRUE(rmdir(path) == 0);
  memset(&s, 0, sizeof s);
  s.dir = dir;
  LT_OK(loom_threads_run(2, NULL, save_fail_rank, &s));
  LT_EQ(s.rc[0], LOOM_OK);
  LT_EQ(s.rc[1], LOOM_OK);
  LT_OK(loom_fsdp_sharded_meta(dir, "fsdp.generation", buf, sizeof buf));
  LT_STREQ(buf, "2");
  LT_EQ(count_generations(dir, NULL), 1);
  /* a folder that cannot be made: every rank fails, naming it */
  char under_file[128];
  snprintf(under_file, sizeof under_file, "%s/plain", dir);
  ck_write_all(under_file, "x", 1);
  char sub[160];
  snprintf(sub, sizeof sub, "%s/ckpt", under_file);
  memset(&s, 0, sizeof s);
  s.dir = sub;
  LT_OK(loom_threads_run(2, NULL, save_fail_rank, &s));
  for (int r = 0; r < 2; r++) LT_EQ(s.rc[r], LOOM_EIO);
  LT_TRUE(strstr(s.msg[0], sub) != NULL);
  /* a flipped byte in the index: every load refuses it, naming it */
  char ix[160];
  snprintf(ix, sizeof ix, "%s/fsdp-index.safetensors", dir);
  size_t n = 0;
  unsigned char *b = ck_read_all(ix, &n);
  LT_TRUE(b && n > 100);
  b[n / 3] ^= 0x04;
  ck_write_all(ix, b, n);
  free(b);
  l = ck_try_load(dir, 2, 3, LOOM_EFORMAT, "fsdp-index.safetensors");
  ck_loader_free(&l);
  LT_TRUE(loom_fsdp_sharded_meta(dir, "fsdp.generation", buf, sizeof buf) == LOOM_EFORMAT);
  /* no index at all */
  LT_TRUE(unlink(ix) == 0);
  l = ck_try_load(dir, 1, 1, LOOM_ENOTFOUND, "fsdp-index.safetensors"); /* no checkpoint there */
  ck_loader_free(&l);
  free(a.mid);
  fm_rm_tree(dir);
}

/* ---- values a checkpoint must not hold (a set whose CRCs all agree) ------------------------ */

LT_TEST(fsdp_ckpt_refuses_non_finite_values_and_negative_moments) {
  char dir[64], path[256];
  ck_tmp_dir(dir, sizeof dir);
  ck_job a = {.world = 2, .seed = 1, .pre_steps = 1, .save_dir = dir, .mid = ck_fbuf()};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
  ck_rank_file(path, sizeof path, dir, 1, 1, 2);
  size_t n1 = 0, ni = 0;
  char ix[160];
  snprintf(ix, sizeof ix, "%s/fsdp-index.safetensors", dir);
  unsigned char *good1 = ck_read_all(path, &n1), *goodi = ck_read_all(ix, &ni);
  LT_TRUE(good1 && goodi);
  /* the rewrite itself keeps a loadable set */
  ck_rewrite_rank_file(dir, path, 1, NULL, 0, 0, NULL, NULL);
  ck_loader l = ck_try_load(dir, 2, 0, LOOM_OK, "");
  LT_TRUE(l.rc[0] == LOOM_OK && l.rc[1] == LOOM_OK);
  LT_TRUE(memcmp(l.after, a.mid, ck_numel() * sizeof(float)) == 0);
  ck_loader_free(&l);
  static const struct {
    const char *name;
    float v;
    const char *needle;
  } cases[] = {
      {"layers.2.flat_param", NAN, "layers.2.flat_param"},
      {"layers.0.flat_param", -INFINITY, "layers.0.flat_param"},
      {"layers.4.flat_param.exp_avg", INFINITY, "layers.4.flat_param.exp_avg"},
      {"layers.2.flat_param.exp_avg_sq", -1e-3f, "layers.2.flat_param.exp_avg_sq"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    ck_rewrite_rank_file(dir, path, 1, cases[c].name, 3, cases[c].v, NULL, NULL);
    l = ck_try_load(dir, 2, 2, LOOM_EFORMAT, cases[c].needle);
    ck_loader_free(&l);
    ck_write_all(path, good1, n1);
    ck_write_all(ix, goodi, ni);
  }
  /* a negative step count (rank 0's file has it for everyone) */
  ck_rank_file(path, sizeof path, dir, 1, 0, 2);
  ck_rewrite_rank_file(dir, path, 0, NULL, 0, 0, "optim.step", "-3");
  l = ck_try_load(dir, 2, 3, LOOM_EFORMAT, "optim.step = \"-3\"");
  ck_loader_free(&l);
  free(good1);
  free(goodi);
  free(a.mid);
  fm_rm_tree(dir);
}

/* AdamW over the later units (the first layer frozen): state found by its name on load. */
LT_TEST(fsdp_ckpt_optimizer_over_later_units_resumes_bit_identical) {
  char dir[64];
  ck_tmp_dir(dir, sizeof dir);
  size_t np = ck_numel();
  for (int w = 1; w <= 2; w++) {
    frozen_job a = {.save_dir = dir, .seed = 1, .pre_steps = 2, .post_steps = 2, .end = ck_fbuf(),
                    .skip_first = true};
    LT_OK(loom_threads_run(w, NULL, frozen_rank, &a));
    frozen_job b = {.load_dir = dir, .seed = 30, .first_step = 2, .post_steps = 2, .end = ck_fbuf(),
                    .skip_first = true};
    LT_OK(loom_threads_run(w, NULL, frozen_rank, &b));
    LT_TRUE(memcmp(a.end, b.end, np * sizeof(float)) == 0);
    free(a.end), free(b.end);
  }
  fm_rm_tree(dir);
}
