/* gemm_prim.c: the oneDNN plumbing the GEMM and convolution kernels share: status mapping,
 * the CPU engine, the thread count, and the primitive cache.
 *
 * Building a oneDNN primitive descriptor and primitive costs from tens of microseconds to a
 * few milliseconds, far more than a small GEMM, so built primitives are kept in a cache keyed
 * by everything that shapes them (loom__prim_key), evicted least recently used. The cache is
 * a static array scanned by hash under one mutex (a few hundred nanoseconds) and allocates
 * nothing itself (the primitives are oneDNN's). Building happens outside the lock; when two
 * threads build the same key at once the second keeps the first's entry and drops its own.
 * Each slot counts the calls running it, and only idle slots are evicted, so a primitive is
 * never destroyed under a running call (if every slot is busy, a new primitive serves its one
 * call and is destroyed after it). Each run creates its own stream and memory objects and allocates
 * its scratchpad (user scratchpad mode) through loom__malloc, so concurrent runs share nothing
 * mutable and no memory stays allocated between calls. */
#include "ops/gemm.h"
#include "ops/gemm_int.h"
#include "loom/ops.h"

#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom__dnnl_check(dnnl_status_t st, const char *who, const char *what) {
  if (st == dnnl_success) return LOOM_OK;
  return loom__fail(st == dnnl_out_of_memory ? LOOM_ENOMEM : LOOM_EBACKEND,
                    "%s: oneDNN %s failed: %s", who, what, dnnl_status2str(st));
}

void *loom__gemm_alloc(size_t bytes, const char *who, const char *what) {
  void *p = loom__malloc(LOOM_POOL_COMPUTE, bytes);
  if (!p) loom__fail(LOOM_ENOMEM, "%s: out of memory allocating %s (%zu bytes)", who, what, bytes);
  return p;
}

/* ---- engine ------------------------------------------------------------------------ */

static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static dnnl_engine_t engine;
static dnnl_status_t engine_status;

/* Builds and runs one tiny matmul so that oneDNN's lazily created globals (its primitive
 * cache, CPU ISA detection) are made here, under pthread_once, and not by whichever threads
 * first call in at the same time. oneDNN makes them thread-safely (C++ static
 * initialisation), but it is not built with ThreadSanitizer, which then cannot see that
 * synchronisation and reports races between rank threads; pthread_once it can see. */
static dnnl_status_t warm_up(void) {
  dnnl_status_t st;
  dnnl_memory_desc_t md;
  dnnl_matmul_desc_t desc;
  dnnl_primitive_desc_t pd = NULL;
  dnnl_primitive_t prim = NULL;
  dnnl_stream_t stream = NULL;
  dnnl_memory_t mem = NULL;
  float v = 1.0f;
  if ((st = dnnl_memory_desc_init_by_tag(&md, 2, (dnnl_dims_t){1, 1}, dnnl_f32, dnnl_ab)) ||
      (st = dnnl_matmul_desc_init(&desc, &md, &md, NULL, &md)) ||
      (st = dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL)) ||
      (st = dnnl_primitive_create(&prim, pd)) || (st = dnnl_memory_create(&mem, &md, engine, &v)) ||
      (st = dnnl_stream_create(&stream, engine, dnnl_stream_default_flags)))
    goto done;
  dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, mem}, {DNNL_ARG_WEIGHTS, mem}, {DNNL_ARG_DST, mem}};
  if ((st = dnnl_primitive_execute(prim, stream, 3, args)) == dnnl_success)
    st = dnnl_stream_wait(stream);
done:
  if (stream) dnnl_stream_destroy(stream);
  if (mem) dnnl_memory_destroy(mem);
  if (prim) dnnl_primitive_destroy(prim);
  if (pd) dnnl_primitive_desc_destroy(pd);
  return st;
}

/* LOOM_CPU=avx2 (or scalar) emulates a CPU without AVX-512 for oneDNN as well: it caps
 * oneDNN at AVX2 unless oneDNN's own cap (ONEDNN_MAX_CPU_ISA, or DNNL_MAX_CPU_ISA) is set.
 * Must run before oneDNN generates its first kernel. */
