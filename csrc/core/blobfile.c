/* blobfile.c -- the milstorage weight blob: writer, validating reader, and
 * the in-place patcher of the delta-compilation path.
 *
 * Layout (coremltools MILBlob StorageFormat.hpp; all little-endian):
 *   file header, 64 bytes at 0:   u32 count, u32 version (= 2), 7 x u64 reserved
 *   per entry, at a 64-aligned offset (the first at 64), a 64-byte metadata:
 *     u32 sentinel 0xDEADBEEF, u32 dtype, u64 size_in_bytes, u64 data_offset,
 *     u64 padding_size_in_bits, 4 x u64 reserved
 *   then the data at data_offset (64-aligned, right after the metadata); the
 *   next metadata starts at the next 64-aligned offset after the data. The
 *   last entry's data is not padded, as coremltools writes it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blobfile.h"
#include "error.h"
#include "regular_file.h"

#define BLOB_MAX_ENTRIES (1u << 20)

static uint64_t align_up(uint64_t x) { return (x + BLOB_ALIGNMENT - 1) / BLOB_ALIGNMENT * BLOB_ALIGNMENT; }

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v) {
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

uint32_t blob_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case ORION_BLOB_FLOAT16: case ORION_BLOB_BFLOAT16: case ORION_BLOB_INT16:
    case ORION_BLOB_UINT16: return 2;
    case ORION_BLOB_FLOAT32: case ORION_BLOB_INT32: case ORION_BLOB_UINT32: return 4;
    case ORION_BLOB_UINT8: case ORION_BLOB_INT8: case 16: case 17: return 1;
    default: return 0;   /* sub-byte types (8..13) and unknown codes */
    }
}

uint32_t blob_dtype_sub_bits(uint32_t dtype) {
    switch (dtype) {
    case ORION_BLOB_INT4: case ORION_BLOB_UINT4: return 4;
    case ORION_BLOB_UINT1: return 1;
    case ORION_BLOB_UINT2: return 2;
    case ORION_BLOB_UINT3: return 3;
    case ORION_BLOB_UINT6: return 6;
    default: return 0;
    }
}

const char *blob_dtype_name(uint32_t dtype) {
    static const char *names[] = {
        "invalid", "Float16", "Float32", "UInt8", "Int8", "BFloat16", "Int16", "UInt16", "Int4",
        "UInt1", "UInt2", "UInt4", "UInt3", "UInt6", "Int32", "UInt32", "Float8E4M3FN",
        "Float8E5M2"};
    return dtype < sizeof names / sizeof names[0] ? names[dtype] : "unknown";
}

static int dtype_known(uint32_t dtype) { return dtype >= 1 && dtype <= 17; }

/* ---- reading ----------------------------------------------------------- */

/* Where the headers come from: the bytes in memory, or (bytes NULL) a file read with
 * pread, so that a loader touches no page of the file but the headers' (a mapping's
 * fault-around would make every header's 64 KiB resident). */
typedef struct header_source {
    const uint8_t *bytes;
    int fd;
    const char *what;
} header_source;

