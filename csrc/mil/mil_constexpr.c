/* mil_constexpr.c -- checks and result types of the constexpr ops (see
 * mil_ops.h): coremltools' validation of each op (iOS18 compression.py,
 * iOS16 constexpr_ops.py), narrowed to what the device computes (fp16
 * results), each refusal naming its catalog row. */
#include "mil_constexpr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "../core/catalog.h"
#include "../core/error.h"
#include "mil_internal.h"

const char *const mil_affine_attrs[] = {"quantized_data", "zero_point", "scale", "axis", NULL};

int mil_is_constexpr(mil_op_kind kind) {
    return kind == MIL_OP_CONSTEXPR_SHIFT_SCALE || kind == MIL_OP_CONSTEXPR_LUT ||
           kind == MIL_OP_CONSTEXPR_AFFINE;
}

const mil_value *mil_constexpr_input(const mil_program *program, const mil_stmt *stmt,
                                     mil_op_kind kind, const char *name) {
    if (kind == MIL_OP_CONSTEXPR_AFFINE) {
        const mil_arg *a = mil_stmt_attr(stmt, name);
        return a && a->value.kind != MIL_VAL_REF && a->value.kind != MIL_VAL_TUPLE ? &a->value
                                                                                   : NULL;
    }
    const mil_arg *a = mil_stmt_arg(stmt, name);
    if (!a || a->value.kind != MIL_VAL_REF) return NULL;
    return mil_const_value(program, &a->value);
}

