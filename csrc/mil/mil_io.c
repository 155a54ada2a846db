/* mil_io.c -- a program's I/O signature in binding order and its BLOBFILE
 * references, as the runtime and the backends read them (mil.h). */
#include <string.h>

#include "../core/error.h"
#include "mil_internal.h"

size_t mil_io_count(const mil_program *program, int is_output) {
    if (!program) return 0;
    return is_output ? program->n_outputs : program->n_inputs;
}

orion_status mil_io_info(const mil_program *program, int is_output, size_t index,
                         orion_io_info *out) {
    if (!program || !out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_io_info: NULL argument");
    const mil_arena *a = program->arena;
    size_t n = mil_io_count(program, is_output);
    if (index >= n)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_io_info: %s %zu of %zu",
                          is_output ? "output" : "input", index, n);
    const char *name;
    const mil_type *t;
    if (is_output) {
        name = program->outputs[a->output_order[index]];
        t = mil_def_type(program, mil_lookup(program, name));
        if (!t) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "output '%s' is not defined", name);
    } else {
        const mil_param *in = &program->inputs[a->input_order[index]];
        name = in->name;
        t = &in->type;
    }
    size_t len = strlen(name);
    if (len >= sizeof out->name)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "I/O name '%.40s...' is longer than %zu bytes",
                          name, sizeof out->name - 1);
    if (!t->is_tensor || (t->dtype != MIL_DT_FP16 && t->dtype != MIL_DT_FP32))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "I/O '%s' is not an fp16 or fp32 tensor", name);
    memset(out, 0, sizeof *out);
    memcpy(out->name, name, len + 1);
    out->dtype = t->dtype == MIL_DT_FP16 ? ORION_BLOB_FLOAT16 : ORION_BLOB_FLOAT32;
    out->rank = (uint32_t)t->rank;
    for (int i = 0; i < t->rank; i++) out->shape[i] = t->shape[i];
    out->nbytes = mil_type_nbytes(t);
    return ORION_OK;
}

size_t mil_blobfile_count(const mil_program *program) {
    if (!program || !program->arena) return 0;
    return ((const mil_arena *)program->arena)->n_blobfiles;
}

orion_status mil_blobfile_at(const mil_program *program, size_t index, mil_blobfile_ref *out) {
    if (!program || !out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_blobfile_at: NULL argument");
    const mil_arena *a = program->arena;
    if (index >= a->n_blobfiles)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_blobfile_at: %zu of %zu", index,
                          a->n_blobfiles);
    const mil_value *v = a->blobfiles[index];
    out->path = v->blob_path;
    out->offset = v->blob_offset;
    switch (v->type.dtype) {
    case MIL_DT_FP16: out->dtype = ORION_BLOB_FLOAT16; break;
    case MIL_DT_FP32: out->dtype = ORION_BLOB_FLOAT32; break;
    case MIL_DT_INT32: out->dtype = ORION_BLOB_INT32; break;
    case MIL_DT_INT8: out->dtype = ORION_BLOB_INT8; break;
    default: out->dtype = ORION_BLOB_UINT8; break;   // the parser allows no other BLOBFILE type
    }
    out->nbytes = mil_type_nbytes(&v->type);
    return ORION_OK;
}