/* The n header bytes at `at` (inside the size checked by the caller). */
static orion_status read_header(const header_source *src, uint64_t at, size_t n, uint8_t *buf,
                                const uint8_t **got) {
    if (src->bytes) {
        *got = src->bytes + at;
        return ORION_OK;
    }
    for (size_t done = 0; done < n;) {
        ssize_t r = pread(src->fd, buf + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return orion_fail(ORION_ERR_IO, "%s: reading the header at offset %llu: %s",
                              src->what, (unsigned long long)at,
                              r < 0 ? strerror(errno) : "the file shrank");
        done += (size_t)r;
    }
    *got = buf;
    return ORION_OK;
}

static orion_status parse_headers(const header_source *src, uint64_t size, blob_view *out) {
    const char *what = src->what;
    memset(out, 0, sizeof *out);
    if (size < BLOB_HEADER_BYTES)
        return orion_fail(ORION_ERR_FORMAT,
                          "%s: truncated blob file: %llu bytes, the file header alone needs 64",
                          what, (unsigned long long)size);
    uint8_t buf[BLOB_METADATA_BYTES];
    const uint8_t *b;
    orion_status rc = read_header(src, 0, 8, buf, &b);
    if (rc) return rc;
    uint32_t count = rd32(b), version = rd32(b + 4);
    if (version != BLOB_VERSION)
        return orion_fail(ORION_ERR_FORMAT,
                          "%s: bad blob file version %u (expected 2; is this a weight blob?)",
                          what, version);
    if (count > BLOB_MAX_ENTRIES || (uint64_t)count * BLOB_METADATA_BYTES > size - BLOB_HEADER_BYTES)
        return orion_fail(ORION_ERR_FORMAT,
                          "%s: header claims %u entries, more than %llu bytes can hold", what,
                          count, (unsigned long long)size);
    orion_blob_entry *entries = calloc(count ? count : 1, sizeof *entries);
    if (!entries) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    uint64_t at = BLOB_HEADER_BYTES;
    for (uint32_t i = 0; i < count; i++) {
        orion_status st = ORION_ERR_FORMAT;
        if (at > size || size - at < BLOB_METADATA_BYTES) {
            orion_fail(st, "%s: truncated: entry %u's metadata at offset %llu runs past the end "
                           "(%llu bytes)", what, i, (unsigned long long)at, (unsigned long long)size);
            goto fail;
        }
        const uint8_t *m;
        if ((st = read_header(src, at, BLOB_METADATA_BYTES, buf, &m))) goto fail;
        st = ORION_ERR_FORMAT;
        uint32_t sentinel = rd32(m), dtype = rd32(m + 4);
        uint64_t nbytes = rd64(m + 8), data = rd64(m + 16), pad_bits = rd64(m + 24);
        if (sentinel != BLOB_SENTINEL) {
            orion_fail(st, "%s: bad magic at offset %llu: sentinel 0x%08x, expected 0xDEADBEEF",
                       what, (unsigned long long)at, sentinel);
            goto fail;
        }
        if (!dtype_known(dtype)) {
            orion_fail(st, "%s: entry at offset %llu has unknown dtype code %u", what,
                       (unsigned long long)at, dtype);
            goto fail;
        }
        if (data % BLOB_ALIGNMENT != 0) {
            orion_fail(st, "%s: entry at offset %llu: data offset %llu is not 64-byte aligned",
                       what, (unsigned long long)at, (unsigned long long)data);
            goto fail;
        }
        if (data < at + BLOB_METADATA_BYTES) {
            orion_fail(st, "%s: entry at offset %llu: data offset %llu overlaps its metadata",
                       what, (unsigned long long)at, (unsigned long long)data);
            goto fail;
        }
        if (data > size || nbytes > size - data) {
            orion_fail(st, "%s: entry at offset %llu: %llu bytes of data at offset %llu run past "
                           "the end of the file (%llu bytes)", what, (unsigned long long)at,
                       (unsigned long long)nbytes, (unsigned long long)data,
                       (unsigned long long)size);
            goto fail;
        }
        uint32_t esize = blob_dtype_size(dtype);
        if (blob_dtype_sub_bits(dtype) && (pad_bits > 7 || (pad_bits && !nbytes))) {
            orion_fail(st, "%s: entry at offset %llu: %llu padding bits for %llu bytes of %s "
                       "(coremltools pads only the last byte)", what, (unsigned long long)at,
                       (unsigned long long)pad_bits, (unsigned long long)nbytes,
                       blob_dtype_name(dtype));
            goto fail;
        }
        if ((esize && nbytes % esize) || (esize && pad_bits)) {
            orion_fail(st, "%s: entry at offset %llu: %llu bytes is not a whole number of %s "
                           "elements", what, (unsigned long long)at, (unsigned long long)nbytes,
                       blob_dtype_name(dtype));
            goto fail;
        }
        entries[i] = (orion_blob_entry){at, data, nbytes, dtype, (uint32_t)pad_bits};
        at = align_up(data + nbytes);
        continue;
    fail:
        free(entries);
        return st;
    }
    out->bytes = src->bytes;
    out->size = size;
    out->count = count;
    out->entries = entries;
    return ORION_OK;
}

orion_status blob_view_parse(const void *bytes, uint64_t size, const char *what, blob_view *out) {
    memset(out, 0, sizeof *out);
    if (!bytes && size) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "%s: no bytes", what);
    static const uint8_t none[1];
    header_source src = {bytes ? bytes : none, -1, what};
    return parse_headers(&src, size, out);
}

orion_status blob_view_parse_file(int fd, uint64_t size, const char *what, blob_view *out) {
    header_source src = {NULL, fd, what};
    return parse_headers(&src, size, out);
}

