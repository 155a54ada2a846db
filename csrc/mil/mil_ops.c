/* mil_ops.c -- the op table of mil_ops.h: names, argument lists, and the ops
 * the constraint catalog refuses by name. */
#include <string.h>

#include "mil_ops.h"

#define CONV_ARGS "x", "weight", "pad_type", "strides", "pad", "dilations", "groups"

static const mil_op_info ops[MIL_OP_COUNT] = {
    [MIL_OP_CONST] = {MIL_OP_CONST, "const", {NULL}, {NULL}},
    [MIL_OP_CONV] = {MIL_OP_CONV, "conv", {CONV_ARGS, NULL}, {NULL}},
    [MIL_OP_MATMUL] = {MIL_OP_MATMUL, "matmul", {"x", "y", "transpose_x", "transpose_y", NULL}, {NULL}},
    [MIL_OP_ADD] = {MIL_OP_ADD, "add", {"x", "y", NULL}, {NULL}},
    [MIL_OP_SUB] = {MIL_OP_SUB, "sub", {"x", "y", NULL}, {NULL}},
    [MIL_OP_MUL] = {MIL_OP_MUL, "mul", {"x", "y", NULL}, {NULL}},
    [MIL_OP_REAL_DIV] = {MIL_OP_REAL_DIV, "real_div", {"x", "y", NULL}, {NULL}},
    [MIL_OP_POW] = {MIL_OP_POW, "pow", {"x", "y", NULL}, {NULL}},
    [MIL_OP_MAXIMUM] = {MIL_OP_MAXIMUM, "maximum", {"x", "y", NULL}, {NULL}},
    [MIL_OP_MINIMUM] = {MIL_OP_MINIMUM, "minimum", {"x", "y", NULL}, {NULL}},
    [MIL_OP_REDUCE_SUM] = {MIL_OP_REDUCE_SUM, "reduce_sum", {"x", "axes", NULL}, {"keep_dims", NULL}},
    [MIL_OP_REDUCE_MEAN] = {MIL_OP_REDUCE_MEAN, "reduce_mean", {"x", "axes", NULL}, {"keep_dims", NULL}},
    [MIL_OP_REDUCE_MAX] = {MIL_OP_REDUCE_MAX, "reduce_max", {"x", "axes", NULL}, {"keep_dims", NULL}},
    [MIL_OP_SOFTMAX] = {MIL_OP_SOFTMAX, "softmax", {"x", "axis", NULL}, {NULL}},
    [MIL_OP_SIGMOID] = {MIL_OP_SIGMOID, "sigmoid", {"x", NULL}, {NULL}},
    [MIL_OP_TANH] = {MIL_OP_TANH, "tanh", {"x", NULL}, {NULL}},
    [MIL_OP_EXP] = {MIL_OP_EXP, "exp", {"x", NULL}, {NULL}},
    [MIL_OP_SQRT] = {MIL_OP_SQRT, "sqrt", {"x", NULL}, {NULL}},
    [MIL_OP_RELU] = {MIL_OP_RELU, "relu", {"x", NULL}, {NULL}},
    [MIL_OP_NEG] = {MIL_OP_NEG, "neg", {"x", NULL}, {NULL}},
    [MIL_OP_IDENTITY] = {MIL_OP_IDENTITY, "identity", {"x", NULL}, {NULL}},
    [MIL_OP_CLIP] = {MIL_OP_CLIP, "clip", {"x", "alpha", "beta", NULL}, {NULL}},
    [MIL_OP_CAST] = {MIL_OP_CAST, "cast", {"x", "dtype", NULL}, {NULL}},
    [MIL_OP_RESHAPE] = {MIL_OP_RESHAPE, "reshape", {"x", "shape", NULL}, {NULL}},
    [MIL_OP_TRANSPOSE] = {MIL_OP_TRANSPOSE, "transpose", {"x", "perm", NULL}, {NULL}},
    [MIL_OP_SLICE_BY_INDEX] = {MIL_OP_SLICE_BY_INDEX, "slice_by_index", {"x", "begin", "end", NULL},
                               {"stride", "begin_mask", "end_mask", "squeeze_mask", NULL}},
    [MIL_OP_SLICE_BY_SIZE] = {MIL_OP_SLICE_BY_SIZE, "slice_by_size", {"x", "begin", "size", NULL}, {NULL}},
    [MIL_OP_SPLIT] = {MIL_OP_SPLIT, "split", {"x", "axis", NULL}, {"num_splits", "split_sizes", NULL}},
    [MIL_OP_PAD] = {MIL_OP_PAD, "pad", {"x", "pad", NULL}, {"mode", "constant_val", NULL}},
    [MIL_OP_CONSTEXPR_SHIFT_SCALE] = {MIL_OP_CONSTEXPR_SHIFT_SCALE, "constexpr_blockwise_shift_scale",
                                      {"data", "scale", NULL}, {"offset", NULL}},
    [MIL_OP_CONSTEXPR_LUT] = {MIL_OP_CONSTEXPR_LUT, "constexpr_lut_to_dense", {"indices", "lut", NULL},
                              {"vector_axis", NULL}},
    [MIL_OP_CONSTEXPR_AFFINE] = {MIL_OP_CONSTEXPR_AFFINE, "constexpr_affine_dequantize", {NULL},
                                 {NULL}},
};

mil_op_kind mil_op_lookup(const char *name) {
    if (!name) return MIL_OP_UNKNOWN;
    for (int k = 1; k < MIL_OP_COUNT; k++)
        if (strcmp(ops[k].name, name) == 0) return (mil_op_kind)k;
    return MIL_OP_UNKNOWN;
}

const char *mil_op_name(mil_op_kind kind) {
    if (kind <= MIL_OP_UNKNOWN || kind >= MIL_OP_COUNT) return "unknown";
    return ops[kind].name;
}

const mil_op_info *mil_op_info_of(mil_op_kind kind) {
    if (kind <= MIL_OP_UNKNOWN || kind >= MIL_OP_COUNT) return NULL;
    return &ops[kind];
}

static const mil_op_refusal refusals[] = {
    {"concat", "ANE-C01", NULL},
    {"gelu", "ANE-C02", NULL},
    {"rsqrt", "ANE-C03", NULL},
    {"scaled_dot_product_attention", "ANE-C07",NULL},
    {"stack", "ANE-C13", "stack fails to compile"},
    {"l2_norm", "ANE-C13", "l2_norm fails to compile"},
    {"gather", "ANE-C13", "gather fails to compile"},
    {"tile", "ANE-C13", "tile fails to compile"},
    {"softplus", "ANE-C13", "softplus is silently wrong above about 10.4"},
    {"softplus_parametric", "ANE-C13", "softplus_parametric is silently wrong above about 10.4"},
    {"log", "ANE-C13", "log needs an explicit epsilon and is not in the verified op set"},
};

const mil_op_refusal *mil_op_refused(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++)
        if (strcmp(refusals[i].op, name) == 0) return &refusals[i];
    return NULL;
}
