/* mil_ast.c -- the arena that owns a parsed program, the name index, and the
 * small helpers over the syntax tree declared in mil_ast.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mil_internal.h"

// ----------------------------------------------------------------------------
// arena: bump allocation in chunks, all freed at once with the program

#define MIL_CHUNK_BYTES ((size_t)64 * 1024)

mil_arena *mil_arena_new(void) {
    return calloc(1, sizeof(mil_arena));
}

void mil_arena_free(mil_arena *arena) {
    if (!arena) return;
    mil_chunk *c = arena->chunks;
    while (c) {
        mil_chunk *next = c->next;
        free(c);
        c = next;
    }
    free(arena->stmts);
    mil_strmap_free(&arena->names);
    free(arena->defs);
    free(arena->blobfiles);
    free(arena->blob_owners);
    free(arena->input_order);
    free(arena->output_order);
    free(arena);
}

void *mil_arena_alloc(mil_arena *arena, size_t size) {
    if (size > MIL_MAX_ARENA_BYTES) return NULL;
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    mil_chunk *c = arena->chunks;
    if (!c || c->cap - c->used < size) {
        // a large request gets a chunk of its own; the current chunk stays
        // first so that its free tail is still used by small requests
        size_t cap = size > MIL_CHUNK_BYTES / 4 ? size : MIL_CHUNK_BYTES;
        if (arena->total + cap > MIL_MAX_ARENA_BYTES) return NULL;
        size_t head = (sizeof(mil_chunk) + 15) & ~(size_t)15;
        mil_chunk *n = malloc(head + cap);
        if (!n) return NULL;
        n->used = 0;
        n->cap = cap;
        n->data = (unsigned char *)n + head;
        arena->total += cap;
        if (c && cap != MIL_CHUNK_BYTES) {
            n->next = c->next;
            c->next = n;
        } else {
            n->next = c;
            arena->chunks = n;
        }
        c = n;
    }
    void *p = c->data + c->used;
    c->used += size;
    memset(p, 0, size);
    return p;
}

char *mil_arena_strndup(mil_arena *arena, const char *s, size_t n) {
    char *d = mil_arena_alloc(arena, n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

// ----------------------------------------------------------------------------
// string map

static uint64_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull;   // FNV-1a
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int mil_strmap_init(mil_strmap *map, size_t expected) {
    memset(map, 0, sizeof(*map));
    if (expected > ((size_t)1 << 40)) return -1;
    size_t cap = 16;
    while (cap < 2 * expected + 1) cap *= 2;
    map->keys = calloc(cap, sizeof(*map->keys));
    map->values = calloc(cap, sizeof(*map->values));
    if (!map->keys || !map->values) {
        mil_strmap_free(map);
        return -1;
    }
    map->cap = cap;
    map->limit = expected;
    return 0;
}

void mil_strmap_free(mil_strmap *map) {
    free(map->keys);
    free(map->values);
    memset(map, 0, sizeof(*map));
}

size_t *mil_strmap_put(mil_strmap *map, const char *key, int *found) {
    *found = 0;
    if (map->cap == 0) return NULL;
    size_t mask = map->cap - 1;
    for (size_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
        if (!map->keys[i]) {
            if (map->count >= map->limit) return NULL;
            map->keys[i] = key;
            map->values[i] = 0;
            map->count++;
            return &map->values[i];
        }
        if (strcmp(map->keys[i], key) == 0) {
            *found = 1;
            return &map->values[i];
        }
    }
}

const size_t *mil_strmap_get(const mil_strmap *map, const char *key) {
    if (map->cap == 0) return NULL;
    size_t mask = map->cap - 1;
    // the load factor stays below 1/2, so an empty slot ends every probe
    for (size_t i = hash_str(key) & mask;; i = (i + 1) & mask) {
        if (!map->keys[i]) return NULL;
        if (strcmp(map->keys[i], key) == 0) return &map->values[i];
    }
}

// ----------------------------------------------------------------------------
// the name index and the binding order

// Binding order is a byte-wise sort of the names (ANE-C19, ANE-C20); strcmp
// compares as unsigned char, which is that order. A small merge sort over
// indices: stable, O(n log n), and with no global state (qsort has no
// context argument, and two threads may parse at once).
static void sort_by_name(size_t *idx, size_t *tmp, size_t n, const char *const *names) {
    if (n < 2) return;
    size_t h = n / 2;
    sort_by_name(idx, tmp, h, names);
    sort_by_name(idx + h, tmp, n - h, names);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = strcmp(names[idx[j]], names[idx[i]]) < 0 ? idx[j++] : idx[i++];
    while (i < h) tmp[k++] = idx[i++];
    while (j < n) tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof(*idx));
}

orion_status mil_index_build(mil_program *program) {
    mil_arena *a = program->arena;
    size_t n = program->n_inputs;
    for (size_t s = 0; s < program->n_stmts; s++) n += program->stmts[s].n_results;
    a->defs = calloc(n ? n : 1, sizeof(*a->defs));
    if (!a->defs || mil_strmap_init(&a->names, n) != 0) return ORION_ERR_OUT_OF_MEMORY;
    size_t d = 0;
    for (size_t i = 0; i < program->n_inputs; i++) {
        int found;
        size_t *slot = mil_strmap_put(&a->names, program->inputs[i].name, &found);
        if (!slot) return ORION_ERR_OUT_OF_MEMORY;
        if (found) continue;   // a second definition; mil_verify reports it
        a->defs[d] = (mil_def){1, i, 0};
        *slot = d++;
    }
    for (size_t s = 0; s < program->n_stmts; s++) {
        const mil_stmt *st = &program->stmts[s];
        for (size_t r = 0; r < st->n_results; r++) {
            int found;
            size_t *slot = mil_strmap_put(&a->names, st->results[r], &found);
            if (!slot) return ORION_ERR_OUT_OF_MEMORY;
            if (found) continue;
            a->defs[d] = (mil_def){0, s, r};
            *slot = d++;
        }
    }
    a->n_defs = d;

    size_t ni = program->n_inputs, no = program->n_outputs;
    size_t big = ni > no ? ni : no;
    size_t *tmp = malloc((big ? big : 1) * sizeof(size_t));
    const char **in_names = malloc((ni ? ni : 1) * sizeof(char *));
    a->input_order = malloc((ni ? ni : 1) * sizeof(size_t));
    a->output_order = malloc((no ? no : 1) * sizeof(size_t));
    if (!tmp || !in_names || !a->input_order || !a->output_order) {
        free(tmp);
        free(in_names);
        return ORION_ERR_OUT_OF_MEMORY;
    }
    for (size_t i = 0; i < ni; i++) {
        a->input_order[i] = i;
        in_names[i] = program->inputs[i].name;
    }
    for (size_t i = 0; i < no; i++) a->output_order[i] = i;
    sort_by_name(a->input_order, tmp, ni, in_names);
    sort_by_name(a->output_order, tmp, no, program->outputs);
    free(tmp);
    free(in_names);
    return ORION_OK;
}

const mil_def *mil_lookup(const mil_program *program, const char *name) {
    const mil_arena *a = program->arena;
    if (!a || !name) return NULL;
    const size_t *v = mil_strmap_get(&a->names, name);
    return v ? &a->defs[*v] : NULL;
}

const mil_type *mil_def_type(const mil_program *program, const mil_def *def) {
    if (!def) return NULL;
    if (def->is_input) return &program->inputs[def->index].type;
    return &program->stmts[def->index].types[def->result];
}

// ----------------------------------------------------------------------------
// helpers of mil_ast.h

static const mil_arg *find_arg(const mil_arg *args, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(args[i].name, name) == 0) return &args[i];
    return NULL;
}

const mil_arg *mil_stmt_arg(const mil_stmt *stmt, const char *name) {
    return find_arg(stmt->args, stmt->n_args, name);
}

const mil_arg *mil_stmt_attr(const mil_stmt *stmt, const char *name) {
    return find_arg(stmt->attrs, stmt->n_attrs, name);
}

const mil_stmt *mil_find_def(const mil_program *program, const char *name, size_t *result_index) {
    const mil_def *d = mil_lookup(program, name);
    if (!d || d->is_input) return NULL;
    if (result_index) *result_index = d->result;
    return &program->stmts[d->index];
}

const mil_param *mil_find_input(const mil_program *program, const char *name) {
    const mil_def *d = mil_lookup(program, name);
    return d && d->is_input ? &program->inputs[d->index] : NULL;
}

const mil_value *mil_const_value(const mil_program *program, const mil_value *value) {
    if (!value) return NULL;
    switch (value->kind) {
    case MIL_VAL_SCALAR:
    case MIL_VAL_TENSOR:
    case MIL_VAL_BLOBFILE:
        return value;
    case MIL_VAL_REF: {
        const mil_stmt *s = mil_find_def(program, value->name, NULL);
        if (!s || strcmp(s->op, "const") != 0) return NULL;
        const mil_arg *val = mil_stmt_attr(s, "val");
        if (!val || val->value.kind == MIL_VAL_REF || val->value.kind == MIL_VAL_TUPLE) return NULL;
        return &val->value;
    }
    default:
        return NULL;
    }
}

size_t mil_dtype_size(mil_dtype dtype) {
    switch (dtype) {
    case MIL_DT_FP16: return 2;
    case MIL_DT_FP32: return 4;
    case MIL_DT_INT32: return 4;
    case MIL_DT_INT8: return 1;
    case MIL_DT_UINT8: return 1;
    case MIL_DT_BOOL: return 1;
    case MIL_DT_UINT64: return 8;
    default: return 0;
    }
}

int64_t mil_type_numel(const mil_type *type) {
    if (!type->is_tensor) return 1;
    int64_t n = 1;
    for (int i = 0; i < type->rank; i++) n *= type->shape[i];   // bounded by the parser
    return n;
}

int mil_dtype_is_sub_byte(mil_dtype dtype) {
    return dtype >= MIL_DT_INT4 && dtype <= MIL_DT_UINT6;
}

unsigned mil_dtype_bits(mil_dtype dtype) {
    switch (dtype) {
    case MIL_DT_INT4: case MIL_DT_UINT4: return 4;
    case MIL_DT_UINT1: return 1;
    case MIL_DT_UINT2: return 2;
    case MIL_DT_UINT3: return 3;
    case MIL_DT_UINT6: return 6;
    default: return 8 * (unsigned)mil_dtype_size(dtype);
    }
}

uint64_t mil_type_nbytes(const mil_type *type) {
    if (!type->is_tensor) return 0;
    if (mil_dtype_is_sub_byte(type->dtype))   /* whole bytes, the last one padded */
        return ((uint64_t)mil_type_numel(type) * mil_dtype_bits(type->dtype) + 7) / 8;
    return (uint64_t)mil_type_numel(type) * mil_dtype_size(type->dtype);
}

