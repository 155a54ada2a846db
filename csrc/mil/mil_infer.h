/* mil_infer.h -- result types of one statement (mil_infer.c), for the verifier. */
#ifndef ORION_MIL_INFER_H
#define ORION_MIL_INFER_H

#include "mil_ast.h"
#include "mil_ops.h"

/* Checks the arguments of `stmt` (an op of `kind`) and writes the types it
 * produces to out[0..*n_out). `out` holds MIL_MAX_RESULTS types. The caller
 * has checked argument names and that every REF is defined before `stmt`.
 * Fails with ORION_ERR_INVALID_ARGUMENT, or ORION_ERR_CONSTRAINT naming the
 * catalog id (ANE-C04, C08, C15). */
orion_status mil_infer_stmt(const mil_program *program, const mil_stmt *stmt, mil_op_kind kind,
                            mil_type *out, size_t *n_out);

#endif
