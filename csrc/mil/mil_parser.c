/* mil_parser.c -- recursive descent over MIL program text (ane-facts §2).
 *
 *   program  := 'program' '(' VERSION ')' [ '[' buildInfo ']' ] '{' function '}'
 *   buildInfo:= 'buildInfo' '=' 'dict' '<' 'string' ',' 'string' '>'
 *                '(' '{' [ '{' STRING ',' STRING '}' { ',' ... } ] '}' ')'
 *   function := 'func' NAME '<' OPSET '>' '(' [ type NAME { ',' type NAME } ] ')'
 *               '{' { stmt } '}' '->' '(' [ NAME { ',' NAME } ] ')' [ ';' ]
 *   stmt     := results '=' OP '(' [ args ] ')' [ '[' args ']' ] ';'
 *   results  := type NAME { ',' type NAME } | '(' type NAME { ',' type NAME } ')'
 *   args     := NAME '=' value { ',' NAME '=' value }
 *   value    := NAME | dtype '(' scalar ')' | tensortype '(' list | blobfile ')'
 *               | '(' value { ',' value } ')'
 *   type     := dtype | 'tensor' '<' dtype ',' '[' [ INT { ',' INT } ] ']' '>'
 *
 * The parser checks syntax and the sizes of things (every limit of
 * mil_internal.h); what names mean, and whether ops and types agree, is the
 * verifier's job. The first error stops parsing: ORION_ERR_PARSE with
 * "line L, column C: expected ..., found ...". */
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "mil_internal.h"
#include "mil_lexer.h"

typedef struct parser {
    mil_lexer lx;
    mil_token tok;             /* the current token */
    mil_token ahead;           /* one token of lookahead */
    mil_arena *arena;
    mil_program *prog;
    mil_stmt *stmts;           /* growing vector, handed to the arena at the end */
    size_t n_stmts, cap_stmts;
    const mil_value **blobs;   /* every BLOBFILE value, program order */
    const char **owners;       /* the first result of each one's statement */
    size_t n_blobs, cap_blobs;
    size_t literal_total;      /* elements of all tensor literals so far */
    int failed;
    orion_status status;       /* of the first failure */
} parser;

// ----------------------------------------------------------------------------
// errors

// Describes a token for "found ..." in a message: short, printable, never
// more than a few dozen bytes of the (possibly hostile) text.
static void describe(const mil_token *t, char *buf, size_t cap) {
    switch (t->kind) {
    case TOK_EOF: snprintf(buf, cap, "end of input"); return;
    case TOK_ERROR: snprintf(buf, cap, "%s", t->error); return;
    case TOK_STRING: snprintf(buf, cap, "a string"); return;
    default: break;
    }
    char text[40];
    size_t n = t->len < 32 ? t->len : 32;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)t->start[i];
        text[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    text[n] = '\0';
    snprintf(buf, cap, "'%s%s'", text, t->len > 32 ? "..." : "");
}

