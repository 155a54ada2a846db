/* mil_infer.c -- result types of each op of mil_ops.h, from the types and
 * const values of its arguments. The verifier calls mil_infer_stmt once per
 * statement, in order, after it has checked that every argument name is one
 * the op takes and that every referenced name is defined earlier; so here a
 * REF always has a type, and the results of earlier statements are known to
 * match their declared types. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/catalog.h"
#include "../core/error.h"
#include "mil_constexpr.h"
#include "mil_infer.h"
#include "mil_internal.h"
#include "mil_ops.h"

typedef struct ictx {
    const mil_program *p;
    const mil_stmt *s;
} ictx;

// "line L, column C: <op> 'result': <what>", at the value if there is one
static orion_status ifail(const ictx *c, const mil_value *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static orion_status ifail(const ictx *c, const mil_value *at, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = at ? at->line : c->s->line, col = at ? at->column : c->s->column;
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "line %d, column %d: %s '%s': %s", line, col,
                      c->s->op, c->s->results[0], msg);
}

static const mil_value *arg(const ictx *c, const char *name) {
    const mil_arg *a = mil_stmt_arg(c->s, name);
    return a ? &a->value : NULL;
}

static int is_float(mil_dtype dt) { return dt == MIL_DT_FP16 || dt == MIL_DT_FP32; }

// The type of any non-tuple value (the verifier refused tuples already).
static const mil_type *value_type(const ictx *c, const mil_value *v) {
    if (v->kind == MIL_VAL_REF) return mil_def_type(c->p, mil_lookup(c->p, v->name));
    return &v->type;
}

static orion_status tensor_arg(const ictx *c, const char *name, int want_float, mil_type *out) {
    const mil_value *v = arg(c, name);
    const mil_type *t = value_type(c, v);
    if (!t->is_tensor) return ifail(c, v, "%s must be a tensor, it is %s", name, mil_dtype_name(t->dtype));
    if (want_float && !is_float(t->dtype))
        return ifail(c, v, "%s must be fp16 or fp32, it is %s", name, mil_dtype_name(t->dtype));
    *out = *t;
    return ORION_OK;
}

// ---- const arguments

// The literal behind an argument that must be constant; `named` further
// requires a reference to a const() rather than an inline literal.
static orion_status const_arg(const ictx *c, const char *name, int named, const mil_value **out) {
    const mil_value *v = arg(c, name);
    const mil_value *k = mil_const_value(c->p, v);
    if (!k || k->kind == MIL_VAL_BLOBFILE)
        return ifail(c, v, "%s must be a constant (a const() or a literal)", name);
    if (named && v->kind != MIL_VAL_REF)
        return ifail(c, v, "%s must be a named const (declare it with const() and pass its name; "
                     "ane-facts 2.4)", name);
    *out = k;
    return ORION_OK;
}

// int32 values: a scalar (if scalar_ok) or a rank-1 tensor of at most max.
static orion_status const_ints(const ictx *c, const char *name, int scalar_ok, size_t max,
                               int64_t *vals, size_t *n) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, 0, &k);
    if (st != ORION_OK) return st;
    const mil_value *v = arg(c, name);
    int shape_ok = k->type.is_tensor ? k->type.rank == 1 : scalar_ok;
    if (k->type.dtype != MIL_DT_INT32 || !shape_ok || k->n_numbers > max)
        return ifail(c, v, "%s must be %s of int32 (at most %zu values)", name,
                     scalar_ok ? "a scalar or a rank-1 tensor" : "a rank-1 tensor", max);
    for (size_t i = 0; i < k->n_numbers; i++) vals[i] = (int64_t)k->numbers[i];
    *n = k->n_numbers;
    return ORION_OK;
}

static orion_status const_int(const ictx *c, const char *name, int64_t *out) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, 0, &k);
    if (st != ORION_OK) return st;
    if (k->type.is_tensor || k->type.dtype != MIL_DT_INT32)
        return ifail(c, arg(c, name), "%s must be an int32 scalar", name);
    *out = (int64_t)k->numbers[0];
    return ORION_OK;
}

static orion_status const_bool(const ictx *c, const char *name, int named, int *out) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, named, &k);
    if (st != ORION_OK) return st;
    if (k->type.is_tensor || k->type.dtype != MIL_DT_BOOL)
        return ifail(c, arg(c, name), "%s must be a bool scalar", name);
    *out = k->numbers[0] != 0;
    return ORION_OK;
}

static orion_status const_bools(const ictx *c, const char *name, size_t count, int *out) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, 0, &k);
    if (st != ORION_OK) return st;
    if (!k->type.is_tensor || k->type.rank != 1 || k->type.dtype != MIL_DT_BOOL || k->n_numbers != count)
        return ifail(c, arg(c, name), "%s must be a bool tensor of %zu values", name, count);
    for (size_t i = 0; i < count; i++) out[i] = k->numbers[i] != 0;
    return ORION_OK;
}

static orion_status const_string(const ictx *c, const char *name, int named, const char **out) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, named, &k);
    if (st != ORION_OK) return st;
    if (k->type.is_tensor || k->type.dtype != MIL_DT_STRING)
        return ifail(c, arg(c, name), "%s must be a string", name);
    *out = k->string;
    return ORION_OK;
}

static orion_status const_float(const ictx *c, const char *name, double *out) {
    const mil_value *k = NULL;
    orion_status st = const_arg(c, name, 0, &k);
    if (st != ORION_OK) return st;
    if (k->type.is_tensor || !is_float(k->type.dtype))
        return ifail(c, arg(c, name), "%s must be an fp16 or fp32 scalar", name);
    *out = k->numbers[0];
    return ORION_OK;
}

// An axis in [-rank, rank), made non-negative.
static orion_status norm_axis(const ictx *c, const char *name, int64_t a, int rank, int *out) {
    if (a < -rank || a >= rank)
        return ifail(c, arg(c, name), "%s %lld is out of range for rank %d", name, (long long)a, rank);
    *out = (int)(a < 0 ? a + rank : a);
    return ORION_OK;
}

// Result shapes are computed from declared ones, but padding, broadcasting
// and matmul can still make them large: refuse before anyone multiplies.
static orion_status check_size(const ictx *c, const mil_type *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) {
        if (t->shape[i] < 1 || t->shape[i] > MIL_MAX_DIM || n > MIL_MAX_NUMEL / t->shape[i])
            return ifail(c, NULL, "the result would have a dimension above 2^31 or more than "
                         "2^32 elements");
        n *= t->shape[i];
    }
    return ORION_OK;
}

// ---- ops

static orion_status infer_const(const ictx *c, mil_type *out) {
    const mil_arg *val = mil_stmt_attr(c->s, "val");
    if (!val) return ifail(c, NULL, "const() needs a val attribute: [name = string(\"...\"), val = ...]");
    const mil_value *v = &val->value;
    if (v->kind != MIL_VAL_SCALAR && v->kind != MIL_VAL_TENSOR && v->kind != MIL_VAL_BLOBFILE)
        return ifail(c, v, "val must be a literal (a scalar, a tensor literal or a BLOBFILE)");
    *out = v->type;
    return ORION_OK;
}

// numpy broadcasting: shapes aligned at the right, each pair equal or one 1
static orion_status broadcast(const ictx *c, const mil_type *a, const mil_type *b, mil_type *out) {
    char ta[128], tb[128];
    int rank = a->rank > b->rank ? a->rank : b->rank;
    out->rank = rank;
    for (int i = 0; i < rank; i++) {
        int ia = a->rank - rank + i, ib = b->rank - rank + i;
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            mil_type_format(a, ta, sizeof ta);
            mil_type_format(b, tb, sizeof tb);
            return ifail(c, NULL, "shapes %s and %s do not broadcast (dims must be equal or 1)", ta, tb);
        }
        out->shape[i] = da == 1 ? db : da;
    }
    return ORION_OK;
}

static orion_status infer_binary(const ictx *c, mil_type *out) {
    const mil_value *vx = arg(c, "x"), *vy = arg(c, "y");
    const mil_type *x = value_type(c, vx), *y = value_type(c, vy);
    if (!is_float(x->dtype) || x->dtype != y->dtype)
        return ifail(c, vx, "x and y must share one float dtype, they are %s and %s",
                     mil_dtype_name(x->dtype), mil_dtype_name(y->dtype));
    memset(out, 0, sizeof *out);
    out->dtype = x->dtype;
    out->is_tensor = x->is_tensor || y->is_tensor;
    if (!out->is_tensor) return ORION_OK;
    return broadcast(c, x, y, out);
}

static orion_status infer_unary(const ictx *c, int want_float, mil_type *out) {
    return tensor_arg(c, "x", want_float, out);
}

static orion_status infer_conv(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 1, &x);
    if (st != ORION_OK) return st;
    const mil_value *vw = arg(c, "weight");
    const mil_value *kw = mil_const_value(c->p, vw);
    const mil_stmt *def = vw->kind == MIL_VAL_REF ? mil_find_def(c->p, vw->name, NULL) : NULL;
    const mil_type *w;
    if (def && mil_is_constexpr(mil_op_lookup(def->op))) {
        w = &def->types[0];   /* a compressed weight the device expands at load */
    } else {
        if (vw->kind != MIL_VAL_REF || !kw || (kw->kind != MIL_VAL_BLOBFILE &&
                                               kw->kind != MIL_VAL_TENSOR))
            return ifail(c, vw, "weight must be a named const tensor (a BLOBFILE, or a constexpr "
                         "op's result); for weights that change per call use matmul with the "
                         "weights as an input");
        w = &kw->type;
    }
    if (x.rank != 4) return ifail(c, arg(c, "x"), "x must be rank 4 [N, C, H, W], it has rank %d", x.rank);
    if (w->rank != 4 || w->shape[2] != 1 || w->shape[3] != 1)
        return ifail(c, vw, "only 1x1 convs are supported: weight must be [O, I, 1, 1]");
    if (w->dtype != x.dtype)
        return ifail(c, vw, "weight is %s but x is %s", mil_dtype_name(w->dtype), mil_dtype_name(x.dtype));
    // the five parameters, each a named const as the device's MIL spells them
    const char *pad_type;
    int64_t v[8];
    size_t n;
    int64_t groups;
    if ((st = const_string(c, "pad_type", 1, &pad_type)) != ORION_OK) return st;
    if (strcmp(pad_type, "valid") && strcmp(pad_type, "same") && strcmp(pad_type, "custom"))
        return ifail(c, arg(c, "pad_type"), "pad_type must be \"valid\", \"same\" or \"custom\"");
    static const struct { const char *name; size_t n; int64_t want; } params[] = {
        {"strides", 2, 1}, {"dilations", 2, 1}, {"pad", 4, 0}};
    for (size_t i = 0; i < 3; i++) {
        if ((st = const_arg(c, params[i].name, 1, &(const mil_value *){0})) != ORION_OK) return st;
        if ((st = const_ints(c, params[i].name, 0, 8, v, &n)) != ORION_OK) return st;
        int ok = n == params[i].n;
        for (size_t k = 0; ok && k < n; k++) ok = v[k] == params[i].want;
        if (!ok)
            return ifail(c, arg(c, params[i].name), "%s must be [%s] for a 1x1 conv", params[i].name,
                         params[i].n == 2 ? (params[i].want ? "1, 1" : "0, 0") : "0, 0, 0, 0");
    }
    if ((st = const_arg(c, "groups", 1, &(const mil_value *){0})) != ORION_OK) return st;
    if ((st = const_int(c, "groups", &groups)) != ORION_OK) return st;
    if (groups != 1) return ifail(c, arg(c, "groups"), "groups must be 1");
    int64_t in_ch = x.shape[1], out_ch = w->shape[0];
    if (w->shape[1] != in_ch)
        return ifail(c, vw, "weight has %lld input channels but x has %lld",
                     (long long)w->shape[1], (long long)in_ch);
    if (in_ch >= 32000)
        return constraint_fail("ANE-C08", "line %d, column %d: conv '%s' has %lld input channels "
                               "(the device rejects 32000 and more)", c->s->line, c->s->column,
                               c->s->results[0], (long long)in_ch);
    if (out_ch > 65536)
        return constraint_fail("ANE-C08", "line %d, column %d: conv '%s' has %lld output channels "
                               "(at most 65536)", c->s->line, c->s->column, c->s->results[0],
                               (long long)out_ch);
    *out = x;
    out->shape[1] = out_ch;
    return ORION_OK;
}

