/* fsdp_offload_cfg.c: the offloader's configuration (loom_fsdp_offload_cfg_default, _validate)
 * and the saved-error helpers the offloader's files share (loom__fsdp_err_save, _restore). The
 * offloader itself is fsdp_offload.c. */
#include "fsdp/fsdp_int.h"
#include "fsdp/offload_store.h"

#include <stdio.h>

#define MAX_PREFETCH_STEPS 10

loom_fsdp_offload_cfg loom_fsdp_offload_cfg_default(void) {
  return (loom_fsdp_offload_cfg){.enabled = true,
                                 .offload_optimizer_states = true,
                                 .offload_gradients = true,
                                 .offload_parameters = true,
                                 .prefetch_parameters = true,
                                 .prefetch_gradients = true,
                                 .prefetch_steps = 1,
                                 .tier = LOOM_FSDP_TIER_HOST,
                                 .dir = NULL,
                                 .chunk_bytes = (size_t)4 << 20,
                                 .io_threads = 0,
                                 .low_precision_params = true,
                                 .async_step = false};
}

int loom_fsdp_offload_cfg_validate(const loom_fsdp_offload_cfg *cfg) {
  if (!cfg) return loom__fail(LOOM_EINVAL, "fsdp offload cfg: NULL");
  if (!cfg->enabled) return LOOM_OK;
  if (cfg->prefetch_steps < 0 || cfg->prefetch_steps > MAX_PREFETCH_STEPS)
    return loom__fail(LOOM_EINVAL, "fsdp offload cfg: prefetch_steps %d must be between 0 and %d",
                      cfg->prefetch_steps, MAX_PREFETCH_STEPS);
  if ((unsigned)cfg->tier > LOOM_FSDP_TIER_DISK)
    return loom__fail(LOOM_EINVAL, "fsdp offload cfg: tier %d is not host (0) or disk (1)",
                      (int)cfg->tier);
  if (cfg->tier == LOOM_FSDP_TIER_DISK && (!cfg->dir || !*cfg->dir))
    return loom__fail(LOOM_EINVAL, "fsdp offload cfg: the disk tier needs a folder (dir)");
  if (cfg->chunk_bytes < 64 || cfg->chunk_bytes % 64 || cfg->chunk_bytes > ((size_t)1 << 30))
    return loom__fail(LOOM_EINVAL, "fsdp offload cfg: chunk_bytes %zu must be a multiple of 64 "
                      "within 64..1 GiB", cfg->chunk_bytes);
  if (cfg->io_threads < 0 || cfg->io_threads > LOOM__OSTORE_MAX_WORKERS)
    return loom__fail(LOOM_EINVAL, "fsdp offload cfg: io_threads %d must be between 0 and %d "
                      "(0: the tier's default)", cfg->io_threads, LOOM__OSTORE_MAX_WORKERS);
  return LOOM_OK;
}

void loom__fsdp_err_save(loom__fsdp_err *e, int rc) {
  e->rc = rc;
  snprintf(e->msg, sizeof e->msg, "%s", rc ? loom_last_error() : "");
}

int loom__fsdp_err_restore(const loom__fsdp_err *e) {
  return e->rc ? loom__fail(e->rc, "%s", e->msg) : LOOM_OK;
}

