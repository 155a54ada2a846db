/* mil_internal.h -- what the MIL parser, the verifier and mil_ast.c share
 * and nobody else needs: the hard limits, the arena, the string map and the
 * name index that the parser builds once so lookups are O(1).
 *
 * The limits exist so that hostile text cannot exhaust memory or overflow a
 * size computation: every count the parser keeps is bounded here, and every
 * tensor size is bounded by MIL_MAX_NUMEL (mil_ast.h). */
#ifndef ORION_MIL_INTERNAL_H
#define ORION_MIL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include "mil_ast.h"

/* ---- hard limits --------------------------------------------------------- */

#define MIL_MAX_TEXT_BYTES   ((size_t)1 << 28)  /* 256 MiB of MIL text */
#define MIL_MAX_ARENA_BYTES  ((size_t)1 << 30)  /* everything a program owns */
#define MIL_MAX_IDENT        255                /* bytes in a name */
#define MIL_MAX_STRING       4096               /* bytes in a string literal, decoded */
#define MIL_MAX_NUMBER_TOKEN 96                 /* bytes in one numeric token */
#define MIL_MAX_STMTS        1000000
#define MIL_MAX_ARGS         64                 /* per call, and per attribute list */
#define MIL_MAX_RESULTS      64                 /* results of one statement */
#define MIL_MAX_INPUTS       256
#define MIL_MAX_OUTPUTS      256
#define MIL_MAX_TUPLE        1024               /* items of (a, b, ...) */
#define MIL_MAX_BUILDINFO    64                 /* pairs of the buildInfo dict */
#define MIL_MAX_DIM          ((int64_t)1 << 31)
#define MIL_MAX_LITERAL      ((size_t)1 << 20)  /* elements of one tensor literal */
#define MIL_MAX_LITERAL_ALL  ((size_t)1 << 24)  /* elements of all literals together */

/* ---- string map: open addressing, fixed capacity ------------------------- */

/* Keys are borrowed (they live in the arena or in the caller's data). The
 * capacity is fixed at init from the number of keys expected, so a put never
 * rehashes; a put beyond `expected` keys fails. */
typedef struct mil_strmap {
    size_t cap;            /* power of two, > 2 * expected */
    size_t count;
    size_t limit;          /* expected */
    const char **keys;     /* (cap) NULL = empty slot */
    size_t *values;        /* (cap) */
} mil_strmap;

int mil_strmap_init(mil_strmap *map, size_t expected);     /* 0, or -1: out of memory */
void mil_strmap_free(mil_strmap *map);
/* Finds or inserts key. *found says whether it was there; returns the value
 * slot, or NULL when the map is full. */
size_t *mil_strmap_put(mil_strmap *map, const char *key, int *found);
const size_t *mil_strmap_get(const mil_strmap *map, const char *key);

/* ---- the arena and the name index ----------------------------------------- */

typedef struct mil_chunk {
    struct mil_chunk *next;
    size_t used, cap;
    unsigned char *data;   /* cap bytes, right after the struct */
} mil_chunk;

/* Where a name is defined: an input (index = input index) or a statement
 * result (index = statement index, result = which result). Only the first
 * definition of a name is indexed; the verifier reports later ones. */
typedef struct mil_def {
    int is_input;
    size_t index;
    size_t result;
} mil_def;

typedef struct mil_arena {
    mil_chunk *chunks;
    size_t total;                 /* bytes taken from the allocator */
    mil_stmt *stmts;              /* (n_stmts) malloc'd vector, owned */
    mil_strmap names;             /* name -> index into defs */
    mil_def *defs;                /* (n_inputs + all results) */
    size_t n_defs;
    const mil_value **blobfiles;  /* (n_blobfiles) every BLOBFILE value, program order */
    const char **blob_owners;     /* (n_blobfiles) first result of the statement holding it */
    size_t n_blobfiles;
    size_t *input_order;          /* (n_inputs) binding order: byte-wise sorted names */
    size_t *output_order;         /* (n_outputs) */
} mil_arena;

mil_arena *mil_arena_new(void);
void mil_arena_free(mil_arena *arena);
/* 16-byte aligned, zeroed. NULL when out of memory or past MIL_MAX_ARENA_BYTES. */
void *mil_arena_alloc(mil_arena *arena, size_t size);
char *mil_arena_strndup(mil_arena *arena, const char *s, size_t n);

/* Builds names/defs, input_order and output_order once the tree is complete.
 * Returns ORION_OK or ORION_ERR_OUT_OF_MEMORY. */
orion_status mil_index_build(mil_program *program);
const mil_def *mil_lookup(const mil_program *program, const char *name);
/* The declared type of a defined name, or NULL. */
const mil_type *mil_def_type(const mil_program *program, const mil_def *def);

/* Writes "tensor<fp16, [1, 64, 1, 32]>" or "fp16" into buf (always terminated). */
void mil_type_format(const mil_type *type, char *buf, size_t capacity);
int mil_type_equal(const mil_type *a, const mil_type *b);
size_t mil_dtype_size(mil_dtype dtype);     /* bytes per element; 0 for string */

#endif
