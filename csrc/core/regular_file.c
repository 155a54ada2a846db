/* regular_file.c -- see regular_file.h. Its own file (error.c its only
 * dependency) so the blob reader still builds alone in the fuzz harnesses. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "regular_file.h"

orion_status open_regular_file(const char *path, int flags, int *fd_out, struct stat *st) {
    /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer */
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return orion_fail(ORION_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        return orion_fail(ORION_ERR_IO, "%s is not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return orion_fail(ORION_ERR_IO, "cannot use %s: %s", path, strerror(e));
    }
    *fd_out = fd;
    return ORION_OK;
}
