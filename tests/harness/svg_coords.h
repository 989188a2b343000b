/* svg_coords.h: the check that an SVG holds only finite coordinates, shared by the plot tests
 * (tests/tools/test_plot.c) and the plot fuzz harness (fuzz/fuzz_plot.c). */
#ifndef LOOM_SVG_COORDS_H
#define LOOM_SVG_COORDS_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every coordinate attribute (x y x1 y1 x2 y2 width height points d transform) holds only
 * finite numbers of a sane size: no nan, no inf. NULL if so, else what is wrong. */
static const char *svg_coords_problem(const char *s) {
  static char why[200];
  static const char *const attrs[] = {" x=\"", " y=\"", " x1=\"", " y1=\"", " x2=\"", " y2=\"",
                                      " width=\"", " height=\"", " points=\"", " d=\"",
                                      " transform=\""};
  for (size_t a = 0; a < sizeof attrs / sizeof *attrs; a++)
    for (const char *p = s; (p = strstr(p, attrs[a])); p++) {
      const char *v = p + strlen(attrs[a]), *e = strchr(v, '"');
      if (!e) return "an unterminated attribute";
      if (!strncmp(v, "100%\"", 5)) continue; /* the background's width and height */
      for (const char *c = v; c < e;) {
        if (!strncmp(c, "translate", 9)) {
          c += 9;
          continue;
        }
        if (strchr("Mlm(), ", *c)) {
          c++;
          continue;
        }
        char *end;
        double x = strtod(c, &end);
        if (end == c || end > e || !isfinite(x) || fabs(x) > 1e7) {
          snprintf(why, sizeof why, "attribute%.*s%.*s\" is not finite coordinates",
                   (int)strlen(attrs[a]) - 1, attrs[a], (int)(e - v > 60 ? 60 : e - v), v);
          return why;
        }
        c = end;
      }
    }
  return NULL;
}

#endif
