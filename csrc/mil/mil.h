/* mil.h -- the MIL front end as the runtime sees it: parse, verify, and the
 * program's I/O signature and weight references. The syntax tree itself is
 * declared in mil_ast.h for the verifier and the vane interpreter. */
#ifndef ORION_MIL_H
#define ORION_MIL_H

#include <stddef.h>
#include <stdint.h>
#include "../orion.h"

typedef struct mil_program mil_program;

/* Parses MIL program text. On failure: ORION_ERR_PARSE with "line L, column C:
 * <what>" in the last error. Never reads outside [text, text + len). */
orion_status mil_parse(const char *text, size_t len, mil_program **out);
void mil_program_free(mil_program *program);
/* Bytes the parse took from the allocator (its arena's chunks). */
size_t mil_program_bytes(const mil_program *program);

/* Checks the program against the constraint catalog and against the weight
 * files it will be compiled with (every BLOBFILE must name a key in `weights`,
 * point at a blob metadata header there, and match its type and size).
 * Fails with ORION_ERR_CONSTRAINT naming the id, or ORION_ERR_INVALID_ARGUMENT
 * / ORION_ERR_FORMAT for problems that are not device constraints. */
orion_status mil_verify(const mil_program *program, const orion_weight_file *weights,
                        size_t n_weights);

/* The I/O signature in binding order: sorted by MIL name, byte-wise, as the
 * device binds surfaces (ANE-C19, ANE-C20). */
size_t mil_io_count(const mil_program *program, int is_output);
orion_status mil_io_info(const mil_program *program, int is_output, size_t index,
                         orion_io_info *out);

/* The BLOBFILE constants of the program, in program order. */
typedef struct mil_blobfile_ref {
    const char *path;         /* as written: "@model_path/weights/w.bin" */
    uint64_t offset;          /* the metadata offset */
    uint32_t dtype;           /* ORION_BLOB_* of the declared tensor type */
    uint64_t nbytes;          /* bytes of the declared tensor type */
} mil_blobfile_ref;

size_t mil_blobfile_count(const mil_program *program);
orion_status mil_blobfile_at(const mil_program *program, size_t index, mil_blobfile_ref *out);

#endif
