/* handles.h -- handle tables: the uint64 handles of surfaces and programs.
 *
 * A handle is (generation << 32) | (slot + 1), never 0. Objects are reference
 * counted: the table holds one reference while the handle is valid, and every
 * handle_get takes one more, so an object in use by an eval on one thread
 * outlives a release on another. A stale handle is recognised by its
 * generation and refused with ORION_ERR_RELEASED; it is never dereferenced. */
#ifndef ORION_CORE_HANDLES_H
#define ORION_CORE_HANDLES_H

#include <pthread.h>
#include <stdint.h>
#include "../orion.h"

typedef struct handle_obj {
    int refs;                              /* atomic: table + every get */
    int api_refs;                          /* guarded by the table lock: retain/release */
    void (*destroy)(struct handle_obj *);  /* called once refs reach 0 */
} handle_obj;

typedef struct handle_table {
    pthread_mutex_t lock;
    const char *kind;                      /* "surface", "program": for messages */
    handle_obj **slots;
    uint32_t *generations;
    uint32_t capacity;
    uint64_t live;
} handle_table;

#define HANDLE_TABLE_INIT(kind_name) { PTHREAD_MUTEX_INITIALIZER, kind_name, 0, 0, 0, 0 }

/* Registers obj (refs and api_refs set to 1) and returns its handle. */
orion_status handle_add(handle_table *table, handle_obj *obj, uint64_t *out);
/* Takes a reference; fails for 0, unknown or released handles. */
orion_status handle_get(handle_table *table, uint64_t handle, handle_obj **out);
void handle_put(handle_obj *obj);
/* API-level retain / release; the last release invalidates the handle. */
orion_status handle_retain(handle_table *table, uint64_t handle);
orion_status handle_release(handle_table *table, uint64_t handle);
uint64_t handle_live(handle_table *table);

#endif
