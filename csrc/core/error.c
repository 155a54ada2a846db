/* error.c -- status names and the thread-local last-error message. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"

#define ERROR_CAPACITY 2048

static _Thread_local char last_error[ERROR_CAPACITY];

orion_status orion_fail(orion_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

orion_status orion_fail_context(orion_status status, const char *fmt, ...) {
    char previous[ERROR_CAPACITY];
    memcpy(previous, last_error, sizeof previous);
    char context[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    snprintf(last_error, sizeof last_error, "%.500s: %.1500s", context, previous);
    return status;
}

void orion_clear_error(void) { last_error[0] = '\0'; }

const char *orion_last_error(void) { return last_error; }

const char *orion_status_name(orion_status status) {
    switch (status) {
    case ORION_OK: return "ORION_OK";
    case ORION_ERR_INVALID_ARGUMENT: return "ORION_ERR_INVALID_ARGUMENT";
    case ORION_ERR_OUT_OF_MEMORY: return "ORION_ERR_OUT_OF_MEMORY";
    case ORION_ERR_IO: return "ORION_ERR_IO";
    case ORION_ERR_FORMAT: return "ORION_ERR_FORMAT";
    case ORION_ERR_PARSE: return "ORION_ERR_PARSE";
    case ORION_ERR_CONSTRAINT: return "ORION_ERR_CONSTRAINT";
    case ORION_ERR_BUDGET: return "ORION_ERR_BUDGET";
    case ORION_ERR_RELEASED: return "ORION_ERR_RELEASED";
    case ORION_ERR_STATE: return "ORION_ERR_STATE";
    case ORION_ERR_BACKEND_UNAVAILABLE: return "ORION_ERR_BACKEND_UNAVAILABLE";
    case ORION_ERR_EVAL: return "ORION_ERR_EVAL";
    case ORION_ERR_INTERNAL: return "ORION_ERR_INTERNAL";
    }
    return "ORION_ERR_UNKNOWN";
}

const char *orion_version(void) { return ORION_VERSION_STRING; }
