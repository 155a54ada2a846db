/* mil_verify.c -- checks a parsed program before anyone compiles it: names
 * defined once and before use, ops in the op set with the arguments they
 * take, declared types equal to inferred ones (mil_infer.c), the static rows
 * of the constraint catalog, and the weight files behind every BLOBFILE.
 *
 * Order matters only for which error a program with several problems gets:
 * inputs first, then statements in program order, then outputs, then
 * weights. Constraint failures name the catalog id; everything else is
 * ORION_ERR_INVALID_ARGUMENT (or the blob parser's ORION_ERR_FORMAT), always
 * with the line and column. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/blobfile.h"
#include "../core/catalog.h"
#include "../core/error.h"
#include "mil_constexpr.h"
#include "mil_infer.h"
#include "mil_internal.h"
#include "mil_ops.h"

#define WEIGHT_FILE_BUDGET 16           /* ANE-C10 */
#define IO_MIN_BYTES 49152              /* ANE-C23 */
#define IO_MIN_WIDTH 32                 /* ANE-C24 */
#define IO_ROW_ALIGN 64                 /* ANE-C22 */
#define BLOB_LIMIT ((uint64_t)1 << 32)  /* ANE-C36 */
#define MODEL_PATH "@model_path/"

static orion_status bad(int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static orion_status bad(int line, int column, const char *fmt, ...) {
    char msg[640];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "line %d, column %d: %s", line, column, msg);
}

static int def_line(const mil_program *p, const mil_def *d) {
    return d->is_input ? p->inputs[d->index].line : p->stmts[d->index].line;
}

// ----------------------------------------------------------------------------
// program I/O: the rows of the catalog about surfaces that the text decides

static orion_status check_dims(const mil_type *t, const char *what, const char *name, int line,
                               int column) {
    static const int64_t max[4] = {65536, 65536, 16384, 16384};   // N C H W, ANE-C09
    static const char axis[4] = {'N', 'C', 'H', 'W'};
    if (!t->is_tensor || t->rank != 4) return ORION_OK;
    for (int i = 0; i < 4; i++)
        if (t->shape[i] > max[i])
            return constraint_fail("ANE-C09", "line %d, column %d: %s '%s' has %c = %lld (at most "
                                   "%lld)", line, column, what, name, axis[i],
                                   (long long)t->shape[i], (long long)max[i]);
    return ORION_OK;
}

static orion_status check_io(const mil_type *t, const char *what, const char *name, int line,
                             int column) {
    char ts[160];
    mil_type_format(t, ts, sizeof ts);
    if (strlen(name) >= ORION_IO_NAME_MAX)
        return bad(line, column, "%s name '%.40s...' is longer than %d bytes", what, name,
                   ORION_IO_NAME_MAX - 1);
    if (!t->is_tensor || t->rank != 4 || t->shape[0] != 1 || t->shape[2] != 1)
        return constraint_fail("ANE-C29", "line %d, column %d: %s '%s' is %s", line, column, what,
                               name, ts);
    if (t->dtype != MIL_DT_FP16)
        return constraint_fail("ANE-C12", "line %d, column %d: %s '%s' is %s", line, column, what,
                               name, ts);
    uint64_t width = (uint64_t)t->shape[3];
    if (width < IO_MIN_WIDTH)
        return constraint_fail("ANE-C24", "line %d, column %d: %s '%s' is %s, its width %llu is "
                               "below %d", line, column, what, name, ts,
                               (unsigned long long)width, IO_MIN_WIDTH);
    if ((width * 2) % IO_ROW_ALIGN)
        return constraint_fail("ANE-C22", "line %d, column %d: %s '%s' is %s, its last axis is "
                               "%llu bytes", line, column, what, name, ts,
                               (unsigned long long)(width * 2));
    if (mil_type_nbytes(t) < IO_MIN_BYTES)
        return constraint_fail("ANE-C23", "line %d, column %d: %s '%s' is %s, %llu bytes", line,
                               column, what, name, ts, (unsigned long long)mil_type_nbytes(t));
    return check_dims(t, what, name, line, column);
}

