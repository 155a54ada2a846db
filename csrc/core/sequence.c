/* sequence.c -- evals and host copies declared once, run by one call (orion.h,
 * "sequences"). The steps hold handles, not objects: every run looks each one
 * up again, so a program or surface released since the step was added fails
 * that step with ORION_ERR_RELEASED instead of being touched. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "handles.h"
#include "surface.h"

#define MAX_STEPS 65536u

typedef struct step {
    orion_program program;          /* 0 for a copy */
    orion_surface *surfaces;        /* an eval's inputs, then its outputs */
    uint64_t n_inputs, n_outputs;
    orion_sequence_copy copy;
} step;

typedef struct sequence {
    handle_obj obj;                 /* first: the handle table's view */
    pthread_mutex_t lock;           /* adds and runs of one sequence take turns */
    step *steps;
    uint32_t n_steps, capacity;
} sequence;

static handle_table sequences = HANDLE_TABLE_INIT("sequence");

static void sequence_destroy(handle_obj *obj) {
    sequence *q = (sequence *)obj;
    for (uint32_t i = 0; i < q->n_steps; i++) free(q->steps[i].surfaces);
    free(q->steps);
    pthread_mutex_destroy(&q->lock);
    free(q);
}

static orion_status sequence_get(orion_sequence h, sequence **out) {
    handle_obj *obj = NULL;
    orion_status st = handle_get(&sequences, h, &obj);
    *out = (sequence *)obj;
    return st;
}

orion_status orion_sequence_create(orion_sequence *out) {
    orion_clear_error();
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence_create: out is NULL");
    *out = 0;
    sequence *q = calloc(1, sizeof *q);
    if (!q) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for a sequence");
    q->obj.destroy = sequence_destroy;
    pthread_mutex_init(&q->lock, NULL);
    orion_status st = handle_add(&sequences, &q->obj, out);
    if (st != ORION_OK) sequence_destroy(&q->obj);
    return st;
}

orion_status orion_sequence_release(orion_sequence h) {
    orion_clear_error();
    return handle_release(&sequences, h);
}

uint64_t orion_sequence_live_count(void) { return handle_live(&sequences); }

/* Appends a step with the sequence locked; takes ownership of s->surfaces. */
static orion_status append(orion_sequence h, step *s) {
    sequence *q = NULL;
    orion_status st = sequence_get(h, &q);
    if (st != ORION_OK) {
        free(s->surfaces);
        return st;
    }
    pthread_mutex_lock(&q->lock);
    if (q->n_steps == MAX_STEPS) {
        st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "a sequence holds at most %u steps", MAX_STEPS);
    } else if (q->n_steps == q->capacity) {
        uint32_t cap = q->capacity ? q->capacity * 2 : 16;
        step *grown = realloc(q->steps, cap * sizeof *grown);
        if (!grown) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for a sequence step");
        else q->steps = grown, q->capacity = cap;
    }
    if (st == ORION_OK) q->steps[q->n_steps++] = *s;
    else free(s->surfaces);
    pthread_mutex_unlock(&q->lock);
    handle_put(&q->obj);
    return st;
}

orion_status orion_sequence_add_eval(orion_sequence h, orion_program program,
                                     const orion_surface *inputs, uint64_t n_inputs,
                                     const orion_surface *outputs, uint64_t n_outputs) {
    orion_clear_error();
    if ((n_inputs && !inputs) || (n_outputs && !outputs))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence eval: surface array is NULL");
    uint32_t want_in = 0, want_out = 0;
    orion_status st = orion_program_io_count(program, &want_in, &want_out);
    if (st != ORION_OK) return orion_fail_context(st, "sequence eval");
    if (n_inputs != want_in || n_outputs != want_out)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence eval: the program takes %u inputs "
                          "and %u outputs; got %llu and %llu", want_in, want_out,
                          (unsigned long long)n_inputs, (unsigned long long)n_outputs);
    step s = {.program = program, .n_inputs = n_inputs, .n_outputs = n_outputs};
    s.surfaces = malloc((size_t)(n_inputs + n_outputs + 1) * sizeof *s.surfaces);
    if (!s.surfaces) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for a sequence step");
    if (n_inputs) memcpy(s.surfaces, inputs, (size_t)n_inputs * sizeof *inputs);
    if (n_outputs) memcpy(s.surfaces + n_inputs, outputs, (size_t)n_outputs * sizeof *outputs);
    return append(h, &s);
}

/* Whether rows of row_bytes, stride apart from offset, lie inside size bytes. */
static int extent_fits(uint64_t size, uint64_t offset, uint64_t rows, uint64_t row_bytes,
                       uint64_t stride) {
    uint64_t span = 0, end = 0;
    if (__builtin_mul_overflow(rows - 1, stride, &span)) return 0;
    if (__builtin_add_overflow(span, row_bytes, &span)) return 0;
    if (__builtin_add_overflow(offset, span, &end)) return 0;
    return end <= size;
}

/* The destination offset of a run at `position`, or a failure naming the overflow. */
static orion_status dst_offset_at(const orion_sequence_copy *c, uint64_t position, uint64_t *out) {
    uint64_t shift = 0;
    if (__builtin_mul_overflow(position, c->dst_step, &shift) ||
        __builtin_add_overflow(c->dst_offset, shift, out))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "copy destination offset overflows at "
                          "position %llu", (unsigned long long)position);
    return ORION_OK;
}

