/* store.c -- the program cache across processes (see store.h). */
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "folder.h"
#include "store.h"

#define TMP_PREFIX ".tmp-"

int store_key_ok(const char *key) {
    size_t n = key ? strlen(key) : 0;
    if (n < 16 || n > 128) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f'))) return 0;
    return 1;
}

uint64_t store_max_bytes(void) {
    const char *env = getenv("ORION_CACHE_MAX_BYTES");
    if (!env || !*env) return STORE_DEFAULT_MAX_BYTES;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(env, &end, 10);
    if (errno || *end || env[0] == '-') return STORE_DEFAULT_MAX_BYTES;
    return (uint64_t)v;
}

/* <cache>/store, made (mode 0700) when missing; refused when it is a link, not a
 * directory, or another user's. */
static orion_status store_root(const char *cache, char *buf, size_t capacity) {
    int n = snprintf(buf, capacity, "%s/store", cache);
    if (n < 0 || (size_t)n >= capacity)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
    struct stat st;
    if (lstat(buf, &st) != 0) {
        orion_status rc = folder_make_dirs(buf);
        if (rc != ORION_OK) return rc;
        if (lstat(buf, &st) != 0)
            return orion_fail(ORION_ERR_IO, "program store %s: %s", buf, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != getuid())
        return orion_fail(ORION_ERR_IO, "program store %s is not a directory of this user "
                          "(Orion uses only a folder it made; remove it)", buf);
    return ORION_OK;
}

/* A folder Orion made: a real directory of this user holding the marker file. */
static int marked_folder(const char *path) {
    struct stat st;
    char marker[4096];
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) return 0;
    if (snprintf(marker, sizeof marker, "%s/" PROGRAM_MARKER, path) >= (int)sizeof marker)
        return 0;
    return lstat(marker, &st) == 0 && S_ISREG(st.st_mode);
}

static void touch_marker(const char *entry) {
    char marker[4096];
    if (snprintf(marker, sizeof marker, "%s/" PROGRAM_MARKER, entry) < (int)sizeof marker)
        utimensat(AT_FDCWD, marker, NULL, AT_SYMLINK_NOFOLLOW);
}

orion_status store_find(const char *cache, const char *key, char *buf, size_t capacity,
                        int *found) {
    *found = 0;
    if (!store_key_ok(key))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "store key must be 16 to 128 lower-case "
                          "hex digits");
    if (store_max_bytes() == 0) return ORION_OK;
    char root[4096];
    orion_status rc = store_root(cache, root, sizeof root);
    if (rc != ORION_OK) return rc;
    if (snprintf(buf, capacity, "%s/%s", root, key) >= (int)capacity)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
    if (!marked_folder(buf)) return ORION_OK;
    touch_marker(buf);
    *found = 1;
    return ORION_OK;
}

orion_status store_link_file(const char *src, const char *folder, const char *relpath) {
    char dst[4096];
    if (snprintf(dst, sizeof dst, "%s/%s", folder, relpath) >= (int)sizeof dst)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "path %s/%s is too long", folder, relpath);
    char *slash = strrchr(dst, '/');
    *slash = '\0';
    orion_status rc = folder_make_dirs(dst);
    *slash = '/';
    if (rc != ORION_OK) return rc;
    struct stat st;
    if (lstat(src, &st) != 0 || !S_ISREG(st.st_mode))
        return orion_fail(ORION_ERR_IO, "%s is missing or not a regular file", src);
    if (link(src, dst) == 0) return ORION_OK;
    if (errno != EXDEV && errno != EPERM && errno != EMLINK)
        return orion_fail(ORION_ERR_IO, "cannot link %s to %s: %s", dst, src, strerror(errno));
    void *buf = NULL;   /* another file system, or no hard links there: a copy */
    uint64_t cap = 0, size = 0;
    rc = folder_read_file(src, &buf, &cap, &size);
    if (rc == ORION_OK) rc = folder_write_file(folder, relpath, buf, size);
    free(buf);
    return rc;
}

/* ---- the bound ----------------------------------------------------------- */

typedef struct file_id {
    dev_t dev;
    ino_t ino;
} file_id;

typedef struct usage {
    file_id *seen;      /* files counted once, however many entries link them */
    size_t n, cap;
    uint64_t bytes;
} usage;

static void count_file(usage *u, const struct stat *st) {
    for (size_t i = 0; i < u->n; i++)
        if (u->seen[i].dev == st->st_dev && u->seen[i].ino == st->st_ino) return;
    if (u->n == u->cap) {
        size_t cap = u->cap ? 2 * u->cap : 64;
        file_id *p = realloc(u->seen, cap * sizeof *p);
        if (!p) return;   /* undercounts; the next trim counts again */
        u->seen = p;
        u->cap = cap;
    }
    u->seen[u->n++] = (file_id){st->st_dev, st->st_ino};
    u->bytes += (uint64_t)st->st_size;
}

/* Adds the regular files under `dir` (links are not followed). */
static void count_tree(usage *u, const char *dir, int depth) {
    DIR *d = depth < 8 ? opendir(dir) : NULL;
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) continue;
        if (lstat(path, &st) != 0) continue;
        if (S_ISREG(st.st_mode)) count_file(u, &st);
        else if (S_ISDIR(st.st_mode)) count_tree(u, path, depth + 1);
    }
    closedir(d);
}

