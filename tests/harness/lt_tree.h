/* lt_tree.h: the folders tests make and look into: one walker that counts the names under a
 * folder holding a piece of text (what a run left behind: ".tmp.", offload files) and, asked
 * to, removes the folder with everything under it. */
#ifndef LOOM_TESTS_LT_TREE_H
#define LOOM_TESTS_LT_TREE_H

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The names under path (at any depth) that contain `part` (NULL: every name). With remove,
 * path and all under it are removed too (path may be a file). Symlinks are not followed. */
static inline int lt_tree_walk(const char *path, const char *part, bool remove) {
  int n = 0;
  struct stat st;
  DIR *d = lstat(path, &st) == 0 && S_ISDIR(st.st_mode) ? opendir(path) : NULL;
  for (struct dirent *e; d && (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    n += !part || strstr(e->d_name, part) != NULL;
    char p[4096];
    int len = snprintf(p, sizeof p, "%s/%s", path, e->d_name);
    if (len > 0 && (size_t)len < sizeof p) n += lt_tree_walk(p, part, remove);
  }
  if (d) closedir(d);
  if (remove) d ? (void)rmdir(path) : (void)unlink(path);
  return n;
}

#endif