void blob_view_free(blob_view *view) {
    free(view->entries);
    memset(view, 0, sizeof *view);
}

const orion_blob_entry *blob_view_find(const blob_view *view, uint64_t metadata_offset) {
    /* Entries are in increasing offset order: binary search. */
    uint64_t lo = 0, hi = view->count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        uint64_t off = view->entries[mid].metadata_offset;
        if (off == metadata_offset) return &view->entries[mid];
        if (off < metadata_offset) lo = mid + 1; else hi = mid;
    }
    return NULL;
}

struct orion_blob {
    blob_view view;
    void *map;
    uint64_t map_size;
    char *path;
};

orion_status orion_blob_open(const char *path, orion_blob **out) {
    orion_clear_error();
    if (!path || !out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_open: NULL argument");
    *out = NULL;
    int fd;
    struct stat stt;
    orion_status opened = open_regular_file(path, O_RDONLY, &fd, &stt);
    if (opened != ORION_OK) return opened;
    uint64_t size = (uint64_t)stt.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return orion_fail(ORION_ERR_IO, "cannot map %s: %s", path, strerror(e));
        }
    }
    close(fd);
    orion_blob *blob = calloc(1, sizeof *blob);
    char *copy = strdup(path);
    if (!blob || !copy) {
        free(blob);
        free(copy);
        if (map) munmap(map, size);
        return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory opening %s", path);
    }
    orion_status st = blob_view_parse(map, size, path, &blob->view);
    if (st != ORION_OK) {
        free(blob);
        free(copy);
        if (map) munmap(map, size);
        return st;
    }
    blob->map = map;
    blob->map_size = size;
    blob->path = copy;
    *out = blob;
    return ORION_OK;
}

void orion_blob_close(orion_blob *blob) {
    if (!blob) return;
    if (blob->map) munmap(blob->map, blob->map_size);
    blob_view_free(&blob->view);
    free(blob->path);
    free(blob);
}

uint64_t orion_blob_count(const orion_blob *blob) { return blob ? blob->view.count : 0; }

orion_status orion_blob_entry_at(const orion_blob *blob, uint64_t index, orion_blob_entry *out) {
    orion_clear_error();
    if (!blob || !out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_entry_at: NULL argument");
    if (index >= blob->view.count)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "%s has %llu entries; no entry %llu",
                          blob->path, (unsigned long long)blob->view.count,
                          (unsigned long long)index);
    *out = blob->view.entries[index];
    return ORION_OK;
}

orion_status orion_blob_find(const orion_blob *blob, uint64_t metadata_offset, orion_blob_entry *out) {
    orion_clear_error();
    if (!blob || !out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_find: NULL argument");
    const orion_blob_entry *e = blob_view_find(&blob->view, metadata_offset);
    if (!e)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "%s has no blob metadata header at offset %llu", blob->path,
                          (unsigned long long)metadata_offset);
    *out = *e;
    return ORION_OK;
}

orion_status orion_blob_read(const orion_blob *blob, uint64_t metadata_offset, void *dst,
                             uint64_t capacity) {
    orion_blob_entry e;
    orion_status st = orion_blob_find(blob, metadata_offset, &e);
    if (st != ORION_OK) return st;
    if (!dst && e.nbytes) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_read: dst is NULL");
    if (capacity < e.nbytes)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT,
                          "blob_read: entry at %llu has %llu bytes, buffer holds %llu",
                          (unsigned long long)metadata_offset, (unsigned long long)e.nbytes,
                          (unsigned long long)capacity);
    if (e.nbytes) memcpy(dst, blob->view.bytes + e.data_offset, e.nbytes);
    return ORION_OK;
}

/* ---- writing ----------------------------------------------------------- */

static orion_status write_all(int fd, const void *data, uint64_t n, const char *path) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return orion_fail(ORION_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        p += w;
        n -= (uint64_t)w;
    }
    return ORION_OK;
}

static orion_status pwrite_all(int fd, const void *data, uint64_t n, uint64_t at, const char *path) {
    const uint8_t *p = data;
    while (n > 0) {
        size_t chunk = n > (1u << 30) ? (1u << 30) : (size_t)n;
        ssize_t w = pwrite(fd, p, chunk, (off_t)at);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return orion_fail(ORION_ERR_IO, "cannot write %s: %s", path, strerror(errno));
        p += w;
        at += (uint64_t)w;
        n -= (uint64_t)w;
    }
    return ORION_OK;
}