typedef struct entry {
    char name[136];
    struct timespec used;
} entry;

static int older(const void *a, const void *b) {
    const struct timespec *x = &((const entry *)a)->used, *y = &((const entry *)b)->used;
    if (x->tv_sec != y->tv_sec) return x->tv_sec < y->tv_sec ? -1 : 1;
    return (x->tv_nsec > y->tv_nsec) - (x->tv_nsec < y->tv_nsec);
}

/* A temp entry of a process that is gone (it died between making and renaming). */
static int stale_temp(const char *name) {
    const char *dash = strrchr(name, '-');
    if (strncmp(name, TMP_PREFIX, strlen(TMP_PREFIX)) != 0 || !dash) return 0;
    char *end;
    long pid = strtol(dash + 1, &end, 10);
    return !*end && pid > 0 && pid != (long)getpid() && kill((pid_t)pid, 0) != 0 &&
           errno == ESRCH;
}

/* Marked entries, least recently used first; stale temp entries removed. */
static entry *list_entries(const char *root, size_t *count) {
    *count = 0;
    DIR *d = opendir(root);
    if (!d) return NULL;
    entry *list = NULL;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[4096], marker[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", root, e->d_name) >= (int)sizeof path) continue;
        if (!marked_folder(path)) continue;
        if (e->d_name[0] == '.') {
            if (stale_temp(e->d_name)) folder_remove(path);
            continue;
        }
        if (!store_key_ok(e->d_name)) continue;   /* at most 128 characters */
        if (snprintf(marker, sizeof marker, "%s/" PROGRAM_MARKER, path) >= (int)sizeof marker ||
            lstat(marker, &st) != 0)
            continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 32;
            entry *p = realloc(list, cap * sizeof *p);
            if (!p) break;
            list = p;
        }
        memcpy(list[*count].name, e->d_name, strlen(e->d_name) + 1);
#ifdef __APPLE__
        list[*count].used = st.st_mtimespec;
#else
        list[*count].used = st.st_mtim;
#endif
        (*count)++;
    }
    closedir(d);
    if (list) qsort(list, *count, sizeof *list, older);
    return list;
}

static uint64_t store_bytes(const char *root, const entry *list, size_t from, size_t count) {
    usage u = {0};
    for (size_t i = from; i < count; i++) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", root, list[i].name) < (int)sizeof path)
            count_tree(&u, path, 0);
    }
    free(u.seen);
    return u.bytes;
}

/* Removes the least recently used entries until the rest fit `max` bytes. */
static void trim(const char *root, uint64_t max) {
    size_t count;
    entry *list = list_entries(root, &count);
    size_t first = 0;
    while (first < count && store_bytes(root, list, first, count) > max) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", root, list[first].name) < (int)sizeof path &&
            marked_folder(path))
            folder_remove(path);
        first++;
    }
    free(list);
}

orion_status store_publish(const char *cache, const char *key, const char *folder,
                           const char *const *relpaths, size_t n_relpaths) {
    if (!store_key_ok(key))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "store key must be 16 to 128 lower-case "
                          "hex digits");
    uint64_t max = store_max_bytes();
    if (max == 0) return ORION_OK;
    char root[4096], final[4096], tmp[4096], src[4096];
    orion_status rc = store_root(cache, root, sizeof root);
    if (rc != ORION_OK) return rc;
    if (snprintf(final, sizeof final, "%s/%s", root, key) >= (int)sizeof final ||
        snprintf(tmp, sizeof tmp, "%s/" TMP_PREFIX "%s-%ld", root, key, (long)getpid()) >=
            (int)sizeof tmp)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
    if (marked_folder(final)) {
        touch_marker(final);
        return ORION_OK;
    }
    if (marked_folder(tmp)) folder_remove(tmp);   /* ours, from an earlier failure */
    rc = folder_make_dirs(tmp);
    if (rc == ORION_OK) rc = folder_write_file(tmp, PROGRAM_MARKER, "", 0);
    if (rc == ORION_OK && snprintf(src, sizeof src, "%s/model.mil", folder) >= (int)sizeof src)
        rc = orion_fail(ORION_ERR_INVALID_ARGUMENT, "path too long");
    if (rc == ORION_OK) rc = store_link_file(src, tmp, "model.mil");
    for (size_t i = 0; rc == ORION_OK && i < n_relpaths; i++) {
        if (snprintf(src, sizeof src, "%s/%s", folder, relpaths[i]) >= (int)sizeof src)
            rc = orion_fail(ORION_ERR_INVALID_ARGUMENT, "path too long");
        else
            rc = store_link_file(src, tmp, relpaths[i]);
    }
    if (rc == ORION_OK && rename(tmp, final) != 0 && !marked_folder(final))
        rc = orion_fail(ORION_ERR_IO, "cannot add %s to the program store: %s", final,
                        strerror(errno));
    if (marked_folder(tmp)) folder_remove(tmp);   /* another process added it first */
    if (rc == ORION_OK) trim(root, max);
    return rc;
}
