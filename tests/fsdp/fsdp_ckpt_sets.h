/* fsdp_ckpt_sets.h: sharded checkpoint sets for the FSDP checkpoint tests (test_fsdp_ckpt.c,
 * test_fsdp_ckpt_ranks.c): runs that train the fm model, save and load a set (ck_job), a fresh
 * fsdp that tries to load one and reports each rank's status, message and whether its state is
 * untouched (ck_loader, ck_try_load), and the forgery of a rank file with the index re-signed
 * to name it (ck_rewrite_rank_file). */
#ifndef LOOM_TESTS_FSDP_CKPT_SETS_H
#define LOOM_TESTS_FSDP_CKPT_SETS_H

#include "fsdp_model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { GB = 12, MAXW = 4, MAXSTEPS = 8, MSG = 600 };

/* A run: create, [load], [train, save], train. */
typedef struct ck_job {
  int world;
  bool f16;
  uint64_t seed;          /* model seed = seed + rank (rank 0's values win) */
  const char *load_dir;   /* load right after create */
  int first_step;         /* data index of the first step */
  int pre_steps;          /* steps before the save */
  const char *save_dir;   /* save after pre_steps */
  const loom_safetensors_meta_kv *meta;
  size_t nmeta;
  int post_steps;         /* steps after the save (or the load) */
  /* results */
  float *mid;             /* rank 0: the full state at the save, or right after the load */
  float *end;             /* rank 0: the full state at the end */
  int64_t step_count;     /* rank 0: the optimizer's step count at mid */
  float scales[MAXSTEPS]; /* rank 0: the loss scale after each post step */
  float scale_mid;
} ck_job;

/* A fresh fsdp (other seeds, one step of training so the optimizer state is not zero) that
 * tries to load dir: each rank's status and message, whether its shards, optimizer state and
 * step count are untouched, and rank 0's full state before and after. */
typedef struct ck_loader {
  const char *dir;
  const int64_t *sizes;         /* NULL: the fm model */
  const char *const *list;      /* a list wrap policy (NULL: the default) */
  size_t nlist;
  int rc[MAXW];
  char msg[MAXW][MSG];
  bool untouched[MAXW];
  float *before, *after;        /* rank 0 (the fm model only) */
} ck_loader;


size_t ck_numel(void);                       /* the fm model's parameter count */
float *ck_fbuf(void);                        /* calloc'ed, ck_numel() floats */
void ck_tmp_dir(char *dir, size_t cap);      /* a new folder under /tmp */
unsigned char *ck_read_all(const char *path, size_t *n);
void ck_write_all(const char *path, const void *b, size_t n);
void ck_rank_file(char *buf, size_t cap, const char *dir, long long gen, int r, int w);
int ck_train_step(loom_module *m, loom_fsdp *f, loom_optim *opt, int s, int rank, int world);
int ck_full_state(loom_fsdp *f, float *out);
void ck_mp_cfg(loom_fsdp_cfg *c, bool f16);
int ck_job_rank(loom_pg *pg, void *arg);     /* arg: a ck_job */
int ck_loader_rank(loom_pg *pg, void *arg);  /* arg: a ck_loader */
ck_loader ck_try_load(const char *dir, int world, unsigned failing, int code, const char *needle);
void ck_loader_free(ck_loader *l);
/* Rewrite the checkpoint at path (a valid CRC) with tensor `name`'s element `at` set to v (f32
 * or i64 tensors), or (name NULL) the metadata `key` set to `value`. */
void ck_rewrite(const char *path, const char *name, size_t at, double v, const char *key,
                const char *value);
/* Re-sign dir's index for the file at path as rank `rank`'s: its size and CRC. */
void ck_resign(const char *dir, const char *path, int rank);
/* ck_rewrite of rank `rank`'s file at path, then ck_resign. */
void ck_rewrite_rank_file(const char *dir, const char *path, int rank, const char *name,
                          size_t at, float v, const char *key, const char *value);

#endif