// Names in binding order (sorted): if one is a prefix of another, the
// device's sort of "name@output" symbols may differ from ours (ANE-C19/C20).
// In a sorted list a prefix sorts right before a name it prefixes, so
// neighbours suffice.
static orion_status check_prefixes(const char *id, const char *what, const char *const *names,
                                   const size_t *order, size_t n, const int *lines) {
    for (size_t i = 0; i + 1 < n; i++) {
        const char *a = names[order[i]], *b = names[order[i + 1]];
        size_t la = strlen(a);
        if (strncmp(a, b, la) == 0)
            return constraint_fail(id, "line %d: %s '%s' is a prefix of %s '%s', so the binding "
                                   "order is ambiguous", lines[order[i + 1]], what, a, what, b);
    }
    return ORION_OK;
}

static orion_status verify_inputs(const mil_program *p) {
    const mil_arena *a = p->arena;
    size_t n = p->n_inputs;
    const char **names = malloc((n ? n : 1) * sizeof *names);
    int *lines = malloc((n ? n : 1) * sizeof *lines);
    orion_status st = names && lines ? ORION_OK : orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    for (size_t i = 0; st == ORION_OK && i < n; i++) {
        const mil_param *in = &p->inputs[i];
        const mil_def *d = mil_lookup(p, in->name);
        if (!d->is_input || d->index != i)
            st = bad(in->line, in->column, "input '%s' is already defined at line %d", in->name,
                     def_line(p, d));
        else
            st = check_io(&in->type, "input", in->name, in->line, in->column);
        names[i] = in->name;
        lines[i] = in->line;
    }
    if (st == ORION_OK) st = check_prefixes("ANE-C20", "input", names, a->input_order, n, lines);
    free(names);
    free(lines);
    return st;
}

// ----------------------------------------------------------------------------
// statements

static const char *op_list(char *list, size_t cap) {
    size_t n = 0;
    list[0] = '\0';
    for (int k = 1; k < MIL_OP_COUNT && n < cap; k++) {
        int w = snprintf(list + n, cap - n, "%s%s", k > 1 ? ", " : "", mil_op_name((mil_op_kind)k));
        n += w > 0 ? (size_t)w : 0;
    }
    return list;
}

static int listed(const char *const *names, const char *name) {
    for (; *names; names++)
        if (strcmp(*names, name) == 0) return 1;
    return 0;
}

// A value used by statement `si`: names defined before it, no tuples, no
// BLOBFILE outside const().
static orion_status check_use(const mil_program *p, const mil_stmt *s, size_t si, const char *arg,
                              const mil_value *v) {
    if (v->kind == MIL_VAL_TUPLE)
        return bad(v->line, v->column, "%s '%s': %s is a tuple; no op of the set takes one",
                   s->op, s->results[0], arg);
    if (v->kind == MIL_VAL_BLOBFILE && mil_is_constexpr(mil_op_lookup(s->op)))
        return constraint_fail("ANE-C50", "line %d, column %d: %s '%s': %s is an inline "
                               "BLOBFILE", v->line, v->column, s->op, s->results[0], arg);
    if (v->kind == MIL_VAL_BLOBFILE)
        return bad(v->line, v->column, "%s '%s': a BLOBFILE may only be the val of a const()",
                   s->op, s->results[0]);
    if (v->kind != MIL_VAL_REF) return ORION_OK;
    const mil_def *d = mil_lookup(p, v->name);
    if (!d) return bad(v->line, v->column, "%s '%s': '%s' is not defined", s->op, s->results[0], v->name);
    if (!d->is_input && d->index >= si)
        return bad(v->line, v->column, "%s '%s': '%s' is used before its definition at line %d",
                   s->op, s->results[0], v->name, def_line(p, d));
    return ORION_OK;
}

typedef struct verify_state {
    mil_strmap op_names;     /* the name = string(...) attributes seen */
    const mil_value *inline_scalar;   /* first inline float scalar operand (ANE-C11) */
} verify_state;

