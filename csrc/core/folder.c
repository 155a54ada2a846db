/* folder.c -- program folders on disk (see folder.h). */
#define _XOPEN_SOURCE 700
#define _DEFAULT_SOURCE   /* MADV_HUGEPAGE (Linux) */
#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "folder.h"
#include "regular_file.h"

#define MODEL_PATH_PREFIX "@model_path/"
#define KEY_MAX 1024

orion_status folder_check_key(const char *key) {
    if (!key) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key is NULL");
    size_t n = strlen(key), plen = strlen(MODEL_PATH_PREFIX);
    if (n > KEY_MAX)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "weight key is %zu bytes long (limit %d)", n,
                          KEY_MAX);
    if (strncmp(key, MODEL_PATH_PREFIX, plen) != 0 || n == plen)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "weight key \"%s\" must be \"@model_path/<relative path>\"", key);
    const char *seg = key + plen;
    for (;;) {
        const char *end = strchr(seg, '/');
        size_t len = end ? (size_t)(end - seg) : strlen(seg);
        if (len == 0 || (len == 1 && seg[0] == '.') || (len == 2 && seg[0] == '.' && seg[1] == '.'))
            return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                              "weight key \"%s\" escapes or is not inside the program folder "
                              "(empty, \".\" or \"..\" path segment)", key);
        for (size_t i = 0; i < len; i++)
            if (seg[i] == '\\' || (unsigned char)seg[i] < 0x20)
                return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                                  "weight key \"%s\" holds a backslash or control character", key);
        if (!end) break;
        seg = end + 1;
    }
    return ORION_OK;
}

orion_status folder_default_cache(char *buf, size_t capacity) {
    const char *env = getenv("ORION_CACHE_DIR");
    int n;
    if (env && *env) {
        n = snprintf(buf, capacity, "%s", env);
    } else {
        const char *tmp = getenv("TMPDIR");
        n = snprintf(buf, capacity, "%s/orion-%ld", tmp && *tmp ? tmp : "/tmp", (long)getuid());
    }
    if (n < 0 || (size_t)n >= capacity)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
    return ORION_OK;
}

orion_status folder_make_dirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "directory path is empty or too long");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char saved = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0700) != 0 && errno != EEXIST)
            return orion_fail(ORION_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        buf[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return orion_fail(ORION_ERR_IO, "%s is not a directory", path);
    return ORION_OK;
}

orion_status folder_write_file(const char *folder, const char *relpath, const void *data,
                               uint64_t nbytes) {
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", folder, relpath);
    if (n < 0 || (size_t)n >= sizeof path)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "path %s/%s is too long", folder, relpath);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    orion_status st = folder_make_dirs(path);
    *slash = '/';
    if (st != ORION_OK) return st;
    /* O_NONBLOCK: a FIFO here must fail, not wait for a reader; regular files only */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600);
    if (fd < 0) return orion_fail(ORION_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return orion_fail(ORION_ERR_IO, "%s is not a regular file", path);
    }
    const uint8_t *p = data;
    uint64_t left = nbytes;
    while (left > 0) {
        size_t chunk = left > (1u << 30) ? (1u << 30) : (size_t)left;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return orion_fail(ORION_ERR_IO, "cannot write %s: %s", path, strerror(e));
        }
        p += w;
        left -= (uint64_t)w;
    }
    if (close(fd) != 0) return orion_fail(ORION_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    return ORION_OK;
}

/* Memory for a file the kernels stream through (weights: a decode step reads every
 * byte once). At least 64-byte aligned; a large one starts on a 2 MiB boundary and its
 * whole 2 MiB pages are offered to transparent huge pages, so the stream does not take
 * a TLB miss every 4 KiB. The partial page at the end stays in small pages: no memory
 * is touched that the file does not fill. */
static void *alloc_streamed(uint64_t n) {
    size_t bytes = (size_t)((n + 63) / 64 * 64 + 64);
#if defined(MADV_HUGEPAGE)
    const size_t huge = (size_t)2 << 20;
    if (n >= 2 * huge) {
        void *p = aligned_alloc(huge, (bytes + huge - 1) / huge * huge);
        if (p) madvise(p, (size_t)n / huge * huge, MADV_HUGEPAGE);   /* a hint only */
        return p;
    }
#endif
    return aligned_alloc(64, bytes);
}

