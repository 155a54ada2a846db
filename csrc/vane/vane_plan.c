/* vane_plan.c -- the vane planner: a verified MIL program becomes a list of
 * steps over value slots, with typed attributes, materialized inline
 * constants, and intermediate buffers shared between values whose lifetimes
 * do not overlap. Nothing here reads weight files: BLOBFILE constants are
 * read at load (vane_backend.c). */
#include "vane_plan.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/catalog.h"
#include "../core/error.h"
#include "../mil/mil_constexpr.h"

size_t vane_dtype_size(mil_dtype dtype)
{
    switch (dtype) {
    case MIL_DT_FP16: return 2;
    case MIL_DT_FP32: return 4;
    default: return 0;
    }
}

int vane_slot_root(const vane_plan *plan, int slot)
{
    while (plan->slots[slot].storage == VS_ALIAS) slot = (int)plan->slots[slot].index;
    return slot;
}

/* ---- small helpers ------------------------------------------------------ */

#define FAIL(P, st, ...) ((void)(P), fail_at((st), __VA_ARGS__))

static orion_status fail_at(const mil_stmt *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static orion_status fail_at(const mil_stmt *st, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (st)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: line %d (%s %s): %s", st->line,
                          st->op, st->n_results ? st->results[0] : "", msg);
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: %s", msg);
}

static const mil_value *find_arg(const mil_stmt *st, const char *name)
{
    for (size_t i = 0; i < st->n_args; i++)
        if (strcmp(st->args[i].name, name) == 0) return &st->args[i].value;
    return NULL;
}

static const mil_value *find_attr(const mil_stmt *st, const char *name)
{
    for (size_t i = 0; i < st->n_attrs; i++)
        if (strcmp(st->attrs[i].name, name) == 0) return &st->attrs[i].value;
    return NULL;
}