static void cap_isa(void) {
  const char *cap = getenv("LOOM_CPU");
  if (!cap || (strcmp(cap, "avx2") != 0 && strcmp(cap, "scalar") != 0)) return;
  if (getenv("ONEDNN_MAX_CPU_ISA") || getenv("DNNL_MAX_CPU_ISA")) return;
  dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
}

static void engine_init(void) {
  cap_isa();
  engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
  if (engine_status == dnnl_success) engine_status = warm_up();
}

int loom__dnnl_engine(const char *who, dnnl_engine_t *out) {
  pthread_once(&engine_once, engine_init);
  *out = engine;
  return loom__dnnl_check(engine_status, who, "engine creation");
}

/* ---- threads ----------------------------------------------------------------------- */

/* Under ThreadSanitizer oneDNN runs on the calling thread only: libgomp is not instrumented,
 * so TSan cannot see its barriers and would report every parallel region as racy. */
#ifdef __SANITIZE_THREAD__
enum { MAX_THREADS = 1 };
#else
enum { MAX_THREADS = 1 << 16 };
#endif

/* The most threads a call may use: loom_max_num_threads() (a few per CPU), also when
 * OMP_NUM_THREADS asks for more (libgomp crashes creating 100000 threads). */
static int max_threads(void) {
  int m = loom_max_num_threads();
  return m < MAX_THREADS ? m : MAX_THREADS;
}

void loom__gemm_set_threads(int n) {
  int m = max_threads();
  omp_set_num_threads(n < 1 ? 1 : n > m ? m : n);
}

int loom__gemm_threads(void) {
  int n = omp_get_max_threads(), m = max_threads();
  if (n > m) omp_set_num_threads(n = m);
  return n;
}

/* ---- cache ------------------------------------------------------------------------- */

typedef struct slot {
  uint64_t hash, used;
  loom__prim_key key;
  dnnl_primitive_t prim; /* NULL: free slot */
  size_t scratch_bytes;
  int refs; /* calls running it */
} slot;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static slot slots[LOOM__PRIM_CACHE_MAX];
static int64_t capacity = 256, entries;
static uint64_t tick, hits, misses, evictions;

static uint64_t key_hash(const loom__prim_key *k) { /* FNV-1a over the key's bytes */
  return loom__fnv1a(LOOM__FNV1A_BASIS, k, sizeof *k);
}

static int find(const loom__prim_key *key, uint64_t h) {
  for (int i = 0; i < LOOM__PRIM_CACHE_MAX; i++)
    if (slots[i].prim && slots[i].hash == h && memcmp(&slots[i].key, key, sizeof *key) == 0)
      return i;
  return -1;
}

/* Evicts least recently used idle entries while `limit` or more are held, collecting their
 * primitives in dead[] to destroy outside the lock (under cache_mu). */
static void evict(int64_t limit, dnnl_primitive_t *dead, int *ndead) {
  while (entries >= limit) {
    slot *lru = NULL;
    for (int i = 0; i < LOOM__PRIM_CACHE_MAX; i++)
      if (slots[i].prim && slots[i].refs == 0 && (!lru || slots[i].used < lru->used))
        lru = &slots[i];
    if (!lru) return; /* every entry is running */
    dead[(*ndead)++] = lru->prim;
    lru->prim = NULL;
    entries--;
    evictions++;
  }
}

/* The primitive descriptor for `key`, with the attr every loom primitive has (user
 * scratchpad). */
static int build_pd(const loom__prim_key *key, loom__prim_build_fn build, const char *who,
                    dnnl_primitive_desc_t *pd) {
  int rc = LOOM_OK;
  dnnl_engine_t eng;
  dnnl_primitive_attr_t attr = NULL;
  *pd = NULL;
  LOOM_TRY(loom__dnnl_engine(who, &eng));
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_attr_create(&attr), who, "attribute creation"));
  LOOM_TRY(
      loom__dnnl_check(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
                       who, "scratchpad mode"));
  rc = build(key, attr, eng, who, pd);
done:
  if (attr) dnnl_primitive_attr_destroy(attr);
  return rc;
}

