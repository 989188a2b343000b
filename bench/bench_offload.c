/* bench_offload.c: FSDP offload against FSDP without it, side by side in one run: the compute
 * pool's peak per rank, the process's peak RSS, step time and the exposed transfer wait.
 *
 * Model and step as bench_fsdp: MLP 784-4096-4096-4096-4096-10 (53.6 M parameters: 858 MB of
 * f32 AdamW training state, values + gradients + two moments), 2 ranks on the threads backend,
 * batch 64 per rank of seeded random data, cross-entropy, AdamW (loom_adamw_cfg_default), FSDP's
 * defaults (one unit per Linear, reshard after forward, prefetch 1). A step is forward, loss,
 * backward, loom_fsdp_finish and loom_fsdp_optim_step. Configurations:
 *   fsdp          no offload (the optimizer's state in the compute pool, as bench_fsdp);
 *   host p1, p0   everything offloaded (parameters, gradients, optimizer state) to the host tier,
 *                 prefetch_steps 1 and 0 (0: no transfer ahead of its use);
 *   disk p1 t1, disk p0 t1   the disk tier with one I/O thread per rank (io_threads 1:
 *                 one transfer at a time, as before the worker pool) instead of the default;
 *   disk p1 buf, disk p0 buf   the disk tier through the page cache (LOOM_OFFLOAD_DIRECT=0)
 *                 instead of O_DIRECT;
 *   disk p1 g0    disk p1 with FSDP's gathers issued when needed, not one unit ahead
 *                 (forward_prefetch = backward_prefetch = 0): one gathered unit per rank at a
 *                 time, the resident memory's floor;
 *   disk p1 cache disk p1 with loom's allocator cache on (its default): no fresh pages to fault
 *                 in for each gathered unit, gradient and chunk buffer, more resident memory;
 *   disk p1 gfifo, disk p1 bf16 gfifo   disk p1 and disk p1 bf16 as before the backward's
 *                 gradient puts went ahead of the gathers' queued reads
 *                 (LOOM_FSDP_GRAD_FIRST=0): the A/B of that change;
 *   disk p1 gover, disk p1 bf16 gover   each unit's gradient written while the next unit's
 *                 backward computes (LOOM_FSDP_GRAD_OVERLAP=1; the default writes it before
 *                 that backward starts): faster, about one shard more resident in f32;
 *   disk p1 async, disk p1 bf16 async, disk p0 async   the optimizer step's pass on a thread
 *                 of its own behind the next forward (cfg.offload.async_step true);
 *   disk p1 sync, disk p1 bf16 sync, disk p0 sync   the pass within loom_fsdp_optim_step
 *                 (async_step false, the default): the A/B of that change;
 *   disk p1 nothp disk p1 with the allocator's large blocks in 4 KiB pages
 *                 (LOOM_ALLOC_HUGEPAGES=0) instead of transparent huge pages;
 *   fsdp bf16, host p1 bf16, disk p1 bf16, disk p0 bf16   FSDP mixed precision with a bf16
 *                 forward (the gathers move bf16), with the tier's low-precision parameter copy
 *                 (the default: the gathers read it, the optimizer step writes it);
 *                 "fsdp bf16" is their reference for step / fsdp;
 *   host p1 bf16 nocopy, disk p1 bf16 nocopy   the same without that copy
 *                 (low_precision_params false: the gathers read the f32 shard and cast it);
 *   disk p1 oib, disk p1 bf16 oib   disk p1 and disk p1 bf16 with the optimizer step inside
 *                 backward (cfg.optim_in_backward): no gradient goes to the tier and back;
 *   disk p1, p0   the same on the disk tier, in a folder of the first argument (default
 *                 /var/tmp). The whole page cache is dropped before each run (sync;
 *                 drop_caches 1 when writable), and the tier file's pages before every step
 *                 (fdatasync, POSIX_FADV_DONTNEED; with O_DIRECT, which caches nothing, before the
 *                 first timed step only), so the disk is really read ("disk rd MB" is
 *                 /proc/self/io's read_bytes per step: what came from storage, not from the
 *                 cache) while the libraries' pages stay cached, as in any run. That
 *                 fdatasync is outside the timed step: it also lands the last step's writes
 *                 the kernel had not written back yet ("writeback s", median per step), which
 *                 a run without it would pay during its next step, so the disk ratio is also
 *                 given with it counted in (the steady-state cost).
 * With offload the optimizer is made with state_pool LOOM_POOL_HOST (loom_fsdp.h's advice).
 * The disk runs turn loom's allocator cache off (loom_mem_set_cache_limit(0), as
 * LOOM_ALLOC_CACHE_MB=0 does): the blocks it keeps for reuse are resident memory, which is
 * what the disk tier is there to cut.
 *
 * Each configuration runs in a child process of its own (fork, before any thread exists), so
 * its peak RSS is its own: VmHWM is reset (/proc/self/clear_refs 5) after the warm-up step and
 * read after the timed steps: the training's peak, apart from building the model (each rank
 * builds the whole model before FSDP shards it: "RSS build" is VmHWM before the reset).
 * Compute pool: each rank's peak on its account over the timed steps (reset after warm-up),
 * the largest over the ranks. What offload has to keep in the compute pool ("in flight"): the
 * no-offload run's peak less its state between steps (the gathered units, local gradients and
 * activations of the step, which offload does not change), plus, with prefetch on the disk
 * tier under bf16 without the low-precision copy, the parameter shard brought back ahead of its
 * gather to be cast (every other gather reads its part straight out of the tier into its
 * buffer, and gradients are reduce-scattered in place, so nothing else of a shard is in the
 * compute pool), plus on the disk tier the optimizer's chunk ring (3 sets of 4 chunks of chunk_bytes; the host
 * tier's step works on the tier's buffers). Targets (the offload issue):
 * compute peak <= 1.1 x that, and <= 0.4 x the no-offload peak; disk RSS <= 35% of the training
 * state; step host p1 <= 1.2 x fsdp, disk p1 <= 2 x; exposed wait <= 30% of the transfer time.
 * Speed: `rounds` rounds of every configuration (default 3), rank 0's mean step time per run
 * (a step: from its forward's start to the next step's; the last one's to the end of its
 * optimizer step's pass, loom_fsdp_optim_wait: the pass behind the call is in the step it
 * belongs to, and the warm-up step's pass ends before the timed steps start),
 * the ratio to the round's fsdp run, median over rounds. The step's floor on the disk tier is
 * measured right after each disk run, in the same round (the same load on the machine): that
 * run's traffic per step (bytes read and written per rank) replayed with no compute, one
 * replay per rank at once, twice: O_DIRECT with loom's 4 requests in flight per rank, and
 * through the page cache one request at a time; the floor is the faster of the two (on the
 * Zen 3 VM the page cache's, 1.4-2.1 s against 2.1-3.6: a floor that another way of moving the
 * bytes beat would flatter the step); "step / floor" is per round, median over the
 * rounds (target <= 1.2), and prefetch on / off per round (target <= 1). On a disk whose rate
 * was set (bench/steady_disk.sh, which sets LOOM_BENCH_DEVICE_MBPS: a RAM-backed disk
 * throttled to that many MB/s each way), the floor that rate gives is reported beside: the
 * larger of both ranks' reads and writes over it (the replays came out 0.74-1.25 of it on a
 * Zen 3: the kernel's throttle lets some bursts through faster than its rate). "Bytes read from
 * storage / the gets' bytes" is /proc/self/io's read_bytes per step over what the store's gets
 * asked for, both ranks (target <= 1.05).
 *
 * Where the time goes ("cpu," lines): per configuration and round the median step's wall time
 * beside the process's CPU time per step (both ranks; user and system from getrusage) and its
 * minor page faults per step (fresh pages the kernel zeroes and maps).
 *
 * Usage: bench_offload [dir] [steps] [rounds] [configs]: configs a comma-separated list of the
 * names above (fsdp always runs: the ratios' reference), default all. Under MPI, one rank per process (how a site runs
 * it, and where "the process's peak RSS" is one rank's): mpirun -n 2 bench_offload --mpi CONFIG
 * [dir] [steps], CONFIG one of the names above; each process reports its own RSS. */