static orion_status flag(const ictx *c, const char *name, int *out) {
    const mil_value *v = arg(c, name);
    if (v->kind != MIL_VAL_REF)
        return constraint_fail("ANE-C04", "line %d, column %d: matmul '%s' passes %s as an inline "
                               "literal", v->line, v->column, c->s->results[0], name);
    return const_bool(c, name, 1, out);
}

static orion_status infer_matmul(const ictx *c, mil_type *out) {
    mil_type x, y;
    int tx = 0, ty = 0;
    orion_status st;
    if ((st = flag(c, "transpose_x", &tx)) != ORION_OK) return st;
    if ((st = flag(c, "transpose_y", &ty)) != ORION_OK) return st;
    if ((st = tensor_arg(c, "x", 1, &x)) != ORION_OK) return st;
    if ((st = tensor_arg(c, "y", 1, &y)) != ORION_OK) return st;
    if (x.dtype != y.dtype)
        return ifail(c, arg(c, "y"), "x is %s but y is %s", mil_dtype_name(x.dtype), mil_dtype_name(y.dtype));
    if (x.rank < 2 || y.rank < 2) return ifail(c, NULL, "x and y must have rank 2 or more");
    int64_t m = x.shape[x.rank - 2], k = x.shape[x.rank - 1];
    if (tx) m = x.shape[x.rank - 1], k = x.shape[x.rank - 2];
    int64_t k2 = y.shape[y.rank - 2], n = y.shape[y.rank - 1];
    if (ty) k2 = y.shape[y.rank - 1], n = y.shape[y.rank - 2];
    if (k != k2)
        return ifail(c, NULL, "inner dims differ: x gives %lld, y gives %lld (check transpose_x/y)",
                     (long long)k, (long long)k2);
    // the batch dims broadcast like elementwise ops
    mil_type bx = x, by = y, b = {0};
    bx.rank -= 2;
    by.rank -= 2;
    if ((st = broadcast(c, &bx, &by, &b)) != ORION_OK) return st;
    *out = x;
    out->rank = b.rank + 2;
    memcpy(out->shape, b.shape, sizeof(int64_t) * (size_t)b.rank);
    out->shape[b.rank] = m;
    out->shape[b.rank + 1] = n;
    return ORION_OK;
}