/* Checks the inputs and computes where each entry goes; *total gets the file size. */
static orion_status blob_layout(const orion_blob_input *entries, uint64_t count,
                                uint64_t *metadata_offsets, uint64_t *total) {
    if (count && !entries) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entries is NULL");
    if (count > BLOB_MAX_ENTRIES)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: %llu entries is too many",
                          (unsigned long long)count);
    uint64_t at = BLOB_HEADER_BYTES;
    for (uint64_t i = 0; i < count; i++) {
        uint32_t esize = blob_dtype_size(entries[i].dtype);
        if (blob_dtype_sub_bits(entries[i].dtype)) {
            esize = 1;   /* packed codes: whole bytes, padding bits in the last one */
            if (entries[i].padding_bits > 7 || (entries[i].padding_bits && !entries[i].nbytes))
                return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entry %llu: %u padding "
                                  "bits for %llu bytes", (unsigned long long)i,
                                  entries[i].padding_bits, (unsigned long long)entries[i].nbytes);
        } else if (entries[i].padding_bits) {
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entry %llu: padding bits are "
                              "for sub-byte dtypes only", (unsigned long long)i);
        }
        if (!esize)
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entry %llu: dtype %u (%s) is not "
                              "supported for writing", (unsigned long long)i, entries[i].dtype,
                              blob_dtype_name(entries[i].dtype));
        if (entries[i].nbytes % esize || (entries[i].nbytes && !entries[i].data))
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entry %llu: %llu bytes is not a "
                              "whole number of %s elements", (unsigned long long)i,
                              (unsigned long long)entries[i].nbytes, blob_dtype_name(entries[i].dtype));
        if (entries[i].nbytes > (((uint64_t)1) << 40))
            return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob: entry %llu is absurdly large",
                              (unsigned long long)i);
        if (i > 0) at = align_up(at);
        if (metadata_offsets) metadata_offsets[i] = at;
        at += BLOB_METADATA_BYTES + entries[i].nbytes;
    }
    *total = at;
    return ORION_OK;
}

static void encode_header(uint8_t *header, uint64_t count) {
    memset(header, 0, BLOB_HEADER_BYTES);
    wr32(header, (uint32_t)count);
    wr32(header + 4, BLOB_VERSION);
}

static void encode_metadata(uint8_t *meta, const orion_blob_input *e, uint64_t at) {
    memset(meta, 0, BLOB_METADATA_BYTES);
    wr32(meta, BLOB_SENTINEL);
    wr32(meta + 4, e->dtype);
    wr64(meta + 8, e->nbytes);
    wr64(meta + 16, at + BLOB_METADATA_BYTES);
    wr64(meta + 24, e->padding_bits);
}

orion_status orion_blob_encode(const orion_blob_input *entries, uint64_t count, void *dst,
                               uint64_t capacity, uint64_t *size_out, uint64_t *metadata_offsets) {
    orion_clear_error();
    if (!size_out) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_encode: size_out is NULL");
    uint64_t total;
    orion_status st = blob_layout(entries, count, metadata_offsets, &total);
    if (st != ORION_OK) return st;
    *size_out = total;
    if (!dst) return ORION_OK;
    if (capacity < total)
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_encode: %llu bytes needed, %llu given",
                          (unsigned long long)total, (unsigned long long)capacity);
    uint8_t *out = dst;
    memset(out, 0, total);
    encode_header(out, count);
    uint64_t at = BLOB_HEADER_BYTES;
    for (uint64_t i = 0; i < count; i++) {
        if (i > 0) at = align_up(at);
        encode_metadata(out + at, &entries[i], at);
        if (entries[i].nbytes) memcpy(out + at + BLOB_METADATA_BYTES, entries[i].data, entries[i].nbytes);
        at += BLOB_METADATA_BYTES + entries[i].nbytes;
    }
    return ORION_OK;
}

