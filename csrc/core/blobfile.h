/* blobfile.h -- in-memory view of a milstorage weight blob (internal). */
#ifndef ORION_CORE_BLOBFILE_H
#define ORION_CORE_BLOBFILE_H

#include "../orion.h"

#define BLOB_ALIGNMENT 64
#define BLOB_HEADER_BYTES 64
#define BLOB_METADATA_BYTES 64
#define BLOB_SENTINEL 0xDEADBEEFu
#define BLOB_VERSION 2

/* A validated view over blob bytes that the caller keeps alive (or, parsed from a
 * file, its entries alone). */
typedef struct blob_view {
    const uint8_t *bytes;
    uint64_t size;
    uint64_t count;
    orion_blob_entry *entries;   /* count entries, owned by the view */
} blob_view;

/* Validates every header of `bytes` (see orion_blob_open). `what` names the
 * file in error messages. */
orion_status blob_view_parse(const void *bytes, uint64_t size, const char *what, blob_view *out);
/* The same, reading only the headers of the open file `fd` of `size` bytes (pread,
 * nothing mapped); the view's bytes are NULL. */
orion_status blob_view_parse_file(int fd, uint64_t size, const char *what, blob_view *out);
void blob_view_free(blob_view *view);
/* The entry whose metadata header sits at metadata_offset, or NULL. */
const orion_blob_entry *blob_view_find(const blob_view *view, uint64_t metadata_offset);
/* Size in bytes of one element of a blob dtype, 0 if sub-byte or unknown. */
uint32_t blob_dtype_size(uint32_t dtype);
/* Bits of one element of a sub-byte dtype (Int4 = 8 ... UInt6 = 13), else 0. */
uint32_t blob_dtype_sub_bits(uint32_t dtype);
const char *blob_dtype_name(uint32_t dtype);

#endif