static orion_status infer_reduce(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 1, &x);
    if (st != ORION_OK) return st;
    int64_t axes[MIL_MAX_RANK];
    size_t n;
    if ((st = const_ints(c, "axes", 1, MIL_MAX_RANK, axes, &n)) != ORION_OK) return st;
    if (n == 0) return ifail(c, arg(c, "axes"), "axes is empty");
    int keep = 0;
    if (arg(c, "keep_dims") && (st = const_bool(c, "keep_dims", 0, &keep)) != ORION_OK) return st;
    int reduced[MIL_MAX_RANK] = {0};
    for (size_t i = 0; i < n; i++) {
        int a = 0;
        if ((st = norm_axis(c, "axes", axes[i], x.rank, &a)) != ORION_OK) return st;
        if (reduced[a]) return ifail(c, arg(c, "axes"), "axis %d appears twice", a);
        reduced[a] = 1;
    }
    *out = x;
    out->rank = 0;
    for (int i = 0; i < x.rank; i++) {
        if (!reduced[i]) out->shape[out->rank++] = x.shape[i];
        else if (keep) out->shape[out->rank++] = 1;
    }
    return ORION_OK;
}

static orion_status infer_softmax(const ictx *c, mil_type *out) {
    orion_status st = tensor_arg(c, "x", 1, out);
    int64_t a = 0;
    int axis = 0;
    if (st == ORION_OK) st = const_int(c, "axis", &a);
    if (st == ORION_OK) st = norm_axis(c, "axis", a, out->rank, &axis);
    return st;
}

