/* mil_constexpr.h -- the compressed-weight ops (constexpr_*): their inputs
 * resolved to consts, their checks (catalog rows ANE-C50..C53) and result
 * types. The verifier calls mil_infer_constexpr; the vane planner reads the
 * inputs with mil_constexpr_input after the verifier has passed them. */
#ifndef ORION_MIL_CONSTEXPR_H
#define ORION_MIL_CONSTEXPR_H

#include "mil_ast.h"
#include "mil_ops.h"

/* Is `kind` one of the constexpr ops? */
int mil_is_constexpr(mil_op_kind kind);

/* The literal (a BLOBFILE, tensor or scalar) of a constexpr input `name`: the
 * val of the const() an argument names (shift_scale, lut), or the attribute
 * itself (affine_dequantize). NULL when absent or not a const. */
const mil_value *mil_constexpr_input(const mil_program *program, const mil_stmt *stmt,
                                     mil_op_kind kind, const char *name);

/* The attributes constexpr_affine_dequantize takes besides name (NULL-ended). */
extern const char *const mil_affine_attrs[];

/* Checks a constexpr statement and writes its one result type to *out. */
orion_status mil_infer_constexpr(const mil_program *program, const mil_stmt *stmt,
                                 mil_op_kind kind, mil_type *out);

#endif
