/* weight_cache.c -- see weight_cache.h. */
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "folder.h"
#include "regular_file.h"
#include "weight_cache.h"

#ifdef __APPLE__
#define MTIME(st) ((st)->st_mtimespec)
#else
#define MTIME(st) ((st)->st_mtim)
#endif

struct weight_bytes {
    dev_t dev;
    ino_t ino;
    uint64_t size;
    struct timespec mtime;
    void *data;
    uint64_t refs;
    weight_bytes *next;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static weight_bytes *entries;
static uint64_t resident;

static int same_version(const weight_bytes *e, const struct stat *st) {
    return e->dev == st->st_dev && e->ino == st->st_ino && e->size == (uint64_t)st->st_size &&
           e->mtime.tv_sec == MTIME(st).tv_sec && e->mtime.tv_nsec == MTIME(st).tv_nsec;
}

orion_status weight_bytes_acquire(const char *path, weight_bytes **out, const void **bytes,
                                  uint64_t *size) {
    int fd;
    struct stat st;
    orion_status rc = open_regular_file(path, O_RDONLY, &fd, &st);
    if (rc != ORION_OK) return rc;
    close(fd);
    pthread_mutex_lock(&lock);
    for (weight_bytes *e = entries; e; e = e->next)
        if (same_version(e, &st)) {
            e->refs++;
            pthread_mutex_unlock(&lock);
            *out = e;
            *bytes = e->data;
            *size = e->size;
            return ORION_OK;
        }
    pthread_mutex_unlock(&lock);
    weight_bytes *e = calloc(1, sizeof *e);
    if (!e) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "no memory to read %s", path);
    uint64_t cap = 0, got = 0;
    if ((rc = folder_read_file(path, &e->data, &cap, &got)) != ORION_OK) {
        free(e->data);
        free(e);
        return rc;
    }
    /* keyed by the version read: the stat taken before it, unless it changed meanwhile */
    struct stat now;
    if (stat(path, &now) != 0 || !same_version(&(weight_bytes){.dev = st.st_dev,
            .ino = st.st_ino, .size = got, .mtime = MTIME(&st)}, &now))
        st.st_ino = 0, st.st_dev = 0;   /* a private copy no later load will match */
    e->dev = st.st_dev;
    e->ino = st.st_ino;
    e->size = got;
    e->mtime = MTIME(&st);
    e->refs = 1;
    pthread_mutex_lock(&lock);
    e->next = entries;
    entries = e;
    resident += got;
    pthread_mutex_unlock(&lock);
    *out = e;
    *bytes = e->data;
    *size = got;
    return ORION_OK;
}

void weight_bytes_release(weight_bytes *held) {
    if (!held) return;
    pthread_mutex_lock(&lock);
    if (--held->refs == 0) {
        for (weight_bytes **q = &entries; *q; q = &(*q)->next)
            if (*q == held) {
                *q = held->next;
                break;
            }
        resident -= held->size;
    } else {
        held = NULL;
    }
    pthread_mutex_unlock(&lock);
    if (held) {
        free(held->data);
        free(held);
    }
}

uint64_t orion_weight_memory_bytes(void) {
    pthread_mutex_lock(&lock);
    uint64_t n = resident;
    pthread_mutex_unlock(&lock);
    return n;
}
