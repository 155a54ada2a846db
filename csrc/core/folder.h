/* folder.h -- the on-disk program folder: <cache>/<identifier>/{model.mil, weights/...}.
 * The device's compiler reads its inputs from such a folder (ANE-C30), so
 * both backends get one, written before compile. */
#ifndef ORION_CORE_FOLDER_H
#define ORION_CORE_FOLDER_H

#include <stddef.h>
#include "../orion.h"

/* Checks a weight key: "@model_path/" then a relative path that stays inside
 * the folder (no "..", no ".", no empty segment, no backslash). */
orion_status folder_check_key(const char *key);
/* The default cache directory: ORION_CACHE_DIR, else $TMPDIR/orion-<uid>. */
orion_status folder_default_cache(char *buf, size_t capacity);
/* The file that marks a program folder as Orion's: the pruner deletes nothing else. */
#define PROGRAM_MARKER ".orion-program"
/* Creates the cache directory (mode 0700) when missing; refuses one that is a
 * symlink, not a directory, owned by another user, or writable by others. */
orion_status folder_check_cache(const char *cache);
/* This process's directory under a cache directory: <cache>/p<pid>. Program
 * folders of concurrent processes never meet, so one process's release cannot
 * delete another's program. Program folders (with PROGRAM_MARKER) of processes
 * that are gone are removed the first time a cache directory is used. */
orion_status folder_process_dir(const char *cache, char *buf, size_t capacity);
/* Removes a program folder, then its process directory if that is empty. */
void folder_remove_program(const char *folder);
/* mkdir -p with mode 0700 for created directories. */
orion_status folder_make_dirs(const char *path);
/* Writes bytes to folder/relpath (creating parent directories). */
orion_status folder_write_file(const char *folder, const char *relpath, const void *data,
                               uint64_t nbytes);
/* Reads a whole regular file into *buf (64-byte aligned, free() it), reusing
 * *buf when *capacity already holds the file. */
orion_status folder_read_file(const char *path, void **buf, uint64_t *capacity, uint64_t *size);
/* Removes the folder and everything in it. */
void folder_remove(const char *folder);

#endif
