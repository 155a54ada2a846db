/* weight_share.h -- one copy on disk of a weight file that several live
 * programs of this process bake with equal bytes.
 *
 * Each program keeps its weights in one file of its own (weight_cache.h shares
 * equal tensors in memory, whichever files they come from); two programs whose
 * whole weight files are equal (the same layer built twice, under two keys)
 * store that file once: a hard link to the live program's file, not a second
 * copy. Nothing is stored outside the program folders: each program holds its
 * own link, so removing a program folder (at release, or by the stale-process
 * pruner) never takes bytes another program uses. Bytes are compared in full
 * before linking, never trusted from a name. The delta path patches only a
 * program's OWN file: a patch first breaks the link (copy-on-write), so the
 * other programs keep the bytes they baked. */
#ifndef ORION_CORE_WEIGHT_SHARE_H
#define ORION_CORE_WEIGHT_SHARE_H

#include <stdint.h>
#include "../orion.h"

/* Writes folder/relpath with `data` -- a hard link to an equal live file when
 * there is one -- and remembers it as a candidate for later programs. */
orion_status weight_share_write(const char *folder, const char *relpath, const void *data,
                                uint64_t nbytes);
/* Forgets every file under `folder` (before the folder is removed). */
void weight_share_forget_folder(const char *folder);
/* Makes `path` this program's own file before it is patched: forgets it as a
 * candidate and, when other links share its bytes, replaces it by a copy. */
orion_status weight_share_unshare(const char *path);

#endif