static int64_t numel_of(int rank, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

static int same_shape(int ra, const int64_t *a, int rb, const int64_t *b)
{
    if (ra != rb) return 0;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

static void shape_str(char *buf, size_t cap, int rank, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < rank && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* ---- the planner's state ------------------------------------------------ */

typedef struct planner {
    vane_plan *plan;
    const mil_program *prog;
    int cur_step;              /* index of the step being built */
    int *names;                /* open-addressed hash of slot names -> latest slot (-1 empty) */
    size_t names_cap, names_used;
} planner;

static int new_slot(planner *P)
{
    vane_plan *pl = P->plan;
    if (pl->n_slots == pl->cap_slots) {
        int cap = pl->cap_slots ? pl->cap_slots * 2 : 64;
        vane_slot *s = realloc(pl->slots, (size_t)cap * sizeof *s);
        if (!s) return -1;
        pl->slots = s;
        pl->cap_slots = cap;
    }
    vane_slot *s = &pl->slots[pl->n_slots];
    memset(s, 0, sizeof *s);
    s->name = "";
    s->blob = -1;
    s->quant = -1;
    s->def_step = -1;
    s->last_use = -1;
    return pl->n_slots++;
}

static void set_type(vane_slot *s, const mil_type *t)
{
    s->dtype = t->dtype;
    s->rank = t->is_tensor ? t->rank : 0;
    for (int i = 0; i < s->rank; i++) s->shape[i] = t->shape[i];
    s->numel = numel_of(s->rank, s->shape);
}

static size_t name_hash(const char *name)
{
    size_t h = 1469598103934665603ull;   /* FNV-1a */
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 1099511628211ull;
    return h;
}

/* The hash slot where `name` is, or the empty one where it would go. */
static size_t name_probe(const planner *P, const char *name)
{
    size_t mask = P->names_cap - 1, i = name_hash(name) & mask;
    while (P->names[i] >= 0 && strcmp(P->plan->slots[P->names[i]].name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* The latest slot named `name`, or -1. A hash, not a scan: a program of n
 * statements plans in O(n), not O(n^2) (40k statements were 128 s under ASan). */
static int find_slot(const planner *P, const char *name)
{
    if (!P->names_cap || !name[0]) return -1;
    return P->names[name_probe(P, name)];
}

/* Gives slot `id` its name and indexes it; a later slot of the same name wins. */
static int name_slot(planner *P, int id, const char *name)
{
    P->plan->slots[id].name = name;
    if (!name[0]) return 0;
    if ((P->names_used + 1) * 2 > P->names_cap) {
        size_t cap = P->names_cap ? P->names_cap * 2 : 256;
        int *t = malloc(cap * sizeof *t);
        if (!t) return -1;
        free(P->names);
        P->names = t;
        P->names_cap = cap;
        P->names_used = 0;
        for (size_t i = 0; i < cap; i++) t[i] = -1;
        for (int k = 0; k < P->plan->n_slots; k++) {   /* in order: later names win */
            const char *nm = P->plan->slots[k].name;
            if (k == id || !nm[0]) continue;
            size_t at = name_probe(P, nm);
            if (P->names[at] < 0) P->names_used++;
            P->names[at] = k;
        }
    }
    size_t at = name_probe(P, name);
    if (P->names[at] < 0) P->names_used++;
    if (P->names[at] < id) P->names[at] = id;
    return 0;
}

/* The constant literal behind a value (following a reference to a const),
 * or NULL when the value is computed at run time. */
static const mil_value *const_of(const planner *P, const mil_value *v)
{
    if (!v) return NULL;
    if (v->kind == MIL_VAL_REF) {
        int s = find_slot(P, v->name);
        if (s < 0 || P->plan->slots[s].storage != VS_CONST) return NULL;
        return P->plan->slots[s].value;
    }
    return v;
}

/* Integer list attribute; *n receives its length. Missing: *n = -1. */
static orion_status attr_ints(const planner *P, const mil_stmt *st, const char *name,
                              int64_t *out, int max, int *n)
{
    const mil_value *raw = find_arg(st, name);
    *n = -1;
    if (!raw) return ORION_OK;
    const mil_value *v = const_of(P, raw);
    if (!v || (v->kind != MIL_VAL_SCALAR && v->kind != MIL_VAL_TENSOR) || !v->numbers ||
        (v->type.dtype != MIL_DT_INT32 && v->type.dtype != MIL_DT_BOOL &&
         v->type.dtype != MIL_DT_UINT64 && v->type.dtype != MIL_DT_INT8))
        return FAIL(P, st, "'%s' must be an integer constant", name);
    if (v->n_numbers > (size_t)max) return FAIL(P, st, "'%s' has too many values", name);
    for (size_t i = 0; i < v->n_numbers; i++) out[i] = (int64_t)v->numbers[i];
    *n = (int)v->n_numbers;
    return ORION_OK;
}

static orion_status attr_int(const planner *P, const mil_stmt *st, const char *name,
                             int64_t dflt, int64_t *out)
{
    int64_t buf[1] = {dflt};
    int n;
    *out = dflt;
    orion_status rc = attr_ints(P, st, name, buf, 1, &n);
    if (rc) return rc;
    if (n == 0) return FAIL(P, st, "'%s' is empty", name);
    *out = n < 0 ? dflt : buf[0];
    return ORION_OK;
}

static orion_status attr_float(const planner *P, const mil_stmt *st, const char *name,
                               double dflt, int required, double *out)
{
    const mil_value *raw = find_arg(st, name);
    if (!raw) {
        if (required) return FAIL(P, st, "missing '%s'", name);
        *out = dflt;
        return ORION_OK;
    }
    const mil_value *v = const_of(P, raw);
    if (!v || (v->kind != MIL_VAL_SCALAR && v->kind != MIL_VAL_TENSOR) || !v->numbers ||
        v->n_numbers != 1)
        return FAIL(P, st, "'%s' must be a scalar constant", name);
    *out = v->numbers[0];
    return ORION_OK;
}

static orion_status attr_string(const planner *P, const mil_stmt *st, const char *name,
                                const char **out)
{
    const mil_value *raw = find_arg(st, name);
    *out = NULL;
    if (!raw) return ORION_OK;
    const mil_value *v = const_of(P, raw);
    if (!v || v->kind != MIL_VAL_SCALAR || v->type.dtype != MIL_DT_STRING || !v->string)
        return FAIL(P, st, "'%s' must be a string constant", name);
    *out = v->string;
    return ORION_OK;
}

/* ---- constants ---------------------------------------------------------- */

static orion_status materialize(planner *P, vane_slot *s, const mil_stmt *st)
{
    const mil_value *v = s->value;
    if (!v || v->kind == MIL_VAL_BLOBFILE) return ORION_OK;   /* read or decoded at load */
    size_t es = vane_dtype_size(s->dtype);
    if (!es) return ORION_OK;   /* int/bool/string consts serve as attributes only */
    if (!v->numbers || (int64_t)v->n_numbers != s->numel)
        return FAIL(P, st, "constant '%s' has %zu values for %lld elements", s->name,
                    v->n_numbers, (long long)s->numel);
    s->data = malloc((size_t)s->numel * es + 1);
    if (!s->data) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    for (int64_t i = 0; i < s->numel; i++) {
        float f = (float)v->numbers[i];
        if (s->dtype == MIL_DT_FP16) ((fp16_t *)s->data)[i] = vk_f32_to_f16(f);
        else ((float *)s->data)[i] = f;
    }
    return ORION_OK;
}

/* Slot `id`, a BLOBFILE const, is read at load. */
static orion_status add_blob_ref(planner *P, const mil_stmt *st, int id)
{
    vane_plan *pl = P->plan;
    vane_slot *s = &pl->slots[id];
    const mil_value *v = s->value;
    uint32_t bdt = mil_blob_dtype(s->dtype);
    if (!bdt) return FAIL(P, st, "a BLOBFILE cannot hold %s", mil_dtype_name(s->dtype));
    if (pl->n_blobs == pl->cap_blobs) {
        int cap = pl->cap_blobs ? pl->cap_blobs * 2 : 16;
        vane_blob_ref *nb = realloc(pl->blobs, (size_t)cap * sizeof *nb);
        if (!nb) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        pl->blobs = nb;
        pl->cap_blobs = cap;
    }
    mil_type t = {s->dtype, 1, s->rank, {0}};
    memcpy(t.shape, s->shape, sizeof s->shape);
    pl->blobs[pl->n_blobs] = (vane_blob_ref){v->blob_path, v->blob_offset, bdt,
                                             mil_type_nbytes(&t), id};
    s->blob = pl->n_blobs++;
    return ORION_OK;
}

static orion_status plan_const(planner *P, const mil_stmt *st)
{
    if (st->n_results != 1) return FAIL(P, st, "const must have one result");
    const mil_value *v = find_attr(st, "val");
    if (!v) v = find_arg(st, "val");
    if (!v) return FAIL(P, st, "const without 'val'");
    if (v->kind == MIL_VAL_REF || v->kind == MIL_VAL_TUPLE)
        return FAIL(P, st, "const 'val' must be a literal or BLOBFILE");
    int id = new_slot(P);
    if (id < 0) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    if (name_slot(P, id, st->results[0])) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    vane_slot *s = &P->plan->slots[id];
    set_type(s, &st->types[0]);
    s->storage = VS_CONST;
    s->value = v;
    if (v->type.dtype != s->dtype)
        return FAIL(P, st, "const value type %s differs from the declared %s",
                    mil_dtype_name(v->type.dtype), mil_dtype_name(s->dtype));
    if (v->kind == MIL_VAL_BLOBFILE) return add_blob_ref(P, st, id);
    return ORION_OK;
}

/* One const input of a constexpr op: the slot of the const() an argument
 * names, or an anonymous const slot for an attribute literal. */
static orion_status constexpr_input(planner *P, const mil_stmt *st, mil_op_kind kind,
                                    const char *name, int *out)
{
    *out = -1;
    if (kind != MIL_OP_CONSTEXPR_AFFINE) {
        const mil_value *a = find_arg(st, name);
        if (!a) return ORION_OK;
        int id = a->kind == MIL_VAL_REF ? find_slot(P, a->name) : -1;
        if (id < 0 || P->plan->slots[id].storage != VS_CONST || !P->plan->slots[id].value)
            return FAIL(P, st, "'%s' must name a const", name);
        *out = id;
        return ORION_OK;
    }
    const mil_value *v = find_attr(st, name);
    if (!v) return ORION_OK;
    if (v->kind != MIL_VAL_SCALAR && v->kind != MIL_VAL_TENSOR && v->kind != MIL_VAL_BLOBFILE)
        return FAIL(P, st, "attribute '%s' must be a literal", name);
    int id = new_slot(P);
    if (id < 0) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    vane_slot *s = &P->plan->slots[id];
    set_type(s, &v->type);
    s->storage = VS_CONST;
    s->value = v;
    *out = id;
    return v->kind == MIL_VAL_BLOBFILE ? add_blob_ref(P, st, id) : ORION_OK;
}

/* A constexpr op: a weight slot whose values come from its inputs at load. */
static orion_status plan_constexpr(planner *P, const mil_stmt *st, mil_op_kind kind)
{
    if (st->n_results != 1) return FAIL(P, st, "a constexpr op has one result");
    vane_plan *pl = P->plan;
    if (pl->n_quants == pl->cap_quants) {
        int cap = pl->cap_quants ? pl->cap_quants * 2 : 16;
        vane_quant *nq = realloc(pl->quants, (size_t)cap * sizeof *nq);
        if (!nq) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        pl->quants = nq;
        pl->cap_quants = cap;
    }
    vane_quant *q = &pl->quants[pl->n_quants];
    memset(q, 0, sizeof *q);
    q->kind = kind;
    q->offset = q->lut = q->scale = q->data = -1;
    /* the inputs: codes, then the scale (or lut), then the offset (or zero point);
     * affine's axis is read by vane_quant_plan */
    static const char *const names[3][3] = {{"data", "scale", "offset"},
                                            {"indices", "lut", NULL},
                                            {"quantized_data", "scale", "zero_point"}};
    int which = kind == MIL_OP_CONSTEXPR_SHIFT_SCALE ? 0 : kind == MIL_OP_CONSTEXPR_LUT ? 1 : 2;
    int *dst[3] = {&q->data, which == 1 ? &q->lut : &q->scale, &q->offset};
    orion_status rc;
    for (int i = 0; i < 3 && names[which][i]; i++)
        if ((rc = constexpr_input(P, st, kind, names[which][i], dst[i]))) return rc;
    int id = new_slot(P);
    if (id < 0) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    vane_slot *r = &pl->slots[id];
    set_type(r, &st->types[0]);
    r->storage = VS_CONST;
    r->quant = pl->n_quants;
    q = &pl->quants[pl->n_quants];
    q->result = id;
    if ((rc = vane_quant_plan(pl, q, st))) return rc;
    pl->n_quants++;
    if (name_slot(P, id, st->results[0])) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    return ORION_OK;
}

/* The slot of a data operand: a named value, or an inline literal that
 * becomes an anonymous constant. Missing and not required: -1. */
static orion_status data_arg(planner *P, const mil_stmt *st, const char *name, int required,
                             int *out)
{
    const mil_value *v = find_arg(st, name);
    *out = -1;
    if (!v) return required ? FAIL(P, st, "missing operand '%s'", name) : ORION_OK;
    int id;
    if (v->kind == MIL_VAL_REF) {
        id = find_slot(P, v->name);
        if (id < 0) return FAIL(P, st, "'%s' refers to unknown value '%s'", name, v->name);
    } else if (v->kind == MIL_VAL_SCALAR || v->kind == MIL_VAL_TENSOR) {
        id = new_slot(P);
        if (id < 0) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        vane_slot *s = &P->plan->slots[id];
        set_type(s, &v->type);
        s->storage = VS_CONST;
        s->value = v;
    } else {
        return FAIL(P, st, "operand '%s' must be a value", name);
    }
    vane_slot *s = &P->plan->slots[id];
    if (!vane_dtype_size(s->dtype))
        return FAIL(P, st, "operand '%s' is %s; vane computes on fp16 and fp32 tensors", name,
                    mil_dtype_name(s->dtype));
    if (s->storage == VS_CONST && !s->used_as_data) {
        orion_status rc = materialize(P, s, st);
        if (rc) return rc;
    }
    s->used_as_data = 1;
    *out = id;
    return ORION_OK;
}

/* ---- shape rules per op ------------------------------------------------- */

static int broadcast(int ra, const int64_t *a, int rb, const int64_t *b, int *ro, int64_t *o)
{
    int r = ra > rb ? ra : rb;
    for (int i = 0; i < r; i++) {
        int64_t da = i < r - ra ? 1 : a[i - (r - ra)];
        int64_t db = i < r - rb ? 1 : b[i - (r - rb)];
        if (da != db && da != 1 && db != 1) return -1;
        o[i] = da == 1 ? db : da;
    }
    *ro = r;
    return 0;
}

static orion_status check_result(const planner *P, const mil_stmt *st, const vane_slot *r,
                                 int rank, const int64_t *shape)
{
    if (same_shape(r->rank, r->shape, rank, shape)) return ORION_OK;
    char want[160], got[160];
    shape_str(want, sizeof want, rank, shape);
    shape_str(got, sizeof got, r->rank, r->shape);
    return FAIL(P, st, "result '%s' is declared %s but the op gives %s", r->name, got, want);
}

static int norm_axis(int64_t a, int rank, int *out)
{
    if (a < 0) a += rank;
    if (a < 0 || a >= rank) return -1;
    *out = (int)a;
    return 0;
}

static orion_status plan_conv(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x, w, bias;
    if ((rc = data_arg(P, st, "x", 1, &x)) || (rc = data_arg(P, st, "weight", 1, &w)) ||
        (rc = data_arg(P, st, "bias", 0, &bias)))
        return rc;
    if (bias >= 0)
        return constraint_fail("ANE-C05", "line %d: conv '%s' has a bias= argument", st->line,
                               st->results[0]);
    int64_t g = 1;
    if ((rc = attr_int(P, st, "groups", 1, &g))) return rc;
    if (g != 1) return FAIL(P, st, "only groups=1 is supported, got %lld", (long long)g);
    int64_t v[8];
    int n;
    const char *names[] = {"strides", "dilations"};
    for (int k = 0; k < 2; k++) {
        if ((rc = attr_ints(P, st, names[k], v, 8, &n))) return rc;
        for (int i = 0; i < n; i++)
            if (v[i] != 1) return FAIL(P, st, "only %s of 1 are supported", names[k]);
    }
    if ((rc = attr_ints(P, st, "pad", v, 8, &n))) return rc;
    for (int i = 0; i < n; i++)
        if (v[i] != 0) return FAIL(P, st, "only zero padding is supported (1x1 conv)");
    const vane_slot *X = &P->plan->slots[x], *W = &P->plan->slots[w];
    if (X->dtype != MIL_DT_FP16 || W->dtype != MIL_DT_FP16)
        return FAIL(P, st, "conv computes on fp16 tensors");
    if (X->rank != 4 || W->rank != 4)
        return FAIL(P, st, "conv needs x [N,C,H,W] and weight [O,C,1,1]");
    if (W->shape[2] != 1 || W->shape[3] != 1)
        return FAIL(P, st, "only 1x1 convolutions are supported (kernel %lldx%lld)",
                    (long long)W->shape[2], (long long)W->shape[3]);
    if (W->shape[1] != X->shape[1])
        return FAIL(P, st, "weight has %lld input channels, x has %lld",
                    (long long)W->shape[1], (long long)X->shape[1]);
    int64_t o[4] = {X->shape[0], W->shape[0], X->shape[2], X->shape[3]};
    const vane_slot *R = &P->plan->slots[sp->out[0]];
    if (R->dtype != MIL_DT_FP16) return FAIL(P, st, "conv result must be fp16");
    sp->n_in = 2;
    sp->in[0] = x;
    sp->in[1] = w;
    return check_result(P, st, R, 4, o);
}

static orion_status plan_matmul(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x, y;
    int64_t tx = 0, ty = 0;
    if ((rc = data_arg(P, st, "x", 1, &x)) || (rc = data_arg(P, st, "y", 1, &y)) ||
        (rc = attr_int(P, st, "transpose_x", 0, &tx)) ||
        (rc = attr_int(P, st, "transpose_y", 0, &ty)))
        return rc;
    const vane_slot *X = &P->plan->slots[x], *Y = &P->plan->slots[y];
    if (X->dtype != MIL_DT_FP16 || Y->dtype != MIL_DT_FP16)
        return FAIL(P, st, "matmul computes on fp16 tensors");
    if (X->rank < 2 || Y->rank < 2) return FAIL(P, st, "matmul needs rank >= 2 operands");
    int64_t xm = X->shape[X->rank - (tx ? 1 : 2)], xk = X->shape[X->rank - (tx ? 2 : 1)];
    int64_t yk = Y->shape[Y->rank - (ty ? 1 : 2)], yn = Y->shape[Y->rank - (ty ? 2 : 1)];
    if (xk != yk)
        return FAIL(P, st, "inner dimensions differ: %lld vs %lld", (long long)xk, (long long)yk);
    int64_t o[MIL_MAX_RANK];
    int ro;
    if (broadcast(X->rank - 2, X->shape, Y->rank - 2, Y->shape, &ro, o))
        return FAIL(P, st, "batch dimensions do not broadcast");
    o[ro] = xm;
    o[ro + 1] = yn;
    const vane_slot *R = &P->plan->slots[sp->out[0]];
    if (R->dtype != MIL_DT_FP16) return FAIL(P, st, "matmul result must be fp16");
    sp->n_in = 2;
    sp->in[0] = x;
    sp->in[1] = y;
    sp->flag_x = tx != 0;
    sp->flag_y = ty != 0;
    return check_result(P, st, R, ro + 2, o);
}

static orion_status plan_binary(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x, y;
    if ((rc = data_arg(P, st, "x", 1, &x)) || (rc = data_arg(P, st, "y", 1, &y))) return rc;
    const vane_slot *X = &P->plan->slots[x], *Y = &P->plan->slots[y];
    int64_t o[MIL_MAX_RANK];
    int ro;
    if (broadcast(X->rank, X->shape, Y->rank, Y->shape, &ro, o))
        return FAIL(P, st, "operand shapes do not broadcast");
    sp->n_in = 2;
    sp->in[0] = x;
    sp->in[1] = y;
    return check_result(P, st, &P->plan->slots[sp->out[0]], ro, o);
}

static orion_status plan_unary(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    if ((rc = data_arg(P, st, "x", 1, &x))) return rc;
    const vane_slot *X = &P->plan->slots[x];
    sp->n_in = 1;
    sp->in[0] = x;
    if (sp->op == MIL_OP_CLIP) {
        double a, b;
        if ((rc = attr_float(P, st, "alpha", 0, 1, &a)) ||
            (rc = attr_float(P, st, "beta", 0, 1, &b)))
            return rc;
        if (!(a <= b)) return FAIL(P, st, "clip needs alpha <= beta");
        sp->f0 = (float)a;
        sp->f1 = (float)b;
    }
    const vane_slot *R = &P->plan->slots[sp->out[0]];
    if (sp->op == MIL_OP_CAST) {
        const char *dt;
        if ((rc = attr_string(P, st, "dtype", &dt))) return rc;
        if (!dt) return FAIL(P, st, "cast without dtype");
        mil_dtype to = strcmp(dt, "fp16") == 0 ? MIL_DT_FP16
                       : strcmp(dt, "fp32") == 0 ? MIL_DT_FP32 : MIL_DT_INVALID;
        if (to == MIL_DT_INVALID) return FAIL(P, st, "vane casts only to fp16 or fp32, not %s", dt);
        if (R->dtype != to) return FAIL(P, st, "result type differs from dtype %s", dt);
        sp->cast_to = to;
    } else if (sp->op == MIL_OP_IDENTITY && R->dtype != X->dtype) {
        return FAIL(P, st, "identity must keep the dtype");
    }
    return check_result(P, st, R, X->rank, X->shape);
}

static orion_status plan_reduce(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t axes[MIL_MAX_RANK], keep = 0;
    int n;
    if ((rc = data_arg(P, st, "x", 1, &x)) ||
        (rc = attr_ints(P, st, "axes", axes, MIL_MAX_RANK, &n)) ||
        (rc = attr_int(P, st, "keep_dims", 0, &keep)))
        return rc;
    const vane_slot *X = &P->plan->slots[x];
    uint32_t mask = 0;
    if (n < 0) mask = (1u << X->rank) - 1;
    for (int i = 0; i < n; i++) {
        int a;
        if (norm_axis(axes[i], X->rank, &a)) return FAIL(P, st, "axis %lld out of range",
                                                         (long long)axes[i]);
        mask |= 1u << a;
    }
    int64_t o[MIL_MAX_RANK];
    int ro = 0;
    for (int d = 0; d < X->rank; d++) {
        if (!(mask >> d & 1)) o[ro++] = X->shape[d];
        else if (keep) o[ro++] = 1;
    }
    sp->n_in = 1;
    sp->in[0] = x;
    sp->axes_mask = mask;
    sp->flag_x = keep != 0;
    return check_result(P, st, &P->plan->slots[sp->out[0]], ro, o);
}

static orion_status plan_softmax(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t axis = -1;
    if ((rc = data_arg(P, st, "x", 1, &x)) || (rc = attr_int(P, st, "axis", -1, &axis))) return rc;
    const vane_slot *X = &P->plan->slots[x];
    if (norm_axis(axis, X->rank, &sp->axis)) return FAIL(P, st, "axis out of range");
    sp->n_in = 1;
    sp->in[0] = x;
    return check_result(P, st, &P->plan->slots[sp->out[0]], X->rank, X->shape);
}

static orion_status plan_reshape(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    if ((rc = data_arg(P, st, "x", 1, &x))) return rc;
    const vane_slot *X = &P->plan->slots[x];
    vane_slot *R = &P->plan->slots[sp->out[0]];
    if (R->dtype != X->dtype) return FAIL(P, st, "reshape must keep the dtype");
    if (R->numel != X->numel)
        return FAIL(P, st, "reshape from %lld to %lld elements", (long long)X->numel,
                    (long long)R->numel);
    int64_t shp[MIL_MAX_RANK];
    int n;
    if ((rc = attr_ints(P, st, "shape", shp, MIL_MAX_RANK, &n))) return rc;
    if (n >= 0) {
        if (n != R->rank) return FAIL(P, st, "shape has %d entries, result rank %d", n, R->rank);
        for (int i = 0; i < n; i++)
            if (shp[i] > 0 && shp[i] != R->shape[i])
                return FAIL(P, st, "shape disagrees with the declared result type");
    }
    sp->n_in = 1;
    sp->in[0] = x;
    return ORION_OK;
}

static orion_status plan_transpose(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t perm[MIL_MAX_RANK];
    int n;
    if ((rc = data_arg(P, st, "x", 1, &x)) ||
        (rc = attr_ints(P, st, "perm", perm, MIL_MAX_RANK, &n)))
        return rc;
    const vane_slot *X = &P->plan->slots[x];
    if (n != X->rank) return FAIL(P, st, "perm must have %d entries", X->rank);
    uint32_t seen = 0;
    int64_t o[MIL_MAX_RANK];
    for (int i = 0; i < n; i++) {
        int a;
        if (norm_axis(perm[i], X->rank, &a) || (seen >> a & 1))
            return FAIL(P, st, "perm is not a permutation");
        seen |= 1u << a;
        sp->perm[i] = a;
        o[i] = X->shape[a];
    }
    sp->n_in = 1;
    sp->in[0] = x;
    return check_result(P, st, &P->plan->slots[sp->out[0]], X->rank, o);
}

static orion_status plan_slice_by_index(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t b[MIL_MAX_RANK], e[MIL_MAX_RANK], s[MIL_MAX_RANK], bm[MIL_MAX_RANK],
        em[MIL_MAX_RANK], sq[MIL_MAX_RANK];
    int nb, ne, ns, nbm, nem, nsq;
    if ((rc = data_arg(P, st, "x", 1, &x)) ||
        (rc = attr_ints(P, st, "begin", b, MIL_MAX_RANK, &nb)) ||
        (rc = attr_ints(P, st, "end", e, MIL_MAX_RANK, &ne)) ||
        (rc = attr_ints(P, st, "stride", s, MIL_MAX_RANK, &ns)) ||
        (rc = attr_ints(P, st, "begin_mask", bm, MIL_MAX_RANK, &nbm)) ||
        (rc = attr_ints(P, st, "end_mask", em, MIL_MAX_RANK, &nem)) ||
        (rc = attr_ints(P, st, "squeeze_mask", sq, MIL_MAX_RANK, &nsq)))
        return rc;
    const vane_slot *X = &P->plan->slots[x];
    int r = X->rank;
    if (nb != r || ne != r) return FAIL(P, st, "begin and end need %d entries", r);
    if ((ns >= 0 && ns != r) || (nbm >= 0 && nbm != r) || (nem >= 0 && nem != r) ||
        (nsq >= 0 && nsq != r))
        return FAIL(P, st, "stride and masks need %d entries", r);
    int64_t o[MIL_MAX_RANK];
    int ro = 0;
    for (int d = 0; d < r; d++) {
        int64_t dim = X->shape[d], st_ = ns < 0 ? 1 : s[d];
        if (st_ <= 0) return FAIL(P, st, "only positive strides are supported");
        int64_t lo = nbm > 0 && bm[d] ? 0 : b[d];
        int64_t hi = nem > 0 && em[d] ? dim : e[d];
        if (lo < 0) lo += dim;
        if (hi < 0) hi += dim;
        if (lo < 0) lo = 0;
        if (hi > dim) hi = dim;
        if (lo >= hi) return FAIL(P, st, "empty slice on axis %d", d);
        int64_t len = (hi - lo + st_ - 1) / st_;
        sp->begin[d] = lo;
        sp->stride[d] = st_;
        if (nsq > 0 && sq[d]) {
            if (len != 1) return FAIL(P, st, "squeezed axis %d has length %lld", d,
                                      (long long)len);
        } else {
            o[ro++] = len;
        }
        sp->perm[d] = (int)len;   /* unsqueezed extent, used by the executor */
    }
    sp->n_in = 1;
    sp->in[0] = x;
    return check_result(P, st, &P->plan->slots[sp->out[0]], ro, o);
}

static orion_status plan_slice_by_size(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t b[MIL_MAX_RANK], z[MIL_MAX_RANK];
    int nb, nz;
    if ((rc = data_arg(P, st, "x", 1, &x)) ||
        (rc = attr_ints(P, st, "begin", b, MIL_MAX_RANK, &nb)) ||
        (rc = attr_ints(P, st, "size", z, MIL_MAX_RANK, &nz)))
        return rc;
    const vane_slot *X = &P->plan->slots[x];
    int r = X->rank;
    if (nb != r || nz != r) return FAIL(P, st, "begin and size need %d entries", r);
    int64_t o[MIL_MAX_RANK];
    for (int d = 0; d < r; d++) {
        int64_t dim = X->shape[d], lo = b[d] < 0 ? b[d] + dim : b[d];
        int64_t len = z[d] == -1 ? dim - lo : z[d];
        if (lo < 0 || len <= 0 || lo + len > dim)
            return FAIL(P, st, "slice [%lld, +%lld) outside axis %d of %lld", (long long)b[d],
                        (long long)z[d], d, (long long)dim);
        sp->begin[d] = lo;
        sp->stride[d] = 1;
        sp->perm[d] = (int)len;
        o[d] = len;
    }
    sp->op = MIL_OP_SLICE_BY_INDEX;   /* same executor */
    sp->n_in = 1;
    sp->in[0] = x;
    return check_result(P, st, &P->plan->slots[sp->out[0]], r, o);
}

/* Whether a planned slice selects the first elements of its operand, in order: it
 * starts at 0 with stride 1, keeps every axis after some axis d0 whole, and takes one
 * index of every axis before d0. */
static int slice_is_leading_prefix(const vane_plan *pl, const vane_step *sp)
{
    const vane_slot *X = &pl->slots[sp->in[0]];
    int d0 = 0;
    for (int d = 0; d < X->rank; d++) {
        if (sp->begin[d] != 0 || sp->stride[d] != 1) return 0;
        if (sp->perm[d] != X->shape[d]) d0 = d;
    }
    for (int d = 0; d < d0; d++)
        if (sp->perm[d] != 1) return 0;
    return 1;
}

static orion_status plan_split(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t axis = 0, ns = 0;
    if ((rc = data_arg(P, st, "x", 1, &x)) || (rc = attr_int(P, st, "axis", 0, &axis)) ||
        (rc = attr_int(P, st, "num_splits", 0, &ns)))
        return rc;
    const vane_slot *X = &P->plan->slots[x];
    if (norm_axis(axis, X->rank, &sp->axis)) return FAIL(P, st, "axis out of range");
    int64_t dim = X->shape[sp->axis];
    sp->sizes = calloc((size_t)sp->n_out, sizeof *sp->sizes);
    if (!sp->sizes) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    const mil_value *raw = find_arg(st, "split_sizes");
    if (raw) {
        const mil_value *v = const_of(P, raw);
        if (!v || !v->numbers || v->n_numbers != (size_t)sp->n_out)
            return FAIL(P, st, "split_sizes must be a constant with one size per result");
        for (int i = 0; i < sp->n_out; i++) sp->sizes[i] = (int64_t)v->numbers[i];
    } else {
        if (ns <= 0) ns = sp->n_out;
        if (ns != sp->n_out || dim % ns) return FAIL(P, st, "num_splits does not divide the axis");
        for (int i = 0; i < sp->n_out; i++) sp->sizes[i] = dim / ns;
    }
    int64_t total = 0;
    for (int i = 0; i < sp->n_out; i++) {
        if (sp->sizes[i] <= 0) return FAIL(P, st, "split sizes must be positive");
        total += sp->sizes[i];
        int64_t o[MIL_MAX_RANK];
        memcpy(o, X->shape, sizeof o);
        o[sp->axis] = sp->sizes[i];
        if ((rc = check_result(P, st, &P->plan->slots[sp->out[i]], X->rank, o))) return rc;
        if (P->plan->slots[sp->out[i]].dtype != X->dtype) return FAIL(P, st, "dtype changes");
    }
    if (total != dim) return FAIL(P, st, "split sizes sum to %lld, axis is %lld",
                                  (long long)total, (long long)dim);
    sp->n_in = 1;
    sp->in[0] = x;
    return ORION_OK;
}

static orion_status plan_pad(planner *P, const mil_stmt *st, vane_step *sp)
{
    orion_status rc;
    int x;
    int64_t pad[2 * MIL_MAX_RANK];
    int n;
    const char *mode;
    double cv;
    if ((rc = data_arg(P, st, "x", 1, &x)) ||
        (rc = attr_ints(P, st, "pad", pad, 2 * MIL_MAX_RANK, &n)) ||
        (rc = attr_string(P, st, "mode", &mode)) ||
        (rc = attr_float(P, st, "constant_val", 0.0, 0, &cv)))
        return rc;
    if (mode && strcmp(mode, "constant") != 0)
        return FAIL(P, st, "only constant padding is supported, not '%s'", mode);
    const vane_slot *X = &P->plan->slots[x];
    if (n < 0 || n % 2 || n / 2 > X->rank) return FAIL(P, st, "pad needs 2 entries per axis");
    int first = X->rank - n / 2;
    int64_t o[MIL_MAX_RANK];
    for (int d = 0; d < X->rank; d++) {
        int64_t lo = d < first ? 0 : pad[2 * (d - first)];
        int64_t hi = d < first ? 0 : pad[2 * (d - first) + 1];
        if (lo < 0 || hi < 0) return FAIL(P, st, "negative padding");
        sp->begin[d] = lo;
        sp->stride[d] = hi;
        o[d] = X->shape[d] + lo + hi;
    }
    sp->f0 = (float)cv;
    sp->n_in = 1;
    sp->in[0] = x;
    if (P->plan->slots[sp->out[0]].dtype != X->dtype) return FAIL(P, st, "pad must keep the dtype");
    return check_result(P, st, &P->plan->slots[sp->out[0]], X->rank, o);
}

/* ---- one statement -------------------------------------------------------- */

static orion_status plan_stmt(planner *P, const mil_stmt *st)
{
    if (strcmp(st->op, "const") == 0) return plan_const(P, st);
    vane_op op = mil_op_lookup(st->op);
    if (mil_is_constexpr(op)) return plan_constexpr(P, st, op);
    if (op == MIL_OP_UNKNOWN || op == MIL_OP_CONST) {
        const mil_op_refusal *no = mil_op_refused(st->op);
        if (no)
            return constraint_fail(no->id, "line %d: op '%s'%s%s", st->line, st->op,
                                   no->why ? ": " : "", no->why ? no->why : "");
        return FAIL(P, st, "vane cannot execute op '%s'", st->op);
    }
    if (st->n_results < 1) return FAIL(P, st, "op without a result");
    if (op != MIL_OP_SPLIT && st->n_results != 1) return FAIL(P, st, "op must have one result");
    vane_plan *pl = P->plan;
    if (pl->n_steps == pl->cap_steps) {   /* geometric growth: linear planning time */
        int cap = pl->cap_steps ? pl->cap_steps * 2 : 64;
        vane_step *steps = realloc(pl->steps, (size_t)cap * sizeof *steps);
        if (!steps) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        pl->steps = steps;
        pl->cap_steps = cap;
    }
    vane_step *sp = &pl->steps[pl->n_steps++];
    memset(sp, 0, sizeof *sp);
    sp->op = op;
    sp->line = st->line;
    sp->name = st->results[0];
    sp->n_out = (int)st->n_results;
    sp->out = calloc(st->n_results, sizeof *sp->out);
    if (!sp->out) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    int step_index = pl->n_steps - 1;
    /* Result slots are created first so the per-op checks can read them;
     * their names stay empty until the op is planned, so an operand cannot
     * resolve to the op's own result. */
    for (size_t k = 0; k < st->n_results; k++) {
        int id = new_slot(P);
        if (id < 0) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        vane_slot *s = &pl->slots[id];
        set_type(s, &st->types[k]);
        if (!vane_dtype_size(s->dtype))
            return FAIL(P, st, "result '%s' is %s; vane produces fp16 and fp32 tensors",
                        st->results[k], mil_dtype_name(s->dtype));
        s->storage = VS_BUFFER;
        s->def_step = step_index;
        pl->steps[step_index].out[k] = id;
    }
    orion_status rc;
    switch (op) {
    case MIL_OP_CONV: rc = plan_conv(P, st, sp); break;
    case MIL_OP_MATMUL: rc = plan_matmul(P, st, sp); break;
    case MIL_OP_ADD: case MIL_OP_SUB: case MIL_OP_MUL: case MIL_OP_REAL_DIV: case MIL_OP_POW:
    case MIL_OP_MAXIMUM: case MIL_OP_MINIMUM:
        rc = plan_binary(P, st, sp); break;
    case MIL_OP_REDUCE_SUM: case MIL_OP_REDUCE_MEAN: case MIL_OP_REDUCE_MAX:
        rc = plan_reduce(P, st, sp); break;
    case MIL_OP_SOFTMAX: rc = plan_softmax(P, st, sp); break;
    case MIL_OP_RESHAPE: rc = plan_reshape(P, st, sp); break;
    case MIL_OP_TRANSPOSE: rc = plan_transpose(P, st, sp); break;
    case MIL_OP_SLICE_BY_INDEX: rc = plan_slice_by_index(P, st, sp); break;
    case MIL_OP_SLICE_BY_SIZE: rc = plan_slice_by_size(P, st, sp); break;
    case MIL_OP_SPLIT: rc = plan_split(P, st, sp); break;
    case MIL_OP_PAD: rc = plan_pad(P, st, sp); break;
    default: rc = plan_unary(P, st, sp); break;
    }
    if (rc) return rc;
    /* reshape and identity share their operand's bytes, and so does a slice of a
     * leading prefix (a program's block of a larger uniform surface, ANE-C18: a decode
     * step's rows of a KV cache surface sized for the largest bucket) */
    if (op == MIL_OP_RESHAPE || op == MIL_OP_IDENTITY ||
        (sp->op == MIL_OP_SLICE_BY_INDEX && slice_is_leading_prefix(pl, sp))) {
        vane_slot *r = &pl->slots[sp->out[0]];
        sp->folded = sp->op == MIL_OP_SLICE_BY_INDEX;
        r->storage = VS_ALIAS;
        r->index = sp->in[0];
    }
    for (size_t k = 0; k < st->n_results; k++)
        if (name_slot(P, sp->out[k], st->results[k]))
            return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    return ORION_OK;
}

/* ---- folding transposes into matmuls -------------------------------------- */

/* A transpose whose only reader is a matmul (and that no output shares) is not
 * run: the matmul reads the transpose's operand through the permutation, with
 * strides. The values read are the same fp16 values the copy would hold, and a
 * product of more than VK_FEW_ROWS rows and more than one column sums them in
 * the same (k) order whatever the strides, so results do not change. Smaller
 * products pick their kernel by the strides (a GEMV for contiguous rows, a
 * vector x matrix product otherwise), so a fold could change the order of
 * their sums: their transposes are left to run; so are the left operand's of
 * up to VK_GEMV_MULTI_MAX columns, which sum as GEMVs where that operand's rows
 * are contiguous (the right operand's strides do not matter there). Runs before
 * liveness, so the operand stays alive until the matmul. */
static orion_status fold_transposes(vane_plan *pl)
{
    int *readers = calloc((size_t)pl->n_slots + 1, sizeof *readers);
    if (!readers) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    for (int i = 0; i < pl->n_steps; i++)
        for (int k = 0; k < pl->steps[i].n_in; k++) readers[pl->steps[i].in[k]]++;
    for (int i = 0; i < pl->n_outputs; i++) {
        readers[pl->output_slots[i]] += 2;      /* an output is read by the caller */
        readers[vane_slot_root(pl, pl->output_slots[i])] += 2;
    }
    for (int i = 0; i < pl->n_steps; i++) {
        vane_step *sp = &pl->steps[i];
        if (sp->op != MIL_OP_MATMUL) continue;
        const vane_slot *R = &pl->slots[sp->out[0]];
        if (R->rank < 2 || R->shape[R->rank - 2] <= VK_FEW_ROWS || R->shape[R->rank - 1] <= 1)
            continue;
        int few_cols = R->shape[R->rank - 1] <= VK_GEMV_MULTI_MAX;
        for (int k = few_cols; k < 2; k++) {
            vane_slot *t = &pl->slots[sp->in[k]];
            if (t->storage != VS_BUFFER || t->def_step < 0 || readers[sp->in[k]] != 1) continue;
            vane_step *tp = &pl->steps[t->def_step];
            if (tp->op != MIL_OP_TRANSPOSE) continue;
            tp->folded = 1;
            sp->viewed[k] = 1;
            memcpy(sp->view_perm[k], tp->perm, sizeof tp->perm);
            /* nothing reads the transpose's result now: it takes no buffer */
            t->storage = VS_ALIAS;
            t->index = tp->in[0];
            sp->in[k] = tp->in[0];
        }
    }
    free(readers);
    return ORION_OK;
}

/* ---- liveness and buffers ----------------------------------------------- */

static orion_status assign_buffers(vane_plan *pl)
{
    for (int i = 0; i < pl->n_steps; i++) {
        const vane_step *sp = &pl->steps[i];
        for (int k = 0; k < sp->n_in; k++) {
            int r = vane_slot_root(pl, sp->in[k]);
            if (pl->slots[r].last_use < i) pl->slots[r].last_use = i;
        }
        for (int k = 0; k < sp->n_out; k++) {
            int r = vane_slot_root(pl, sp->out[k]);
            if (pl->slots[r].last_use < i) pl->slots[r].last_use = i;
        }
    }
    for (int i = 0; i < pl->n_outputs; i++)
        pl->slots[vane_slot_root(pl, pl->output_slots[i])].pinned++;
    /* An output whose bytes an op computes into a buffer of its own (not shared with
     * another output) is written straight into its surface: the op's result, the
     * output's root through reshapes and identities of the same bytes (Orion's
     * programs name their outputs out_NN, by identities of values their layers read
     * on: a layer's v, say). */
    for (int i = 0; i < pl->n_outputs; i++) {
        const vane_slot *o = &pl->slots[pl->output_slots[i]];
        vane_slot *s = &pl->slots[vane_slot_root(pl, pl->output_slots[i])];
        int64_t bytes = s->numel * (int64_t)vane_dtype_size(s->dtype);
        s->direct = pl->output_direct[i] = s->storage == VS_BUFFER && s->pinned == 1 &&
                                           bytes == o->numel * (int64_t)vane_dtype_size(o->dtype);
    }

    /* Greedy over steps: results take a free buffer (best fit, else the
     * largest free one grown), operands whose last use this was give theirs
     * back after the step's results are placed. */
    int *free_list = malloc((size_t)(pl->n_slots + 1) * sizeof *free_list);
    int n_free = 0, cap_buf = 0;
    if (!free_list) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    for (int i = 0; i < pl->n_steps; i++) {
        const vane_step *sp = &pl->steps[i];
        for (int k = 0; k < sp->n_out; k++) {
            vane_slot *s = &pl->slots[sp->out[k]];
            if (s->storage != VS_BUFFER) continue;
            uint64_t need = (uint64_t)s->numel * vane_dtype_size(s->dtype);
            int best = -1, largest = -1;
            for (int f = 0; f < n_free && !s->pinned; f++) {
                uint64_t have = pl->buffer_bytes[free_list[f]];
                if (have >= need && (best < 0 || have < pl->buffer_bytes[free_list[best]]))
                    best = f;
                if (largest < 0 || have > pl->buffer_bytes[free_list[largest]]) largest = f;
            }
            int pick = best >= 0 ? best : largest;
            if (pick >= 0) {
                s->index = free_list[pick];
                free_list[pick] = free_list[--n_free];
                if (pl->buffer_bytes[s->index] < need) pl->buffer_bytes[s->index] = need;
            } else {
                if (pl->n_buffers == cap_buf) {
                    cap_buf = cap_buf ? cap_buf * 2 : 16;
                    uint64_t *nb = realloc(pl->buffer_bytes, (size_t)cap_buf * sizeof *nb);
                    if (!nb) {
                        free(free_list);
                        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
                    }
                    pl->buffer_bytes = nb;
                }
                /* a direct output never touches its buffer: keep it minimal */
                pl->buffer_bytes[pl->n_buffers] = s->direct ? 0 : need;
                s->index = pl->n_buffers++;
            }
        }
        /* release dead roots touched by this step */
        int touched[VANE_MAX_IN + 64];
        int nt = 0;
        for (int k = 0; k < sp->n_in; k++) touched[nt++] = vane_slot_root(pl, sp->in[k]);
        for (int k = 0; k < sp->n_out && nt < (int)(sizeof touched / sizeof touched[0]); k++)
            touched[nt++] = vane_slot_root(pl, sp->out[k]);
        for (int t = 0; t < nt; t++) {
            vane_slot *s = &pl->slots[touched[t]];
            if (s->storage != VS_BUFFER || s->pinned || s->last_use != i) continue;
            int dup = 0;
            for (int u = 0; u < t; u++) dup |= touched[u] == touched[t];
            if (!dup) free_list[n_free++] = (int)s->index;
        }
    }
    free(free_list);
    return ORION_OK;
}

/* ---- build / free ------------------------------------------------------- */

/* Bytes from the plan's own block: 8-byte aligned (NULL when only counting). */
static void *take(unsigned char *block, size_t *at, size_t n)
{
    size_t start = (*at + 7) & ~(size_t)7;
    *at = start + n;
    return block ? block + start : NULL;
}

/* A copy of s from the block (NULL when only counting, or for NULL). */
static const char *take_string(unsigned char *block, size_t *at, const char *s)
{
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = take(block, at, n);
    if (d) memcpy(d, s, n);
    return d;
}

/* One pass of detach_from_mil: with block NULL it only counts the bytes. */
static void copy_what_the_plan_reads(vane_plan *pl, unsigned char *block, size_t *at)
{
    for (int i = 0; i < pl->n_slots; i++) {
        vane_slot *s = &pl->slots[i];
        const char *name = take_string(block, at, s->name);
        const mil_value *v = s->value;
        mil_value *c = v ? take(block, at, sizeof *c) : NULL;
        double *numbers = v && v->numbers ? take(block, at, v->n_numbers * sizeof *numbers)
                                          : NULL;
        const char *string = v ? take_string(block, at, v->string) : NULL;
        const char *path = v ? take_string(block, at, v->blob_path) : NULL;
        if (!block) continue;
        s->name = name;
        if (!v) continue;
        *c = *v;   /* a const's literal (REF and TUPLE values are never a slot's) */
        c->name = NULL;
        c->n_items = 0;
        c->items = NULL;
        if (numbers) memcpy(numbers, v->numbers, v->n_numbers * sizeof *numbers);
        c->numbers = numbers;
        c->string = string;
        c->blob_path = path;
        s->value = c;
    }
    for (int i = 0; i < pl->n_steps; i++) {
        const char *name = take_string(block, at, pl->steps[i].name);
        if (block) pl->steps[i].name = name;
    }
    if (block)
        for (int i = 0; i < pl->n_blobs; i++)
            pl->blobs[i].path = pl->slots[pl->blobs[i].slot].value->blob_path;
}

/* The plan's own copy of all it reads of the MIL after planning (names for messages,
 * literals, BLOBFILE paths), in one block: the runtime then frees the parsed program
 * once compiled (`keeps_no_mil`; a 28-layer program's parse held megabytes). */
static orion_status detach_from_mil(vane_plan *pl)
{
    size_t bytes = 0;
    copy_what_the_plan_reads(pl, NULL, &bytes);
    if (!(pl->owned = malloc(bytes ? bytes : 1)))
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    size_t at = 0;
    copy_what_the_plan_reads(pl, pl->owned, &at);
    pl->program = NULL;
    return ORION_OK;
}

/* The slot and step arrays grew by doubling while planning: a built plan gives back
 * the capacity it does not use (up to half of them, for as long as it lives). */
static void shrink_to_fit(vane_plan *pl)
{
    vane_slot *slots = realloc(pl->slots, (size_t)(pl->n_slots + 1) * sizeof *slots);
    if (slots) {
        pl->slots = slots;
        pl->cap_slots = pl->n_slots + 1;
    }
    vane_step *steps = realloc(pl->steps, (size_t)(pl->n_steps + 1) * sizeof *steps);
    if (steps) {
        pl->steps = steps;
        pl->cap_steps = pl->n_steps + 1;
    }
}

void vane_plan_free(vane_plan *pl)
{
    if (!pl) return;
    vane_quant_unbind(pl);
    for (int i = 0; i < pl->n_slots; i++)
        if (pl->slots[i].storage == VS_CONST && pl->slots[i].blob < 0 && pl->slots[i].quant < 0)
            free(pl->slots[i].data);
    free(pl->quants);
    for (int i = 0; i < pl->n_steps; i++) {
        free(pl->steps[i].out);
        free(pl->steps[i].sizes);
    }
    free(pl->slots);
    free(pl->steps);
    free(pl->input_slots);
    free(pl->output_slots);
    free(pl->output_direct);
    free(pl->input_info);
    free(pl->output_info);
    free(pl->buffer_bytes);
    free(pl->blobs);
    free(pl->owned);
    free(pl);
}

orion_status vane_plan_build(const mil_program *program, vk_numerics numerics, vane_plan **out)
{
    *out = NULL;
    if (!program) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: no program");
    vane_plan *pl = calloc(1, sizeof *pl);
    if (!pl) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
    planner P = {pl, program, 0, NULL, 0, 0};
    pl->program = program;
    pl->numerics = numerics;
    orion_status rc = ORION_OK;

    for (size_t i = 0; i < program->n_inputs; i++) {
        int id = new_slot(&P);
        if (id < 0) { rc = orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory"); goto fail; }
        if (name_slot(&P, id, program->inputs[i].name)) {
            rc = orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
            goto fail;
        }
        vane_slot *s = &pl->slots[id];
        set_type(s, &program->inputs[i].type);
        s->storage = VS_INPUT;
        s->index = -1;
        if (!vane_dtype_size(s->dtype)) {
            rc = fail_at(NULL, "input '%s' must be fp16 or fp32", s->name);
            goto fail;
        }
    }
    for (size_t i = 0; i < program->n_stmts; i++)
        if ((rc = plan_stmt(&P, &program->stmts[i]))) goto fail;

    pl->n_inputs = (int)mil_io_count(program, 0);
    pl->n_outputs = (int)mil_io_count(program, 1);
    pl->input_slots = calloc((size_t)pl->n_inputs + 1, sizeof *pl->input_slots);
    pl->output_slots = calloc((size_t)pl->n_outputs + 1, sizeof *pl->output_slots);
    pl->output_direct = calloc((size_t)pl->n_outputs + 1, sizeof *pl->output_direct);
    pl->input_info = calloc((size_t)pl->n_inputs + 1, sizeof *pl->input_info);
    pl->output_info = calloc((size_t)pl->n_outputs + 1, sizeof *pl->output_info);
    if (!pl->input_slots || !pl->output_slots || !pl->output_direct || !pl->input_info ||
        !pl->output_info) {
        rc = orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        goto fail;
    }
    for (int g = 0; g < 2; g++) {
        int n = g ? pl->n_outputs : pl->n_inputs;
        for (int i = 0; i < n; i++) {
            orion_io_info *info = g ? &pl->output_info[i] : &pl->input_info[i];
            if ((rc = mil_io_info(program, g, (size_t)i, info))) goto fail;
            int id = find_slot(&P, info->name);
            if (id < 0) {
                rc = fail_at(NULL, "%s '%s' is not defined", g ? "output" : "input", info->name);
                goto fail;
            }
            vane_slot *s = &pl->slots[id];
            if (g == 0 && s->storage != VS_INPUT) {
                rc = fail_at(NULL, "input '%s' is redefined", info->name);
                goto fail;
            }
            if (!vane_dtype_size(s->dtype) ||
                (uint64_t)s->numel * vane_dtype_size(s->dtype) != info->nbytes) {
                rc = fail_at(NULL, "%s '%s' has an unexpected size", g ? "output" : "input",
                             info->name);
                goto fail;
            }
            if (g) pl->output_slots[i] = id;
            else {
                pl->input_slots[i] = id;
                s->index = i;
            }
        }
    }
    /* a constexpr weight read other than as a conv's weight is decoded at load */
    for (int i = 0; i < pl->n_steps; i++)
        for (int k = 0; k < pl->steps[i].n_in; k++) {
            const vane_slot *w = &pl->slots[pl->steps[i].in[k]];
            if (w->quant >= 0 && !(pl->steps[i].op == MIL_OP_CONV && k == 1))
                pl->quants[w->quant].dense = 1;
        }
    if ((rc = fold_transposes(pl)) || (rc = assign_buffers(pl)) || (rc = detach_from_mil(pl)))
        goto fail;
    shrink_to_fit(pl);
    free(P.names);
    *out = pl;
    return ORION_OK;
fail:
    free(P.names);
    vane_plan_free(pl);
    return rc;
}