#define _GNU_SOURCE /* sync_file_range */
#include "bench_util.h"

#include <loom/cpu.h>
#include <loom/dist.h>
#include <loom/dist_mpi.h>
#include <loom/fsdp.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define NR 2
#define BATCH 64
#define MAXSTEPS 16
#define MB(x) ((double)(x) / 1e6)
#define CHUNK_BYTES ((size_t)4 << 20)

static double maxd(double a, double b) { return a > b ? a : b; }

/* The disk's rate in bytes per second each way when it was set (LOOM_BENCH_DEVICE_MBPS, as
 * bench/steady_disk.sh sets it), else 0. */
static double device_rate(void) {
  const char *v = getenv("LOOM_BENCH_DEVICE_MBPS");
  double mbps = v ? atof(v) : 0;
  return mbps > 0 ? mbps * 1e6 : 0;
}

static double tv_s(struct timeval t) { return (double)t.tv_sec + (double)t.tv_usec * 1e-6; }

static const int64_t sizes[] = {784, 4096, 4096, 4096, 4096, 10};
#define NSIZES 6

typedef struct config {
  const char *name;
  bool offload;
  loom_fsdp_tier tier;
  int prefetch;
  int io_threads; /* 0: the tier's default */
  bool buffered;  /* disk: LOOM_OFFLOAD_DIRECT=0 (page cache, no O_DIRECT) */
  bool lean;      /* FSDP's gathers not issued ahead (forward_prefetch = backward_prefetch = 0) */
  bool cache;     /* disk: loom's allocator cache left on (its default) */
  bool no_huge;   /* LOOM_ALLOC_HUGEPAGES=0: the allocator's blocks in 4 KiB pages */
  bool bf16;      /* FSDP mixed precision, bf16 forward (loom_fsdp_mp_cfg_for(LOOM_BF16)) */
  bool no_copy;   /* bf16: no low-precision parameter copy in the tier (the gathers read and
                     cast the f32 shard) */
  bool oib;       /* the optimizer step inside backward (cfg.optim_in_backward) */
  bool gover;     /* LOOM_FSDP_GRAD_OVERLAP=1: each unit's gradient written while the next
                     unit's backward computes (the default: before it starts) */
  bool gfifo;     /* LOOM_FSDP_GRAD_FIRST=0: the gradient puts queued behind the gathers'
                     reads (the behaviour before they went first) */
  bool sync;      /* cfg.offload.async_step false: the optimizer's pass within the call */
  bool async;     /* cfg.offload.async_step true: the pass behind the call */
} config;

typedef struct result {
  double peak[NR], state[NR];     /* compute pool, bytes */
  double host[NR], file[NR];      /* host and file pools between steps, bytes */
  double step_s, cpu_s;           /* rank 0, median step; process CPU per step */
  double sync_s;                  /* disk tier: median fdatasync + drop before a step (untimed) */
  double fb_s, opt_s;             /* rank 0, medians: forward + backward + finish; optimizer step */
  double tail_s, mean_s;          /* rank 0: median time from the optimizer step's return to the
                                     next step's start; mean step (all timed steps) */
  double fb_busy, opt_busy;       /* disk tier: the device's busy fraction in those phases */
  double rss_sampled;             /* largest RSS sample over the timed steps, and its phase */
  int rss_phase;
  double wait_s, transfer_s, moved; /* rank 0 per step: exposed wait, transfer time, bytes */
  double to_tier;                   /* rank 0 per step: of those bytes, written to the tier */
  double rss_build, rss_train;    /* bytes: VmHWM before and after the reset */
  double disk_read;               /* bytes read from storage per step (whole process) */
  double shard_max;               /* largest unit shard, bytes */
  double rss_anon, rss_file, rss_shmem; /* after the timed steps: what the resident bytes are */
  double user_s, sys_s, minflt;   /* process per step: user and system CPU, minor page faults */
  double params;
  int ok;
} result;

static double worst(const double *v) { return maxd(v[0], v[1]); }

typedef struct job {
  const config *c;
  const char *dir;
  int steps;
  bool mpi; /* one rank per process (mpirun): every rank measures its own process */
  result r;
  pthread_barrier_t bar;
} job;

static void sync_ranks(job *j, loom_pg *pg) {
  if (j->mpi) BENCH_CHECK(loom_pg_barrier(pg, NULL));
  else pthread_barrier_wait(&j->bar);
}

static double proc_status_kb(const char *key) {
  FILE *p = fopen("/proc/self/status", "r");
  char line[256];
  double v = -1;
  size_t n = strlen(key);
  while (p && fgets(line, sizeof line, p))
    if (!strncmp(line, key, n)) v = atof(line + n + 1);
  if (p) fclose(p);
  return v * 1024;
}

static double io_read_bytes(void) {
  FILE *p = fopen("/proc/self/io", "r");
  char line[256];
  double v = 0;
  while (p && fgets(line, sizeof line, p))
    if (!strncmp(line, "read_bytes:", 11)) v = atof(line + 11);
  if (p) fclose(p);
  return v;
}

/* Milliseconds the block device holding `dir` has been busy (/proc/diskstats' io_ticks of
 * its major:minor, a partition's own figure); -1 if not found. */
static double disk_busy_ms(const char *dir) {
  struct stat st;
  if (!dir || stat(dir, &st)) return -1;
  unsigned maj = major(st.st_dev), mnr = minor(st.st_dev);
  FILE *p = fopen("/proc/diskstats", "r");
  char line[512];
  double v = -1;
  while (p && fgets(line, sizeof line, p)) {
    unsigned a, b;
    char name[64];
    double f[10];
    if (sscanf(line, "%u %u %63s %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf", &a, &b, name, &f[0],
               &f[1], &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8], &f[9]) == 13 &&
        a == maj && b == mnr)
      v = f[9];
  }
  if (p) fclose(p);
  return v;
}

/* The process's resident bytes, sampled every millisecond by a thread of rank 0's during the
 * timed steps: the largest sample and the phase it fell in (1 forward + backward + finish, 2
 * the optimizer step), so a peak can be placed. */
static _Atomic int rss_phase;
static _Atomic bool rss_stop;
static double rss_max_bytes;
static int rss_max_phase;
static void *rss_sampler(void *arg) {
  (void)arg;
  long pg = sysconf(_SC_PAGESIZE);
  while (!atomic_load(&rss_stop)) {
    FILE *p = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (p && fscanf(p, "%ld %ld", &size, &res) == 2 && (double)res * (double)pg > rss_max_bytes &&
        atomic_load(&rss_phase)) {
      rss_max_bytes = (double)res * (double)pg;
      rss_max_phase = atomic_load(&rss_phase);
    }
    if (p) fclose(p);
    usleep(1000);
  }
  return NULL;
}

static void write_file(const char *path, const char *s) {
  int fd = open(path, O_WRONLY);
  if (fd >= 0) {
    if (write(fd, s, strlen(s)) < 0) { /* not allowed here: the figure says so */
    }
    close(fd);
  }
}

static void drop_page_cache(void) {
  sync();
  write_file("/proc/sys/vm/drop_caches", "1");
}

/* Drop the page cache of this process's offload files in dir (loom-offload-*-<pid>-*.bin),
 * written back first: the tier is cold, as if just read from a cold disk, while the libraries'
 * pages stay, as in any run. */