static int fail_at(parser *p, int line, int column, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(parser *p, int line, int column, const char *fmt, ...) {
    if (p->failed) return -1;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    p->status = orion_fail(ORION_ERR_PARSE, "line %d, column %d: %s", line, column, msg);
    p->failed = 1;
    return -1;
}

// "expected <what>, found <the current token>"
static int expected(parser *p, const char *what) {
    char found[64];
    describe(&p->tok, found, sizeof found);
    return fail_at(p, p->tok.line, p->tok.column, "expected %s, found %s", what, found);
}

static int out_of_memory(parser *p) {
    if (p->failed) return -1;
    p->status = orion_fail(ORION_ERR_OUT_OF_MEMORY, "line %d, column %d: out of memory while "
                           "parsing MIL (a program may hold at most %zu MiB)", p->tok.line,
                           p->tok.column, MIL_MAX_ARENA_BYTES >> 20);
    p->failed = 1;
    return -1;
}

// ----------------------------------------------------------------------------
// tokens

static void next(parser *p) {
    p->tok = p->ahead;
    if (p->ahead.kind != TOK_EOF && p->ahead.kind != TOK_ERROR) p->ahead = mil_lexer_next(&p->lx);
}

static int tok_is(const mil_token *t, const char *word) {
    size_t n = strlen(word);
    return t->kind == TOK_IDENT && t->len == n && memcmp(t->start, word, n) == 0;
}

static int is_punct(const parser *p, char c) {
    return p->tok.kind == TOK_PUNCT && p->tok.punct == c;
}

static int expect_punct(parser *p, char c, const char *what) {
    if (!is_punct(p, c)) return expected(p, what);
    next(p);
    return 0;
}

static int expect_word(parser *p, const char *word) {
    if (!tok_is(&p->tok, word)) {
        char what[64];
        snprintf(what, sizeof what, "'%s'", word);
        return expected(p, what);
    }
    next(p);
    return 0;
}

static int expect_name(parser *p, const char *what, const char **out) {
    if (p->tok.kind != TOK_IDENT) return expected(p, what);
    if (p->tok.len > MIL_MAX_IDENT)
        return fail_at(p, p->tok.line, p->tok.column, "name is %zu bytes long, the limit is %d",
                       p->tok.len, MIL_MAX_IDENT);
    *out = mil_arena_strndup(p->arena, p->tok.start, p->tok.len);
    if (!*out) return out_of_memory(p);
    next(p);
    return 0;
}

// ----------------------------------------------------------------------------
// numbers and strings

// Decimal digits only, no sign; refuses values above `max`.
static int parse_uint(parser *p, const mil_token *t, uint64_t max, uint64_t *out, const char *what) {
    if (t->kind != TOK_NUMBER) return expected(p, what);
    uint64_t v = 0;
    for (size_t i = 0; i < t->len; i++) {
        char c = t->start[i];
        if (c < '0' || c > '9')
            return fail_at(p, t->line, t->column, "expected %s, found a number that is not a "
                           "plain decimal integer", what);
        uint64_t d = (uint64_t)(c - '0');
        if (v > (max - d) / 10)
            return fail_at(p, t->line, t->column, "integer is too large (the limit here is %llu)",
                           (unsigned long long)max);
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// The forms strtod accepts that we want: decimal 1, 1.5, .5, 1e-4 and hex
// 0x1p-3, 0x1.8p1. Checked before strtod so that it consumes the whole token
// and never sees "nan(...)", "infinity" or locale-specific forms.
static int valid_float(const char *s, size_t n) {
    size_t i = 0, digits = 0;
    int hex = n > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
    if (hex) i = 2;
    while (i < n && (hex ? hexval(s[i]) >= 0 : (s[i] >= '0' && s[i] <= '9'))) i++, digits++;
    if (i < n && s[i] == '.') {
        i++;
        while (i < n && (hex ? hexval(s[i]) >= 0 : (s[i] >= '0' && s[i] <= '9'))) i++, digits++;
    }
    if (digits == 0) return 0;
    if (i < n && (hex ? (s[i] == 'p' || s[i] == 'P') : (s[i] == 'e' || s[i] == 'E'))) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) i++;
        size_t e = 0;
        while (i < n && s[i] >= '0' && s[i] <= '9') i++, e++;
        if (e == 0) return 0;
    } else if (hex) {
        return 0;   // C requires the binary exponent of a hex float
    }
    return i == n;
}

// One number of a literal of `dtype`: ['-'] (NUMBER | inf | nan), or
// true/false for bool. Integer dtypes take integers in their range.
static int parse_number(parser *p, mil_dtype dtype, double *out) {
    mil_token first = p->tok;
    if (dtype == MIL_DT_BOOL) {
        if (tok_is(&p->tok, "true")) *out = 1;
        else if (tok_is(&p->tok, "false")) *out = 0;
        else return expected(p, "true or false");
        next(p);
        return 0;
    }
    int neg = 0;
    if (is_punct(p, '-')) {
        neg = 1;
        next(p);
    }
    int is_float = dtype == MIL_DT_FP16 || dtype == MIL_DT_FP32;
    if (is_float && (tok_is(&p->tok, "inf") || tok_is(&p->tok, "nan"))) {
        *out = tok_is(&p->tok, "inf") ? (neg ? -INFINITY : INFINITY) : NAN;
        next(p);
        return 0;
    }
    if (p->tok.kind != TOK_NUMBER) return expected(p, is_float ? "a number" : "an integer");
    if (p->tok.len > MIL_MAX_NUMBER_TOKEN)
        return fail_at(p, p->tok.line, p->tok.column, "number is longer than %d characters",
                       MIL_MAX_NUMBER_TOKEN);
    double v;
    if (is_float) {
        if (!valid_float(p->tok.start, p->tok.len))
            return fail_at(p, p->tok.line, p->tok.column, "malformed number (write 0.5, 1e-4 "
                           "or a hex float such as 0x1p-3)");
        char buf[MIL_MAX_NUMBER_TOKEN + 1];
        memcpy(buf, p->tok.start, p->tok.len);
        buf[p->tok.len] = '\0';
        char *end = NULL;
        v = strtod(buf, &end);
        // a locale whose decimal point is not '.' stops strtod early: refuse
        // rather than read a different number
        if (end != buf + p->tok.len)
            return fail_at(p, p->tok.line, p->tok.column, "number could not be read");
        if (neg) v = -v;
        double max = dtype == MIL_DT_FP16 ? 65504.0 : (double)FLT_MAX;
        // fp16 values below 65520 round to 65504, above it to inf
        double bound = dtype == MIL_DT_FP16 ? 65520.0 : (double)FLT_MAX;
        if (!(fabs(v) < bound || (dtype == MIL_DT_FP32 && fabs(v) == bound)))
            return fail_at(p, first.line, first.column, "%s literal is out of range (largest "
                           "finite value %g; write inf if infinity is meant)",
                           mil_dtype_name(dtype), max);
    } else {
        uint64_t lim;
        switch (dtype) {
        case MIL_DT_INT32: lim = neg ? (uint64_t)1 << 31 : ((uint64_t)1 << 31) - 1; break;
        case MIL_DT_INT8: lim = neg ? 128 : 127; break;
        case MIL_DT_UINT8: lim = neg ? 0 : 255; break;
        case MIL_DT_INT4: lim = neg ? 8 : 7; break;
        case MIL_DT_UINT4: case MIL_DT_UINT1: case MIL_DT_UINT2: case MIL_DT_UINT3:
        case MIL_DT_UINT6: lim = neg ? 0 : ((uint64_t)1 << mil_dtype_bits(dtype)) - 1; break;
        default: lim = neg ? 0 : (uint64_t)1 << 53; break;   // uint64: exact in a double
        }
        uint64_t u;
        if (parse_uint(p, &p->tok, lim, &u, "an integer") != 0) return -1;
        v = neg ? -(double)u : (double)u;
    }
    next(p);
    *out = v;
    return 0;
}

// Decodes the current STRING token (escapes were validated by the lexer).
static int parse_string(parser *p, const char **out) {
    if (p->tok.kind != TOK_STRING) return expected(p, "a string in double quotes");
    const char *s = p->tok.start + 1;
    size_t n = p->tok.len - 2;
    if (n > MIL_MAX_STRING)
        return fail_at(p, p->tok.line, p->tok.column, "string is longer than %d bytes",
                       MIL_MAX_STRING);
    char *d = mil_arena_alloc(p->arena, n + 1);
    if (!d) return out_of_memory(p);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            c = s[++i];
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c;
        }
        d[k++] = c;
    }
    d[k] = '\0';
    *out = d;
    next(p);
    return 0;
}

