/* train_signal.c: SIGINT, SIGTERM and SIGHUP during `loom train` (a closed terminal or an ssh
 * session that drops sends SIGHUP: the same clean stop as SIGTERM). The first one only sets a
 * flag: the write in progress (a checkpoint save) finishes, the run stops at the next step
 * boundary (every rank at the same step: train_run.c combines the flag over ranks), the run is
 * torn down as after any failure (the disk tier's offload files removed) and the tool exits
 * 128 + the signal (130, 143, 129) after saying so, with the last checkpoint intact. A second
 * one ends the process at once (SA_RESETHAND); a temporary it leaves is removed by the next
 * save. --metrics never holds up the stop: its writes never wait for a reader
 * (train_metrics.c). */
#include "train_api.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t pending;

static void on_signal(int sig) { pending = sig; }

void train_signal_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
  for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) sigaction(sigs[i], &sa, NULL);
}

int train_signal_pending(void) { return pending; }