static void drop_tier_cache(const char *dir) {
  char mine[64];
  snprintf(mine, sizeof mine, "-%ld-", (long)getpid());
  DIR *d = opendir(dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, "loom-offload-", 13) || !strstr(e->d_name, mine)) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    int fd = open(path, O_RDONLY);
    if (fd < 0) continue;
    (void)fdatasync(fd);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  if (d) closedir(d);
}

static double pool_now(int acct, loom_pool pool) {
  loom_pool_stats st;
  BENCH_CHECK(loom_mem_account_stats(acct, pool, &st));
  return (double)st.current_bytes;
}

static int rank_main(loom_pg *pg, void *arg) {
  job *j = arg;
  const config *c = j->c;
  int rank = loom_pg_rank(pg), acct = loom_mem_account();
  bool measures_process = rank == 0 || j->mpi; /* VmHWM, page cache, read bytes */
  loom_set_num_threads(loom_pg_compute_threads(pg));
  loom_module *m = NULL;
  BENCH_CHECK(loom_nn_mlp_create(sizes, NSIZES, LOOM_ACT_RELU, LOOM_F32, 1, &m));
  loom_fsdp_cfg fc = loom_fsdp_cfg_default();
  if (c->lean) fc.forward_prefetch = fc.backward_prefetch = 0;
  if (c->bf16) fc.mp = loom_fsdp_mp_cfg_for(LOOM_BF16);
  fc.optim_in_backward = c->oib;
  loom_adam_cfg ac = loom_adamw_cfg_default();
  if (c->offload) {
    fc.offload = loom_fsdp_offload_cfg_default();
    fc.offload.tier = c->tier;
    fc.offload.dir = j->dir;
    fc.offload.prefetch_steps = c->prefetch;
    fc.offload.chunk_bytes = CHUNK_BYTES;
    fc.offload.io_threads = c->io_threads;
    fc.offload.low_precision_params = !c->no_copy;
    if (c->sync || c->async) fc.offload.async_step = c->async; /* else the default */
    ac.state_pool = LOOM_POOL_HOST;
  }
  j->r.params = (double)loom_module_numel(m);
  loom_fsdp *f = NULL;
  loom_optim *opt = NULL;
  BENCH_CHECK(loom_fsdp_create(pg, m, &fc, &f));
  const loom_param_seg *fs = NULL;
  size_t nseg = 0;
  BENCH_CHECK(loom_fsdp_segments(f, &fs, &nseg));
  BENCH_CHECK(loom_optim_create_adamw(fs, nseg, &ac, &opt));
  BENCH_CHECK(loom_fsdp_set_optim(f, opt)); /* backward steps with it (optim_in_backward) */
  for (size_t u = 0; u < nseg; u++)
    if (4.0 * (double)fs[u].n > j->r.shard_max && rank == 0) j->r.shard_max = 4.0 * (double)fs[u].n;
  srand(1 + (unsigned)rank);
  int64_t xs[2] = {BATCH, sizes[0]};
  loom_tensor *x = bench_rand_tensor(2, xs, LOOM_F32, 1.0f), *y = NULL;
  BENCH_CHECK(loom_tensor_empty(LOOM_I64, 1, xs, &y));
  for (int64_t i = 0; i < BATCH; i++)
    ((int64_t *)loom_tensor_data(y))[i] = rand() % sizes[NSIZES - 1];
  result *r = &j->r;
  double fb_busy[MAXSTEPS] = {0}, opt_busy[MAXSTEPS] = {0};
  pthread_t sampler;
  bool sampling = measures_process && pthread_create(&sampler, NULL, rss_sampler, NULL) == 0;
  double step_t[MAXSTEPS], fb_t[MAXSTEPS], opt_t[MAXSTEPS], sync_t[MAXSTEPS] = {0}, cpu0 = 0, io0 = 0, io_sum = 0;
  double start_t[MAXSTEPS], tail_t[MAXSTEPS], t_end = 0;
  struct rusage ru0 = {0};
  loom_fsdp_stats before = {0}, after = {0};
  for (int s = 0; s < 1 + j->steps; s++) {
    bool timed = s > 0;
    if (s == 1) {
      BENCH_CHECK(loom_fsdp_optim_wait(f)); /* the warm-up step's pass, untimed */
      int slot = j->mpi ? 0 : rank;
      r->state[slot] = pool_now(acct, LOOM_POOL_COMPUTE);
      r->host[slot] = pool_now(acct, LOOM_POOL_HOST);
      r->file[slot] = pool_now(acct, LOOM_POOL_FILE);
      loom_mem_account_reset_peak(acct, LOOM_POOL_COMPUTE);
      BENCH_CHECK(loom_fsdp_stats_get(f, &before));
    }
    sync_ranks(j, pg);
    if (measures_process && timed) {
      if (s == 1) { /* the training's own peak RSS from here */
        r->rss_build = proc_status_kb("VmHWM:");
        write_file("/proc/self/clear_refs", "5");
        cpu0 = bench_process_cpu_now();
        getrusage(RUSAGE_SELF, &ru0);
      }
      /* through the page cache, before every step: the last step's writes still in flight
       * land here. With O_DIRECT (the default) the file has no cached pages: once, before the
       * first (an fdatasync between steps would only flush the device's cache while the last
       * step's pass still writes behind the call, which no training loop does) */
      if (c->offload && c->tier == LOOM_FSDP_TIER_DISK && (c->buffered || s == 1)) {
        double d0 = bench_now();
        drop_tier_cache(j->dir);
        sync_t[s - 1] = bench_now() - d0;
      }
      if (s == 1) io0 = io_read_bytes(); /* to the end of the last step's pass */
    }
    sync_ranks(j, pg);
    double t0 = bench_now(), k0 = measures_process ? disk_busy_ms(j->dir) : -1;
    if (measures_process && timed) atomic_store(&rss_phase, 1);
    loom_tensor *logits = NULL, *loss = NULL;
    BENCH_CHECK(loom_module_forward(m, x, &logits));
    BENCH_CHECK(loom_cross_entropy(logits, y, LOOM_REDUCTION_MEAN, -100, &loss));
    BENCH_CHECK(loom_backward(loss, NULL, false));
    BENCH_CHECK(loom_fsdp_finish(f));
    loom_tensor_free(logits);
    loom_tensor_free(loss);
    double tb = bench_now(), kb = measures_process ? disk_busy_ms(j->dir) : -1;
    if (measures_process && timed) atomic_store(&rss_phase, 2);
    BENCH_CHECK(loom_fsdp_optim_step(f, opt, 1.0f));
    double t1 = bench_now(), k1 = measures_process ? disk_busy_ms(j->dir) : -1;
    if (s == j->steps) { /* the last step ends with its pass (the others' run into the next) */
      BENCH_CHECK(loom_fsdp_optim_wait(f));
      t_end = bench_now();
    }
    if (measures_process) atomic_store(&rss_phase, 0);
    if (timed && k0 >= 0 && kb >= 0 && k1 >= 0) {
      fb_busy[s - 1] = (kb - k0) / 1e3 / (tb - t0);
      opt_busy[s - 1] = (k1 - kb) / 1e3 / (t1 - tb);
    }
    sync_ranks(j, pg);
    if (measures_process && s == j->steps) io_sum = io_read_bytes() - io0;
    if (timed) start_t[s - 1] = t0, fb_t[s - 1] = tb - t0, opt_t[s - 1] = t1 - tb;
  }
  double mean = 0;
  for (int k = 0; k < j->steps; k++) { /* a step runs to the next one's start */
    step_t[k] = (k + 1 < j->steps ? start_t[k + 1] : t_end) - start_t[k];
    tail_t[k] = step_t[k] - fb_t[k] - opt_t[k];
    mean += step_t[k] / j->steps;
  }
  if (sampling) {
    atomic_store(&rss_stop, true);
    pthread_join(sampler, NULL);
  }
  loom_pool_stats ps;
  BENCH_CHECK(loom_mem_account_stats(acct, LOOM_POOL_COMPUTE, &ps));
  r->peak[j->mpi ? 0 : rank] = (double)ps.peak_bytes;
  if (measures_process) {
    int n = j->steps;
    /* the mean: the timed steps run from a settled start (no pass behind) to a settled end
     * (the last pass waited for), so their total over n is the steady step; with the pass
     * behind the call one step's period is not (the first has no pass to wait for, the last
     * waits for its own whole) */
    r->step_s = mean;
    r->sync_s = bench_median(sync_t, n);
    r->fb_s = bench_median(fb_t, n);
    r->opt_s = bench_median(opt_t, n);
    r->tail_s = bench_median(tail_t, n);
    r->mean_s = mean;
    r->fb_busy = bench_median(fb_busy, n);
    r->opt_busy = bench_median(opt_busy, n);
    r->rss_sampled = rss_max_bytes;
    r->rss_phase = rss_max_phase;
    r->cpu_s = (bench_process_cpu_now() - cpu0) / n;
    struct rusage ru1;
    getrusage(RUSAGE_SELF, &ru1);
    r->user_s = (tv_s(ru1.ru_utime) - tv_s(ru0.ru_utime)) / n;
    r->sys_s = (tv_s(ru1.ru_stime) - tv_s(ru0.ru_stime)) / n;
    r->minflt = (double)(ru1.ru_minflt - ru0.ru_minflt) / n;
    r->rss_train = proc_status_kb("VmHWM:");
    r->rss_anon = proc_status_kb("RssAnon:");
    r->rss_file = proc_status_kb("RssFile:");
    r->rss_shmem = proc_status_kb("RssShmem:");
    r->disk_read = io_sum / n;
    BENCH_CHECK(loom_fsdp_stats_get(f, &after));
    r->wait_s = (after.offload_wait_s - before.offload_wait_s) / n;
    r->transfer_s = (after.offload_transfer_s - before.offload_transfer_s) / n;
    r->to_tier = (double)(after.offload_to_bytes - before.offload_to_bytes) / n;
    r->moved = (double)(after.offload_to_bytes + after.offload_from_bytes -
                        before.offload_to_bytes - before.offload_from_bytes) / n;
  }
  loom_optim_free(opt);
  loom_fsdp_free(f);
  loom_tensor_free(x);
  loom_tensor_free(y);
  loom_module_free(m);
  return LOOM_OK;
}