const char *mil_dtype_name(mil_dtype dtype) {
    switch (dtype) {
    case MIL_DT_FP16: return "fp16";
    case MIL_DT_FP32: return "fp32";
    case MIL_DT_INT32: return "int32";
    case MIL_DT_INT8: return "int8";
    case MIL_DT_UINT8: return "uint8";
    case MIL_DT_BOOL: return "bool";
    case MIL_DT_STRING: return "string";
    case MIL_DT_UINT64: return "uint64";
    case MIL_DT_INT4: return "int4";
    case MIL_DT_UINT4: return "uint4";
    case MIL_DT_UINT1: return "uint1";
    case MIL_DT_UINT2: return "uint2";
    case MIL_DT_UINT3: return "uint3";
    case MIL_DT_UINT6: return "uint6";
    default: return "invalid";
    }
}

uint32_t mil_blob_dtype(mil_dtype dtype) {
    switch (dtype) {
    case MIL_DT_FP16: return ORION_BLOB_FLOAT16;
    case MIL_DT_FP32: return ORION_BLOB_FLOAT32;
    case MIL_DT_INT32: return ORION_BLOB_INT32;
    case MIL_DT_INT8: return ORION_BLOB_INT8;
    case MIL_DT_UINT8: return ORION_BLOB_UINT8;
    case MIL_DT_INT4: return ORION_BLOB_INT4;
    case MIL_DT_UINT4: return ORION_BLOB_UINT4;
    case MIL_DT_UINT1: return ORION_BLOB_UINT1;
    case MIL_DT_UINT2: return ORION_BLOB_UINT2;
    case MIL_DT_UINT3: return ORION_BLOB_UINT3;
    case MIL_DT_UINT6: return ORION_BLOB_UINT6;
    default: return 0;
    }
}

