/* test_fsdp_ckpt_ranks.c: a sharded set whose files disagree with their index or each other,
 * every CRC valid (the index re-signed as someone who copies or edits files would): a rank file
 * of another rank, world, generation or optimizer step, and numbers written another way (a
 * sign, a leading zero, 20 digits), each refused with EFORMAT naming the file and both values,
 * nothing loaded. And the index itself forged with a valid CRC: its world, generation, step,
 * unit names and lengths, files table, each refused naming the file and the reason. */
#include "lt.h"
#include "fsdp_ckpt_sets.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A 2-rank set after `steps` steps in dir: rank r's file in path[r], its bytes in good[r], the
 * index's in goodi. */
typedef struct set {
  char dir[64], path[2][256], index[160];
  unsigned char *good[2], *goodi;
  size_t n[2], ni;
  float *mid;
} set;

static void set_make(set *s, int steps) {
  ck_tmp_dir(s->dir, sizeof s->dir);
  s->mid = ck_fbuf();
  ck_job a = {.world = 2, .seed = 1, .pre_steps = steps, .save_dir = s->dir, .mid = s->mid};
  LT_OK(loom_threads_run(2, NULL, ck_job_rank, &a));
  for (int r = 0; r < 2; r++) {
    ck_rank_file(s->path[r], sizeof s->path[r], s->dir, 1, r, 2);
    s->good[r] = ck_read_all(s->path[r], &s->n[r]);
    LT_TRUE(s->good[r] != NULL);
  }
  snprintf(s->index, sizeof s->index, "%s/fsdp-index.safetensors", s->dir);
  s->goodi = ck_read_all(s->index, &s->ni);
  LT_TRUE(s->goodi != NULL);
}

static void set_restore(set *s) {
  for (int r = 0; r < 2; r++) ck_write_all(s->path[r], s->good[r], s->n[r]);
  ck_write_all(s->index, s->goodi, s->ni);
}

static void set_free(set *s) {
  set_restore(s);
  ck_loader l = ck_try_load(s->dir, 2, 0, LOOM_OK, ""); /* restored: it loads again */
  LT_TRUE(l.rc[0] == LOOM_OK && l.rc[1] == LOOM_OK);
  LT_TRUE(memcmp(l.after, s->mid, ck_numel() * sizeof(float)) == 0);
  ck_loader_free(&l);
  free(s->good[0]), free(s->good[1]), free(s->goodi), free(s->mid);
  fm_rm_tree(s->dir);
}

/* Loads of dir at 2 ranks (`failing` the ranks that read the bad file) and at 1: EFORMAT, each
 * message holding both needles. */
static void refused(const char *dir, unsigned failing, const char *a, const char *b, int line) {
  for (int w = 2; w >= 1; w--) {
    ck_loader l = ck_try_load(dir, w, w == 2 ? failing : 1, LOOM_EFORMAT, a);
    for (int r = 0; r < w; r++)
      if ((w == 1 || failing >> r & 1) && !strstr(l.msg[r], b))
        lt_fail_at(__FILE__, line, "%d ranks, rank %d: \"%s\" lacks \"%s\"", w, r, l.msg[r], b);
    ck_loader_free(&l);
  }
}

/* Rank 0's file copied over rank 1's, the index re-signed: it used to load, exit 0, rank 1
 * holding rank 0's shards. */
LT_TEST(fsdp_ckpt_rank_file_of_another_rank_is_refused_naming_both) {
  set s;
  set_make(&s, 2);
  ck_write_all(s.path[1], s.good[0], s.n[0]);
  ck_resign(s.dir, s.path[1], 1);
  refused(s.dir, 2, "rank-1-of-2.safetensors", "rank 0 of 2; the index puts it at rank 1 of 2",
          __LINE__);
  set_restore(&s);
  /* and its metadata edited instead: another rank, another world */
  ck_rewrite_rank_file(s.dir, s.path[1], 1, NULL, 0, 0, "fsdp.rank", "0");
  refused(s.dir, 2, "rank-1-of-2.safetensors", "rank 0 of 2", __LINE__);
  set_restore(&s);
  ck_rewrite_rank_file(s.dir, s.path[1], 1, NULL, 0, 0, "fsdp.world", "3");
  refused(s.dir, 2, "rank-1-of-2.safetensors", "rank 1 of 3", __LINE__);
  set_free(&s);
}

/* A rank file of the same run one step earlier, in place and re-signed; and the generation or
 * step edited. */