orion_status folder_read_file(const char *path, void **buf, uint64_t *capacity, uint64_t *size) {
    int fd;
    struct stat st;
    orion_status rc = open_regular_file(path, O_RDONLY, &fd, &st);
    if (rc != ORION_OK) return rc;
    uint64_t n = (uint64_t)st.st_size;
    if (!*buf || *capacity < n) {
        free(*buf);
        *capacity = 0;
        /* 64-byte aligned: the kernels read weights straight from this memory */
        if (!(*buf = alloc_streamed(n))) {
            close(fd);
            return orion_fail(ORION_ERR_OUT_OF_MEMORY, "no memory to read %s (%llu bytes)", path,
                              (unsigned long long)n);
        }
        *capacity = n;
    }
    char *dst = *buf;
    uint64_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, dst + got, (size_t)(n - got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            close(fd);
            return orion_fail(ORION_ERR_IO, "reading %s: %s", path,
                              r < 0 ? strerror(e) : "the file shrank while being read");
        }
        got += (uint64_t)r;
    }
    close(fd);
    *size = n;
    return ORION_OK;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    remove(path);
    return 0;
}

void folder_remove(const char *folder) {
    nftw(folder, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Removes the program folders (those holding PROGRAM_MARKER) in <cache>/p<pid>
 * directories whose process no longer exists, then the p<pid> directory if that
 * left it empty. Anything without Orion's marker is never entered or deleted. */
static void prune_process_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char prog[4096], marker[4096];
        struct stat st;
        if (snprintf(prog, sizeof prog, "%s/%s", dir, e->d_name) >= (int)sizeof prog) continue;
        if (snprintf(marker, sizeof marker, "%s/" PROGRAM_MARKER, prog) >= (int)sizeof marker)
            continue;
        if (lstat(prog, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
        if (lstat(marker, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        folder_remove(prog);
    }
    closedir(d);
    rmdir(dir);   /* only if empty: what we did not create stays */
}

static void prune_stale(const char *cache) {
    DIR *d = opendir(cache);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        if (e->d_name[0] != 'p') continue;
        long pid = strtol(e->d_name + 1, &end, 10);
        if (*end || pid <= 0 || pid == (long)getpid()) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;   /* alive, or not ours */
        char path[4096];
        struct stat st;
        if (snprintf(path, sizeof path, "%s/%s", cache, e->d_name) >= (int)sizeof path) continue;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) continue;
        prune_process_dir(path);
    }
    closedir(d);
}

orion_status folder_check_cache(const char *cache) {
    struct stat st;
    if (lstat(cache, &st) != 0 && errno == ENOENT) {
        orion_status rc = folder_make_dirs(cache);   /* mode 0700 */
        if (rc != ORION_OK) return rc;
    }
    if (lstat(cache, &st) != 0)
        return orion_fail(ORION_ERR_IO, "cache directory %s: %s", cache, strerror(errno));
    if (S_ISLNK(st.st_mode))
        return orion_fail(ORION_ERR_IO, "cache directory %s is a symbolic link; Orion uses only a "
                          "directory it owns (remove it, or set ORION_CACHE_DIR)", cache);
    if (!S_ISDIR(st.st_mode))
        return orion_fail(ORION_ERR_IO, "cache directory %s is not a directory", cache);
    if (st.st_uid != getuid())
        return orion_fail(ORION_ERR_IO, "cache directory %s is owned by uid %ld, not by this user "
                          "(uid %ld); Orion refuses it (remove it, or set ORION_CACHE_DIR)", cache,
                          (long)st.st_uid, (long)getuid());
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return orion_fail(ORION_ERR_IO, "cache directory %s is writable by other users (mode %03o);"
                          " Orion refuses it (chmod 700 it, or set ORION_CACHE_DIR)", cache,
                          (unsigned)(st.st_mode & 0777));
    return ORION_OK;
}

orion_status folder_process_dir(const char *cache, char *buf, size_t capacity) {
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static char pruned[4096];
    int n = snprintf(buf, capacity, "%s/p%ld", cache, (long)getpid());
    if (n < 0 || (size_t)n >= capacity)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "cache directory path is too long");
    orion_status rc = folder_check_cache(cache);
    if (rc != ORION_OK) return rc;
    pthread_mutex_lock(&lock);
    if (strcmp(pruned, cache) != 0) {
        prune_stale(cache);
        snprintf(pruned, sizeof pruned, "%s", cache);
    }
    pthread_mutex_unlock(&lock);
    return ORION_OK;
}

void folder_remove_program(const char *folder) {
    folder_remove(folder);
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", folder);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        rmdir(parent);   /* only if no other program of this process is there */
    }
}