/* ---- the disk's own floor for a disk-tier step ----------------------------------------- */

#define PROBE_BLOCK ((size_t)4 << 20)
#define PROBE_DIRECT_THREADS 4 /* loom's default io_threads per rank: its requests in flight */

typedef struct probe {
  char path[512];
  size_t file_bytes, read_bytes, write_bytes; /* one rank's tier file and step traffic */
  bool direct;                                /* O_DIRECT, PROBE_DIRECT_THREADS at once */
  int fd;
  size_t nr, nw, blocks;
  atomic_size_t next;                         /* the next operation, in the step's proportion */
  atomic_int failed;
  double seconds;                             /* < 0: failed */
} probe;

/* Operation k of nr reads and nw writes interleaved in the step's proportion: a read (block
 * *b) or a write. The k-th operation is the one the sequential rule "read while reads lag the
 * proportion" picks, so one stream and several take the same blocks in the same order. */
static bool probe_op(const probe *p, size_t k, size_t *b) {
  size_t total = p->nr + p->nw;
  size_t r = total ? (k * p->nr + total - 1) / total : 0; /* reads before op k, rounded up */
  size_t rn = total ? ((k + 1) * p->nr + total - 1) / total : 0;
  bool read = rn > r;
  *b = (read ? r : k - r) % p->blocks;
  return read;
}

/* A worker of one rank's replay: takes operations in order until none is left. */
static void *probe_worker(void *arg) {
  probe *p = arg;
  char *buf = NULL;
  if (posix_memalign((void **)&buf, 4096, PROBE_BLOCK)) {
    atomic_store(&p->failed, 1);
    return NULL;
  }
  memset(buf, 0x5a, PROBE_BLOCK);
  for (size_t k; (k = atomic_fetch_add(&p->next, 1)) < p->nr + p->nw && !atomic_load(&p->failed);) {
    size_t b;
    bool read = probe_op(p, k, &b);
    off_t at = (off_t)(b * PROBE_BLOCK);
    ssize_t n = read ? pread(p->fd, buf, PROBE_BLOCK, at) : pwrite(p->fd, buf, PROBE_BLOCK, at);
    if (n != (ssize_t)PROBE_BLOCK) {
      atomic_store(&p->failed, 1);
      break;
    }
    if (p->direct) continue;
    if (read) (void)posix_fadvise(p->fd, at, (off_t)PROBE_BLOCK, POSIX_FADV_DONTNEED);
    else (void)sync_file_range(p->fd, at, (off_t)PROBE_BLOCK, SYNC_FILE_RANGE_WRITE);
  }
  free(buf);
  return NULL;
}

/* One rank's step traffic with no compute: a file of the rank's tier size, written and synced
 * untimed; then, timed, reads and writes of 4 MiB blocks interleaved in the step's proportion,
 * ending with fdatasync. Either through the page cache one request at a time (pread; pwrite
 * with writeback started at once and the pages dropped, as loom's store does with
 * LOOM_OFFLOAD_DIRECT=0), or as loom's store moves them by default: O_DIRECT, aligned
 * buffers, PROBE_DIRECT_THREADS requests in flight. */
