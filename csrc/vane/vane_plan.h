/* vane_plan.h -- the execution plan of one vane program (internal to csrc/vane).
 *
 * The planner (vane_plan.c) turns a verified mil_program into a flat list of
 * steps over value slots. Every value of the program (an input, a constant,
 * an op result) is one slot with a dtype and a packed shape. A slot's storage
 * is decided at plan time:
 *   input      the caller's surface, read in place (packed from byte 0)
 *   const      bytes materialized at compile (inline literals) or at load
 *              (BLOBFILE constants, copied out of the weight file)
 *   buffer     one of the program's intermediate buffers; buffers are reused
 *              once the value that held one is dead (liveness over steps)
 *   alias      the same bytes as another slot (reshape, identity)
 * The executor (vane_exec.c) runs the steps; the backend (vane_backend.c)
 * owns load/unload/eval. */
#ifndef ORION_VANE_PLAN_H
#define ORION_VANE_PLAN_H

#include <stddef.h>
#include <stdint.h>
#include "../mil/mil_ast.h"
#include "../mil/mil_ops.h"
#include "kernels.h"

/* ---- op kinds: the catalog's mil_op_kind (csrc/mil/mil_ops.h) --------- */

typedef mil_op_kind vane_op;

/* ---- value slots -------------------------------------------------------- */

typedef enum vane_storage {
    VS_INPUT,      /* index = binding index of the input */
    VS_CONST,      /* data = inline bytes owned by the plan, or set at load (blob) */
    VS_BUFFER,     /* index = intermediate buffer id */
    VS_ALIAS       /* index = root slot whose bytes this slot shares */
} vane_storage;

typedef struct vane_slot {
    const char *name;          /* MIL name ("" for an inline literal), plan-owned */
    mil_dtype dtype;           /* FP16 or FP32 for data; INT32/BOOL only for attributes */
    int rank;                  /* 0 for a scalar */
    int64_t shape[MIL_MAX_RANK];
    int64_t numel;
    vane_storage storage;
    int64_t index;             /* see vane_storage */
    void *data;                /* VS_CONST: the bytes (inline: owned; blob: into a load buffer) */
    int blob;                  /* VS_CONST from BLOBFILE: index into plan->blobs, else -1 */
    const mil_value *value;    /* VS_CONST: the literal (the plan's copy) */
    int def_step;              /* step that writes it, -1 for inputs and consts */
    int last_use;              /* last step that reads it (or its aliases) */
    int pinned;                /* outputs rooted here: never reused */
    int direct;                /* an output written straight into its surface */
    int used_as_data;          /* read as a tensor operand by some step */
    int quant;                 /* a constexpr op's weight: index into plan->quants, else -1 */
} vane_slot;

/* ---- steps -------------------------------------------------------------- */

#define VANE_MAX_IN 3

typedef struct vane_step {
    vane_op op;
    int line;                  /* of the MIL statement, for messages */
    const char *name;          /* first result name, plan-owned */
    int n_in;
    int in[VANE_MAX_IN];       /* slot ids: x, y / weight */
    int n_out;
    int *out;                  /* slot ids of the results (plan-owned) */
    /* typed attributes, by op */
    int flag_x, flag_y;        /* matmul transpose_x / transpose_y; reduce keep_dims */
    int axis;                  /* softmax / split (normalized, >= 0) */
    uint32_t axes_mask;        /* reduce: bit d set = axis d reduced */
    int64_t begin[MIL_MAX_RANK];  /* slice: first index per axis; pad: before */
    int64_t stride[MIL_MAX_RANK]; /* slice: step per axis; pad: after */
    int64_t *sizes;            /* split: n_out sizes along axis (plan-owned) */
    int perm[MIL_MAX_RANK];    /* transpose */
    float f0, f1;              /* clip alpha / beta; pad constant value */
    mil_dtype cast_to;         /* cast */
    /* A transpose read by one matmul only is folded into it (fold_transposes):
     * the transpose step is skipped, and the matmul reads the transpose's
     * operand in place, its axis d being axis view_perm[k][d] of in[k]. */
    int folded;                /* no work of its own, skipped: its reader does it (a folded
                                  transpose) or it shares its operand's bytes (a slice of a
                                  leading prefix) */
    int viewed[2];             /* matmul: operand k is a permuted view of in[k] */
    int view_perm[2][MIL_MAX_RANK];
} vane_step;

