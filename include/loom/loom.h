/* loom/loom.h: the whole public API of loom, one include: every header of include/loom/. Each
 * layer's header documents its own ownership and error rules; DESIGN.md is the map. */
#ifndef LOOM_LOOM_H
#define LOOM_LOOM_H

#include "loom/alloc.h"
#include "loom/amp.h"
#include "loom/scaler.h"
#include "loom/autocast.h"
#include "loom/cpu.h"
#include "loom/dtype.h"
#include "loom/layout.h"
#include "loom/status.h"
#include "loom/check.h"
#include "loom/version.h"
#include "loom/tensor.h"
#include "loom/scope.h"
#include "loom/ops.h"
#include "loom/autograd.h"
#include "loom/nn.h"
#include "loom/gpt.h"
#include "loom/rng.h"
#include "loom/optim.h"
#include "loom/dist.h"
#include "loom/dist_mpi.h"
#include "loom/ddp.h"
#include "loom/fsdp.h"
#include "loom/io.h"
#include "loom/step.h"

#endif
