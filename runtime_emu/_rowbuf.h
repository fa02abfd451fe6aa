/* The recorder's row buffers, shared by runtime_emu/_rowtable.c (which defines the type, on its
 * block pool) and runtime_emu/_core.c (whose kernel path appends to them).
 *
 * A RowBuffer is a growable run of bytes, like the bytearray it stands in for (the recorder's
 * packed int64 rows): appended to, viewed through the buffer protocol (numpy.frombuffer), and
 * not resized while a view exists. Its memory comes from the table build's pool of big blocks
 * and goes back to it when the buffer is freed, so the next recording in the process writes
 * into memory faulted in already, where a bytearray takes new memory from the kernel each time
 * (a page fault per 4 KiB, a third of a 400k-kernel run's time on a 2-core VM). A new buffer
 * starts in a pool block as big as the most one of its role held before; it grows by doubling,
 * with realloc (a big block's pages move, none is copied), where a bytearray grows by an
 * eighth. */
#ifndef RUNTIME_EMU_ROWBUF_H
#define RUNTIME_EMU_ROWBUF_H

#include <Python.h>

typedef struct {
    PyObject_HEAD
    char *p;              /* the bytes (a pool block), or NULL while empty */
    Py_ssize_t len, cap;  /* bytes used, bytes room */
    Py_ssize_t exports;   /* buffer-protocol views alive: no resize meanwhile */
    int role;             /* what it holds (a recorder buffer, the ground truth), -1: unsaid */
} RowBuf;

/* What _rowtable.c offers _core.c, through the capsule ROWBUF_CAPSULE. */
typedef struct {
    PyTypeObject *type;
    /* room for at least `need` bytes in all (the buffer not viewed); -1 with an error set */
    int (*reserve)(RowBuf *r, Py_ssize_t need);
} RowBufAPI;

#define ROWBUF_CAPSULE "runtime_emu._rowtable._rowbuf_api"

/* `add` bytes appended to a RowBuf */
static inline int rowbuf_append(const RowBufAPI *api, RowBuf *r, const void *data, Py_ssize_t add) {
    if (r->cap - r->len < add && api->reserve(r, r->len + add) < 0) return -1;
    memcpy(r->p + r->len, data, (size_t)add);
    r->len += add;
    return 0;
}

#endif
