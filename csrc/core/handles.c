/* handles.c -- generation-checked handle tables (see handles.h). */
#include <stdlib.h>

#include "error.h"
#include "handles.h"

#define HANDLE_MAX_SLOTS (1u << 24)

static uint32_t handle_slot(uint64_t h) { return (uint32_t)(h & 0xffffffffu) - 1u; }
static uint32_t handle_generation(uint64_t h) { return (uint32_t)(h >> 32); }

static orion_status grow(handle_table *t) {
    uint32_t cap = t->capacity ? t->capacity * 2 : 64;
    if (cap > HANDLE_MAX_SLOTS)
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "too many live %s handles (%u)", t->kind,
                          t->capacity);
    handle_obj **slots = realloc(t->slots, cap * sizeof *slots);
    if (!slots) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for %s handles", t->kind);
    t->slots = slots;
    uint32_t *gens = realloc(t->generations, cap * sizeof *gens);
    if (!gens) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory for %s handles", t->kind);
    t->generations = gens;
    for (uint32_t i = t->capacity; i < cap; i++) {
        slots[i] = NULL;
        gens[i] = 1;
    }
    t->capacity = cap;
    return ORION_OK;
}

orion_status handle_add(handle_table *t, handle_obj *obj, uint64_t *out) {
    obj->refs = 1;
    obj->api_refs = 1;
    pthread_mutex_lock(&t->lock);
    uint32_t slot = 0;
    while (slot < t->capacity && t->slots[slot]) slot++;
    if (slot == t->capacity) {
        orion_status st = grow(t);
        if (st != ORION_OK) {
            pthread_mutex_unlock(&t->lock);
            return st;
        }
    }
    t->slots[slot] = obj;
    t->live++;
    *out = ((uint64_t)t->generations[slot] << 32) | (uint64_t)(slot + 1);
    pthread_mutex_unlock(&t->lock);
    return ORION_OK;
}

/* Looks the handle up with the table locked. */
static orion_status find_locked(handle_table *t, uint64_t h, uint32_t *slot_out) {
    if (h == 0) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "null %s handle", t->kind);
    uint32_t slot = handle_slot(h);
    if (slot >= t->capacity || handle_generation(h) == 0 ||
        handle_generation(h) > t->generations[slot])
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "0x%llx is not a %s handle",
                          (unsigned long long)h, t->kind);
    if (handle_generation(h) != t->generations[slot] || !t->slots[slot])
        return orion_fail(ORION_ERR_RELEASED, "%s 0x%llx was released", t->kind,
                          (unsigned long long)h);
    *slot_out = slot;
    return ORION_OK;
}

orion_status handle_get(handle_table *t, uint64_t h, handle_obj **out) {
    pthread_mutex_lock(&t->lock);
    uint32_t slot = 0;
    orion_status st = find_locked(t, h, &slot);
    if (st == ORION_OK) {
        *out = t->slots[slot];
        __atomic_add_fetch(&(*out)->refs, 1, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&t->lock);
    return st;
}

void handle_put(handle_obj *obj) {
    if (obj && __atomic_sub_fetch(&obj->refs, 1, __ATOMIC_ACQ_REL) == 0) obj->destroy(obj);
}

orion_status handle_retain(handle_table *t, uint64_t h) {
    pthread_mutex_lock(&t->lock);
    uint32_t slot = 0;
    orion_status st = find_locked(t, h, &slot);
    if (st == ORION_OK) t->slots[slot]->api_refs++;
    pthread_mutex_unlock(&t->lock);
    return st;
}

orion_status handle_release(handle_table *t, uint64_t h) {
    pthread_mutex_lock(&t->lock);
    uint32_t slot = 0;
    orion_status st = find_locked(t, h, &slot);
    handle_obj *dead = NULL;
    if (st == ORION_OK && --t->slots[slot]->api_refs == 0) {
        dead = t->slots[slot];
        t->slots[slot] = NULL;
        t->generations[slot]++;   /* every copy of the old handle is now stale */
        t->live--;
    }
    pthread_mutex_unlock(&t->lock);
    handle_put(dead);             /* the table's reference; outside the lock */
    return st;
}

uint64_t handle_live(handle_table *t) {
    pthread_mutex_lock(&t->lock);
    uint64_t n = t->live;
    pthread_mutex_unlock(&t->lock);
    return n;
}
