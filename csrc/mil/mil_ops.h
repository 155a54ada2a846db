/* mil_ops.h -- the op set of MIL programs that Orion accepts, defined once.
 *
 * The verifier (mil_verify.c) accepts exactly these ops and infers their
 * result types; the vane interpreter dispatches on mil_op_kind. Argument
 * names are as the device's MIL spells them (ane-facts §2.4). "const" means
 * the argument must resolve with mil_const_value() (a named const() or an
 * inline literal); the verifier has checked every value listed here.
 *
 *   const          [val]: a scalar, tensor literal or BLOBFILE. No arguments.
 *   conv           x [N,I,H,W], weight const [O,I,1,1] (1x1 only), pad_type const
 *                  string ("valid" | "same" | "custom"), strides const [1,1],
 *                  pad const [0,0,0,0], dilations const [1,1], groups const 1.
 *                  Result [N,O,H,W]. No bias (ANE-C05).
 *   matmul         x, y (rank >= 2), transpose_x, transpose_y: named bool
 *                  consts (ANE-C04). Batch dims broadcast; [.., M, K] x [.., K, N].
 *   add sub mul real_div pow maximum minimum
 *                  x, y: tensors or scalars of one float dtype, broadcast
 *                  numpy-style (dims aligned from the right, equal or 1).
 *   reduce_sum reduce_mean reduce_max
 *                  x, axes const int32[k] (negative counts from the end, no
 *                  repeats), keep_dims const bool (default false).
 *   softmax        x, axis const int32 scalar.
 *   sigmoid tanh exp sqrt relu neg identity
 *                  x; result = x's type.
 *   clip           x, alpha, beta: const float scalars, alpha <= beta;
 *                  result min(max(x, alpha), beta).
 *   cast           x, dtype const string "fp16" | "fp32".
 *   reshape        x, shape const int32[r] (positive dims, at most one -1).
 *   transpose      x, perm const int32[rank], a permutation.
 *   slice_by_index x, begin, end const int32[rank]; optional stride (> 0),
 *                  begin_mask, end_mask, squeeze_mask const bool[rank] (a set
 *                  mask means "from the start" / "to the end" / "drop this
 *                  axis", which must then have length 1). Negative begin/end
 *                  count from the end; after that 0 <= begin < end <= dim (no
 *                  clamping). Result dim = ceil((end - begin) / stride).
 *   slice_by_size  x, begin const int32[rank] (negative counts from the end),
 *                  size const int32[rank] (-1 = to the end).
 *   split          x, axis const int32, and either num_splits const int32
 *                  (equal parts) or split_sizes const int32[n]. n results.
 *   pad            x, pad const int32[2k], k <= rank: (before, after) pairs for
 *                  the last k dims, >= 0; mode const string "constant" (the
 *                  default); constant_val const float scalar (default 0).
 *
 * The constexpr ops give a weight tensor (fp16) from compressed consts, as
 * coremltools' reference `decompress` computes it (mil_constexpr.c):
 *   constexpr_blockwise_shift_scale  data, scale, offset?: named consts;
 *                  out = fp16(scale * fp16(data - offset)), one scale (and
 *                  offset) per block of data.shape / scale.shape
 *   constexpr_lut_to_dense  indices, lut, vector_axis?: named consts;
 *                  out = lut[block][index] (vector size 1, or a vector along
 *                  vector_axis)
 *   constexpr_affine_dequantize  no arguments; attributes quantized_data,
 *                  zero_point, scale, axis (maderix's iOS16 spelling);
 *                  out = fp16(scale * (quantized_data - zero_point)) along axis
 *
 * Every op carries the attribute name = string("..."), unique in the program. */
#ifndef ORION_MIL_OPS_H
#define ORION_MIL_OPS_H

typedef enum mil_op_kind {
    MIL_OP_UNKNOWN = 0,
    MIL_OP_CONST,
    MIL_OP_CONV,
    MIL_OP_MATMUL,
    MIL_OP_ADD,
    MIL_OP_SUB,
    MIL_OP_MUL,
    MIL_OP_REAL_DIV,
    MIL_OP_POW,
    MIL_OP_MAXIMUM,
    MIL_OP_MINIMUM,
    MIL_OP_REDUCE_SUM,
    MIL_OP_REDUCE_MEAN,
    MIL_OP_REDUCE_MAX,
    MIL_OP_SOFTMAX,
    MIL_OP_SIGMOID,
    MIL_OP_TANH,
    MIL_OP_EXP,
    MIL_OP_SQRT,
    MIL_OP_RELU,
    MIL_OP_NEG,
    MIL_OP_IDENTITY,
    MIL_OP_CLIP,
    MIL_OP_CAST,
    MIL_OP_RESHAPE,
    MIL_OP_TRANSPOSE,
    MIL_OP_SLICE_BY_INDEX,
    MIL_OP_SLICE_BY_SIZE,
    MIL_OP_SPLIT,
    MIL_OP_PAD,
    MIL_OP_CONSTEXPR_SHIFT_SCALE,   /* constexpr_blockwise_shift_scale (iOS18) */
    MIL_OP_CONSTEXPR_LUT,           /* constexpr_lut_to_dense (iOS18) */
    MIL_OP_CONSTEXPR_AFFINE,        /* constexpr_affine_dequantize (iOS16) */
    MIL_OP_COUNT
} mil_op_kind;

/* The kind of an op as written in MIL ("conv"), MIL_OP_UNKNOWN if it is not
 * in the set (including the ops the catalog refuses, such as concat). */
mil_op_kind mil_op_lookup(const char *name);
/* The MIL spelling of a kind; "unknown" for MIL_OP_UNKNOWN or out of range. */
const char *mil_op_name(mil_op_kind kind);

/* Argument names an op takes: `required` must all be present, `optional`
 * may be. Lists end with NULL. */
#define MIL_OP_MAX_ARGS 8
typedef struct mil_op_info {
    mil_op_kind kind;
    const char *name;
    const char *required[MIL_OP_MAX_ARGS];
    const char *optional[MIL_OP_MAX_ARGS];
} mil_op_info;

const mil_op_info *mil_op_info_of(mil_op_kind kind);   /* NULL for UNKNOWN */

/* An op the device is known to refuse or get wrong: the catalog id
 * ("ANE-C01") and, where one catalog row covers several ops, what is wrong
 * with this one (`why`, else NULL). mil_op_refused returns NULL if `name`
 * is not one of them. */
typedef struct mil_op_refusal {
    const char *op;
    const char *id;
    const char *why;
} mil_op_refusal;

const mil_op_refusal *mil_op_refused(const char *name);

#endif
