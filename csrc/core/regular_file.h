/* regular_file.h -- opening a file Orion reads or patches: regular files only,
 * checked on the descriptor, never blocking on a FIFO. */
#ifndef ORION_CORE_REGULAR_FILE_H
#define ORION_CORE_REGULAR_FILE_H

#include <sys/stat.h>
#include "../orion.h"

/* Opens `path` with `flags` (O_RDONLY, O_RDWR or O_WRONLY, plus e.g. O_NOFOLLOW)
 * non-blocking, refuses anything fstat does not call a regular file (a FIFO, a
 * device, a socket, a folder), then makes the descriptor blocking again. Fills
 * *fd and *st on success. */
orion_status open_regular_file(const char *path, int flags, int *fd, struct stat *st);

#endif