// "line L, column C: <op> '<result>': <detail>" under catalog row `id`
static orion_status refuse(const char *id, const mil_stmt *s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static orion_status refuse(const char *id, const mil_stmt *s, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return constraint_fail(id, "line %d, column %d: %s '%s': %s", s->line, s->column, s->op,
                           s->results[0], msg);
}

// ANE-C50: every named input is a const (a BLOBFILE or tensor literal)
static orion_status const_input(const mil_program *p, const mil_stmt *s, mil_op_kind kind,
                                const char *name, int tensor, const mil_value **out) {
    *out = NULL;
    int present = kind == MIL_OP_CONSTEXPR_AFFINE ? mil_stmt_attr(s, name) != NULL
                                                  : mil_stmt_arg(s, name) != NULL;
    if (!present) return ORION_OK;
    const mil_value *v = mil_constexpr_input(p, s, kind, name);
    if (!v)
        return refuse("ANE-C50", s, "%s is not a const (pass the name of a const() holding "
                      "it%s)", name, kind == MIL_OP_CONSTEXPR_AFFINE ? ", or a literal" : "");
    if (tensor && !v->type.is_tensor)
        return refuse("ANE-C50", s, "%s must be a tensor const", name);
    *out = v;
    return ORION_OK;
}

static int dims_divide(const mil_type *big, const mil_type *small, int lead) {
    for (int i = 0; i < lead; i++)
        if (small->shape[i] < 1 || big->shape[i] % small->shape[i]) return 0;
    return 1;
}

static orion_status infer_shift_scale(const mil_program *p, const mil_stmt *s, mil_type *out) {
    const mil_value *data, *scale, *offset;
    orion_status st;
    mil_op_kind k = MIL_OP_CONSTEXPR_SHIFT_SCALE;
    if ((st = const_input(p, s, k, "data", 1, &data)) || (st = const_input(p, s, k, "scale", 1, &scale)) ||
        (st = const_input(p, s, k, "offset", 1, &offset)))
        return st;
    mil_dtype dt = data->type.dtype;
    if (dt != MIL_DT_INT4 && dt != MIL_DT_UINT4 && dt != MIL_DT_INT8 && dt != MIL_DT_UINT8)
        return refuse("ANE-C51", s, "data is %s (int4, uint4, int8 or uint8)", mil_dtype_name(dt));
    if (scale->type.dtype != MIL_DT_FP16)
        return refuse("ANE-C51", s, "scale is %s; the device's weights are fp16",
                      mil_dtype_name(scale->type.dtype));
    if (scale->type.rank != data->type.rank || !dims_divide(&data->type, &scale->type,
                                                            data->type.rank)) {
        char ts[160], tx[160];
        mil_type_format(&data->type, tx, sizeof tx);
        mil_type_format(&scale->type, ts, sizeof ts);
        return refuse("ANE-C51", s, "scale %s does not tile data %s (same rank, each dim of "
                      "data a multiple of scale's)", ts, tx);
    }
    if (offset) {
        if (offset->type.rank != scale->type.rank ||
            memcmp(offset->type.shape, scale->type.shape,
                   sizeof(int64_t) * (size_t)scale->type.rank) != 0)
            return refuse("ANE-C51", s, "offset's shape differs from scale's");
        if (offset->type.dtype != dt && offset->type.dtype != MIL_DT_FP16)
            return refuse("ANE-C51", s, "offset is %s; it must be data's %s or fp16",
                          mil_dtype_name(offset->type.dtype), mil_dtype_name(dt));
    }
    *out = data->type;
    out->dtype = MIL_DT_FP16;
    return ORION_OK;
}

static orion_status infer_lut(const mil_program *p, const mil_stmt *s, mil_type *out) {
    const mil_value *idx, *lut, *axis;
    orion_status st;
    mil_op_kind k = MIL_OP_CONSTEXPR_LUT;
    if ((st = const_input(p, s, k, "indices", 1, &idx)) || (st = const_input(p, s, k, "lut", 1, &lut)) ||
        (st = const_input(p, s, k, "vector_axis", 0, &axis)))
        return st;
    mil_dtype dt = idx->type.dtype;
    if (dt != MIL_DT_UINT1 && dt != MIL_DT_UINT2 && dt != MIL_DT_UINT3 && dt != MIL_DT_UINT4 &&
        dt != MIL_DT_UINT6 && dt != MIL_DT_UINT8)
        return refuse("ANE-C52", s, "indices are %s (uint1, 2, 3, 4, 6 or 8)", mil_dtype_name(dt));
    if (lut->type.dtype != MIL_DT_FP16)
        return refuse("ANE-C52", s, "lut is %s; the device's weights are fp16",
                      mil_dtype_name(lut->type.dtype));
    int r = idx->type.rank;
    if (lut->type.rank != r + 2 || !dims_divide(&idx->type, &lut->type, r))
        return refuse("ANE-C52", s, "lut has rank %d; it needs rank %d, its first %d dims "
                      "dividing the indices' shape", lut->type.rank, r + 2, r);
    int64_t entries = (int64_t)1 << mil_dtype_bits(dt), vs = lut->type.shape[r + 1];
    if (lut->type.shape[r] != entries)
        return refuse("ANE-C52", s, "lut holds %lld entries per table; %s indices need %lld",
                      (long long)lut->type.shape[r], mil_dtype_name(dt), (long long)entries);
    *out = idx->type;
    out->dtype = MIL_DT_FP16;
    if (vs > 1) {
        if (!axis || axis->type.is_tensor || axis->type.dtype != MIL_DT_INT32)
            return refuse("ANE-C52", s, "a vector size of %lld needs vector_axis, an int32 "
                          "scalar", (long long)vs);
        int64_t a = (int64_t)axis->numbers[0];
        if (a < -r || a >= r) return refuse("ANE-C52", s, "vector_axis %lld is out of range",
                                           (long long)a);
        a = a < 0 ? a + r : a;
        if (out->shape[a] > MIL_MAX_DIM / vs) return refuse("ANE-C52", s, "the result is too large");
        out->shape[a] *= vs;
    }
    return ORION_OK;
}

static orion_status infer_affine(const mil_program *p, const mil_stmt *s, mil_type *out) {
    const mil_value *q, *zp, *scale, *axis;
    orion_status st;
    mil_op_kind k = MIL_OP_CONSTEXPR_AFFINE;
    for (const char *const *a = mil_affine_attrs; *a; a++)
        if (!mil_stmt_attr(s, *a))
            return refuse("ANE-C53", s, "the attribute %s is missing", *a);
    if ((st = const_input(p, s, k, "quantized_data", 1, &q)) ||
        (st = const_input(p, s, k, "zero_point", 0, &zp)) ||
        (st = const_input(p, s, k, "scale", 0, &scale)) || (st = const_input(p, s, k, "axis", 0, &axis)))
        return st;
    mil_dtype dt = q->type.dtype;
    if (dt != MIL_DT_INT8 && dt != MIL_DT_UINT8)
        return refuse("ANE-C53", s, "quantized_data is %s (int8 or uint8)", mil_dtype_name(dt));
    if (zp->type.dtype != dt)
        return refuse("ANE-C53", s, "zero_point is %s; it must be quantized_data's %s",
                      mil_dtype_name(zp->type.dtype), mil_dtype_name(dt));
    if (scale->type.dtype != MIL_DT_FP16)
        return refuse("ANE-C53", s, "scale is %s; the device's weights are fp16",
                      mil_dtype_name(scale->type.dtype));
    if (axis->type.is_tensor || axis->type.dtype != MIL_DT_INT32)
        return refuse("ANE-C53", s, "axis must be an int32 scalar");
    int r = q->type.rank;
    int64_t a = (int64_t)axis->numbers[0];
    if (a < -r || a >= r) return refuse("ANE-C53", s, "axis %lld is out of range for rank %d",
                                       (long long)a, r);
    a = a < 0 ? a + r : a;
    const mil_value *vec[2] = {zp, scale};
    for (int i = 0; i < 2; i++) {
        const mil_type *t = &vec[i]->type;
        if (t->is_tensor && (t->rank != 1 || t->shape[0] != q->type.shape[a]))
            return refuse("ANE-C53", s, "%s must be a scalar or hold %lld values (the axis)",
                          i ? "scale" : "zero_point", (long long)q->type.shape[a]);
    }
    *out = q->type;
    out->dtype = MIL_DT_FP16;
    return ORION_OK;
}

orion_status mil_infer_constexpr(const mil_program *program, const mil_stmt *stmt,
                                 mil_op_kind kind, mil_type *out) {
    memset(out, 0, sizeof *out);
    switch (kind) {
    case MIL_OP_CONSTEXPR_SHIFT_SCALE: return infer_shift_scale(program, stmt, out);
    case MIL_OP_CONSTEXPR_LUT: return infer_lut(program, stmt, out);
    case MIL_OP_CONSTEXPR_AFFINE: return infer_affine(program, stmt, out);
    default: return orion_fail(ORION_ERR_INTERNAL, "mil_infer_constexpr: op kind %d", (int)kind);
    }
}