// ----------------------------------------------------------------------------
// types

static mil_dtype dtype_of(const mil_token *t) {
    static const struct { const char *name; mil_dtype dt; } names[] = {
        {"fp16", MIL_DT_FP16}, {"fp32", MIL_DT_FP32}, {"int32", MIL_DT_INT32},
        {"int8", MIL_DT_INT8}, {"uint8", MIL_DT_UINT8}, {"bool", MIL_DT_BOOL},
        {"string", MIL_DT_STRING}, {"uint64", MIL_DT_UINT64}, {"int4", MIL_DT_INT4},
        {"uint4", MIL_DT_UINT4}, {"uint1", MIL_DT_UINT1}, {"uint2", MIL_DT_UINT2},
        {"uint3", MIL_DT_UINT3}, {"uint6", MIL_DT_UINT6},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (tok_is(t, names[i].name)) return names[i].dt;
    return MIL_DT_INVALID;
}

static int parse_type(parser *p, mil_type *out) {
    memset(out, 0, sizeof *out);
    if (!tok_is(&p->tok, "tensor")) {
        mil_dtype dt = dtype_of(&p->tok);
        if (dt == MIL_DT_INVALID)
            return expected(p, "a type (fp16, fp32, int32, bool, string, or tensor<dtype, [dims]>)");
        out->dtype = dt;
        next(p);
        return 0;
    }
    mil_token at = p->tok;
    next(p);
    if (expect_punct(p, '<', "'<' after tensor") != 0) return -1;
    mil_dtype dt = dtype_of(&p->tok);
    if (dt == MIL_DT_INVALID) return expected(p, "an element type (fp16, fp32, int32, int8, uint8, bool)");
    if (dt == MIL_DT_STRING || dt == MIL_DT_UINT64)
        return fail_at(p, p->tok.line, p->tok.column, "tensors of %s are not supported",
                       mil_dtype_name(dt));
    next(p);
    if (expect_punct(p, ',', "',' after the element type") != 0) return -1;
    if (expect_punct(p, '[', "'[' to open the shape") != 0) return -1;
    out->dtype = dt;
    out->is_tensor = 1;
    int64_t numel = 1;
    if (!is_punct(p, ']')) {
        for (;;) {
            if (out->rank == MIL_MAX_RANK)
                return fail_at(p, p->tok.line, p->tok.column, "tensor rank is above %d",
                               MIL_MAX_RANK);
            uint64_t d;
            if (p->tok.kind != TOK_NUMBER)
                return expected(p, "a dimension (a positive integer)");
            if (parse_uint(p, &p->tok, (uint64_t)MIL_MAX_DIM, &d, "a dimension") != 0) return -1;
            if (d == 0)
                return fail_at(p, p->tok.line, p->tok.column, "a dimension must be at least 1");
            if (numel > MIL_MAX_NUMEL / (int64_t)d)
                return fail_at(p, at.line, at.column, "tensor has more than %lld elements",
                               (long long)MIL_MAX_NUMEL);
            numel *= (int64_t)d;
            out->shape[out->rank++] = (int64_t)d;
            next(p);
            if (is_punct(p, ']')) break;
            if (expect_punct(p, ',', "',' or ']' in the shape") != 0) return -1;
        }
    }
    next(p);   // ']'
    return expect_punct(p, '>', "'>' to close the tensor type");
}

// ----------------------------------------------------------------------------
// values

static int parse_value(parser *p, mil_value *out, int in_tuple);

// '[' elements ']' where an element is a number or a nested list; the
// elements are counted flat against the type's element count.
static int parse_list(parser *p, mil_dtype dtype, double *dst, size_t cap, size_t *n, int depth) {
    if (depth > MIL_MAX_RANK)
        return fail_at(p, p->tok.line, p->tok.column, "lists nest deeper than %d", MIL_MAX_RANK);
    if (expect_punct(p, '[', "'[' to open a list of elements") != 0) return -1;
    if (is_punct(p, ']')) {
        next(p);
        return 0;
    }
    for (;;) {
        if (is_punct(p, '[')) {
            if (parse_list(p, dtype, dst, cap, n, depth + 1) != 0) return -1;
        } else {
            if (*n == cap)
                return fail_at(p, p->tok.line, p->tok.column, "more elements than the %zu the "
                               "tensor type holds", cap);
            if (parse_number(p, dtype, &dst[*n]) != 0) return -1;
            (*n)++;
        }
        if (is_punct(p, ']')) break;
        if (expect_punct(p, ',', "',' or ']' in the list") != 0) return -1;
    }
    next(p);
    return 0;
}

static int is_blob_dtype(mil_dtype dt) {
    return dt == MIL_DT_FP16 || dt == MIL_DT_FP32 || dt == MIL_DT_INT32 || dt == MIL_DT_INT8 ||
           dt == MIL_DT_UINT8 || mil_dtype_is_sub_byte(dt);
}

// BLOBFILE(path = string("..."), offset = uint64(N)), the two in either order.
static int parse_blobfile(parser *p, mil_value *out) {
    mil_token at = p->tok;
    next(p);   // BLOBFILE
    if (!is_blob_dtype(out->type.dtype))
        return fail_at(p, at.line, at.column, "a BLOBFILE cannot hold %s elements",
                       mil_dtype_name(out->type.dtype));
    if (expect_punct(p, '(', "'(' after BLOBFILE") != 0) return -1;
    int have_path = 0, have_offset = 0;
    for (int i = 0; i < 2; i++) {
        if (tok_is(&p->tok, "path") && !have_path) {
            next(p);
            if (expect_punct(p, '=', "'=' after path") != 0) return -1;
            if (expect_word(p, "string") != 0) return -1;
            if (expect_punct(p, '(', "'(' after string") != 0) return -1;
            if (parse_string(p, &out->blob_path) != 0) return -1;
            if (expect_punct(p, ')', "')' after the path") != 0) return -1;
            have_path = 1;
        } else if (tok_is(&p->tok, "offset") && !have_offset) {
            next(p);
            if (expect_punct(p, '=', "'=' after offset") != 0) return -1;
            if (expect_word(p, "uint64") != 0) return -1;
            if (expect_punct(p, '(', "'(' after uint64") != 0) return -1;
            if (parse_uint(p, &p->tok, UINT64_MAX, &out->blob_offset, "a byte offset") != 0)
                return -1;
            next(p);
            if (expect_punct(p, ')', "')' after the offset") != 0) return -1;
            have_offset = 1;
        } else {
            return expected(p, have_path ? "offset = uint64(...)" : "path = string(\"...\")");
        }
        if (i == 0 && expect_punct(p, ',', "',' between path and offset") != 0) return -1;
    }
    if (expect_punct(p, ')', "')' to close BLOBFILE") != 0) return -1;
    out->kind = MIL_VAL_BLOBFILE;
    return 0;
}

static int parse_tensor_value(parser *p, mil_value *out) {
    if (parse_type(p, &out->type) != 0) return -1;
    if (expect_punct(p, '(', "'(' after the tensor type") != 0) return -1;
    if (tok_is(&p->tok, "BLOBFILE")) {
        if (parse_blobfile(p, out) != 0) return -1;
    } else {
        int64_t numel = mil_type_numel(&out->type);
        if ((uint64_t)numel > MIL_MAX_LITERAL)
            return fail_at(p, out->line, out->column, "a tensor literal may hold at most %zu "
                           "elements (use a BLOBFILE for weights)", MIL_MAX_LITERAL);
        if (p->literal_total + (size_t)numel > MIL_MAX_LITERAL_ALL)
            return fail_at(p, out->line, out->column, "tensor literals of the program hold more "
                           "than %zu elements (use BLOBFILEs)", MIL_MAX_LITERAL_ALL);
        p->literal_total += (size_t)numel;
        double *nums = mil_arena_alloc(p->arena, (size_t)numel * sizeof(double));
        if (!nums) return out_of_memory(p);
        size_t n = 0;
        if (parse_list(p, out->type.dtype, nums, (size_t)numel, &n, 1) != 0) return -1;
        if (n != (size_t)numel)
            return fail_at(p, out->line, out->column, "tensor literal has %zu elements, its type "
                           "holds %lld", n, (long long)numel);
        out->kind = MIL_VAL_TENSOR;
        out->numbers = nums;
        out->n_numbers = n;
    }
    return expect_punct(p, ')', "')' to close the tensor value");
}

static int parse_scalar_value(parser *p, mil_value *out) {
    out->type.dtype = dtype_of(&p->tok);
    next(p);
    if (expect_punct(p, '(', "'('") != 0) return -1;
    out->kind = MIL_VAL_SCALAR;
    if (out->type.dtype == MIL_DT_STRING) {
        if (parse_string(p, &out->string) != 0) return -1;
    } else {
        double *num = mil_arena_alloc(p->arena, sizeof(double));
        if (!num) return out_of_memory(p);
        if (parse_number(p, out->type.dtype, num) != 0) return -1;
        out->numbers = num;
        out->n_numbers = 1;
    }
    return expect_punct(p, ')', "')' to close the literal");
}

static int parse_tuple(parser *p, mil_value *out) {
    next(p);   // '('
    // a vector in the arena that doubles; the abandoned copies stay in the
    // arena, at most as much again as the final one
    size_t cap = 8, n = 0;
    mil_value *items = mil_arena_alloc(p->arena, cap * sizeof *items);
    if (!items) return out_of_memory(p);
    for (;;) {
        if (n == MIL_MAX_TUPLE)
            return fail_at(p, p->tok.line, p->tok.column, "a tuple may hold at most %d values",
                           MIL_MAX_TUPLE);
        if (n == cap) {
            mil_value *bigger = mil_arena_alloc(p->arena, 2 * cap * sizeof *items);
            if (!bigger) return out_of_memory(p);
            memcpy(bigger, items, n * sizeof *items);
            items = bigger;
            cap *= 2;
        }
        if (parse_value(p, &items[n], 1) != 0) return -1;
        n++;
        if (is_punct(p, ')')) break;
        if (expect_punct(p, ',', "',' or ')' in the tuple") != 0) return -1;
    }
    next(p);
    out->kind = MIL_VAL_TUPLE;
    out->items = items;
    out->n_items = n;
    return 0;
}

static int parse_value(parser *p, mil_value *out, int in_tuple) {
    memset(out, 0, sizeof *out);
    out->line = p->tok.line;
    out->column = p->tok.column;
    if (is_punct(p, '(')) {
        if (in_tuple)
            return fail_at(p, p->tok.line, p->tok.column, "tuples do not nest");
        return parse_tuple(p, out);
    }
    if (p->tok.kind != TOK_IDENT)
        return expected(p, "a value (a name, a literal such as fp16(0.5), a tensor literal, or "
                           "a tuple (a, b))");
    if (tok_is(&p->tok, "tensor") && p->ahead.kind == TOK_PUNCT && p->ahead.punct == '<')
        return parse_tensor_value(p, out);
    if (dtype_of(&p->tok) != MIL_DT_INVALID && p->ahead.kind == TOK_PUNCT && p->ahead.punct == '(')
        return parse_scalar_value(p, out);
    out->kind = MIL_VAL_REF;
    return expect_name(p, "a name", &out->name);
}

// ----------------------------------------------------------------------------
// statements

// NAME '=' value { ',' NAME '=' value } up to `close`; copied into the arena.
static int parse_args(parser *p, char close, const mil_arg **out, size_t *n_out) {
    mil_arg args[MIL_MAX_ARGS];
    size_t n = 0;
    if (!is_punct(p, close)) {
        for (;;) {
            if (n == MIL_MAX_ARGS)
                return fail_at(p, p->tok.line, p->tok.column, "more than %d arguments",
                               MIL_MAX_ARGS);
            if (expect_name(p, "an argument name", &args[n].name) != 0) return -1;
            if (expect_punct(p, '=', "'=' after the argument name") != 0) return -1;
            if (parse_value(p, &args[n].value, 0) != 0) return -1;
            n++;
            if (is_punct(p, close)) break;
            if (expect_punct(p, ',', close == ')' ? "',' or ')' after an argument"
                                                  : "',' or ']' after an attribute") != 0)
                return -1;
        }
    }
    next(p);   // close
    mil_arg *copy = mil_arena_alloc(p->arena, (n ? n : 1) * sizeof *copy);
    if (!copy) return out_of_memory(p);
    memcpy(copy, args, n * sizeof *copy);
    *out = copy;
    *n_out = n;
    return 0;
}

static int note_blob(parser *p, const mil_value *v, const char *owner) {
    if (p->n_blobs == p->cap_blobs) {
        size_t cap = p->cap_blobs ? 2 * p->cap_blobs : 64;
        const mil_value **b = realloc(p->blobs, cap * sizeof *b);
        if (b) p->blobs = b;
        const char **o = realloc(p->owners, cap * sizeof *o);
        if (o) p->owners = o;
        if (!b || !o) return out_of_memory(p);
        p->cap_blobs = cap;
    }
    p->owners[p->n_blobs] = owner;
    p->blobs[p->n_blobs++] = v;
    return 0;
}

static int note_blobs(parser *p, const mil_arg *args, size_t n, const char *owner) {
    for (size_t i = 0; i < n; i++) {
        const mil_value *v = &args[i].value;
        if (v->kind == MIL_VAL_BLOBFILE && note_blob(p, v, owner) != 0) return -1;
        for (size_t k = 0; v->kind == MIL_VAL_TUPLE && k < v->n_items; k++)
            if (v->items[k].kind == MIL_VAL_BLOBFILE && note_blob(p, &v->items[k], owner) != 0)
                return -1;
    }
    return 0;
}

static int parse_stmt(parser *p) {
    if (p->n_stmts == MIL_MAX_STMTS)
        return fail_at(p, p->tok.line, p->tok.column, "more than %d statements", MIL_MAX_STMTS);
    mil_stmt st = {0};
    st.line = p->tok.line;
    st.column = p->tok.column;
    const char *names[MIL_MAX_RESULTS];
    mil_type types[MIL_MAX_RESULTS];
    size_t n = 0;
    // several results are written either bare or in parentheses:
    // "tensor<..> a, tensor<..> b = split(...)" or "(tensor<..> a, tensor<..> b) = ..."
    int paren = is_punct(p, '(');
    if (paren) next(p);
    for (;;) {
        if (n == MIL_MAX_RESULTS)
            return fail_at(p, p->tok.line, p->tok.column, "more than %d results",
                           MIL_MAX_RESULTS);
        if (parse_type(p, &types[n]) != 0) return -1;
        if (expect_name(p, "a result name", &names[n]) != 0) return -1;
        n++;
        if (!is_punct(p, ',')) break;
        next(p);
    }
    if (paren && expect_punct(p, ')', "')' after the results") != 0) return -1;
    if (expect_punct(p, '=', "'=' after the result") != 0) return -1;
    if (expect_name(p, "an op name", &st.op) != 0) return -1;
    if (expect_punct(p, '(', "'(' after the op name") != 0) return -1;
    if (parse_args(p, ')', &st.args, &st.n_args) != 0) return -1;
    if (is_punct(p, '[')) {
        next(p);
        if (parse_args(p, ']', &st.attrs, &st.n_attrs) != 0) return -1;
    }
    if (expect_punct(p, ';', "';' at the end of the statement") != 0) return -1;

    const char **rn = mil_arena_alloc(p->arena, n * sizeof *rn);
    mil_type *rt = mil_arena_alloc(p->arena, n * sizeof *rt);
    if (!rn || !rt) return out_of_memory(p);
    memcpy(rn, names, n * sizeof *rn);
    memcpy(rt, types, n * sizeof *rt);
    st.results = rn;
    st.types = rt;
    st.n_results = n;
    if (note_blobs(p, st.args, st.n_args, rn[0]) != 0 ||
        note_blobs(p, st.attrs, st.n_attrs, rn[0]) != 0)
        return -1;

    if (p->n_stmts == p->cap_stmts) {
        size_t cap = p->cap_stmts ? 2 * p->cap_stmts : 64;
        if (cap > MIL_MAX_STMTS) cap = MIL_MAX_STMTS;
        mil_stmt *s = realloc(p->stmts, cap * sizeof *s);
        if (!s) return out_of_memory(p);
        p->stmts = s;
        p->cap_stmts = cap;
    }
    p->stmts[p->n_stmts++] = st;
    return 0;
}

// ----------------------------------------------------------------------------
// program

static int parse_build_info(parser *p) {
    next(p);   // '['
    if (expect_word(p, "buildInfo") != 0) return -1;
    if (expect_punct(p, '=', "'=' after buildInfo") != 0) return -1;
    if (expect_word(p, "dict") != 0) return -1;
    if (expect_punct(p, '<', "'<' after dict") != 0) return -1;
    if (expect_word(p, "string") != 0) return -1;
    if (expect_punct(p, ',', "','") != 0) return -1;
    if (expect_word(p, "string") != 0) return -1;
    if (expect_punct(p, '>', "'>'") != 0) return -1;
    if (expect_punct(p, '(', "'(' after the dict type") != 0) return -1;
    if (expect_punct(p, '{', "'{' to open the dict") != 0) return -1;
    int pairs = 0;
    while (!is_punct(p, '}')) {
        if (pairs == MIL_MAX_BUILDINFO)
            return fail_at(p, p->tok.line, p->tok.column, "more than %d buildInfo entries",
                           MIL_MAX_BUILDINFO);
        if (pairs > 0 && expect_punct(p, ',', "',' or '}' between entries") != 0) return -1;
        const char *k, *v;   // read and checked; the device ignores what they say
        if (expect_punct(p, '{', "'{' to open a key-value pair") != 0) return -1;
        if (parse_string(p, &k) != 0) return -1;
        if (expect_punct(p, ',', "',' between key and value") != 0) return -1;
        if (parse_string(p, &v) != 0) return -1;
        if (expect_punct(p, '}', "'}' to close the pair") != 0) return -1;
        pairs++;
    }
    next(p);   // '}'
    if (expect_punct(p, ')', "')' to close the dict") != 0) return -1;
    return expect_punct(p, ']', "']' to close the attributes");
}

static int parse_params(parser *p) {
    mil_param params[MIL_MAX_INPUTS];
    size_t n = 0;
    if (expect_punct(p, '(', "'(' to open the parameter list") != 0) return -1;
    if (!is_punct(p, ')')) {
        for (;;) {
            if (n == MIL_MAX_INPUTS)
                return fail_at(p, p->tok.line, p->tok.column, "more than %d inputs",
                               MIL_MAX_INPUTS);
            params[n].line = p->tok.line;
            params[n].column = p->tok.column;
            if (parse_type(p, &params[n].type) != 0) return -1;
            if (expect_name(p, "a parameter name", &params[n].name) != 0) return -1;
            n++;
            if (is_punct(p, ')')) break;
            if (expect_punct(p, ',', "',' or ')' in the parameter list") != 0) return -1;
        }
    }
    next(p);
    mil_param *copy = mil_arena_alloc(p->arena, (n ? n : 1) * sizeof *copy);
    if (!copy) return out_of_memory(p);
    memcpy(copy, params, n * sizeof *copy);
    p->prog->inputs = copy;
    p->prog->n_inputs = n;
    return 0;
}

static int parse_outputs(parser *p) {
    const char *names[MIL_MAX_OUTPUTS];
    int lines[MIL_MAX_OUTPUTS];
    size_t n = 0;
    if (expect_punct(p, '(', "'(' to open the list of returned names") != 0) return -1;
    if (!is_punct(p, ')')) {
        for (;;) {
            if (n == MIL_MAX_OUTPUTS)
                return fail_at(p, p->tok.line, p->tok.column, "more than %d outputs",
                               MIL_MAX_OUTPUTS);
            lines[n] = p->tok.line;
            if (expect_name(p, "a returned name", &names[n]) != 0) return -1;
            n++;
            if (is_punct(p, ')')) break;
            if (expect_punct(p, ',', "',' or ')' in the returned names") != 0) return -1;
        }
    }
    next(p);
    const char **cn = mil_arena_alloc(p->arena, (n ? n : 1) * sizeof *cn);
    int *cl = mil_arena_alloc(p->arena, (n ? n : 1) * sizeof *cl);
    if (!cn || !cl) return out_of_memory(p);
    memcpy(cn, names, n * sizeof *cn);
    memcpy(cl, lines, n * sizeof *cl);
    p->prog->outputs = cn;
    p->prog->output_lines = cl;
    p->prog->n_outputs = n;
    return 0;
}

static int parse_function(parser *p) {
    if (expect_word(p, "func") != 0) return -1;
    if (expect_name(p, "the function name", &p->prog->function) != 0) return -1;
    if (expect_punct(p, '<', "'<' before the opset") != 0) return -1;
    if (expect_name(p, "an opset such as ios18", &p->prog->opset) != 0) return -1;
    if (expect_punct(p, '>', "'>' after the opset") != 0) return -1;
    if (parse_params(p) != 0) return -1;
    if (expect_punct(p, '{', "'{' to open the function body") != 0) return -1;
    while (!is_punct(p, '}')) {
        if (p->tok.kind == TOK_EOF) return expected(p, "a statement or '}'");
        if (parse_stmt(p) != 0) return -1;
    }
    next(p);
    if (p->tok.kind != TOK_ARROW) return expected(p, "'->' and the returned names");
    next(p);
    if (parse_outputs(p) != 0) return -1;
    if (is_punct(p, ';')) next(p);
    return 0;
}

// DIGITS '.' DIGITS, as in program(1.3)
static int valid_version(const mil_token *t) {
    if (t->kind != TOK_NUMBER || t->len > 16) return 0;
    size_t i = 0, a = 0, b = 0;
    while (i < t->len && t->start[i] >= '0' && t->start[i] <= '9') i++, a++;
    if (i == t->len || t->start[i++] != '.') return 0;
    while (i < t->len && t->start[i] >= '0' && t->start[i] <= '9') i++, b++;
    return a > 0 && b > 0 && i == t->len;
}

static int parse_program(parser *p) {
    if (expect_word(p, "program") != 0) return -1;
    if (expect_punct(p, '(', "'(' after program") != 0) return -1;
    if (!valid_version(&p->tok)) return expected(p, "a version such as 1.3");
    p->prog->version = mil_arena_strndup(p->arena, p->tok.start, p->tok.len);
    if (!p->prog->version) return out_of_memory(p);
    next(p);
    if (expect_punct(p, ')', "')' after the version") != 0) return -1;
    if (is_punct(p, '[') && parse_build_info(p) != 0) return -1;
    if (expect_punct(p, '{', "'{' to open the program body") != 0) return -1;
    if (parse_function(p) != 0) return -1;
    if (tok_is(&p->tok, "func"))
        return fail_at(p, p->tok.line, p->tok.column, "only one function per program is supported");
    if (expect_punct(p, '}', "'}' to close the program") != 0) return -1;
    if (p->tok.kind != TOK_EOF) return expected(p, "end of input");
    return 0;
}

orion_status mil_parse(const char *text, size_t len, mil_program **out) {
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_parse: out is NULL");
    *out = NULL;
    if (!text && len) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "mil_parse: text is NULL");
    if (len > MIL_MAX_TEXT_BYTES)
        return orion_fail(ORION_ERR_PARSE, "line 1, column 1: MIL text is %zu bytes, the limit "
                          "is %zu", len, MIL_MAX_TEXT_BYTES);
    parser p;
    memset(&p, 0, sizeof p);
    p.arena = mil_arena_new();
    if (!p.arena) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while parsing MIL");
    p.prog = mil_arena_alloc(p.arena, sizeof *p.prog);
    if (!p.prog) {
        mil_arena_free(p.arena);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory while parsing MIL");
    }
    p.prog->arena = p.arena;
    mil_lexer_init(&p.lx, text ? text : "", len);
    p.ahead = mil_lexer_next(&p.lx);
    next(&p);

    int rc = parse_program(&p);
    // the arena owns the vectors from here on, so one free releases all
    p.arena->stmts = p.stmts;
    p.arena->blobfiles = p.blobs;
    p.arena->blob_owners = p.owners;
    p.arena->n_blobfiles = p.n_blobs;
    p.prog->stmts = p.stmts;
    p.prog->n_stmts = p.n_stmts;
    if (rc != 0) {
        mil_arena_free(p.arena);
        return p.status;
    }
    orion_status st = mil_index_build(p.prog);
    if (st != ORION_OK) {
        mil_arena_free(p.arena);
        return orion_fail(st, "out of memory while indexing the MIL program");
    }
    *out = p.prog;
    return ORION_OK;
}