LT_TEST(fsdp_ckpt_rank_file_of_another_step_is_refused_naming_both) {
  set s, early;
  set_make(&s, 2);
  set_make(&early, 1);
  ck_write_all(s.path[1], early.good[1], early.n[1]);
  ck_resign(s.dir, s.path[1], 1);
  refused(s.dir, 2, "rank-1-of-2.safetensors", "optimizer step 1; the index says 2", __LINE__);
  set_restore(&s);
  /* rank 0's too: the file every rank reads first */
  ck_write_all(s.path[0], early.good[0], early.n[0]);
  ck_resign(s.dir, s.path[0], 0);
  refused(s.dir, 3, "rank-0-of-2.safetensors", "optimizer step 1; the index says 2", __LINE__);
  set_restore(&s);
  ck_rewrite_rank_file(s.dir, s.path[1], 1, NULL, 0, 0, "fsdp.generation", "4");
  refused(s.dir, 2, "rank-1-of-2.safetensors", "generation 4; the index is of generation 1",
          __LINE__);
  set_free(&s);
  set_free(&early);
}

/* Numbers are written one way: digits, no sign, no leading zero, in range. */
LT_TEST(fsdp_ckpt_rank_file_numbers_are_parsed_strictly) {
  set s;
  set_make(&s, 2);
  static const struct {
    const char *key, *value;
  } cases[] = {
      {"optim.step", "10000000000000000002"}, /* 20 digits */
      {"optim.step", "18446744073709551618"}, /* 2^64 + 2 */
      {"optim.step", "9223372036854775807"},  /* INT64_MAX: no step count that large */
      {"optim.step", "+2"},     {"optim.step", "02"},       {"optim.step", "2 "},
      {"optim.step", ""},       {"optim.step", "0x2"},      {"fsdp.rank", "-1"},
      {"fsdp.rank", "01"},      {"fsdp.world", "2.0"},      {"fsdp.generation", "1e0"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    ck_rewrite_rank_file(s.dir, s.path[1], 1, NULL, 0, 0, cases[c].key, cases[c].value);
    char want[96];
    snprintf(want, sizeof want, "%s = \"%s\" is not a count", cases[c].key, cases[c].value);
    refused(s.dir, 2, "rank-1-of-2.safetensors", want, __LINE__);
    set_restore(&s);
  }
  set_free(&s);
}

/* The index forged, its CRC valid: every load refuses it, naming the file and the reason. */
LT_TEST(fsdp_ckpt_forged_index_with_a_valid_crc_is_refused_naming_the_reason) {
  set s;
  set_make(&s, 2);
  static const struct {
    const char *key, *value; /* a metadata edit, or (key NULL) an element of a table */
    const char *table;
    size_t at;
    double v;
    int code;
    const char *file, *reason;
  } cases[] = {
      {"fsdp.step", "5", NULL, 0, 0, LOOM_EFORMAT, "rank-0-of-2", "optimizer step 2; the index says 5"},
      {"fsdp.step", "-1", NULL, 0, 0, LOOM_EFORMAT, "fsdp-index", "fsdp.step = \"-1\" is not a count"},
      {"fsdp.world", "02", NULL, 0, 0, LOOM_EFORMAT, "fsdp-index", "fsdp.world = \"02\" is not a count"},
      {"fsdp.world", "0", NULL, 0, 0, LOOM_EFORMAT, "fsdp-index", "world 0 out of range"},
      {"fsdp.generation", "99999999999999999999", NULL, 0, 0, LOOM_EFORMAT, "fsdp-index",
       "fsdp.generation = \"99999999999999999999\" is not a count"},
      {"fsdp.generation", "3", NULL, 0, 0, LOOM_EIO, "gen-3/rank-0-of-2", "cannot"},
      {"fsdp.unit.1", "layers.9", NULL, 0, 0, LOOM_EINVAL, "unit 1", "'layers.9'"},
      {"fsdp.units", "2", NULL, 0, 0, LOOM_EFORMAT, "fsdp-index", "does not match its counts"},
      {NULL, NULL, "units", 3, 1, LOOM_EFORMAT, "", "unit 1's shard length 1 in the index is wrong"},
      {NULL, NULL, "files", 2, 1000, LOOM_EFORMAT, "rank-1-of-2", "not the file the index names"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    ck_rewrite(s.index, cases[c].table, cases[c].at, cases[c].v, cases[c].key, cases[c].value);
    /* rank 1 (and a lone rank) reads rank 1's file; every rank reads rank 0's and the index */
    unsigned failing = strcmp(cases[c].file, "rank-1-of-2") == 0 ? 2 : 3;
    ck_loader l = ck_try_load(s.dir, 2, failing, cases[c].code, cases[c].file);
    for (int r = 0; r < 2; r++)
      if ((failing >> r & 1) && !strstr(l.msg[r], cases[c].reason))
        lt_fail_at(__FILE__, __LINE__, "case %zu, rank %d: \"%s\" lacks \"%s\"", c, r, l.msg[r],
                   cases[c].reason);
    ck_loader_free(&l);
    set_restore(&s);
  }
  set_free(&s);
}