static orion_status check_attrs(const mil_program *p, const mil_stmt *s, mil_op_kind kind,
                                verify_state *vs) {
    for (size_t i = 0; i < s->n_attrs; i++) {
        const mil_arg *a = &s->attrs[i];
        int ok = strcmp(a->name, "name") == 0 || (kind == MIL_OP_CONST && strcmp(a->name, "val") == 0) ||
                 (kind == MIL_OP_CONSTEXPR_AFFINE && listed(mil_affine_attrs, a->name));
        if (!ok)
            return bad(a->value.line, a->value.column, "%s '%s': unknown attribute '%s' (ops take "
                       "name%s)", s->op, s->results[0], a->name,
                       kind == MIL_OP_CONST ? " and val"
                       : kind == MIL_OP_CONSTEXPR_AFFINE ? ", quantized_data, zero_point, scale and axis"
                                                         : "");
        for (size_t j = 0; j < i; j++)
            if (strcmp(s->attrs[j].name, a->name) == 0)
                return bad(a->value.line, a->value.column, "%s '%s': attribute '%s' is given twice",
                           s->op, s->results[0], a->name);
    }
    const mil_arg *name = mil_stmt_attr(s, "name");
    if (!name || name->value.kind != MIL_VAL_SCALAR || name->value.type.dtype != MIL_DT_STRING)
        return bad(s->line, s->column, "%s '%s' needs the attribute [name = string(\"%s\")]", s->op,
                   s->results[0], s->results[0]);
    int found;
    size_t *slot = mil_strmap_put(&vs->op_names, name->value.string, &found);
    if (!slot) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying");
    if (found)
        return bad(name->value.line, name->value.column, "%s '%s': op name \"%s\" is already used "
                   "at line %d", s->op, s->results[0], name->value.string, p->stmts[*slot].line);
    *slot = (size_t)(s - p->stmts);
    return ORION_OK;
}

static orion_status check_args(const mil_program *p, const mil_stmt *s, size_t si,
                               const mil_op_info *info, verify_state *vs) {
    if (info->kind == MIL_OP_CONV && mil_stmt_arg(s, "bias"))
        return constraint_fail("ANE-C05", "line %d, column %d: conv '%s' passes bias=", s->line,
                               s->column, s->results[0]);
    for (size_t i = 0; i < s->n_args; i++) {
        const mil_arg *a = &s->args[i];
        if (!listed(info->required, a->name) && !listed(info->optional, a->name))
            return bad(a->value.line, a->value.column, "%s '%s': %s takes no argument '%s'", s->op,
                       s->results[0], s->op, a->name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(s->args[j].name, a->name) == 0)
                return bad(a->value.line, a->value.column, "%s '%s': argument '%s' is given twice",
                           s->op, s->results[0], a->name);
        orion_status st = check_use(p, s, si, a->name, &a->value);
        if (st != ORION_OK) return st;
        if (a->value.kind == MIL_VAL_SCALAR && !vs->inline_scalar &&
            (a->value.type.dtype == MIL_DT_FP16 || a->value.type.dtype == MIL_DT_FP32))
            vs->inline_scalar = &a->value;
    }
    for (const char *const *r = info->required; *r; r++)
        if (!mil_stmt_arg(s, *r))
            return bad(s->line, s->column, "%s '%s' needs the argument %s=", s->op, s->results[0], *r);
    return ORION_OK;
}

static orion_status verify_stmt(const mil_program *p, size_t si, verify_state *vs) {
    const mil_stmt *s = &p->stmts[si];
    const mil_op_refusal *no = mil_op_refused(s->op);
    if (no)
        return constraint_fail(no->id, "line %d, column %d: '%s' uses the op %s%s%s%s", s->line,
                               s->column, s->results[0], s->op, no->why ? " (" : "",
                               no->why ? no->why : "", no->why ? ")" : "");
    mil_op_kind kind = mil_op_lookup(s->op);
    if (kind == MIL_OP_UNKNOWN) {
        char list[400];
        return bad(s->line, s->column, "'%s' uses the unknown op '%s' (the op set: %s)",
                   s->results[0], s->op, op_list(list, sizeof list));
    }
    for (size_t r = 0; r < s->n_results; r++) {
        const mil_def *d = mil_lookup(p, s->results[r]);
        if (d->is_input || d->index != si || d->result != r)
            return bad(s->line, s->column, "'%s' is already defined at line %d", s->results[r],
                       def_line(p, d));
    }
    orion_status st = check_attrs(p, s, kind, vs);
    if (st == ORION_OK) st = check_args(p, s, si, mil_op_info_of(kind), vs);
    if (st != ORION_OK) return st;
    if (kind != MIL_OP_SPLIT && s->n_results != 1)
        return bad(s->line, s->column, "%s makes one result, %zu are declared", s->op, s->n_results);

    mil_type inferred[MIL_MAX_RESULTS];
    size_t n = 0;
    if ((st = mil_infer_stmt(p, s, kind, inferred, &n)) != ORION_OK) return st;
    for (size_t r = 0; r < n; r++) {
        if (!mil_type_equal(&inferred[r], &s->types[r])) {
            char want[160], have[160];
            mil_type_format(&inferred[r], want, sizeof want);
            mil_type_format(&s->types[r], have, sizeof have);
            return bad(s->line, s->column, "'%s' is declared %s but %s produces %s", s->results[r],
                       have, s->op, want);
        }
        // weights are not laid out as activations; their limits are the
        // conv's (ANE-C08), so ANE-C09 is checked on op results only
        if (kind != MIL_OP_CONST && !mil_is_constexpr(kind) &&
            (st = check_dims(&s->types[r], "tensor", s->results[r], s->line, s->column)) != ORION_OK)
            return st;
    }
    return ORION_OK;
}