static int build_prim(const loom__prim_key *key, loom__prim_build_fn build, const char *who,
                      loom__prim *out) {
  int rc = LOOM_OK;
  dnnl_primitive_desc_t pd = NULL;
  LOOM_TRY(build_pd(key, build, who, &pd));
  const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
  out->scratch_bytes = smd ? dnnl_memory_desc_get_size(smd) : 0;
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_create(&out->prim, pd), who, "primitive creation"));
done:
  if (pd) dnnl_primitive_desc_destroy(pd);
  return rc;
}

bool loom__bf16_kernel_fast(bool amx, bool intel) {
  static _Atomic int mode = -1; /* 0 rule, 1 native, 2 widen: LOOM_BF16_KERNELS, read once */
  int m = atomic_load(&mode);
  if (m < 0) {
    const char *e = getenv("LOOM_BF16_KERNELS");
    m = e && !strcmp(e, "native") ? 1 : e && !strcmp(e, "widen") ? 2 : 0;
    atomic_store(&mode, m);
  }
  if (m) return m == 1;
  return amx || !intel;
}

bool loom__prim_probe_bf16(_Atomic int *answer, const loom__prim_key *key,
                           loom__prim_build_fn build) {
  int known = atomic_load(answer);
  if (known) return known > 0;
  char saved[512]; /* the caller's last error, kept: a probe that fails is not an error */
  snprintf(saved, sizeof saved, "%s", loom_last_error());
  dnnl_primitive_desc_t pd = NULL;
  bool ok = build_pd(key, build, "loom__prim_probe", &pd) == LOOM_OK;
  if (pd) dnnl_primitive_desc_destroy(pd);
  if (saved[0])
    loom__fail(LOOM_EBACKEND, "%s", saved);
  else
    loom_clear_error();
  /* oneDNN's effective ISA (after build_pd: the engine applied loom's cap), which the kernels
   * of every shape use; the kernel of the probe's tiny shape need not be AMX's */
  unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
  unsigned amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
  ok = ok && loom__bf16_kernel_fast((isa & amx) == amx, loom__cpu_intel());
  atomic_store(answer, ok ? 1 : -1); /* threads probing at once all store the same answer */
  return ok;
}


int loom__prim_get(const loom__prim_key *key, loom__prim_build_fn build, const char *who,
                   loom__prim *out) {
  *out = (loom__prim){NULL, 0, -1};
  uint64_t h = key_hash(key);
  pthread_mutex_lock(&cache_mu);
  int i = find(key, h);
  if (i >= 0) {
    slots[i].refs++;
    slots[i].used = ++tick;
    hits++;
    *out = (loom__prim){slots[i].prim, slots[i].scratch_bytes, i};
  } else {
    misses++;
  }
  pthread_mutex_unlock(&cache_mu);
  if (out->prim) return LOOM_OK;

  int rc = build_prim(key, build, who, out);
  if (rc != LOOM_OK) return rc;
  dnnl_primitive_t dead[LOOM__PRIM_CACHE_MAX + 1];
  int ndead = 0;
  pthread_mutex_lock(&cache_mu);
  i = find(key, h);
  if (i >= 0) { /* another thread built it meanwhile: use theirs, drop ours */
    dead[ndead++] = out->prim;
  } else {
    evict(capacity, dead, &ndead);
    for (int j = 0; j < LOOM__PRIM_CACHE_MAX && entries < capacity; j++)
      if (!slots[j].prim) {
        i = j;
        break;
      }
    if (i >= 0) { /* else every entry is running: ours stays private to this call */
      slots[i] =
          (slot){.hash = h, .key = *key, .prim = out->prim, .scratch_bytes = out->scratch_bytes};
      entries++;
    }
  }
  if (i >= 0) {
    slots[i].refs++;
    slots[i].used = ++tick;
    *out = (loom__prim){slots[i].prim, slots[i].scratch_bytes, i};
  }
  pthread_mutex_unlock(&cache_mu);
  for (int d = 0; d < ndead; d++) dnnl_primitive_destroy(dead[d]);
  return LOOM_OK;
}

