/* catalog.h -- the ANE constraint catalog: ids, one-line titles, fixes.
 * The table itself lives in catalog.c; docs/constraints.md is tested against it. */
#ifndef ORION_CORE_CATALOG_H
#define ORION_CORE_CATALOG_H

#include "../orion.h"

/* Fails with ORION_ERR_CONSTRAINT and a message of the form
 *   "ANE-C01 (concat is not supported): <detail>. Fix: <fix from the table>"
 * `id` must be in the table (an unknown id is an internal error). */
orion_status constraint_fail(const char *id, const char *detail_fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