/* One BLOBFILE constant, read at load. */
typedef struct vane_blob_ref {
    const char *path;          /* as written in the MIL */
    uint64_t offset;           /* metadata offset */
    uint32_t dtype;            /* ORION_BLOB_* declared */
    uint64_t nbytes;           /* bytes declared */
    int slot;
} vane_blob_ref;

/* A weight a constexpr op defines from compressed consts (mil_ops.h), read by
 * conv through the fused kernels (vk_qgemm_f16) and never expanded, unless
 * another op reads it: then it is decoded to fp16 at load (`dense`). */
typedef struct vane_quant {
    mil_op_kind kind;
    int result;                /* the weight's slot */
    int data, scale, offset, lut;   /* const slots of the inputs (-1: none) */
    int dense;                 /* read by other than a conv's weight operand */
    vk_qmat m;                 /* shape and blocks from the plan; pointers bound at load */
    fp16_t *owned[4];          /* load: inputs converted to what m needs (freed at unload) */
    uint8_t *codes_owned;      /* load: codes of a literal, packed */
    fp16_t *values;            /* load: the dense weight when `dense` */
} vane_quant;

typedef struct vane_plan {
    const mil_program *program;   /* while planning; NULL after (detach_from_mil) */
    vk_numerics numerics;
    int n_slots, cap_slots;
    vane_slot *slots;
    int n_steps, cap_steps;
    vane_step *steps;
    int n_inputs, n_outputs;   /* binding order (sorted by name) */
    int *input_slots;
    int *output_slots;
    uint8_t *output_direct;    /* 1: the op writes the output surface itself (no copy) */
    orion_io_info *input_info;
    orion_io_info *output_info;
    int n_buffers;
    uint64_t *buffer_bytes;    /* capacity of each intermediate buffer */
    int n_blobs, cap_blobs;
    vane_blob_ref *blobs;
    int n_quants, cap_quants;
    vane_quant *quants;
    unsigned char *owned;      /* the names, literals and paths the slots, steps and blobs
                                  point to: the plan's copy, not the MIL's */
} vane_plan;

/* Builds the plan; fails with the reason in the last error. */
orion_status vane_plan_build(const mil_program *program, vk_numerics numerics, vane_plan **out);
void vane_plan_free(vane_plan *plan);

/* vane_quant.c: checks a constexpr weight's layout and fills its vk_qmat shape
 * (plan time); binds it to the loaded consts, decoding what must be (load);
 * drops what the load made (unload). */
orion_status vane_quant_plan(vane_plan *plan, vane_quant *q, const mil_stmt *st);
orion_status vane_quant_bind(vane_plan *plan);
void vane_quant_unbind(vane_plan *plan);
/* Bytes of one element of a data dtype (2 or 4), 0 otherwise. */
size_t vane_dtype_size(mil_dtype dtype);
/* The root slot of an alias chain. */
int vane_slot_root(const vane_plan *plan, int slot);

/* ---- execution ---------------------------------------------------------- */

/* An input surface's zero-tail promise (orion_surface_set_zero_tail) in elements:
 * in each block of `block` elements, those from `live` on are zero; block 0: none. */
typedef struct vane_zero_tail {
    uint64_t block, live;
} vane_zero_tail;

/* What an eval's caller promised about its data. */
typedef struct vane_eval_hints {
    const vane_zero_tail *tails;   /* each input's zero-tail promise, in binding order */
    /* orion_program_set_live_columns: of a 1x1 conv over `columns` columns, only the
     * `live` from column `first` on are computed (the rest written as zeros); 0: every
     * column */
    uint64_t columns, first, live;
} vane_eval_hints;

/* Runs one step. `ptr` holds the data pointer of every slot (already
 * resolved through aliases); the result slots' buffers are large enough.
 * `hints` NULL: no promises. */
orion_status vane_exec_step(const vane_plan *plan, const vane_step *step, void *const *ptr,
                            const vane_eval_hints *hints);

#endif