static orion_status infer_clip(const ictx *c, mil_type *out) {
    orion_status st = tensor_arg(c, "x", 1, out);
    double lo, hi;
    if (st == ORION_OK) st = const_float(c, "alpha", &lo);
    if (st == ORION_OK) st = const_float(c, "beta", &hi);
    if (st == ORION_OK && !(lo <= hi))
        return ifail(c, arg(c, "alpha"), "alpha (%g) must not exceed beta (%g)", lo, hi);
    return st;
}

static orion_status infer_cast(const ictx *c, mil_type *out) {
    orion_status st = tensor_arg(c, "x", 1, out);
    const char *dt;
    if (st == ORION_OK) st = const_string(c, "dtype", 0, &dt);
    if (st != ORION_OK) return st;
    if (strcmp(dt, "fp16") == 0) out->dtype = MIL_DT_FP16;
    else if (strcmp(dt, "fp32") == 0) out->dtype = MIL_DT_FP32;
    else return ifail(c, arg(c, "dtype"), "dtype must be \"fp16\" or \"fp32\"");
    return ORION_OK;
}

static orion_status infer_reshape(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 0, &x);
    int64_t v[MIL_MAX_RANK];
    size_t n;
    if (st == ORION_OK) st = const_ints(c, "shape", 0, MIL_MAX_RANK, v, &n);
    if (st != ORION_OK) return st;
    int64_t known = 1, numel = mil_type_numel(&x);
    int infer_at = -1;
    for (size_t i = 0; i < n; i++) {
        if (v[i] == -1 && infer_at < 0) {
            infer_at = (int)i;
        } else if (v[i] < 1 || known > numel / v[i]) {
            return ifail(c, arg(c, "shape"), "shape must hold positive dims (at most one -1) whose "
                         "product is x's %lld elements", (long long)numel);
        } else {
            known *= v[i];
        }
    }
    if (infer_at >= 0) {
        if (numel % known) return ifail(c, arg(c, "shape"), "-1 cannot be inferred: %lld elements "
                                        "are not a multiple of %lld", (long long)numel, (long long)known);
        v[infer_at] = numel / known;
    } else if (known != numel) {
        return ifail(c, arg(c, "shape"), "shape holds %lld elements but x has %lld",
                     (long long)known, (long long)numel);
    }
    *out = x;
    out->rank = (int)n;
    memcpy(out->shape, v, n * sizeof *v);
    return ORION_OK;
}

