/* version.c: loom_version, the run-time side of loom/version.h. */
#include "loom/version.h"

const char *loom_version(void) { return LOOM_VERSION_STRING; }
int loom_version_number(void) { return LOOM_VERSION_NUMBER; }
