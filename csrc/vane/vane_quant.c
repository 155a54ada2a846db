/* vane_quant.c -- the weights constexpr ops define (vane_plan.h, vane_quant):
 * their layout as a vk_qmat (plan time), and its pointers into the consts read
 * at load, with the inputs the kernels cannot read as stored (integer offsets
 * and zero points, literals, scalar scales) converted to fp16 arrays.
 *
 * The kernels see a weight as a matrix: its first axis by the rest. A layout
 * whose blocks do not fit that view (blocks along an axis past the second,
 * vector palettization) is refused here by name; the verifier has checked the
 * rest (ANE-C50..C54). */
#include <stdlib.h>
#include <string.h>

#include "../core/error.h"
#include "vane_plan.h"

static orion_status qfail(const mil_stmt *st, const char *what)
{
    return orion_fail(ORION_ERR_INVALID_ARGUMENT, "vane: line %d (%s %s): %s", st->line, st->op,
                      st->results[0], what);
}

static int64_t inner_of(const vane_slot *s)
{
    int64_t n = 1;
    for (int i = 2; i < s->rank; i++) n *= s->shape[i];
    return n;
}

/* Blocks from a grid `g` (one scale, offset or table per cell) over data `d`,
 * both of d's rank: cells along the first two axes only. */
static orion_status blocks_of(const vane_slot *d, const int64_t *g, vk_qmat *m,
                              const mil_stmt *st)
{
    for (int i = 2; i < d->rank; i++)
        if (g[i] != 1) return qfail(st, "blocks along an axis past the second are not implemented");
    int64_t g0 = d->rank ? g[0] : 1, g1 = d->rank > 1 ? g[1] : 1;
    if (g0 < 1 || g1 < 1 || (int64_t)m->rows % g0 || (m->cols / inner_of(d)) % g1)
        return qfail(st, "the blocks do not tile the weight");
    m->brows = m->rows / (size_t)g0;
    m->bcols = m->cols / (size_t)g1;
    return ORION_OK;
}

orion_status vane_quant_plan(vane_plan *pl, vane_quant *q, const mil_stmt *st)
{
    const vane_slot *d = &pl->slots[q->data];
    vk_qmat *m = &q->m;
    memset(m, 0, sizeof *m);
    m->rows = d->rank ? (size_t)d->shape[0] : 1;
    m->cols = (size_t)(d->numel / (int64_t)m->rows);
    m->bits = mil_dtype_bits(d->dtype);
    m->is_signed = d->dtype == MIL_DT_INT4 || d->dtype == MIL_DT_INT8;
    int64_t grid[MIL_MAX_RANK];
    for (int i = 0; i < MIL_MAX_RANK; i++) grid[i] = 1;
    if (q->kind == MIL_OP_CONSTEXPR_LUT) {
        const vane_slot *l = &pl->slots[q->lut];
        if (l->shape[l->rank - 1] != 1)
            return qfail(st, "vector palettization (a lut vector size above 1) is not implemented");
        m->is_signed = 0;
        return blocks_of(d, l->shape, m, st);
    }
    const vane_slot *s = &pl->slots[q->scale];
    if (q->kind == MIL_OP_CONSTEXPR_SHIFT_SCALE) return blocks_of(d, s->shape, m, st);
    /* affine: a scalar scale (and zero point), or one per index of the axis */
    const mil_arg *a = mil_stmt_attr(st, "axis");
    int64_t axis = a && a->value.numbers ? (int64_t)a->value.numbers[0] : 0;
    if (axis < 0) axis += d->rank;
    const vane_slot *z = &pl->slots[q->offset];
    if (s->rank || z->rank) {
        if (axis < 0 || axis >= d->rank) return qfail(st, "axis is out of range");
        grid[axis] = d->shape[axis];
    }
    return blocks_of(d, grid, m, st);
}

/* ---- load ------------------------------------------------------------------ */

static float number_at(const vane_slot *s, size_t i)
{
    const mil_value *v = s->value;
    return (float)v->numbers[v->n_numbers == 1 ? 0 : i];
}