void loom__prim_release(loom__prim *p) {
  if (!p->prim) return;
  if (p->slot < 0) {
    dnnl_primitive_destroy(p->prim);
  } else {
    dnnl_primitive_t dead[LOOM__PRIM_CACHE_MAX + 1];
    int ndead = 0;
    pthread_mutex_lock(&cache_mu);
    slots[p->slot].refs--;
    evict(capacity + 1, dead, &ndead); /* entries kept over capacity while they ran */
    pthread_mutex_unlock(&cache_mu);
    for (int d = 0; d < ndead; d++) dnnl_primitive_destroy(dead[d]);
  }
  *p = (loom__prim){NULL, 0, -1};
}

void loom__prim_cache_stats(loom__prim_cache_info *out) {
  pthread_mutex_lock(&cache_mu);
  *out = (loom__prim_cache_info){entries, capacity, hits, misses, evictions};
  pthread_mutex_unlock(&cache_mu);
}

int loom__prim_cache_set_capacity(int64_t cap) {
  if (cap < 1 || cap > LOOM__PRIM_CACHE_MAX)
    return loom__fail(LOOM_EINVAL, "loom__prim_cache_set_capacity: capacity %lld is not in 1..%d",
                      (long long)cap, LOOM__PRIM_CACHE_MAX);
  dnnl_primitive_t dead[LOOM__PRIM_CACHE_MAX + 1];
  int ndead = 0;
  pthread_mutex_lock(&cache_mu);
  capacity = cap;
  evict(cap + 1, dead, &ndead);
  pthread_mutex_unlock(&cache_mu);
  for (int d = 0; d < ndead; d++) dnnl_primitive_destroy(dead[d]);
  return LOOM_OK;
}

/* ---- running ----------------------------------------------------------------------- */

#define MAX_BUFS 8

int loom__prim_run(const loom__prim *p, const char *who, int n, const loom__dnnl_buf *bufs) {
  int rc = LOOM_OK;
  dnnl_engine_t eng;
  dnnl_stream_t stream = NULL;
  const_dnnl_primitive_desc_t pd = NULL;
  dnnl_exec_arg_t args[MAX_BUFS + 1];
  int nargs = 0;
  void *scratch = NULL;
  LOOM_TRY(loom__dnnl_engine(who, &eng));
  LOOM_TRY(loom__dnnl_check(dnnl_primitive_get_primitive_desc(p->prim, &pd), who, "query"));
  for (int i = 0; i < n && i < MAX_BUFS; i++) {
    const dnnl_memory_desc_t *md =
        dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, bufs[i].arg);
    args[nargs].arg = bufs[i].arg;
    args[nargs].memory = NULL;
    nargs++;
    LOOM_TRY(loom__dnnl_check(md ? dnnl_memory_create(&args[nargs - 1].memory, md, eng, bufs[i].ptr)
                                 : dnnl_invalid_arguments,
                              who, "memory creation"));
  }
  if (p->scratch_bytes) {
    LOOM__GEMM_ALLOC(scratch, p->scratch_bytes, who, "the oneDNN scratchpad");
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    args[nargs].arg = DNNL_ARG_SCRATCHPAD;
    args[nargs].memory = NULL;
    nargs++;
    LOOM_TRY(loom__dnnl_check(dnnl_memory_create(&args[nargs - 1].memory, md, eng, scratch), who,
                              "scratchpad memory creation"));
  }
  if (loom__dry()) goto done; /* every buffer made, nothing run */
  LOOM_TRY(loom__dnnl_check(dnnl_stream_create(&stream, eng, dnnl_stream_default_flags), who,
                            "stream creation"));
  LOOM_TRY(
      loom__dnnl_check(dnnl_primitive_execute(p->prim, stream, nargs, args), who, "execution"));
  LOOM_TRY(loom__dnnl_check(dnnl_stream_wait(stream), who, "stream wait"));
done:
  if (stream) dnnl_stream_destroy(stream);
  for (int i = 0; i < nargs; i++)
    if (args[i].memory) dnnl_memory_destroy(args[i].memory);
  loom__free(scratch);
  return rc;
}
