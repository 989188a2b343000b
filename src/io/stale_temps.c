/* stale_temps.c: removing what interrupted atomic writes left behind. A process killed between
 * mkstemp and rename leaves `<path>.tmp.XXXXXX` (file.c's pattern); nothing else would ever
 * remove it. Only regular files whose names match that exact pattern for this one target, in
 * its own folder, are removed: never another target's temporaries, a symlink or a folder. */
#include "io/io_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool random_part(const char *s) {
  for (int i = 0; i < LOOM__AFILE_RANDOM; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))) return false;
  }
  return s[LOOM__AFILE_RANDOM] == '\0';
}

int loom_remove_stale_temporaries(const char *path, size_t *removed) {
  static const char *who = "loom_remove_stale_temporaries";
  if (removed) *removed = 0;
  if (!path || !path[0]) return loom__fail(LOOM_EINVAL, "%s: empty path", who);
  const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
  char dir[4096];
  int rc = loom__folder_of(who, path, dir, sizeof dir);
  if (rc) return rc;
  size_t blen = strlen(base), slen = strlen(LOOM__AFILE_SUFFIX);
  if (!blen) return loom__fail(LOOM_EINVAL, "%s: '%s' names a folder, not a file", who, path);
  DIR *d = opendir(dir);
  if (!d) return loom__fail(errno == ENOENT ? LOOM_ENOTFOUND : LOOM_EIO,
                            "%s: cannot read folder '%s': %s", who, dir, strerror(errno));
  struct dirent *e;
  while ((e = readdir(d))) {
    const char *name = e->d_name;
    if (strncmp(name, base, blen) != 0 || strncmp(name + blen, LOOM__AFILE_SUFFIX, slen) != 0 ||
        !random_part(name + blen + slen))
      continue;
    struct stat st;
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlinkat(dirfd(d), name, 0) != 0) {
      if (errno == ENOENT) continue; /* gone meanwhile */
      rc = loom__fail(LOOM_EIO, "%s: cannot remove '%s/%s': %s", who, dir, name, strerror(errno));
      break;
    }
    if (removed) ++*removed;
  }
  closedir(d);
  return rc;
}
