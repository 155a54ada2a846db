/* error.h -- the thread-local last-error message behind orion_last_error(). */
#ifndef ORION_CORE_ERROR_H
#define ORION_CORE_ERROR_H

#include "../orion.h"

/* Records a formatted message for this thread and returns status, so callers
 * write `return orion_fail(ORION_ERR_IO, "cannot open %s: %s", p, strerror(e));` */
orion_status orion_fail(orion_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the current message ("while compiling: <old message>"). Returns status. */
orion_status orion_fail_context(orion_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Clears this thread's message (every public entry point starts with it). */
void orion_clear_error(void);

#endif
