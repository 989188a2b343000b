/* loom/version.h: the version of loom, at compile time (the macros) and at run time
 * (loom_version), so a program can check the library it runs with is the one it was built
 * against. The numbers here are the one place the version is written: CMake reads them.
 * Semantic versioning: a program built against MAJOR.x runs with any library MAJOR.y, y >= x. */
#ifndef LOOM_VERSION_H
#define LOOM_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_VERSION_MAJOR 0
#define LOOM_VERSION_MINOR 1
#define LOOM_VERSION_PATCH 0
#define LOOM_VERSION_STRING "0.1.0"
/* One integer that orders versions: MAJOR * 10000 + MINOR * 100 + PATCH. */
#define LOOM_VERSION_NUMBER                                                                   \
  (LOOM_VERSION_MAJOR * 10000 + LOOM_VERSION_MINOR * 100 + LOOM_VERSION_PATCH)

/* The version of the library linked at run time ("0.1.0"): static storage, never NULL. */
const char *loom_version(void);
/* The same as LOOM_VERSION_NUMBER, of the library linked at run time. */
int loom_version_number(void);

#ifdef __cplusplus
}
#endif
#endif