// ----------------------------------------------------------------------------
// outputs

static orion_status verify_outputs(const mil_program *p) {
    if (p->n_outputs == 0)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "the function returns nothing: name at least "
                          "one result in -> (...)");
    for (size_t i = 0; i < p->n_outputs; i++) {
        const char *name = p->outputs[i];
        int line = p->output_lines[i];
        for (size_t j = 0; j < i; j++)
            if (strcmp(p->outputs[j], name) == 0)
                return bad(line, 1, "'%s' is returned twice", name);
        const mil_def *d = mil_lookup(p, name);
        if (!d)
            return constraint_fail("ANE-C06", "line %d: returned '%s' is not defined", line, name);
        if (d->is_input)
            return constraint_fail("ANE-C06", "line %d: returned '%s' is an input, not produced by "
                                   "an op", line, name);
        const mil_stmt *s = &p->stmts[d->index];
        if (strcmp(s->op, "const") == 0 || mil_is_constexpr(mil_op_lookup(s->op)))
            return constraint_fail("ANE-C06", "line %d: returned '%s' is a const, not produced by "
                                   "an op", line, name);
        orion_status st = check_io(&s->types[d->result], "output", name, line, 1);
        if (st != ORION_OK) return st;
    }
    const mil_arena *a = p->arena;
    return check_prefixes("ANE-C19", "output", p->outputs, a->output_order, p->n_outputs,
                          p->output_lines);
}

// ----------------------------------------------------------------------------
// weights

// A weight key or BLOBFILE path names a file inside the program folder; the
// runtime writes it there, so it must not be able to name anything else.
static const char *path_problem(const char *path) {
    size_t n = strlen(path), pre = strlen(MODEL_PATH);
    if (n > MIL_MAX_STRING) return "is too long";
    if (strncmp(path, MODEL_PATH, pre) != 0) return "does not start with " MODEL_PATH;
    const char *rest = path + pre;
    if (*rest == '\0') return "names no file after " MODEL_PATH;
    if (*rest == '/') return "is absolute after " MODEL_PATH;
    for (const char *c = rest; *c; c++) {
        if (*c == '\\') return "contains a backslash";
        if ((unsigned char)*c < 0x20 || *c == 0x7f) return "contains a control character";
    }
    // segment by segment: no empty, "." or ".." segment
    for (const char *seg = rest; seg;) {
        const char *slash = strchr(seg, '/');
        size_t len = slash ? (size_t)(slash - seg) : strlen(seg);
        if (len == 0) return "has an empty path segment";
        if ((len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return "has a '.' or '..' segment (it must stay inside the program folder)";
        seg = slash ? slash + 1 : NULL;
    }
    return NULL;
}

typedef struct weights_state {
    const orion_weight_file *files;
    size_t n;
    mil_strmap keys;      /* key -> index into files */
    blob_view *views;     /* (n) parsed on first use */
    unsigned char *parsed;
} weights_state;

static void weights_free(weights_state *w) {
    for (size_t i = 0; w->views && i < w->n; i++)
        if (w->parsed[i]) blob_view_free(&w->views[i]);
    free(w->views);
    free(w->parsed);
    mil_strmap_free(&w->keys);
}

static orion_status weights_init(weights_state *w, const orion_weight_file *files, size_t n) {
    memset(w, 0, sizeof *w);
    w->files = files;
    w->n = n;
    w->views = calloc(n ? n : 1, sizeof *w->views);
    w->parsed = calloc(n ? n : 1, 1);
    if (!w->views || !w->parsed || mil_strmap_init(&w->keys, n) != 0)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying weights");
    for (size_t i = 0; i < n; i++) {
        const orion_weight_file *f = &files[i];
        if (!f->key || (!f->data && f->nbytes))
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight file %zu has a NULL key or data", i);
        const char *why = path_problem(f->key);
        if (why)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key \"%.200s\" %s", f->key, why);
        int found;
        size_t *slot = mil_strmap_put(&w->keys, f->key, &found);
        if (!slot) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying weights");
        if (found)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key \"%.200s\" is given twice", f->key);
        *slot = i;
    }
    return ORION_OK;
}

