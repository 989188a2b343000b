/* prepared.h: collectives with a first step of the caller's, run where the collective runs
 * (the group's progress thread for an async one), for layers above dist that fill a send
 * buffer late: FSDP reads its part of a gathered buffer out of the offload tier this way, so
 * the read overlaps the rank's compute until it waits for the work. */
#ifndef LOOM_DIST_PREPARED_H
#define LOOM_DIST_PREPARED_H

#include "loom/dist.h"

#include <stdbool.h>

/* Fills the collective's send data; runs once, before the collective, on the thread that runs
 * it. A status other than LOOM_OK (with loom__fail's message) fails the group, as a failed
 * collective does, so peers waiting in it return that error rather than hang; the work's wait
 * returns it. */
typedef int (*loom__coll_prepare_fn)(void *ctx);

/* loom_pg_allgather (same arguments and checks), with `prepare(ctx)` run first. send's bytes
 * may be written by prepare; they are read only after it returns. */
int loom__pg_allgather_prepared(loom_pg *pg, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom__coll_prepare_fn prepare, void *ctx,
                                loom_work **out);

/* loom_pg_allreduce (same arguments and checks), with `prepare(ctx)` run first: hybrid
 * sharding's replica all-reduce waits there for the shard group's reduce-scatter that fills
 * its buffer, so it starts as soon as that completes, on this group's progress thread. */
int loom__pg_allreduce_prepared(loom_pg *pg, const void *send, void *recv, size_t count,
                                loom_dtype dt, loom_redop op, loom__coll_prepare_fn prepare,
                                void *ctx, loom_work **out);

/* Wait until w has completed and return its status (with its message), without consuming it:
 * the handle stays for one loom_work_wait / loom_work_test to free. Several threads may wait
 * so at once (a prepare step on another group's progress thread and the caller), while nobody
 * consumes it. NULL: LOOM_OK. */
int loom__work_wait_keep(loom_work *w);

/* A blocking all-gather whose bytes move even in a dry run (loom_mem_set_dry_run), for
 * metadata the run's structure depends on (FSDP's shared buffers; also dist_int.h). */
int loom__pg_allgather_always(loom_pg *pg, const void *send, void *recv, size_t count,
                              loom_dtype dt);

/* True when every rank of pg runs in this process (the threads backend): a layer above may then
 * share one buffer between the ranks (FSDP's gathered units, fsdp_share.c). */
bool loom__pg_one_address_space(const loom_pg *pg);

/* Fail the group with (code, msg) so that peers waiting for this rank outside a collective
 * (polling loom_pg_async_error) stop; loom__pg_fail for the layers above dist. Returns code. */
int loom__pg_fail_group(loom_pg *pg, int code, const char *msg);

#endif
