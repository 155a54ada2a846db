/* mil_ast.h -- the syntax tree of a parsed MIL program.
 *
 * One program, one function (`func main<ios18>(...) { ... } -> (...)`).
 * Everything is allocated from the program's arena and freed with it, so
 * the tree is read-only after parsing and cheap to share (the verifier, the
 * vane planner and the ane backend all read it). */
#ifndef ORION_MIL_AST_H
#define ORION_MIL_AST_H

#include <stddef.h>
#include <stdint.h>
#include "mil.h"

#define MIL_MAX_RANK 8
/* The parser refuses any tensor type with more elements, so numel * 8 never
 * overflows a uint64 or an int64. */
#define MIL_MAX_NUMEL ((int64_t)1 << 32)

typedef enum mil_dtype {
    MIL_DT_INVALID = 0,
    MIL_DT_FP16,
    MIL_DT_FP32,
    MIL_DT_INT32,
    MIL_DT_INT8,
    MIL_DT_UINT8,
    MIL_DT_BOOL,
    MIL_DT_STRING,
    MIL_DT_UINT64,
    /* sub-byte codes of quantized weights (constexpr ops only), packed least
     * significant bits first in their blob (mil_type_nbytes rounds up to bytes) */
    MIL_DT_INT4,
    MIL_DT_UINT4,
    MIL_DT_UINT1,
    MIL_DT_UINT2,
    MIL_DT_UINT3,
    MIL_DT_UINT6
} mil_dtype;

typedef struct mil_type {
    mil_dtype dtype;
    int is_tensor;               /* 0: a scalar such as `fp16` or `bool` */
    int rank;                    /* tensors only */
    int64_t shape[MIL_MAX_RANK]; /* every dim > 0 (the parser checks) */
} mil_type;

typedef enum mil_value_kind {
    MIL_VAL_REF,       /* a named variable: an input, a const or an op result */
    MIL_VAL_SCALAR,    /* inline literal: fp16(0.5), int32(1), bool(true), string("valid") */
    MIL_VAL_TENSOR,    /* inline tensor literal: tensor<int32, [4]>([0, 1, 3, 2]) */
    MIL_VAL_BLOBFILE,  /* tensor<fp16, [..]>(BLOBFILE(path = string(".."), offset = uint64(64))) */
    MIL_VAL_TUPLE      /* (a, b, ...), as in concat(values = (a, b)) */
} mil_value_kind;

typedef struct mil_value {
    mil_value_kind kind;
    mil_type type;               /* SCALAR/TENSOR/BLOBFILE: the literal's type */
    int line, column;            /* where the value starts, 1-based */
    const char *name;            /* REF */
    size_t n_numbers;            /* SCALAR (1) / TENSOR (product of shape): numeric payload; */
    const double *numbers;       /*   bool as 0/1; NULL for strings */
    const char *string;          /* SCALAR of dtype STRING */
    const char *blob_path;       /* BLOBFILE */
    uint64_t blob_offset;        /* BLOBFILE */
    size_t n_items;              /* TUPLE */
    const struct mil_value *items;
} mil_value;

typedef struct mil_arg {
    const char *name;            /* x, y, weight, transpose_x, ... or name / val in attributes */
    mil_value value;
} mil_arg;

typedef struct mil_stmt {
    const char *op;              /* "conv", "const", "matmul", ... as written */
    size_t n_results;            /* 1, or more for ops such as split */
    const char *const *results;  /* result variable names */
    const mil_type *types;       /* declared result types */
    size_t n_args;               /* call arguments: op(x = a, y = b) */
    const mil_arg *args;
    size_t n_attrs;              /* bracket attributes: [name = string("a"), val = ...] */
    const mil_arg *attrs;
    int line, column;
} mil_stmt;

typedef struct mil_param {
    const char *name;
    mil_type type;
    int line, column;
} mil_param;

struct mil_program {
    const char *version;         /* "1.3" from program(1.3) */
    const char *function;        /* "main" */
    const char *opset;           /* "ios18" */
    size_t n_inputs;             /* in declaration order */
    const mil_param *inputs;
    size_t n_stmts;
    const mil_stmt *stmts;
    size_t n_outputs;            /* in the order of the return list */
    const char *const *outputs;
    const int *output_lines;
    void *arena;                 /* owns everything above */
};

/* Helpers over the tree (mil_ast.c). */
const mil_arg *mil_stmt_arg(const mil_stmt *stmt, const char *name);   /* NULL if absent */
const mil_arg *mil_stmt_attr(const mil_stmt *stmt, const char *name);  /* NULL if absent */
/* The statement that defines `name` (a result), or NULL (an input or unknown). */
const mil_stmt *mil_find_def(const mil_program *program, const char *name, size_t *result_index);
const mil_param *mil_find_input(const mil_program *program, const char *name);
uint64_t mil_type_nbytes(const mil_type *type);   /* 0 if not a fixed-size tensor */
/* Bits of one element: 1-6 for the sub-byte codes, 8 x size otherwise (0: string). */
unsigned mil_dtype_bits(mil_dtype dtype);
int mil_dtype_is_sub_byte(mil_dtype dtype);
int64_t mil_type_numel(const mil_type *type);
const char *mil_dtype_name(mil_dtype dtype);
/* The blob dtype code (ORION_BLOB_*) of a dtype a BLOBFILE may hold, 0 if none. */
uint32_t mil_blob_dtype(mil_dtype dtype);
/* The literal behind a value: the value itself if it is an inline literal
 * (SCALAR, TENSOR, BLOBFILE), the `val` of the const() a REF names, else NULL
 * (an input, an op result, a tuple, an unknown name). */
const mil_value *mil_const_value(const mil_program *program, const mil_value *value);

#endif
