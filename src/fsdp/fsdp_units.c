/* fsdp_units.c: cutting a module into FSDP units and laying out each unit's flat parameter.
 *
 * A policy selects modules (each child of the first Sequential that holds parameters; modules
 * whose not-yet-wrapped parameters reach a size, children first, as PyTorch's size policy; or
 * modules named in a list). Every parameter belongs to the innermost selected module above it,
 * or, if there is none, to a unit for the root (PyTorch's root FSDP unit). Units are numbered
 * in the order their modules start forward (pre-order). A unit's flat parameter holds its
 * parameters in the module's order in core's flat layout (f32: each at a 64-byte aligned offset,
 * padded so that every rank's shard has the same aligned length). */
#include "fsdp/fsdp_int.h"
#include "core/layout.h"

#include <stdio.h>
#include <string.h>

typedef struct walk_mod {
  loom_module *m;
  char *name;
  bool selected;
  size_t unwrapped; /* size policy: parameter elements below not yet in a unit */
} walk_mod;

typedef struct walk {
  walk_mod *mods;
  size_t n, cap;
  int rc;
} walk;

static void walk_add(walk *w, loom_module *m, const char *name) {
  if (w->rc) return;
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 16;
    walk_mod *g = loom__calloc(LOOM_POOL_META, cap, sizeof *g);
    if (!g) {
      w->rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory listing modules");
      return;
    }
    if (w->n) memcpy(g, w->mods, w->n * sizeof *g);
    loom__free(w->mods);
    w->mods = g;
    w->cap = cap;
  }
  char *nm = loom__strdup(LOOM_POOL_META, name);
  if (!nm) {
    w->rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory listing modules");
    return;
  }
  w->mods[w->n++] = (walk_mod){m, nm, false, 0};
  for (int i = 0; i < m->n_children; i++) {
    char child[512];
    snprintf(child, sizeof child, "%s%s%s", name, *name ? "." : "", m->child_names[i]);
    walk_add(w, m->children[i], child);
  }
}

static void walk_free(walk *w) {
  for (size_t i = 0; i < w->n; i++) loom__free(w->mods[i].name);
  loom__free(w->mods);
}

static size_t own_numel(const loom_module *m) {
  size_t n = 0;
  for (int i = 0; i < m->n_params; i++) n += loom_tensor_numel(m->params[i].value);
  return n;
}

static size_t subtree_numel(const loom_module *m) {
  size_t n = own_numel(m);
  for (int i = 0; i < m->n_children; i++) n += subtree_numel(m->children[i]);
  return n;
}

static size_t mod_index(const walk *w, const loom_module *m) {
  for (size_t i = 0; i < w->n; i++)
    if (w->mods[i].m == m) return i;
  return SIZE_MAX;
}

/* Size policy, children first: a module (not the root) whose unwrapped elements reach the
 * limit becomes a unit and passes nothing up. */
static size_t size_policy(walk *w, loom_module *m, size_t limit) {
  size_t n = own_numel(m);
  for (int i = 0; i < m->n_children; i++) n += size_policy(w, m->children[i], limit);
  size_t k = mod_index(w, m);
  if (m->parent && n >= limit && n > 0) {
    w->mods[k].selected = true;
    return 0;
  }
  return n;
}

static int select_units(loom_fsdp *f, walk *w) {
  const loom_fsdp_cfg *c = &f->cfg;
  if (c->wrap == LOOM_FSDP_WRAP_CHILDREN) {
    for (size_t i = 0; i < w->n; i++) {
      loom_module *m = w->mods[i].m;
      if (strcmp(m->type, "Sequential") != 0) continue; /* an MLP's is its "layers" */
      bool any = false;
      for (int k = 0; k < m->n_children; k++) {
        if (subtree_numel(m->children[k]) == 0) continue;
        w->mods[mod_index(w, m->children[k])].selected = true;
        any = true;
      }
      if (any) break;
    }
  } else if (c->wrap == LOOM_FSDP_WRAP_SIZE) {
    size_policy(w, f->root, c->min_unit_numel);
  } else {
    for (size_t k = 0; k < c->n_unit_names; k++) {
      size_t i = 0;
      while (i < w->n && strcmp(w->mods[i].name, f->unit_names[k]) != 0) i++;
      if (i == w->n)
        return loom__fail(LOOM_EINVAL, "fsdp: unit_names[%zu] '%s' is not a module of the "
                          "model", k, f->unit_names[k]);
      if (w->mods[i].m == f->root)
        return loom__fail(LOOM_EINVAL, "fsdp: unit_names[%zu] names the root module: its "
                          "parameters form a unit anyway", k);
      w->mods[i].selected = true;
    }
  }
  return LOOM_OK;
}

/* The unit (index into the selected list, or the root unit) each module's own parameters go
 * to: the innermost selected module above or at it. */
static void owners(const loom_module *m, const walk *w, const size_t *unit_of_mod, size_t cur,
                   size_t *owner_of_mod) {
  size_t k = mod_index(w, m);
  if (w->mods[k].selected) cur = unit_of_mod[k];
  owner_of_mod[k] = cur;
  for (int i = 0; i < m->n_children; i++)
    owners(m->children[i], w, unit_of_mod, cur, owner_of_mod);
}