/* Element i of a loaded const of any dtype, as a float (codes sign-extended). */
static float element_at(const vane_slot *s, size_t i)
{
    if (s->value->kind != MIL_VAL_BLOBFILE) return number_at(s, s->numel == 1 ? 0 : i);
    if (s->numel == 1) i = 0;
    const uint8_t *p = s->data;
    switch (s->dtype) {
    case MIL_DT_FP16: return vk_f16_to_f32(((const fp16_t *)p)[i]);
    case MIL_DT_FP32: return ((const float *)p)[i];
    case MIL_DT_INT8: return (float)(int8_t)p[i];
    case MIL_DT_UINT8: return (float)p[i];
    default: {
        unsigned bits = mil_dtype_bits(s->dtype);
        size_t bit = i * bits;
        unsigned v = p[bit >> 3];
        if ((bit & 7) + bits > 8) v |= (unsigned)p[(bit >> 3) + 1] << 8;
        v = (v >> (bit & 7)) & ((1u << bits) - 1);
        if (s->dtype == MIL_DT_INT4 && (v & 8)) return (float)v - 16.0f;
        return (float)v;
    }
    }
}

/* Slot `id` as `n` fp16 values: its own bytes when it is an fp16 blob of n
 * values, else a converted copy owned by q (a scalar is repeated). */
static orion_status as_fp16(vane_plan *pl, vane_quant *q, int id, size_t n, int k,
                            const fp16_t **out)
{
    const vane_slot *s = &pl->slots[id];
    if (s->dtype == MIL_DT_FP16 && s->value->kind == MIL_VAL_BLOBFILE && (size_t)s->numel == n) {
        *out = s->data;
        return ORION_OK;
    }
    fp16_t *h = malloc((n ? n : 1) * sizeof *h);
    if (!h) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory decoding weights");
    for (size_t i = 0; i < n; i++) h[i] = vk_f32_to_f16(element_at(s, i));
    q->owned[k] = h;
    *out = h;
    return ORION_OK;
}

static orion_status bind_one(vane_plan *pl, vane_quant *q)
{
    vk_qmat *m = &q->m;
    const vane_slot *d = &pl->slots[q->data];
    size_t blocks = (m->rows / m->brows) * (m->cols / m->bcols);
    orion_status rc;
    if (d->value->kind == MIL_VAL_BLOBFILE) {
        m->codes = d->data;
    } else {                    /* a literal: its numbers packed as a blob would hold them */
        size_t nbytes = ((size_t)d->numel * m->bits + 7) / 8;
        uint8_t *c = calloc(nbytes ? nbytes : 1, 1);
        if (!c) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory");
        for (size_t i = 0; i < (size_t)d->numel; i++) {
            unsigned v = (unsigned)(int)number_at(d, i) & ((1u << m->bits) - 1);
            size_t bit = i * m->bits;
            c[bit >> 3] |= (uint8_t)(v << (bit & 7));
            if ((bit & 7) + m->bits > 8) c[(bit >> 3) + 1] |= (uint8_t)(v >> (8 - (bit & 7)));
        }
        q->codes_owned = c;
        m->codes = c;
    }
    if (q->kind == MIL_OP_CONSTEXPR_LUT) {
        rc = as_fp16(pl, q, q->lut, blocks << m->bits, 0, &m->lut);
    } else {
        rc = as_fp16(pl, q, q->scale, blocks, 0, &m->scale);
        if (rc == ORION_OK && q->offset >= 0) rc = as_fp16(pl, q, q->offset, blocks, 1, &m->offset);
    }
    if (rc) return rc;
    vane_slot *r = &pl->slots[q->result];
    if (q->dense) {
        if (!(q->values = malloc((size_t)r->numel * sizeof(fp16_t))))
            return orion_fail(ORION_ERR_OUT_OF_MEMORY, "vane: out of memory decoding weights");
        vk_qmat_dense(m, q->values);
        r->data = q->values;
    } else {
        r->data = (void *)m->codes;   /* what the warm-up reads ahead of the conv */
    }
    return ORION_OK;
}

orion_status vane_quant_bind(vane_plan *pl)
{
    for (int i = 0; i < pl->n_quants; i++) {
        vane_quant *q = &pl->quants[i];
        if (pl->slots[q->result].data) continue;
        orion_status rc = bind_one(pl, q);
        if (rc) return rc;
    }
    return ORION_OK;
}

void vane_quant_unbind(vane_plan *pl)
{
    for (int i = 0; pl && i < pl->n_quants; i++) {
        vane_quant *q = &pl->quants[i];
        for (int k = 0; k < 4; k++) {
            free(q->owned[k]);
            q->owned[k] = NULL;
        }
        free(q->codes_owned);
        free(q->values);
        q->codes_owned = NULL;
        q->values = NULL;
        q->m.codes = NULL;
        q->m.scale = q->m.offset = q->m.lut = NULL;
        pl->slots[q->result].data = NULL;
    }
}
