/* ane_temp.m -- the device temp folder NSTemporaryDirectory()/<identifier>, which
 * every process of the user that makes the same program shares (same identifier,
 * same path).
 *
 * A process that holds the folder keeps a shared flock on tmp_dir/.orion-users;
 * the last one out removes the folder. Entering (create, open, lock) and leaving
 * (the exclusive try, the removal) both run under one lock per user on a file
 * beside the folders that is never deleted. So no process can open the users file
 * of a folder that another is removing, and none holds a lock on an unlinked file
 * while another deletes the folder: the lock inside a folder that can vanish only
 * counts users, it never serialises. Plain C: no Objective-C is needed here. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../core/error.h"
#include "../core/folder.h"
#include "ane_internal.h"

#define USERS_FILE ".orion-users"
#define USER_LOCK_FILE ".orion-ane-folders.lock"

/* The user's lock on temp-folder changes, beside the folders (in the parent of
 * tmp_dir, NSTemporaryDirectory(): per user on macOS), taken exclusively. */
static orion_status user_lock(const char *tmp_dir, int *fd_out) {
    const char *slash = strrchr(tmp_dir, '/');
    size_t parent = slash ? (size_t)(slash - tmp_dir) : 0;
    char path[4096];
    if (!slash || parent + sizeof "/" USER_LOCK_FILE > sizeof path)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "ane: temp folder %s has no parent", tmp_dir);
    snprintf(path, sizeof path, "%.*s/%s", (int)parent, tmp_dir, USER_LOCK_FILE);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return orion_fail(ORION_ERR_IO, "ane: cannot open the temp-folder lock %s: %s", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid()) {
        close(fd);
        return orion_fail(ORION_ERR_IO, "ane: the temp-folder lock %s is not a regular file of "
                          "this user", path);
    }
    while (flock(fd, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        close(fd);
        return orion_fail(ORION_ERR_IO, "ane: cannot lock %s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return ORION_OK;
}

static void user_unlock(int fd) { close(fd); }   /* drops the flock */

orion_status ane_temp_enter(const char *tmp_dir, int *users_fd) {
    if (*users_fd >= 0) return ORION_OK;
    int lock;
    orion_status st = user_lock(tmp_dir, &lock);
    if (st != ORION_OK) return st;
    st = folder_make_dirs(tmp_dir);
    char *path = st == ORION_OK ? ane_join(tmp_dir, USERS_FILE) : NULL;
    if (st == ORION_OK && !path) st = orion_fail(ORION_ERR_OUT_OF_MEMORY, "ane: out of memory");
    int fd = path ? open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600) : -1;
    if (st == ORION_OK && (fd < 0 || flock(fd, LOCK_SH) != 0))
        st = orion_fail(ORION_ERR_IO, "ane: cannot hold the temp folder %s: %s", tmp_dir,
                        strerror(errno));
    free(path);
    if (st != ORION_OK && fd >= 0) close(fd);
    if (st == ORION_OK) *users_fd = fd;
    user_unlock(lock);
    return st;
}

void ane_temp_leave(const char *tmp_dir, int *users_fd) {
    if (*users_fd < 0) return;
    int lock = -1;
    if (user_lock(tmp_dir, &lock) != ORION_OK) {
        orion_clear_error();   /* only a folder left behind for the next user to remove */
    } else if (flock(*users_fd, LOCK_EX | LOCK_NB) == 0) {
        folder_remove(tmp_dir);   /* no other process holds it, and none can enter now */
    }
    close(*users_fd);
    *users_fd = -1;
    if (lock >= 0) user_unlock(lock);
}