static int layout(loom_fsdp *f, walk *w, const size_t *owner_of_mod) {
  loom_module *root = f->root;
  f->nparams = root->n_flat;
  f->by_index = loom__calloc(LOOM_POOL_META, f->nparams ? f->nparams : 1, sizeof *f->by_index);
  if (!f->by_index) return loom__fail(LOOM_ENOMEM, "fsdp: out of memory for the units");
  /* which module holds each flat parameter */
  size_t *unit_of_param = loom__calloc(LOOM_POOL_META, f->nparams ? f->nparams : 1, sizeof(size_t));
  if (!unit_of_param) return loom__fail(LOOM_ENOMEM, "fsdp: out of memory for the units");
  for (size_t i = 0; i < f->nparams; i++) {
    unit_of_param[i] = SIZE_MAX;
    for (size_t k = 0; k < w->n && unit_of_param[i] == SIZE_MAX; k++)
      for (int j = 0; j < w->mods[k].m->n_params; j++)
        if (&w->mods[k].m->params[j] == root->flat[i]) unit_of_param[i] = owner_of_mod[k];
  }
  int rc = LOOM_OK;
  for (size_t u = 0; u < f->nunits && !rc; u++) {
    fsdp_unit *un = &f->units[u];
    size_t count = 0;
    for (size_t i = 0; i < f->nparams; i++) count += unit_of_param[i] == u;
    un->params = loom__calloc(LOOM_POOL_META, count ? count : 1, sizeof *un->params);
    if (!un->params) {
      rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory for the units");
      break;
    }
    loom__layout lay;
    loom__layout_init(&lay, LOOM_F32);
    for (size_t i = 0; i < f->nparams; i++) {
      if (unit_of_param[i] != u) continue;
      fsdp_param *fp = &un->params[un->nparams++];
      fp->p = root->flat[i];
      fp->numel = loom_tensor_numel(fp->p->value);
      fp->offset = loom__layout_add(&lay, fp->numel);
      fp->index = i;
      fp->hook_id = -1; /* none registered yet */
      fp->unit = un;
      f->by_index[i] = fp;
    }
    un->numel = lay.end;
    un->padded = loom__layout_padded(&lay, (size_t)f->world);
    un->shard = un->padded / (size_t)f->world;
  }
  loom__free(unit_of_param);
  return rc;
}

int loom__fsdp_make_units(loom_fsdp *f) {
  walk w = {0};
  walk_add(&w, f->root, "");
  int rc = w.rc;
  if (!rc) rc = select_units(f, &w);
  size_t *unit_of_mod = NULL, *owner_of_mod = NULL;
  if (!rc) {
    unit_of_mod = loom__calloc(LOOM_POOL_META, w.n, sizeof *unit_of_mod);
    owner_of_mod = loom__calloc(LOOM_POOL_META, w.n, sizeof *owner_of_mod);
    if (!unit_of_mod || !owner_of_mod) rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory");
  }
  if (!rc) {
    /* the root unit first (it starts forward first) if some parameter is in no selected
     * module, then the selected modules in pre-order */
    size_t sel = 0;
    for (size_t i = 0; i < w.n; i++) sel += w.mods[i].selected;
    size_t nroot_params = 0;
    size_t *tmp_owner = owner_of_mod;
    size_t *tmp_unit = unit_of_mod;
    size_t next = 1;
    for (size_t i = 0; i < w.n; i++)
      if (w.mods[i].selected) tmp_unit[i] = next++;
    owners(f->root, &w, tmp_unit, 0, tmp_owner);
    for (size_t i = 0; i < w.n; i++)
      if (tmp_owner[i] == 0) nroot_params += (size_t)w.mods[i].m->n_params;
    bool root_unit = nroot_params > 0 || sel == 0;
    size_t shift = root_unit ? 0 : 1;
    for (size_t i = 0; i < w.n; i++) owner_of_mod[i] -= owner_of_mod[i] >= shift ? shift : 0;
    size_t nunits = sel + (root_unit ? 1 : 0);
    f->units = loom__calloc(LOOM_POOL_META, nunits ? nunits : 1, sizeof *f->units);
    if (!f->units) rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory for the units");
    else f->nunits = nunits;
    size_t u = 0;
    if (!rc && root_unit) {
      f->units[u] = (fsdp_unit){.f = f, .index = u, .module = f->root};
      f->units[u].name = loom__strdup(LOOM_POOL_META, "");
      if (!f->units[u].name) rc = loom__fail(LOOM_ENOMEM, "fsdp: out of memory");
      u++;
    }
    for (size_t i = 0; i < w.n && !rc; i++) {
      if (!w.mods[i].selected) continue;
      f->units[u] = (fsdp_unit){.f = f, .index = u, .module = w.mods[i].m};
      f->units[u].name = w.mods[i].name;
      w.mods[i].name = NULL; /* moved */
      u++;
    }
    if (!rc) rc = layout(f, &w, owner_of_mod);
  }
  loom__free(unit_of_mod);
  loom__free(owner_of_mod);
  walk_free(&w);
  return rc;
}

void loom__fsdp_free_units(loom_fsdp *f) {
  for (size_t u = 0; u < f->nunits; u++) {
    loom__free(f->units[u].name);
    loom__free(f->units[u].params);
  }
  loom__free(f->units);
  loom__free(f->by_index);
  f->units = NULL;
  f->by_index = NULL;
  f->nunits = 0;
}