/* Runs a copy; with `check_only` it checks the extents and copies nothing. */
static orion_status run_copy(const orion_sequence_copy *c, uint64_t position, int check_only) {
    surface_impl *src = NULL, *dst = NULL;
    uint64_t dst_offset = 0;
    orion_status st = surface_get(c->src, &src);
    if (st != ORION_OK) return orion_fail_context(st, "copy source");
    st = surface_get(c->dst, &dst);
    if (st != ORION_OK) {
        surface_put(src);
        return orion_fail_context(st, "copy destination");
    }
    if (!extent_fits(surface_size(src), c->src_offset, c->rows, c->row_bytes, c->src_stride))
        st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "copy reads past the end of its %llu-byte "
                        "source surface", (unsigned long long)surface_size(src));
    if (st == ORION_OK) st = dst_offset_at(c, position, &dst_offset);
    if (st == ORION_OK &&
        !extent_fits(surface_size(dst), dst_offset, c->rows, c->row_bytes, c->dst_stride))
        st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "copy at position %llu writes past the end of "
                        "its %llu-byte destination surface", (unsigned long long)position,
                        (unsigned long long)surface_size(dst));
    if (st == ORION_OK && !check_only) st = surface_lock_impl(src, ORION_LOCK_READ_ONLY);
    if (st == ORION_OK && !check_only) {
        st = surface_lock_impl(dst, 0);
        if (st == ORION_OK) {
            const char *from = (const char *)surface_base(src) + c->src_offset;
            char *to = (char *)surface_base(dst) + dst_offset;
            for (uint64_t r = 0; r < c->rows; r++)
                memcpy(to + r * c->dst_stride, from + r * c->src_stride, c->row_bytes);
            surface_wrote(dst, dst_offset, c->dst_stride, c->rows, c->row_bytes);
            surface_unlock_impl(dst, 0);
        }
        surface_unlock_impl(src, ORION_LOCK_READ_ONLY);
    }
    surface_put(dst);
    surface_put(src);
    return st;
}

orion_status orion_sequence_add_copy(orion_sequence h, const orion_sequence_copy *copy) {
    orion_clear_error();
    if (!copy) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence copy is NULL");
    if (copy->src == copy->dst)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence copy: source and destination are "
                          "the same surface");
    if (copy->rows == 0 || copy->row_bytes == 0)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence copy of %llu rows of %llu bytes: "
                          "both must be > 0", (unsigned long long)copy->rows,
                          (unsigned long long)copy->row_bytes);
    if (copy->rows > 1 && (copy->src_stride < copy->row_bytes || copy->dst_stride < copy->row_bytes))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence copy: rows of %llu bytes overlap "
                          "at strides %llu (source) and %llu (destination)",
                          (unsigned long long)copy->row_bytes,
                          (unsigned long long)copy->src_stride,
                          (unsigned long long)copy->dst_stride);
    orion_status st = run_copy(copy, 0, 1);   /* position 0 must fit; later ones at run */
    if (st != ORION_OK) return orion_fail_context(st, "sequence copy");
    step s = {.copy = *copy};
    return append(h, &s);
}

/* The next eval after step i, or -1. */
static int64_t next_eval(const sequence *q, uint32_t i) {
    for (uint32_t j = i + 1; j < q->n_steps; j++)
        if (q->steps[j].program) return j;
    return -1;
}

/* The first eval step whose program is not loaded (-1: none); a released program
 * fails with ORION_ERR_RELEASED, its step named. Called with q->lock held. */
static orion_status first_unloaded(const sequence *q, int64_t *index) {
    *index = -1;
    for (uint32_t i = 0; i < q->n_steps; i++) {
        int loaded = 0;
        if (!q->steps[i].program) continue;
        orion_status st = orion_program_is_loaded(q->steps[i].program, &loaded);
        if (st != ORION_OK) return orion_fail_context(st, "sequence step %u (eval)", i);
        if (!loaded) {
            *index = i;
            break;
        }
    }
    return ORION_OK;
}

orion_status orion_sequence_ready(orion_sequence h, int *out) {
    orion_clear_error();
    if (!out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "sequence_ready: out is NULL");
    *out = 0;
    sequence *q = NULL;
    orion_status st = sequence_get(h, &q);
    if (st != ORION_OK) return st;
    int64_t unloaded = -1;
    pthread_mutex_lock(&q->lock);
    st = first_unloaded(q, &unloaded);
    pthread_mutex_unlock(&q->lock);
    handle_put(&q->obj);
    *out = st == ORION_OK && unloaded < 0;
    return st;
}

orion_status orion_sequence_run(orion_sequence h, uint64_t position) {
    orion_clear_error();
    sequence *q = NULL;
    orion_status st = sequence_get(h, &q);
    if (st != ORION_OK) return st;
    pthread_mutex_lock(&q->lock);
    /* every program loaded before any step runs: a run that cannot finish for that
     * reason changes nothing (a decode step's host copies would be half done) */
    int64_t unloaded = -1;
    st = first_unloaded(q, &unloaded);
    if (st == ORION_OK && unloaded >= 0)
        st = orion_fail(ORION_ERR_STATE, "sequence step %lld (eval): its program is not "
                        "loaded; no step ran", (long long)unloaded);
    for (uint32_t i = 0; i < q->n_steps && st == ORION_OK; i++) {
        const step *s = &q->steps[i];
        if (s->program) {
            st = orion_program_eval(s->program, s->surfaces, s->n_inputs,
                                    s->surfaces + s->n_inputs, s->n_outputs);
            int64_t next = st == ORION_OK ? next_eval(q, i) : -1;
            /* a hint: a failure here (the next program released) is the next step's to
             * report, so its message is not left behind */
            if (next >= 0 && orion_program_prefetch(q->steps[next].program) != ORION_OK)
                orion_clear_error();
        } else {
            st = run_copy(&s->copy, position, 0);
        }
        if (st != ORION_OK)
            orion_fail_context(st, "sequence step %u (%s)", i, s->program ? "eval" : "copy");
    }
    pthread_mutex_unlock(&q->lock);
    handle_put(&q->obj);
    return st;
}