static orion_status infer_transpose(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 0, &x);
    int64_t perm[MIL_MAX_RANK];
    size_t n;
    if (st == ORION_OK) st = const_ints(c, "perm", 0, MIL_MAX_RANK, perm, &n);
    if (st != ORION_OK) return st;
    int seen[MIL_MAX_RANK] = {0};
    int ok = (int)n == x.rank;
    for (size_t i = 0; ok && i < n; i++) {
        ok = perm[i] >= 0 && perm[i] < x.rank && !seen[perm[i]];
        if (ok) seen[perm[i]] = 1;
    }
    if (!ok) return ifail(c, arg(c, "perm"), "perm must be a permutation of 0..%d", x.rank - 1);
    *out = x;
    for (size_t i = 0; i < n; i++) out->shape[i] = x.shape[perm[i]];
    return ORION_OK;
}

static orion_status infer_slice_by_index(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 0, &x);
    if (st != ORION_OK) return st;
    size_t r = (size_t)x.rank, nb, ne, ns = r;
    int64_t b[MIL_MAX_RANK], e[MIL_MAX_RANK], s[MIL_MAX_RANK];
    int bm[MIL_MAX_RANK] = {0}, em[MIL_MAX_RANK] = {0}, sq[MIL_MAX_RANK] = {0};
    if ((st = const_ints(c, "begin", 0, MIL_MAX_RANK, b, &nb)) != ORION_OK) return st;
    if ((st = const_ints(c, "end", 0, MIL_MAX_RANK, e, &ne)) != ORION_OK) return st;
    for (size_t i = 0; i < r; i++) s[i] = 1;
    if (arg(c, "stride") && (st = const_ints(c, "stride", 0, MIL_MAX_RANK, s, &ns)) != ORION_OK) return st;
    if (nb != r || ne != r || ns != r)
        return ifail(c, NULL, "begin, end and stride must each hold %zu values (the rank of x)", r);
    if (arg(c, "begin_mask") && (st = const_bools(c, "begin_mask", r, bm)) != ORION_OK) return st;
    if (arg(c, "end_mask") && (st = const_bools(c, "end_mask", r, em)) != ORION_OK) return st;
    if (arg(c, "squeeze_mask") && (st = const_bools(c, "squeeze_mask", r, sq)) != ORION_OK) return st;
    *out = x;
    out->rank = 0;
    for (size_t i = 0; i < r; i++) {
        int64_t d = x.shape[i];
        int64_t lo = bm[i] ? 0 : (b[i] < 0 ? b[i] + d : b[i]);
        int64_t hi = em[i] ? d : (e[i] < 0 ? e[i] + d : e[i]);
        if (s[i] < 1) return ifail(c, arg(c, "stride"), "stride must be positive");
        if (lo < 0 || hi > d || lo >= hi)
            return ifail(c, arg(c, "begin"), "axis %zu: the slice [%lld, %lld) is empty or outside "
                         "[0, %lld)", i, (long long)lo, (long long)hi, (long long)d);
        int64_t len = (hi - lo + s[i] - 1) / s[i];
        if (sq[i] && len != 1)
            return ifail(c, arg(c, "squeeze_mask"), "axis %zu is squeezed but has length %lld", i,
                         (long long)len);
        if (!sq[i]) out->shape[out->rank++] = len;
    }
    return ORION_OK;
}