static orion_status check_blob_entry(weights_state *w, const mil_value *v, const char *who) {
    const size_t *idx = mil_strmap_get(&w->keys, v->blob_path);
    if (!idx)
        return bad(v->line, v->column, "const '%s': BLOBFILE path \"%.200s\" is not among the %zu "
                   "weight files given (weights are passed as {key: blob bytes})", who,
                   v->blob_path, w->n);
    const orion_weight_file *f = &w->files[*idx];
    if (f->nbytes > BLOB_LIMIT)
        return constraint_fail("ANE-C36", "line %d, column %d: const '%s': weight file \"%.200s\" "
                               "is %llu bytes", v->line, v->column, who, f->key,
                               (unsigned long long)f->nbytes);
    if (!w->parsed[*idx]) {
        orion_status st = blob_view_parse(f->data, f->nbytes, f->key, &w->views[*idx]);
        if (st != ORION_OK)
            return orion_fail_context(st, "line %d, column %d: const '%s': BLOBFILE \"%.200s\"",
                                      v->line, v->column, who, f->key);
        w->parsed[*idx] = 1;
    }
    const blob_view *view = &w->views[*idx];
    const orion_blob_entry *e = blob_view_find(view, v->blob_offset);
    if (!e) {
        char list[160];
        size_t n = 0;
        list[0] = '\0';
        for (uint64_t i = 0; i < view->count && i < 8 && n < sizeof list; i++) {
            int k = snprintf(list + n, sizeof list - n, "%s%llu", i ? ", " : "",
                             (unsigned long long)view->entries[i].metadata_offset);
            n += k > 0 ? (size_t)k : 0;
        }
        return constraint_fail("ANE-C28", "line %d, column %d: const '%s': offset %llu in \"%.200s\" "
                               "is not a blob metadata header (headers are at %s%s)", v->line,
                               v->column, who,
                               (unsigned long long)v->blob_offset, f->key, list,
                               view->count > 8 ? ", ..." : "");
    }
    if (e->data_offset + e->nbytes > BLOB_LIMIT)
        return constraint_fail("ANE-C36", "line %d, column %d: const '%s': the blob at offset %llu "
                               "of \"%.200s\" ends past 4 GiB", v->line, v->column, who,
                               (unsigned long long)v->blob_offset, f->key);
    uint32_t want = mil_blob_dtype(v->type.dtype);
    if (e->dtype != want)
        return bad(v->line, v->column, "const '%s': BLOBFILE is declared %s but the blob at offset "
                   "%llu of \"%.200s\" holds %s", who, mil_dtype_name(v->type.dtype),
                   (unsigned long long)v->blob_offset, f->key, blob_dtype_name(e->dtype));
    uint64_t nbytes = mil_type_nbytes(&v->type);
    if (mil_dtype_is_sub_byte(v->type.dtype)) {
        uint64_t bits = (uint64_t)mil_type_numel(&v->type) * mil_dtype_bits(v->type.dtype);
        if (e->nbytes != nbytes || e->padding_bits != nbytes * 8 - bits)
            return constraint_fail("ANE-C54", "line %d, column %d: const '%s': %llu %s codes "
                                   "need %llu bytes with %llu padding bits; the blob at offset "
                                   "%llu of \"%.200s\" holds %llu bytes with %u", v->line,
                                   v->column, who, (unsigned long long)mil_type_numel(&v->type),
                                   mil_dtype_name(v->type.dtype), (unsigned long long)nbytes,
                                   (unsigned long long)(nbytes * 8 - bits),
                                   (unsigned long long)v->blob_offset, f->key,
                                   (unsigned long long)e->nbytes, e->padding_bits);
    }
    if (e->nbytes != nbytes) {
        char ts[160];
        mil_type_format(&v->type, ts, sizeof ts);
        return bad(v->line, v->column, "const '%s': BLOBFILE is declared %s (%llu bytes) but the "
                   "blob at offset %llu of \"%.200s\" holds %llu bytes", who, ts,
                   (unsigned long long)nbytes,
                   (unsigned long long)v->blob_offset, f->key, (unsigned long long)e->nbytes);
    }
    return ORION_OK;
}