static void *probe_stream(void *arg) {
  probe *p = arg;
  p->seconds = -1;
  p->fd = open(p->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  char *buf = malloc(PROBE_BLOCK);
  p->blocks = p->file_bytes / PROBE_BLOCK;
  if (p->fd < 0 || !buf || p->blocks == 0) goto out;
  memset(buf, 0x5a, PROBE_BLOCK);
  for (size_t b = 0; b < p->blocks; b++)
    if (pwrite(p->fd, buf, PROBE_BLOCK, (off_t)(b * PROBE_BLOCK)) != (ssize_t)PROBE_BLOCK) goto out;
  if (fdatasync(p->fd)) goto out;
  (void)posix_fadvise(p->fd, 0, 0, POSIX_FADV_DONTNEED);
  if (p->direct) { /* the same file, opened again for direct I/O */
    close(p->fd);
    if ((p->fd = open(p->path, O_RDWR | O_DIRECT)) < 0) goto out;
  }
  p->nr = p->read_bytes / PROBE_BLOCK, p->nw = p->write_bytes / PROBE_BLOCK;
  atomic_store(&p->next, 0);
  atomic_store(&p->failed, 0);
  int nt = p->direct ? PROBE_DIRECT_THREADS : 1, started = 0;
  pthread_t th[PROBE_DIRECT_THREADS];
  double t0 = bench_now();
  for (; started < nt; started++)
    if (pthread_create(&th[started], NULL, probe_worker, p)) break;
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  if (started == 0 || atomic_load(&p->failed) || fdatasync(p->fd)) goto out;
  p->seconds = bench_now() - t0;
out:
  if (p->fd >= 0) close(p->fd);
  free(buf);
  return NULL;
}

/* Seconds for NR ranks' step traffic at once (each rank's replay on its own), the page cache
 * dropped first, moved one way (direct or not); -1 if the folder cannot be used. */
static double disk_replay(const char *dir, const result *r, bool direct) {
  static probe ps[NR]; /* static: its atomics need no initialiser; one replay at a time */
  pthread_t th[NR];
  double worst_s = 0;
  drop_page_cache();
  for (int i = 0; i < NR; i++) {
    ps[i].file_bytes = (size_t)(worst(r->file));
    ps[i].read_bytes = (size_t)(r->moved - r->to_tier);
    ps[i].write_bytes = (size_t)r->to_tier;
    ps[i].direct = direct;
    snprintf(ps[i].path, sizeof ps[i].path, "%s/bench_offload_probe.%d.%d", dir, (int)getpid(), i);
    pthread_create(&th[i], NULL, probe_stream, &ps[i]);
  }
  for (int i = 0; i < NR; i++) {
    pthread_join(th[i], NULL);
    worst_s = ps[i].seconds < 0 || worst_s < 0 ? -1 : maxd(worst_s, ps[i].seconds);
    unlink(ps[i].path);
  }
  return worst_s;
}

/* The floor: the faster of the two replays (each a way loom's store can move the bytes), the
 * page cache's first; both kept (*cached, *direct_s) for the report. In a child process of its
 * own: the replays' buffers and threads leave nothing in this process, whose later children
 * (the configurations' runs, which measure their RSS) would inherit it. */
static double disk_floor(const char *dir, const result *r, double *cached_s, double *direct_s) {
  double t[2] = {-1, -1};
  *cached_s = *direct_s = -1;
  int fds[2];
  if (pipe(fds)) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    t[0] = disk_replay(dir, r, false);
    t[1] = disk_replay(dir, r, true);
    ssize_t w = write(fds[1], t, sizeof t);
    _exit(w == (ssize_t)sizeof t ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = pid > 0 ? read(fds[0], t, sizeof t) : -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (got != (ssize_t)sizeof t) return -1;
  *cached_s = t[0], *direct_s = t[1];
  if (*direct_s < 0) return *cached_s;
  if (*cached_s < 0) return *direct_s;
  return *direct_s < *cached_s ? *direct_s : *cached_s;
}

/* One configuration in a child process; its result through a pipe. */
static result run(const config *c, const char *dir, int steps) {
  int fds[2];
  result r = {0};
  if (pipe(fds)) return r;
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    drop_page_cache(); /* between runs: nothing of the last configuration is cached */
    if (c->buffered) setenv("LOOM_OFFLOAD_DIRECT", "0", 1);
    if (c->no_huge) setenv("LOOM_ALLOC_HUGEPAGES", "0", 1);
    if (c->gover) setenv("LOOM_FSDP_GRAD_OVERLAP", "1", 1);
    if (c->gfifo) setenv("LOOM_FSDP_GRAD_FIRST", "0", 1);
    /* the disk tier is about resident memory: no allocator cache (its blocks stay resident) */
    if (c->offload && c->tier == LOOM_FSDP_TIER_DISK && !c->cache) loom_mem_set_cache_limit(0);
    job j = {.c = c, .dir = dir, .steps = steps};
    pthread_barrier_init(&j.bar, NULL, NR);
    int rc = loom_threads_run(NR, NULL, rank_main, &j);
    j.r.ok = rc == LOOM_OK;
    if (rc) fprintf(stderr, "%s: %s\n", c->name, loom_last_error());
    ssize_t w = write(fds[1], &j.r, sizeof j.r);
    _exit(w == (ssize_t)sizeof j.r ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = pid > 0 ? read(fds[0], &r, sizeof r) : -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (got != (ssize_t)sizeof r) r.ok = 0;
  return r;
}


#define HOST LOOM_FSDP_TIER_HOST
#define DISK LOOM_FSDP_TIER_DISK
static const config configs[] = {
    {.name = "fsdp", .offload = false, .tier = HOST, .prefetch = 1},
    {.name = "host p1", .offload = true, .tier = HOST, .prefetch = 1},
    {.name = "host p0", .offload = true, .tier = HOST, .prefetch = 0},
    {.name = "disk p1", .offload = true, .tier = DISK, .prefetch = 1},
    {.name = "disk p0", .offload = true, .tier = DISK, .prefetch = 0},
    {.name = "disk p1 t1", .offload = true, .tier = DISK, .prefetch = 1, .io_threads = 1},
    {.name = "disk p0 t1", .offload = true, .tier = DISK, .prefetch = 0, .io_threads = 1},
    {.name = "disk p1 buf", .offload = true, .tier = DISK, .prefetch = 1, .buffered = true},
    {.name = "disk p0 buf", .offload = true, .tier = DISK, .prefetch = 0, .buffered = true},
    {.name = "disk p1 g0", .offload = true, .tier = DISK, .prefetch = 1, .lean = true},
    {.name = "disk p1 cache", .offload = true, .tier = DISK, .prefetch = 1, .cache = true},
    {.name = "disk p1 nothp", .offload = true, .tier = DISK, .prefetch = 1, .no_huge = true},
    {.name = "disk p1 gover", .offload = true, .tier = DISK, .prefetch = 1, .gover = true},
    {.name = "disk p1 bf16 gover", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .gover = true},
    {.name = "disk p1 gfifo", .offload = true, .tier = DISK, .prefetch = 1, .gfifo = true},
    {.name = "disk p1 bf16 gfifo", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .gfifo = true},
    {.name = "fsdp bf16", .offload = false, .tier = HOST, .prefetch = 1, .bf16 = true},
    {.name = "host p1 bf16", .offload = true, .tier = HOST, .prefetch = 1, .bf16 = true},
    {.name = "host p1 bf16 nocopy", .offload = true, .tier = HOST, .prefetch = 1, .bf16 = true, .no_copy = true},
    {.name = "disk p1 bf16", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true},
    {.name = "disk p0 bf16", .offload = true, .tier = DISK, .prefetch = 0, .bf16 = true},
    {.name = "disk p1 bf16 nocopy", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .no_copy = true},
    {.name = "disk p1 async", .offload = true, .tier = DISK, .prefetch = 1, .async = true},
    {.name = "disk p0 async", .offload = true, .tier = DISK, .prefetch = 0, .async = true},
    {.name = "disk p1 bf16 async", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .async = true},
    {.name = "disk p1 sync", .offload = true, .tier = DISK, .prefetch = 1, .sync = true},
    {.name = "disk p0 sync", .offload = true, .tier = DISK, .prefetch = 0, .sync = true},
    {.name = "disk p1 bf16 sync", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .sync = true},
    {.name = "disk p1 oib", .offload = true, .tier = DISK, .prefetch = 1, .oib = true},
    {.name = "disk p1 bf16 oib", .offload = true, .tier = DISK, .prefetch = 1, .bf16 = true, .oib = true}};
enum { NC = sizeof configs / sizeof configs[0] };

static bool is_disk(const config *c) { return c->offload && c->tier == LOOM_FSDP_TIER_DISK; }

/* The reference of configuration i's step ratios: "fsdp bf16" for a bf16 one when it runs,
 * else "fsdp" (cs[0]). */
static int ref_of(const config *const *cs, int nc, int i) {
  for (int k = 1; k < nc && cs[i]->bf16; k++)
    if (!cs[k]->offload && cs[k]->bf16) return k;
  return 0;
}

/* `mpirun -n 2 bench_offload --mpi CONFIG [dir] [steps]`: one configuration, one rank per
 * process; each process prints its own peak RSS (the training's, VmHWM reset after the warm-up
 * step), compute-pool peak and step time. */
static int main_mpi(int argc, char **argv) {
  const config *c = NULL;
  for (int i = 0; i < NC && argc > 2; i++)
    if (!strcmp(argv[2], configs[i].name)) c = &configs[i];
  const char *dir = argc > 3 ? argv[3] : "/var/tmp";
  int steps = argc > 4 ? atoi(argv[4]) : 3;
  if (!c || steps < 1 || steps > MAXSTEPS) {
    fprintf(stderr, "usage: mpirun -n 2 bench_offload --mpi 'fsdp'|'host p1'|'host p0'|'disk "
            "p1'|'disk p0' [dir] [steps 1..%d]\n", MAXSTEPS);
    return 2;
  }
  if (c->offload && c->tier == LOOM_FSDP_TIER_DISK && !c->cache) loom_mem_set_cache_limit(0);
  if (c->no_huge) setenv("LOOM_ALLOC_HUGEPAGES", "0", 1);
  if (c->gover) setenv("LOOM_FSDP_GRAD_OVERLAP", "1", 1);
  if (c->gfifo) setenv("LOOM_FSDP_GRAD_FIRST", "0", 1);
  drop_page_cache();
  loom_pg *pg = NULL;
  BENCH_CHECK(loom_mpi_pg_create(NULL, NULL, &pg));
  job j = {.c = c, .dir = dir, .steps = steps, .mpi = true};
  int rc = rank_main(pg, &j);
  const result *r = &j.r;
  double state_all = 16.0 * r->params;
  printf("mpi %-8s rank %d of %d: peak RSS %.0f MB = %.0f%% of the training state %.0f MB "
         "(build %.0f MB; now anon %.0f, file %.0f, shmem %.0f MB); compute peak %.0f MB; step %.3f "
         "s (forward + backward %.3f, optimizer %.3f; disk busy %.0f%%, %.0f%%); wait %.3f of "
         "%.3f s transfer%s\n",
         c->name, loom_pg_rank(pg), loom_pg_size(pg), MB(r->rss_train),
         100 * r->rss_train / (state_all > 0 ? state_all : 1), MB(state_all), MB(r->rss_build),
         MB(r->rss_anon), MB(r->rss_file), MB(r->rss_shmem), MB(r->peak[0]), r->step_s, r->fb_s, r->opt_s, 100 * r->fb_busy,
         100 * r->opt_busy, r->wait_s, r->transfer_s, rc ? " FAILED" : "");
  loom_pg_free(pg);
  loom_mpi_finalize();
  return rc ? 1 : 0;
}

/* The configurations named in `list` (comma separated), "fsdp" always first: the ratios'
 * reference. NULL or "all": every one. */
static int pick_configs(const char *list, const config **out) {
  int n = 0;
  out[n++] = &configs[0];
  for (int i = 1; i < NC; i++) {
    if (list && strcmp(list, "all")) {
      const char *at = strstr(list, configs[i].name);
      size_t len = strlen(configs[i].name);
      bool found = false;
      for (; at && !found; at = strstr(at + 1, configs[i].name))
        found = (at == list || at[-1] == ',') && (at[len] == ',' || at[len] == 0);
      if (!found) continue;
    }
    out[n++] = &configs[i];
  }
  return n;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--mpi")) return main_mpi(argc, argv);
  const char *dir = argc > 1 ? argv[1] : "/var/tmp";
  int steps = argc > 2 ? atoi(argv[2]) : 3, rounds = argc > 3 ? atoi(argv[3]) : 3;
  if (steps < 1 || steps > MAXSTEPS || rounds < 1 || rounds > 16) {
    fprintf(stderr, "usage: bench_offload [dir] [steps 1..%d] [rounds 1..16] [configs: comma "
            "separated, of fsdp, host p1, host p0, disk p1, disk p0, disk p1 t1, disk p0 t1, "
            "disk p1 buf, disk p0 buf, disk p1 g0, disk p1 cache, disk p1 nothp, disk p1 gover, disk p1 bf16 gover, disk p1 gfifo, disk p1 bf16 gfifo, disk p1 async, disk p0 async, disk p1 bf16 async, disk p1 sync, disk p0 sync, disk p1 bf16 sync, fsdp bf16, host p1 bf16, host p1 bf16 "
            "nocopy, disk p1 bf16, disk p0 bf16, disk p1 bf16 nocopy, disk p1 oib, disk p1 bf16 oib; "
            "default all]\n", MAXSTEPS);
    return 2;
  }
  const config *cs[NC];
  int nc = pick_configs(argc > 4 ? argv[4] : NULL, cs);
  printf("bench_offload: MLP 784-4096x4-10, FSDP %d ranks (threads), batch %d per rank, AdamW, "
         "%d timed steps after 1 warm-up, %d rounds; disk tier in %s; CPU level %s\n",
         NR, BATCH, steps, rounds, dir, loom_cpu_level_name(loom_cpu_level_active()));
  static result rs[16][NC];
  static double floor_s[16][NC], floor_cached[16][NC], floor_direct[16][NC];
  for (int k = 0; k < rounds; k++)
    for (int i = 0; i < nc; i++) {
      rs[k][i] = run(cs[i], dir, steps);
      if (!rs[k][i].ok) {
        fprintf(stderr, "bench_offload: %s failed\n", cs[i]->name);
        return 1;
      }
      /* the floor right after the run it is the floor of: the same load on the machine */
      if (is_disk(cs[i]))
        floor_s[k][i] = disk_floor(dir, &rs[k][i], &floor_cached[k][i], &floor_direct[k][i]);
    }
  printf("\n%-19s %8s %8s %8s %8s %8s %8s %7s %7s %7s %8s %8s\n", "config", "peak MB", "state MB",
         "host MB", "file MB", "RSS MB", "RSSbuild", "step s", "cpu s", "wait s", "xfer s",
         "moved MB");
  for (int i = 0; i < nc; i++) {
    const result *r = &rs[rounds - 1][i];
    printf("%-19s %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f %7.3f %7.3f %7.3f %8.3f %8.0f", cs[i]->name,
           MB(worst(r->peak)), MB(worst(r->state)), MB(worst(r->host)), MB(worst(r->file)),
           MB(r->rss_train), MB(r->rss_build), r->step_s, r->cpu_s, r->wait_s, r->transfer_s,
           MB(r->moved));
    if (is_disk(cs[i]))
      printf("  disk rd %.0f MB/step, writeback %.3f s; RSS now anon %.0f file %.0f MB",
             MB(r->disk_read), r->sync_s, MB(r->rss_anon), MB(r->rss_file));
    printf("\n");
  }
  const result *base = &rs[rounds - 1][0];
  double state_all = 16.0 * base->params, transient = worst(base->peak) - worst(base->state);
  printf("\ntraining state (16 B x %.1f M params): %.0f MB; largest unit shard %.1f MB; fsdp's "
         "step transient %.0f MB\n", base->params / 1e6, MB(state_all), MB(base->shard_max),
         MB(transient));
  for (int i = 1; i < nc; i++) {
    bool disk = is_disk(cs[i]);
    /* a shard comes back ahead of its gather only to be cast (bf16 with no copy) */
    double prefetched = disk && cs[i]->prefetch && cs[i]->no_copy ? base->shard_max : 0;
    double ring = disk ? 12.0 * (double)CHUNK_BYTES : 0;
    /* gover: a unit's local gradient (NR shards) lives on while its slice is written during
     * the next unit's backward (its pages given back as they land: counted in the pool, not
     * resident) */
    double leaving = disk && cs[i]->gover ? NR * base->shard_max : 0;
    double in_flight = transient + prefetched + ring + leaving, p = worst(rs[rounds - 1][i].peak);
    printf("compute peak, %s: %.0f MB; in flight (transient %.0f + prefetched shard %.0f + chunk "
           "ring %.0f + local gradient leaving %.0f) %.0f MB: peak / that %.2f (target <= 1.10); "
           "peak / fsdp %.2f (target <= 0.40)\n", cs[i]->name, MB(p), MB(transient),
           MB(prefetched), MB(ring), MB(leaving), MB(in_flight), p / in_flight,
           p / worst(base->peak));
  }
  for (int i = 1; i < nc; i++) {
    if (!is_disk(cs[i])) continue;
    double rss[16], rd[16];
    for (int k = 0; k < rounds; k++) {
      rss[k] = rs[k][i].rss_train / state_all;
      /* planned: what the store's gets read, every rank (rank 0's, the ranks' shards equal) */
      rd[k] = rs[k][i].disk_read / (NR * (rs[k][i].moved - rs[k][i].to_tier));
    }
    printf("RSS, %s: median %.0f%% of the training state (target <= 35%%); bytes read from "
           "storage / the gets' bytes: median %.3f (%.0f of %.0f MB in the last round; target "
           "<= 1.05)\n", cs[i]->name, 100 * bench_median(rss, rounds), bench_median(rd, rounds),
           MB(rs[rounds - 1][i].disk_read),
           MB(NR * (rs[rounds - 1][i].moved - rs[rounds - 1][i].to_tier)));
  }
  /* where the step's time goes: wall beside the process's CPU (both ranks), round by round */
  for (int i = 0; i < nc; i++) {
    double st[16], cp[16], us[16], sy[16], mf[16];
    char list[256] = "";
    for (int k = 0, o = 0; k < rounds; k++) {
      const result *r = &rs[k][i];
      st[k] = r->step_s, cp[k] = r->cpu_s, us[k] = r->user_s, sy[k] = r->sys_s, mf[k] = r->minflt;
      if (o < (int)sizeof list)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%.3f/%.3f", k ? " " : "", st[k],
                      cp[k]);
    }
    printf("cpu, %s: step s / process CPU s per round %s -> medians %.3f / %.3f (user %.3f, "
           "system %.3f); minor faults %.0fk per step\n", cs[i]->name, list,
           bench_median(st, rounds), bench_median(cp, rounds), bench_median(us, rounds),
           bench_median(sy, rounds), bench_median(mf, rounds) / 1e3);
    double fb[16], os[16], fbb[16], obb[16], rsp[16], tl[16], mn[16];
    char ph[64] = "";
    for (int k = 0, o = 0; k < rounds; k++) {
      const result *r = &rs[k][i];
      fb[k] = r->fb_s, os[k] = r->opt_s, fbb[k] = r->fb_busy, obb[k] = r->opt_busy;
      tl[k] = r->tail_s, mn[k] = r->mean_s;
      rsp[k] = r->rss_sampled;
      if (o < (int)sizeof ph)
        o += snprintf(ph + o, sizeof ph - (size_t)o, "%s%s", k ? " " : "",
                      r->rss_phase == 1 ? "fb" : r->rss_phase == 2 ? "opt" : "-");
    }
    printf("phases, %s: forward + backward + finish %.3f s, optimizer step %.3f s, then to the "
           "next step %.3f s (rank 0, medians; step, the mean, %.3f s); disk busy %.0f%% and %.0f%% of "
           "the first two; RSS sampled every 1 ms: largest %.0f MB, in the phase per round %s\n",
           cs[i]->name, bench_median(fb, rounds), bench_median(os, rounds),
           bench_median(tl, rounds), bench_median(mn, rounds), 100 * bench_median(fbb, rounds),
           100 * bench_median(obb, rounds), MB(bench_median(rsp, rounds)), ph);
  }
  double step_fsdp[16];
  for (int i = 1; i < nc; i++) {
    double ratio[16], w[16];
    int ref = ref_of(cs, nc, i);
    if (!cs[i]->offload) continue;
    for (int k = 0; k < rounds; k++) step_fsdp[k] = rs[k][ref].step_s;
    for (int k = 0; k < rounds; k++) {
      ratio[k] = rs[k][i].step_s / rs[k][ref].step_s;
      w[k] = rs[k][i].transfer_s > 0 ? rs[k][i].wait_s / rs[k][i].transfer_s : 0;
    }
    char list[160] = "";
    for (int k = 0, o = 0; k < rounds && o < (int)sizeof list; k++)
      o += snprintf(list + o, sizeof list - (size_t)o, "%s%.2f", k ? " " : "", ratio[k]);
    double med = bench_median(ratio, rounds), wmed = bench_median(w, rounds);
    printf("step %s / %s: %s -> median %.2f; exposed wait / transfer %.2f\n", cs[i]->name,
           cs[ref]->name, list, med, wmed);
    if (!is_disk(cs[i])) continue;
    /* the floor: this configuration's traffic per step replayed with no compute, right after
     * its run in the same round */
    double fr[16], fl[16], fw[16], fm[16], fc[16], fd[16];
    list[0] = 0;
    for (int k = 0, o = 0; k < rounds; k++) {
      fl[k] = floor_s[k][i];
      fc[k] = floor_cached[k][i], fd[k] = floor_direct[k][i];
      fr[k] = rs[k][i].step_s / fl[k];
      fm[k] = rs[k][i].step_s / maxd(fl[k], rs[k][ref].step_s);
      fw[k] = (rs[k][i].step_s + rs[k][i].sync_s) / fl[k];
      if (o < (int)sizeof list)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%.2f", k ? " " : "", fr[k]);
    }
    const result *r = &rs[rounds - 1][i];
    printf("floor, %s: the step's traffic alone (%d ranks at once, each %.0f MB read + %.0f MB "
           "written, 4 MiB blocks interleaved, page cache dropped, no compute; the faster of "
           "O_DIRECT with %d requests in flight per rank, median %.3f s, and through the page "
           "cache one at a time, %.3f s): median %.3f s "
           "= %.2f x the fsdp step; step / floor per round %s -> median %.2f (target <= 1.20); "
           "with the writeback synced before each step counted in %.2f; step / the larger of "
           "the floor and the round's fsdp step (compute alone): median %.2f\n", cs[i]->name, NR,
           MB(r->moved - r->to_tier), MB(r->to_tier), PROBE_DIRECT_THREADS,
           bench_median(fd, rounds), bench_median(fc, rounds), bench_median(fl, rounds),
           bench_median(fl, rounds) / bench_median(step_fsdp, rounds), list,
           bench_median(fr, rounds), bench_median(fw, rounds), bench_median(fm, rounds));
    /* on a device whose rate was set (bench/steady_disk.sh: a throttled RAM-backed disk), the
     * floor its rate gives, round by round */
    double rate = device_rate();
    if (rate <= 0) continue;
    double replays = bench_median(fl, rounds);
    list[0] = 0;
    for (int k = 0, o = 0; k < rounds; k++) {
      const result *q = &rs[k][i];
      fl[k] = maxd(NR * (q->moved - q->to_tier), NR * q->to_tier) / rate;
      fr[k] = q->step_s / fl[k];
      if (o < (int)sizeof list)
        o += snprintf(list + o, sizeof list - (size_t)o, "%s%.2f", k ? " " : "", fr[k]);
    }
    printf("floor at the device's set rate, %s: %.0f MB/s each way (LOOM_BENCH_DEVICE_MBPS), "
           "the larger of both ranks' reads and writes over it: %.3f s; the replays' floor / "
           "that %.2f; step / that per round %s -> median %.2f (target <= 1.20)\n", cs[i]->name,
           MB(rate), bench_median(fl, rounds),
           replays / bench_median(fl, rounds),
           list, bench_median(fr, rounds));
  }
  /* prefetch on against off, same tier and I/O threads, round by round */
  for (int i = 1; i < nc; i++) {
    if (!cs[i]->offload || !cs[i]->prefetch) continue;
    for (int o = 1; o < nc; o++) {
      if (!cs[o]->offload || cs[o]->prefetch || cs[o]->tier != cs[i]->tier ||
          cs[o]->io_threads != cs[i]->io_threads || cs[o]->buffered != cs[i]->buffered ||
          cs[o]->bf16 != cs[i]->bf16 || cs[o]->no_copy != cs[i]->no_copy ||
          cs[o]->oib != cs[i]->oib || cs[o]->gfifo != cs[i]->gfifo ||
          cs[o]->gover != cs[i]->gover || cs[o]->sync != cs[i]->sync ||
          cs[o]->async != cs[i]->async)
        continue;
      double q[16];
      for (int k = 0; k < rounds; k++) q[k] = rs[k][i].step_s / rs[k][o].step_s;
      printf("prefetch on / off, %s / %s: median %.2f (target <= 1.00)\n", cs[i]->name,
             cs[o]->name, bench_median(q, rounds));
    }
  }
  /* the optimizer step inside backward against after it, same everything else */
  for (int i = 1; i < nc; i++) {
    if (!cs[i]->oib) continue;
    for (int o = 1; o < nc; o++) {
      if (cs[o]->oib || !cs[o]->offload || cs[o]->tier != cs[i]->tier ||
          cs[o]->prefetch != cs[i]->prefetch || cs[o]->bf16 != cs[i]->bf16 ||
          cs[o]->no_copy != cs[i]->no_copy || cs[o]->io_threads != cs[i]->io_threads ||
          cs[o]->buffered != cs[i]->buffered || cs[o]->lean != cs[i]->lean ||
          cs[o]->cache != cs[i]->cache)
        continue;
      double fq[16], sq[16], mq[16];
      for (int k = 0; k < rounds; k++) {
        fq[k] = is_disk(cs[i]) ? floor_s[k][i] / floor_s[k][o] : 0;
        sq[k] = rs[k][i].step_s / rs[k][o].step_s;
        mq[k] = rs[k][i].moved / rs[k][o].moved;
      }
      printf("in backward / after, %s / %s: bytes moved %.3f (%.0f / %.0f MB per rank); floor "
             "%.2f; step %.2f (medians)\n", cs[i]->name, cs[o]->name, bench_median(mq, rounds),
             MB(rs[rounds - 1][i].moved), MB(rs[rounds - 1][o].moved), bench_median(fq, rounds),
             bench_median(sq, rounds));
    }
  }
  /* the gradient-write variants (gfifo, gover) against the default, same everything else,
   * round by round: step, step / floor, RSS, CPU */
  for (int o = 1; o < nc; o++) {
    if (!is_disk(cs[o]) || !(cs[o]->gfifo || cs[o]->gover)) continue;
    for (int i = 1; i < nc; i++) {
      if (!is_disk(cs[i]) || cs[i]->gfifo || cs[i]->gover || cs[o]->bf16 != cs[i]->bf16 ||
          cs[o]->prefetch != cs[i]->prefetch || cs[o]->no_huge != cs[i]->no_huge ||
          cs[o]->oib != cs[i]->oib || cs[o]->no_copy != cs[i]->no_copy ||
          cs[o]->io_threads != cs[i]->io_threads || cs[o]->lean != cs[i]->lean ||
          cs[o]->cache != cs[i]->cache || cs[o]->buffered != cs[i]->buffered)
        continue;
      double sq[16], fa[16], fb[16], ra[16], rb[16], ca[16], cb[16], pa[16], pb[16];
      for (int k = 0; k < rounds; k++) {
        sq[k] = rs[k][i].step_s / rs[k][o].step_s;
        fa[k] = rs[k][i].step_s / floor_s[k][i], fb[k] = rs[k][o].step_s / floor_s[k][o];
        ra[k] = rs[k][i].rss_train / (16.0 * rs[k][i].params);
        rb[k] = rs[k][o].rss_train / (16.0 * rs[k][o].params);
        ca[k] = rs[k][i].cpu_s, cb[k] = rs[k][o].cpu_s;
        pa[k] = rs[k][i].fb_s, pb[k] = rs[k][o].fb_s;
      }
      printf("gradient writes, %s / %s: step %.2f; forward + backward %.3f against %.3f s; step / "
             "floor %.2f against %.2f; RSS %.0f%% against %.0f%%; process CPU %.3f against %.3f "
             "s (medians)\n", cs[i]->name, cs[o]->name, bench_median(sq, rounds),
             bench_median(pa, rounds), bench_median(pb, rounds), bench_median(fa, rounds),
             bench_median(fb, rounds), 100 * bench_median(ra, rounds),
             100 * bench_median(rb, rounds), bench_median(ca, rounds), bench_median(cb, rounds));
    }
  }
  /* the optimizer's pass behind the next forward against within the call, same everything
   * else, round by round: step, step / floor, the phases, RSS */
  for (int o = 1; o < nc; o++) {
    if (!is_disk(cs[o]) || !cs[o]->sync) continue;
    for (int i = 1; i < nc; i++) {
      if (!is_disk(cs[i]) || !cs[i]->async || cs[o]->bf16 != cs[i]->bf16 ||
          cs[o]->prefetch != cs[i]->prefetch || cs[o]->no_copy != cs[i]->no_copy ||
          cs[o]->gfifo != cs[i]->gfifo || cs[o]->gover != cs[i]->gover ||
          cs[o]->oib != cs[i]->oib || cs[o]->io_threads != cs[i]->io_threads ||
          cs[o]->lean != cs[i]->lean || cs[o]->cache != cs[i]->cache ||
          cs[o]->buffered != cs[i]->buffered || cs[o]->no_huge != cs[i]->no_huge)
        continue;
      double sq[16], fa[16], fb[16], ra[16], rb[16];
      for (int k = 0; k < rounds; k++) {
        sq[k] = rs[k][i].step_s / rs[k][o].step_s;
        fa[k] = rs[k][i].step_s / floor_s[k][i], fb[k] = rs[k][o].step_s / floor_s[k][o];
        ra[k] = rs[k][i].rss_train / (16.0 * rs[k][i].params);
        rb[k] = rs[k][o].rss_train / (16.0 * rs[k][o].params);
      }
      printf("step behind / within the call, %s / %s: step %.2f; step / floor %.2f against "
             "%.2f; RSS %.0f%% against %.0f%% (medians)\n", cs[i]->name, cs[o]->name,
             bench_median(sq, rounds), bench_median(fa, rounds), bench_median(fb, rounds),
             100 * bench_median(ra, rounds), 100 * bench_median(rb, rounds));
    }
  }
  /* the low-precision parameter copy against none, same tier and prefetch, round by round:
   * the bytes, the floor and the step */
  for (int i = 1; i < nc; i++) {
    if (!cs[i]->offload || !cs[i]->bf16 || cs[i]->no_copy || cs[i]->oib || cs[i]->gfifo ||
        cs[i]->gover)
      continue;
    for (int o = 1; o < nc; o++) {
      if (!cs[o]->no_copy || cs[o]->tier != cs[i]->tier || cs[o]->prefetch != cs[i]->prefetch ||
          cs[o]->oib != cs[i]->oib)
        continue;
      double fq[16], sq[16], mq[16], rq[16];
      for (int k = 0; k < rounds; k++) {
        fq[k] = is_disk(cs[i]) ? floor_s[k][i] / floor_s[k][o] : 0;
        sq[k] = rs[k][i].step_s / rs[k][o].step_s;
        mq[k] = rs[k][i].moved / rs[k][o].moved;
        rq[k] = (rs[k][i].moved - rs[k][i].to_tier) / (rs[k][o].moved - rs[k][o].to_tier);
      }
      printf("copy / no copy, %s / %s: bytes moved %.3f, read %.3f (%.0f / %.0f MB per rank); "
             "floor %.2f; step %.2f (medians)\n", cs[i]->name, cs[o]->name,
             bench_median(mq, rounds), bench_median(rq, rounds),
             MB(rs[rounds - 1][i].moved - rs[rounds - 1][i].to_tier),
             MB(rs[rounds - 1][o].moved - rs[rounds - 1][o].to_tier), bench_median(fq, rounds),
             bench_median(sq, rounds));
    }
  }
  return 0;
}
