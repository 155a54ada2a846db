/* weight_share.c -- see weight_share.h. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "folder.h"
#include "regular_file.h"
#include "weight_share.h"

#define MIN_SHARED_BYTES 4096u   /* smaller files are not worth a comparison */

typedef struct {
    char *path;
    uint64_t size;
} candidate;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static candidate *candidates;
static size_t n_candidates, cap_candidates;

/* 1 if the regular file at `path` holds exactly `data`. */
static int holds_bytes(const char *path, const void *data, uint64_t nbytes) {
    int fd;
    struct stat st;
    if (open_regular_file(path, O_RDONLY | O_NOFOLLOW, &fd, &st) != ORION_OK) {
        orion_clear_error();
        return 0;
    }
    int same = 0;
    if ((uint64_t)st.st_size == nbytes) {
        void *map = mmap(NULL, (size_t)nbytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map != MAP_FAILED) {
            same = memcmp(map, data, (size_t)nbytes) == 0;
            munmap(map, (size_t)nbytes);
        }
    }
    close(fd);
    return same;
}

static void remember_locked(const char *path, uint64_t size) {
    if (n_candidates == cap_candidates) {
        size_t cap = cap_candidates ? 2 * cap_candidates : 64;
        candidate *grown = realloc(candidates, cap * sizeof *grown);
        if (!grown) return;   /* only a missed chance to share */
        candidates = grown;
        cap_candidates = cap;
    }
    char *copy = strdup(path);
    if (!copy) return;
    candidates[n_candidates++] = (candidate){copy, size};
}

static void forget_at_locked(size_t i) {
    free(candidates[i].path);
    candidates[i] = candidates[--n_candidates];
}

orion_status weight_share_write(const char *folder, const char *relpath, const void *data,
                                uint64_t nbytes) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", folder, relpath);
    if (n < 0 || (size_t)n >= sizeof path)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "path %s/%s is too long", folder, relpath);
    if (nbytes < MIN_SHARED_BYTES) return folder_write_file(folder, relpath, data, nbytes);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    orion_status st = folder_make_dirs(path);
    *slash = '/';
    if (st != ORION_OK) return st;
    /* never write through a link left at this path: that would change its other names */
    if (unlink(path) != 0 && errno != ENOENT)
        return orion_fail(ORION_ERR_IO, "cannot replace %s: %s", path, strerror(errno));
    int linked = 0;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_candidates && !linked; i++)
        if (candidates[i].size == nbytes && holds_bytes(candidates[i].path, data, nbytes))
            linked = link(candidates[i].path, path) == 0;
    pthread_mutex_unlock(&lock);
    if (!linked && (st = folder_write_file(folder, relpath, data, nbytes)) != ORION_OK) return st;
    pthread_mutex_lock(&lock);
    remember_locked(path, nbytes);
    pthread_mutex_unlock(&lock);
    return ORION_OK;
}

void weight_share_forget_folder(const char *folder) {
    size_t len = strlen(folder);
    pthread_mutex_lock(&lock);
    for (size_t i = n_candidates; i-- > 0;)
        if (strncmp(candidates[i].path, folder, len) == 0 && candidates[i].path[len] == '/')
            forget_at_locked(i);
    if (n_candidates == 0) {
        free(candidates);
        candidates = NULL;
        cap_candidates = 0;
    }
    pthread_mutex_unlock(&lock);
}

orion_status weight_share_unshare(const char *path) {
    pthread_mutex_lock(&lock);
    for (size_t i = n_candidates; i-- > 0;)
        if (strcmp(candidates[i].path, path) == 0) forget_at_locked(i);
    pthread_mutex_unlock(&lock);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink < 2)
        return ORION_OK;   /* own file already (the patch itself reports a bad path) */
    void *buf = NULL;
    uint64_t cap = 0, size = 0;
    orion_status rc = folder_read_file(path, &buf, &cap, &size);
    char tmp[4096];
    if (rc == ORION_OK && snprintf(tmp, sizeof tmp, "%s.own", path) >= (int)sizeof tmp)
        rc = orion_fail(ORION_ERR_INVALID_ARGUMENT, "path %s is too long", path);
    if (rc == ORION_OK) {
        char *slash = strrchr(tmp, '/');
        *slash = '\0';
        rc = folder_write_file(tmp, slash + 1, buf, size);
        *slash = '/';
    }
    if (rc == ORION_OK && rename(tmp, path) != 0) {
        rc = orion_fail(ORION_ERR_IO, "cannot replace %s by its own copy: %s", path,
                        strerror(errno));
        unlink(tmp);
    }
    free(buf);
    return rc;
}