static orion_status verify_blobfiles(const mil_program *p, const orion_weight_file *files,
                                     size_t n_files, const mil_value *inline_scalar) {
    const mil_arena *a = p->arena;
    mil_strmap distinct;
    if (mil_strmap_init(&distinct, a->n_blobfiles) != 0)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying weights");
    orion_status st = ORION_OK;
    size_t nth[2] = {0, 0};   // which references first name the 16th and the 17th file
    for (size_t i = 0; st == ORION_OK && i < a->n_blobfiles; i++) {
        const mil_value *v = a->blobfiles[i];
        const char *who = a->blob_owners[i];
        const char *why = path_problem(v->blob_path);
        if (why) {
            st = bad(v->line, v->column, "const '%s': BLOBFILE path \"%.200s\" %s", who,
                     v->blob_path, why);
        } else if (v->blob_offset < BLOB_HEADER_BYTES || v->blob_offset % BLOB_ALIGNMENT) {
            st = constraint_fail("ANE-C28", "line %d, column %d: const '%s': BLOBFILE offset %llu of "
                                 "\"%.200s\" cannot be a metadata header (those sit at 64-byte "
                                 "multiples from 64)", v->line, v->column, who,
                                 (unsigned long long)v->blob_offset, v->blob_path);
        } else if (v->blob_offset >= BLOB_LIMIT) {
            st = constraint_fail("ANE-C36", "line %d, column %d: const '%s': BLOBFILE offset %llu of "
                                 "\"%.200s\" is past 4 GiB", v->line, v->column, who,
                                 (unsigned long long)v->blob_offset, v->blob_path);
        } else {
            int found;
            if (!mil_strmap_put(&distinct, v->blob_path, &found))
                st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying weights");
            else if (!found && distinct.count >= WEIGHT_FILE_BUDGET && distinct.count <= WEIGHT_FILE_BUDGET + 1)
                nth[distinct.count - WEIGHT_FILE_BUDGET] = i;
        }
    }
    size_t count = distinct.count;
    mil_strmap_free(&distinct);
    if (st != ORION_OK) return st;
    if (count > WEIGHT_FILE_BUDGET) {
        const mil_value *v = a->blobfiles[nth[1]];
        return constraint_fail("ANE-C10", "line %d, column %d: const '%s': the program uses %zu "
                               "distinct weight files", v->line, v->column, a->blob_owners[nth[1]],
                               count);
    }
    if (count == WEIGHT_FILE_BUDGET && inline_scalar) {
        const mil_value *v = a->blobfiles[nth[0]];
        return constraint_fail("ANE-C11", "line %d, column %d: const '%s': the program uses %d "
                               "weight files and an inline scalar operand at line %d, column %d",
                               v->line, v->column, a->blob_owners[nth[0]], WEIGHT_FILE_BUDGET,
                               inline_scalar->line, inline_scalar->column);
    }

    weights_state w;
    st = weights_init(&w, files, n_files);
    for (size_t i = 0; st == ORION_OK && i < a->n_blobfiles; i++)
        st = check_blob_entry(&w, a->blobfiles[i], a->blob_owners[i]);
    weights_free(&w);
    return st;
}

// ----------------------------------------------------------------------------

orion_status mil_verify(const mil_program *p, const orion_weight_file *weights, size_t n_weights) {
    if (!p || !p->arena) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_verify: program is NULL");
    if (n_weights && !weights)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_verify: weights is NULL");
    if (strcmp(p->version, "1.3") != 0)
        return bad(1, 1, "program(%s): vane accepts program(1.3)", p->version);
    if (strcmp(p->function, "main") != 0)
        return bad(1, 1, "the function is '%s'; it must be 'main'", p->function);
    if (strcmp(p->opset, "ios18") != 0)
        return bad(1, 1, "opset <%s>: vane accepts func main<ios18>", p->opset);
    orion_status st = verify_inputs(p);
    if (st != ORION_OK) return st;

    verify_state vs;
    memset(&vs, 0, sizeof vs);
    if (mil_strmap_init(&vs.op_names, p->n_stmts) != 0)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while verifying");
    for (size_t i = 0; st == ORION_OK && i < p->n_stmts; i++) st = verify_stmt(p, i, &vs);
    mil_strmap_free(&vs.op_names);
    if (st != ORION_OK) return st;
    if ((st = verify_outputs(p)) != ORION_OK) return st;
    return verify_blobfiles(p, weights, n_weights, vs.inline_scalar);
}