static orion_status infer_slice_by_size(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 0, &x);
    if (st != ORION_OK) return st;
    size_t r = (size_t)x.rank, nb, ns;
    int64_t b[MIL_MAX_RANK], sz[MIL_MAX_RANK];
    if ((st = const_ints(c, "begin", 0, MIL_MAX_RANK, b, &nb)) != ORION_OK) return st;
    if ((st = const_ints(c, "size", 0, MIL_MAX_RANK, sz, &ns)) != ORION_OK) return st;
    if (nb != r || ns != r) return ifail(c, NULL, "begin and size must each hold %zu values", r);
    *out = x;
    for (size_t i = 0; i < r; i++) {
        int64_t d = x.shape[i], lo = b[i] < 0 ? b[i] + d : b[i];
        int64_t n = sz[i] == -1 ? d - lo : sz[i];
        if (lo < 0 || lo >= d || n < 1 || n > d - lo)
            return ifail(c, arg(c, "size"), "axis %zu: begin %lld size %lld is outside [0, %lld)",
                         i, (long long)b[i], (long long)sz[i], (long long)d);
        out->shape[i] = n;
    }
    return ORION_OK;
}

static orion_status infer_split(const ictx *c, mil_type *out, size_t n_out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 0, &x);
    int64_t a = 0;
    int axis = 0;
    if (st == ORION_OK) st = const_int(c, "axis", &a);
    if (st == ORION_OK) st = norm_axis(c, "axis", a, x.rank, &axis);
    if (st != ORION_OK) return st;
    int has_num = arg(c, "num_splits") != NULL, has_sizes = arg(c, "split_sizes") != NULL;
    if (has_num == has_sizes) return ifail(c, NULL, "give exactly one of num_splits and split_sizes");
    int64_t d = x.shape[axis];
    int64_t sizes[MIL_MAX_RESULTS];
    size_t n;
    if (has_num) {
        int64_t k;
        if ((st = const_int(c, "num_splits", &k)) != ORION_OK) return st;
        if (k < 1 || k > MIL_MAX_RESULTS || d % k)
            return ifail(c, arg(c, "num_splits"), "num_splits %lld must divide the axis of %lld",
                         (long long)k, (long long)d);
        n = (size_t)k;
        for (size_t i = 0; i < n; i++) sizes[i] = d / k;
    } else {
        if ((st = const_ints(c, "split_sizes", 0, MIL_MAX_RESULTS, sizes, &n)) != ORION_OK) return st;
        int64_t sum = 0;
        for (size_t i = 0; i < n; i++) {
            if (sizes[i] < 1 || sizes[i] > d) return ifail(c, arg(c, "split_sizes"), "split sizes must be positive");
            sum += sizes[i];
        }
        if (sum != d)
            return ifail(c, arg(c, "split_sizes"), "split sizes add up to %lld, the axis has %lld",
                         (long long)sum, (long long)d);
    }
    if (n != n_out)
        return ifail(c, NULL, "split makes %zu results but %zu are declared", n, n_out);
    for (size_t i = 0; i < n; i++) {
        out[i] = x;
        out[i].shape[axis] = sizes[i];
    }
    return ORION_OK;
}