int mil_type_equal(const mil_type *a, const mil_type *b) {
    if (a->dtype != b->dtype || a->is_tensor != b->is_tensor) return 0;
    if (!a->is_tensor) return 1;
    if (a->rank != b->rank) return 0;
    for (int i = 0; i < a->rank; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

void mil_type_format(const mil_type *type, char *buf, size_t capacity) {
    if (capacity == 0) return;
    if (!type->is_tensor) {
        snprintf(buf, capacity, "%s", mil_dtype_name(type->dtype));
        return;
    }
    size_t n = 0;
    int w = snprintf(buf, capacity, "tensor<%s, [", mil_dtype_name(type->dtype));
    n = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < type->rank && n < capacity; i++) {
        w = snprintf(buf + n, capacity - n, "%s%lld", i ? ", " : "", (long long)type->shape[i]);
        n += w > 0 ? (size_t)w : 0;
    }
    if (n < capacity) snprintf(buf + n, capacity - n, "]>");
}

// The program struct itself lives in its arena (see mil_parse), so freeing
// the arena frees everything.
void mil_program_free(mil_program *program) {
    if (program) mil_arena_free(program->arena);
}

size_t mil_program_bytes(const mil_program *program) {
    return program ? ((const mil_arena *)program->arena)->total : 0;
}