orion_status orion_blob_write(const char *path, const orion_blob_input *entries, uint64_t count,
                              uint64_t *metadata_offsets) {
    orion_clear_error();
    if (!path) return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_write: path is NULL");
    uint64_t total;
    orion_status st = blob_layout(entries, count, metadata_offsets, &total);
    if (st != ORION_OK) return st;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 32);
    if (!tmp) return orion_fail(ORION_ERR_OUT_OF_MEMORY, "out of memory");
    snprintf(tmp, plen + 32, "%s.%ld.orion-tmp", path, (long)getpid());
    /* the name holds our pid, so a leftover there is ours; O_EXCL + O_NOFOLLOW: a link
     * or FIFO planted at the temp name is never written through */
    unlink(tmp);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) {
        st = orion_fail(ORION_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    /* Streamed, so a large blob is never held twice in memory. */
    uint8_t header[BLOB_HEADER_BYTES];
    encode_header(header, count);
    st = write_all(fd, header, sizeof header, tmp);
    uint64_t at = BLOB_HEADER_BYTES;
    static const uint8_t zeros[BLOB_ALIGNMENT] = {0};
    for (uint64_t i = 0; st == ORION_OK && i < count; i++) {
        if (i > 0 && align_up(at) != at) {
            st = write_all(fd, zeros, align_up(at) - at, tmp);
            at = align_up(at);
        }
        uint8_t meta[BLOB_METADATA_BYTES];
        encode_metadata(meta, &entries[i], at);
        if (st == ORION_OK) st = write_all(fd, meta, sizeof meta, tmp);
        if (st == ORION_OK) st = write_all(fd, entries[i].data, entries[i].nbytes, tmp);
        at += BLOB_METADATA_BYTES + entries[i].nbytes;
    }
    if (st == ORION_OK && fsync(fd) != 0)
        st = orion_fail(ORION_ERR_IO, "cannot fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == ORION_OK)
        st = orion_fail(ORION_ERR_IO, "cannot close %s: %s", tmp, strerror(errno));
    if (st == ORION_OK && rename(tmp, path) != 0)
        st = orion_fail(ORION_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != ORION_OK) unlink(tmp);
    free(tmp);
    return st;
}

orion_status orion_blob_patch_entries(const char *path, const orion_blob_patch *patches,
                                      uint64_t count) {
    orion_clear_error();
    if (!path || (count && !patches))
        return orion_fail(ORION_ERR_INVALID_ARGUMENT, "blob_patch: NULL argument");
    int fd;
    struct stat stt;
    orion_status st = open_regular_file(path, O_RDWR, &fd, &stt);
    if (st != ORION_OK) return st;
    void *map = NULL;
    uint64_t size = 0;
    blob_view view = {0};
    size = (uint64_t)stt.st_size;
    if (size) {
        map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) {
            map = NULL;
            st = orion_fail(ORION_ERR_IO, "cannot map %s: %s", path, strerror(errno));
            goto done;
        }
    }
    /* Validate the file and every patch before writing a byte. */
    st = blob_view_parse(map, size, path, &view);
    for (uint64_t i = 0; st == ORION_OK && i < count; i++) {
        const orion_blob_patch *p = &patches[i];
        const orion_blob_entry *e = blob_view_find(&view, p->metadata_offset);
        if (!e)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "%s has no blob metadata header at offset %llu",
                            path, (unsigned long long)p->metadata_offset);
        else if (e->dtype != p->dtype)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "patch of %s at %llu: dtype %s, the entry holds %s",
                            path, (unsigned long long)p->metadata_offset, blob_dtype_name(p->dtype),
                            blob_dtype_name(e->dtype));
        else if (e->nbytes != p->nbytes)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT,
                            "patch of %s at %llu: %llu bytes, the entry holds %llu (a delta update "
                            "keeps every size; recompile to change shapes)", path,
                            (unsigned long long)p->metadata_offset, (unsigned long long)p->nbytes,
                            (unsigned long long)e->nbytes);
        else if (p->nbytes && !p->data)
            st = orion_fail(ORION_ERR_INVALID_ARGUMENT, "patch %llu has no data", (unsigned long long)i);
    }
    for (uint64_t i = 0; st == ORION_OK && i < count; i++)
        st = pwrite_all(fd, patches[i].data, patches[i].nbytes,
                        blob_view_find(&view, patches[i].metadata_offset)->data_offset, path);
done:
    blob_view_free(&view);
    if (map) munmap(map, size);
    if (close(fd) != 0 && st == ORION_OK)
        st = orion_fail(ORION_ERR_IO, "cannot close %s: %s", path, strerror(errno));
    return st;
}