static orion_status infer_pad(const ictx *c, mil_type *out) {
    mil_type x;
    orion_status st = tensor_arg(c, "x", 1, &x);
    int64_t v[2 * MIL_MAX_RANK];
    size_t n;
    if (st == ORION_OK) st = const_ints(c, "pad", 0, 2 * MIL_MAX_RANK, v, &n);
    if (st != ORION_OK) return st;
    if (n == 0 || n % 2 || n / 2 > (size_t)x.rank)
        return ifail(c, arg(c, "pad"), "pad must hold (before, after) pairs for up to %d axes", x.rank);
    const char *mode = "constant";
    if (arg(c, "mode") && (st = const_string(c, "mode", 0, &mode)) != ORION_OK) return st;
    if (strcmp(mode, "constant") != 0)
        return ifail(c, arg(c, "mode"), "pad mode \"%s\" is not supported; only \"constant\"", mode);
    double cv;
    if (arg(c, "constant_val") && (st = const_float(c, "constant_val", &cv)) != ORION_OK) return st;
    *out = x;
    size_t k = n / 2;
    for (size_t i = 0; i < k; i++) {
        int axis = x.rank - (int)k + (int)i;
        if (v[2 * i] < 0 || v[2 * i + 1] < 0) return ifail(c, arg(c, "pad"), "pad amounts must be >= 0");
        out->shape[axis] = x.shape[axis] + v[2 * i] + v[2 * i + 1];   // each term < 2^32
    }
    if ((st = check_size(c, out)) != ORION_OK) return st;
    int64_t width = out->shape[out->rank - 1];
    if (width > 9216)
        return constraint_fail("ANE-C15", "line %d, column %d: pad '%s' makes a last axis of %lld",
                               c->s->line, c->s->column, c->s->results[0], (long long)width);
    return ORION_OK;
}

orion_status mil_infer_stmt(const mil_program *program, const mil_stmt *stmt, mil_op_kind kind,
                            mil_type *out, size_t *n_out) {
    ictx c = {program, stmt};
    orion_status st;
    size_t n = 1;
    memset(out, 0, sizeof *out);
    switch (kind) {
    case MIL_OP_CONST: st = infer_const(&c, out); break;
    case MIL_OP_CONV: st = infer_conv(&c, out); break;
    case MIL_OP_MATMUL: st = infer_matmul(&c, out); break;
    case MIL_OP_ADD:
    case MIL_OP_SUB:
    case MIL_OP_MUL:
    case MIL_OP_REAL_DIV:
    case MIL_OP_POW:
    case MIL_OP_MAXIMUM:
    case MIL_OP_MINIMUM: st = infer_binary(&c, out); break;
    case MIL_OP_REDUCE_SUM:
    case MIL_OP_REDUCE_MEAN:
    case MIL_OP_REDUCE_MAX: st = infer_reduce(&c, out); break;
    case MIL_OP_SOFTMAX: st = infer_softmax(&c, out); break;
    case MIL_OP_SIGMOID:
    case MIL_OP_TANH:
    case MIL_OP_EXP:
    case MIL_OP_SQRT:
    case MIL_OP_RELU:
    case MIL_OP_NEG: st = infer_unary(&c, 1, out); break;
    case MIL_OP_IDENTITY: st = infer_unary(&c, 0, out); break;
    case MIL_OP_CLIP: st = infer_clip(&c, out); break;
    case MIL_OP_CAST: st = infer_cast(&c, out); break;
    case MIL_OP_RESHAPE: st = infer_reshape(&c, out); break;
    case MIL_OP_TRANSPOSE: st = infer_transpose(&c, out); break;
    case MIL_OP_SLICE_BY_INDEX: st = infer_slice_by_index(&c, out); break;
    case MIL_OP_SLICE_BY_SIZE: st = infer_slice_by_size(&c, out); break;
    case MIL_OP_SPLIT:
        n = stmt->n_results;
        st = infer_split(&c, out, n);
        break;
    case MIL_OP_PAD: st = infer_pad(&c, out); break;
    case MIL_OP_CONSTEXPR_SHIFT_SCALE:
    case MIL_OP_CONSTEXPR_LUT:
    case MIL_OP_CONSTEXPR_AFFINE: st = mil_infer_constexpr(program, stmt, kind, out); break;
    default: return orion_fail(ORION_ERR_INTERNAL, "mil_infer_stmt: op kind %d", (int)kind);
    }
    if (st != ORION_OK) return st;
    for (size_t i = 0; i < n; i++)
        if ((st = check_size(&c, &out[i])) != ORION_OK) return st;
    *n_out = n;
    return ORION_OK;
}
