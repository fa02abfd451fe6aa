/* Native build of the emulator's trace table from the recorder's row buffers.
 *
 * The recorder packs its frequent rows (device tasks, host API slices, launch->task flows,
 * counters) as int64 fields, strings as codes into its string table (recorder.py); rare rows
 * are full tuples in the table's column order. tables.py turns them into the sorted, typed
 * trace table with Arrow compute; this does the same in one pass per output row, with no
 * Python object per row: it sorts the rows by (rank, ts), ties in recording order (the full
 * rows, then tasks, API slices, flows, counters, each in the order recorded), writes every
 * column straight into Arrow-layout buffers in that order (the `args` JSON, the flow ids and
 * extras formatted as it goes), on `workers` threads over disjoint row ranges with the GIL
 * released, and gives the dictionary columns in canonical form (the values used, in order of
 * first use: schema.canonical_dictionary), so the table needs no second pass.
 *
 * It covers what the recorder writes. For anything else it returns None and tables.py's
 * Arrow build decides (with its own errors): a null where the table has a column that is
 * never null, a code outside the string table, a value outside its column's type, a full
 * row of another shape, a key range the radix sort cannot pack, text past 2 GiB. On what it
 * accepts it gives exactly the table the Arrow build gives (tests/test_emu_rowtable.py).
 *
 * build(tasks, apis, flows, counters, rows, strings, quoted, fixed, units, workers)
 *     -> (n, columns) | None
 *   tasks .. counters: C-contiguous int64 buffers of 16, 17, 9 and 9 fields per row, or None;
 *   rows: list of 19-tuples; strings: the recorder's string table (code -> text); quoted: each
 *   of them as it stands between the quotes of a JSON string; fixed: the codes of "X", "s",
 *   "f", "C", "HostToDevice", "AscendCL", "flow", "counter"; units: a counter unit's args key
 *   by unit number; workers: threads to write with (1..8).
 *   columns: per column of the schema, (validity or None, null count, data, offsets or None,
 *   dictionary values or None): buffers as objects exporting the buffer protocol.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include "_rowbuf.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCOL 19
enum { C_RANK, C_PH, C_NAME, C_CAT, C_TS, C_DUR, C_PID, C_TID, C_ID, C_ARGS, C_EXTRA, C_KIND, C_DEVICE,
       C_STREAM, C_CORR, C_BYTES, C_ADDR, C_VALUE, C_STEP };
enum { T_I32, T_CODE, T_I64, T_F64, T_STR };
static const int COL_TYPE[NCOL] = {T_I32, T_CODE, T_CODE, T_CODE, T_I64, T_I64, T_I64, T_I64, T_STR, T_STR,
                                   T_STR, T_CODE, T_I32, T_I32, T_I64, T_I64, T_I64, T_F64, T_I32};
#define NSTR 3 /* id, args, extra */
static const int STR_COL[NSTR] = {C_ID, C_ARGS, C_EXTRA};
static int str_slot(int col) { return col == C_ID ? 0 : col == C_ARGS ? 1 : 2; }

#define NUL (-1) /* a missing value in the packed buffers */
#define MAX_PARTS 8
enum { W_TASK = 16, W_API = 17, W_FLOW = 9, W_COUNTER = 9 };
enum { FX_X, FX_S, FX_F, FX_C, FX_H2D, FX_ACL, FX_FLOW, FX_COUNTER, NFIXED };
enum { K_KERNEL, K_MEMCPY, K_MEMSET, K_WAIT, K_RECORD };
#define NUNITS 3

/* ------------------------------------------------------------------ a pool of big blocks
 *
 * A build needs about 140 bytes of new memory per row (the columns, the sort's temporaries);
 * 2.4M rows are ~340 MB. Memory malloc takes from the kernel costs a page fault per 4 KiB on
 * first touch, and on virtual machines that hand freed memory back to the host (free page
 * reporting) that fault costs several microseconds, more than writing the page: measured on a
 * 2-core VM, 323 MB of fresh columns took 0.13-0.63 s just to fault in, run to run. So the
 * blocks a build allocates (from 1 MiB up) go back to a pool when freed, a table's columns when
 * Arrow lets go of them, and the next build in the process (a streamed cut, the next run)
 * takes them again, faulted in already. The recorder's row buffers (RowBuffer, below) take
 * their room from the same pool and give it back once the table is built, so a recording's
 * rows, about 270 MB more for those 2.4M rows, are written into faulted-in memory too. The
 * pool holds at most pool_limit bytes (MSPROF_PY_POOL_MB, 1024 by default, read by tables.py;
 * 0 turns it off); release_pool() frees what it holds. */

#define POOL_MIN ((size_t)1 << 20) /* smaller blocks are malloc's business */
#define POOL_SLOTS 256
#define BLOCK_HEAD 64 /* a block's header (its capacity), which keeps the data 64-byte aligned as Arrow likes */

static struct {
    char *base;
    size_t cap;
} pool[POOL_SLOTS];
static int npool;
static size_t pooled, pool_limit = (size_t)1024 << 20;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

/* At least `size` bytes from the pool (the smallest block that fits and is not more than twice
 * as big); NULL when it has none. */
static void *pool_take(size_t size) {
    char *base = NULL;
    size_t cap = 0;
    if (size < POOL_MIN / 2) return NULL;
    pthread_mutex_lock(&pool_mu);
    int best = -1;
    for (int k = 0; k < npool; k++)
        if (pool[k].cap >= size && pool[k].cap <= 2 * size && (best < 0 || pool[k].cap < pool[best].cap)) best = k;
    if (best >= 0) {
        base = pool[best].base;
        cap = pool[best].cap;
        pooled -= cap;
        pool[best] = pool[--npool];
    }
    pthread_mutex_unlock(&pool_mu);
    if (!base) return NULL;
    memcpy(base, &cap, sizeof cap);
    return base + BLOCK_HEAD;
}

/* At least `size` bytes, from the pool or new; NULL when out of memory. */
static void *pmalloc(size_t size) {
    if (!size) size = 1;
    char *p = pool_take(size), *base;
    if (p) return p;
    if (posix_memalign((void **)&base, BLOCK_HEAD, BLOCK_HEAD + size)) return NULL;
    memcpy(base, &size, sizeof size);
    return base + BLOCK_HEAD;
}

static void pfree(void *p) {
    if (!p) return;
    char *base = (char *)p - BLOCK_HEAD;
    size_t cap;
    memcpy(&cap, base, sizeof cap);
    if (cap >= POOL_MIN) {
        pthread_mutex_lock(&pool_mu);
        int kept = npool < POOL_SLOTS && pooled + cap <= pool_limit;
        if (kept) {
            pool[npool].base = base;
            pool[npool++].cap = cap;
            pooled += cap;
        }
        pthread_mutex_unlock(&pool_mu);
        if (kept) return;
    }
    free(base);
}

/* A fork while another thread holds the pool's lock (a streamed build) must not leave the child
 * with the lock held: the fork waits for it, and both sides let go. */
static void pool_prepare(void) { pthread_mutex_lock(&pool_mu); }
static void pool_resume(void) { pthread_mutex_unlock(&pool_mu); }

/* set_pool_limit(bytes): the most the pool holds from now on (0: none), the rest freed. */
static PyObject *set_pool_limit(PyObject *self, PyObject *arg) {
    Py_ssize_t limit = PyLong_AsSsize_t(arg);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (limit < 0) {
        PyErr_SetString(PyExc_ValueError, "set_pool_limit: the limit is a number of bytes, >= 0");
        return NULL;
    }
    char *drop[POOL_SLOTS];
    int ndrop = 0;
    pthread_mutex_lock(&pool_mu);
    pool_limit = (size_t)limit;
    while (npool && pooled > pool_limit) {
        drop[ndrop++] = pool[--npool].base;
        pooled -= pool[npool].cap;
    }
    pthread_mutex_unlock(&pool_mu);
    for (int k = 0; k < ndrop; k++) free(drop[k]);
    Py_RETURN_NONE;
}

/* release_pool(): frees every block the pool holds. */
static PyObject *release_pool(PyObject *self, PyObject *unused) {
    char *drop[POOL_SLOTS];
    int ndrop = 0;
    pthread_mutex_lock(&pool_mu);
    while (npool) drop[ndrop++] = pool[--npool].base;
    pooled = 0;
    pthread_mutex_unlock(&pool_mu);
    for (int k = 0; k < ndrop; k++) free(drop[k]);
    Py_RETURN_NONE;
}

/* pool_state() -> (blocks, bytes, limit) */
static PyObject *pool_state(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&pool_mu);
    int blocks = npool;
    size_t bytes = pooled, limit = pool_limit;
    pthread_mutex_unlock(&pool_mu);
    return Py_BuildValue("(inn)", blocks, (Py_ssize_t)bytes, (Py_ssize_t)limit);
}

/* ------------------------------------------------------------------ owned memory for Arrow */

typedef struct {
    PyObject_HEAD
    char *p;
    Py_ssize_t len;
} Mem;

static void mem_dealloc(PyObject *o) {
    pfree(((Mem *)o)->p);
    Py_TYPE(o)->tp_free(o);
}

static char EMPTY[1];

static int mem_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    Mem *m = (Mem *)o;
    return PyBuffer_FillInfo(view, o, m->p ? m->p : EMPTY, m->len, 0, flags);
}

static PyBufferProcs mem_as_buffer = {mem_getbuffer, NULL};

static PyTypeObject MemType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._rowtable.Mem",
    .tp_basicsize = sizeof(Mem),
    .tp_dealloc = mem_dealloc,
    .tp_as_buffer = &mem_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A block of memory a built column owns.",
};

/* A Mem taking over p (freed with it, or here on failure). */
static PyObject *mem_of(char *p, Py_ssize_t len) {
    Mem *m = PyObject_New(Mem, &MemType);
    if (!m) {
        pfree(p);
        return NULL;
    }
    m->p = p;
    m->len = len;
    return (PyObject *)m;
}

/* ------------------------------------------------------------------ the recorder's row buffers */

/* The capacity of a pmalloc'd block (at least what was asked for). */
static size_t pcap(const void *p) {
    size_t cap;
    memcpy(&cap, (const char *)p - BLOCK_HEAD, sizeof cap);
    return cap;
}

#define ROWBUF_FIRST ((Py_ssize_t)1 << 16) /* a buffer's first room */

/* The most a row buffer of each role (the recorder's buffers by name, the ground truth's) has
 * held: one of that role takes a pool block that big for its first row when the pool has one,
 * so a recording the size of an earlier one in the process writes into faulted-in memory and
 * never grows. (At the first row, not when made: a recorder makes new buffers as it hands the
 * old ones to a table build, and a finished recording's unused ones must not hold blocks.) */
#define ROLES 8
static Py_ssize_t role_size[ROLES];

static int rowbuf_reserve(RowBuf *r, Py_ssize_t need) {
    if (need <= r->cap) return 0;
    if (r->exports) {
        PyErr_SetString(PyExc_BufferError, "Existing exports of data: object cannot be re-sized");
        return -1;
    }
    Py_ssize_t cap = r->cap < ROWBUF_FIRST / 2 ? ROWBUF_FIRST : 2 * r->cap;
    if (cap < need) cap = need;
    /* the block it has, grown by realloc, which moves a big block's pages (mremap) where a copy
     * into another block would fault the rows' pages in twice over (the pool's blocks go to new
     * buffers whole, at their first row: see role_size) */
    char *q = NULL;
    if (r->p == NULL) {
        size_t held = r->role >= 0 ? (size_t)role_size[r->role] : 0;
        if (held >= POOL_MIN && held >= (size_t)need) q = pool_take(held);
        if (q == NULL) q = pmalloc((size_t)cap);
    } else {
        char *base = realloc(r->p - BLOCK_HEAD, BLOCK_HEAD + (size_t)cap);
        if (base != NULL && (uintptr_t)base % BLOCK_HEAD != 0) {
            /* moved within the heap (a smaller block), off the pool's alignment: into one of its own */
            q = pmalloc((size_t)cap);
            if (q != NULL) memcpy(q, base + BLOCK_HEAD, (size_t)r->len);
            free(base);
            base = NULL;
            if (q == NULL) r->p = NULL, r->len = r->cap = 0; /* (its rows are lost with the error) */
        }
        if (base != NULL) {
            size_t room = (size_t)cap;
            memcpy(base, &room, sizeof room);
            q = base + BLOCK_HEAD;
        }
    }
    if (q == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    r->p = q;
    r->cap = (Py_ssize_t)pcap(q);
    return 0;
}

/* RowBuffer(data=b"", role=-1): a row buffer holding a copy of data; `role` 0..7 names what it
 * holds (see role_size) */
static PyObject *rowbuf_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"data", "role", NULL};
    Py_buffer view = {0};
    int role = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|y*i:RowBuffer", names, &view, &role)) return NULL;
    if (role < -1 || role >= ROLES) {
        if (view.obj) PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "RowBuffer: role is -1 (none) or 0..%d, got %d", ROLES - 1, role);
        return NULL;
    }
    RowBuf *r = (RowBuf *)type->tp_alloc(type, 0);
    if (r != NULL) r->role = role;
    if (r != NULL && view.len && rowbuf_append(&(RowBufAPI){type, rowbuf_reserve}, r, view.buf, view.len) < 0)
        Py_CLEAR(r);
    if (view.obj) PyBuffer_Release(&view);
    return (PyObject *)r;
}

static void rowbuf_dealloc(PyObject *o) {
    RowBuf *r = (RowBuf *)o;
    if (r->role >= 0 && r->len > role_size[r->role]) role_size[r->role] = r->len;
    pfree(r->p);
    Py_TYPE(o)->tp_free(o);
}

static int rowbuf_getbuffer(PyObject *o, Py_buffer *view, int flags) {
    RowBuf *r = (RowBuf *)o;
    if (PyBuffer_FillInfo(view, o, r->p ? r->p : EMPTY, r->len, 0, flags) < 0) return -1;
    r->exports++;
    return 0;
}

static void rowbuf_releasebuffer(PyObject *o, Py_buffer *view) { ((RowBuf *)o)->exports--; }

static Py_ssize_t rowbuf_length(PyObject *o) { return ((RowBuf *)o)->len; }

static PyObject *rowbuf_sizeof(PyObject *o, PyObject *unused) {
    return PyLong_FromSsize_t((Py_ssize_t)sizeof(RowBuf) + ((RowBuf *)o)->cap);
}

static PyBufferProcs rowbuf_as_buffer = {rowbuf_getbuffer, rowbuf_releasebuffer};
static PySequenceMethods rowbuf_as_sequence = {.sq_length = rowbuf_length};
static PyMethodDef rowbuf_methods[] = {
    {"__sizeof__", rowbuf_sizeof, METH_NOARGS, "size in memory, room included"}, {NULL}};

static PyTypeObject RowBufType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._rowtable.RowBuffer",
    .tp_basicsize = sizeof(RowBuf),
    .tp_new = rowbuf_new,
    .tp_dealloc = rowbuf_dealloc,
    .tp_as_buffer = &rowbuf_as_buffer,
    .tp_as_sequence = &rowbuf_as_sequence,
    .tp_methods = rowbuf_methods,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RowBuffer(data=b'', role=-1): the recorder's packed rows, on the block pool (see _rowbuf.h)",
};

static RowBufAPI rowbuf_api = {&RowBufType, rowbuf_reserve};

/* ------------------------------------------------------------------ inputs */

typedef struct {
    const char *p;
    Py_ssize_t n;
} Text;

/* A full row, converted while the GIL is held. */
typedef struct {
    int64_t v[NCOL]; /* ints, and codes for the dictionary columns */
    double value;
    uint32_t null; /* bit per column */
    Text s[NSTR];
} Full;

typedef struct {
    const int64_t *d;
    int64_t n;
} Src;

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

typedef struct {
    void *data;
    uint8_t *valid;
    int32_t *off;
    char *sdata;
    size_t slen;
    int64_t nulls;
} Col;

struct Ctx;

typedef struct {
    struct Ctx *c;
    int64_t lo, hi;
    int measure;         /* 1: the sizing pass, which only adds up the text each string column needs */
    Buf s[NSTR];         /* sizing pass: scratch room for one row; writing pass: the column's own buffer */
    size_t base[NSTR];   /* where this part's text starts in its column */
    size_t total[NSTR];  /* the text it needs, from the sizing pass */
    int64_t nulls[NCOL];
    int fail; /* 1: out of memory, 2: declined */
} Part;

typedef struct Ctx {
    Src task, api, flow, counter;
    Full *full;
    int64_t nfull;
    int64_t b_task, b_api, b_flow, b_counter, n; /* first positions of each source; rows in all */
    uint32_t *perm; /* output row -> recording position; NULL when already in order */
    Text *str;
    int64_t nstr;
    Text *quoted;
    int64_t nquoted;
    int64_t fixed[NFIXED];
    Text units[NUNITS];
    Col col[NCOL];
} Ctx;

/* ------------------------------------------------------------------ writing one row */

static inline void bit(Col *col, int64_t i) { col->valid[i >> 3] |= (uint8_t)(1u << (i & 7)); }

static inline void put32(Ctx *c, Part *pt, int k, int64_t i, int64_t v, int isnull) {
    Col *col = &c->col[k];
    if (pt->measure) return;
    if (isnull) {
        ((int32_t *)col->data)[i] = 0;
        pt->nulls[k]++;
        return;
    }
    if (v < INT32_MIN || v > INT32_MAX) pt->fail = 2;
    ((int32_t *)col->data)[i] = (int32_t)v;
    bit(col, i);
}

static inline void putcode(Ctx *c, Part *pt, int k, int64_t i, int64_t v, int isnull) {
    if (pt->measure) return;
    if (!isnull && (v < 0 || v >= c->nstr)) pt->fail = 2;
    put32(c, pt, k, i, v, isnull);
}

static inline void put64(Ctx *c, Part *pt, int k, int64_t i, int64_t v, int isnull) {
    Col *col = &c->col[k];
    if (pt->measure) return;
    if (isnull) {
        ((int64_t *)col->data)[i] = 0;
        pt->nulls[k]++;
        return;
    }
    ((int64_t *)col->data)[i] = v;
    bit(col, i);
}

static inline void putf64(Ctx *c, Part *pt, int64_t i, double v, int isnull) {
    Col *col = &c->col[C_VALUE];
    if (pt->measure) return;
    ((double *)col->data)[i] = isnull ? 0.0 : v;
    if (isnull) pt->nulls[C_VALUE]++;
    else bit(col, i);
}

/* A string column's row: sbegin reserves room and returns where to write, send ends it. The
 * sizing pass writes every row at the start of a scratch buffer and adds up the lengths; the
 * writing pass writes them in place, at the part's base in the column's one buffer, which the
 * sizing pass made exactly as long as the text (so the parts need no joining afterwards). */
static inline char *sbegin(Part *pt, int s, size_t need) {
    Buf *b = &pt->s[s];
    if (b->len + need > b->cap) {
        size_t cap = b->cap ? b->cap : (size_t)1 << 16;
        while (cap < b->len + need) cap *= 2;
        char *q = b->p ? realloc(b->p, cap) : malloc(cap);
        if (!q) {
            pt->fail = 1;
            return NULL;
        }
        b->p = q;
        b->cap = cap;
    }
    return b->p + b->len;
}

static inline void send(Ctx *c, Part *pt, int s, int64_t i, char *end) {
    Buf *b = &pt->s[s];
    Col *col = &c->col[STR_COL[s]];
    if (pt->measure) {
        pt->total[s] += (size_t)(end - b->p);
        return;
    }
    col->off[i] = (int32_t)(pt->base[s] + b->len);
    b->len = (size_t)(end - b->p);
    bit(col, i);
}

static inline void snull(Ctx *c, Part *pt, int s, int64_t i) {
    Col *col = &c->col[STR_COL[s]];
    if (pt->measure) return;
    col->off[i] = (int32_t)(pt->base[s] + pt->s[s].len);
    pt->nulls[STR_COL[s]]++;
}

static inline char *lit(char *q, const char *text, size_t n) {
    memcpy(q, text, n);
    return q + n;
}
#define LIT(q, text) lit((q), (text), sizeof(text) - 1)
/* A JSON member whose value is an integer: the literal text before it, then the number. */
#define MEMBER(q, text, v) num(LIT((q), text), (v))

static inline char *text(char *q, Text t) {
    memcpy(q, t.p, (size_t)t.n);
    return q + t.n;
}

static inline char *num(char *q, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u;
    if (v < 0) {
        *q++ = '-';
        u = (uint64_t)0 - (uint64_t)v;
    } else {
        u = (uint64_t)v;
    }
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    while (n) *q++ = tmp[--n];
    return q;
}

/* Room for a row's formatted numbers and fixed text, beyond its strings. */
#define ROOM 320

static void task_row(Ctx *c, Part *pt, int64_t i, const int64_t *f) {
    if (f[3] == NUL) {  /* tid (the stream) is never null */
        pt->fail = 2;
        return;
    }
    put32(c, pt, C_RANK, i, f[0], 0);
    putcode(c, pt, C_PH, i, c->fixed[FX_X], 0);
    putcode(c, pt, C_NAME, i, f[6], 0);
    putcode(c, pt, C_CAT, i, 0, 1);
    put64(c, pt, C_TS, i, f[4], 0);
    put64(c, pt, C_DUR, i, f[5], 0);
    put64(c, pt, C_PID, i, f[2], 0);
    put64(c, pt, C_TID, i, (int32_t)f[3], 0);
    snull(c, pt, 0, i);
    snull(c, pt, 2, i);
    putcode(c, pt, C_KIND, i, f[7], 0);
    put32(c, pt, C_DEVICE, i, f[1], f[1] == NUL);
    put32(c, pt, C_STREAM, i, f[3], 0);
    put64(c, pt, C_CORR, i, f[9], f[9] == NUL);
    put64(c, pt, C_BYTES, i, f[12], f[12] == NUL);
    /* addr: a kernel's pool's cores, an event wait's or record's event (field 14); value: a
     * kernel's block dim */
    int64_t kind = f[7];
    int kern = kind == K_KERNEL, addr14 = kern || kind == K_WAIT || kind == K_RECORD;
    put64(c, pt, C_ADDR, i, addr14 ? f[14] : 0, !addr14 || f[14] == NUL);
    putf64(c, pt, i, kern ? (double)f[10] : 0.0, !kern || f[10] == NUL);
    put32(c, pt, C_STEP, i, f[15], f[15] == NUL);
    /* args: the head every kind has, then the kind's own members; null with a null part */
    if (f[8] < 0 || f[8] >= c->nstr || kind < K_KERNEL || kind > K_RECORD) {
        pt->fail = 2;
        return;
    }
    int64_t text13 = f[13] > 0 ? f[13] : 0;
    if (f[9] == NUL || ((kind == K_MEMCPY || kind == K_MEMSET) && f[12] == NUL)) {
        snull(c, pt, 1, i);
        return;
    }
    Text tail = {"", 0};
    if (kind == K_KERNEL) {
        if (text13 >= c->nquoted) {
            pt->fail = 2;
            return;
        }
        tail = c->quoted[text13];
    } else if (kind == K_MEMCPY) {
        if (text13 >= c->nstr) {
            pt->fail = 2;
            return;
        }
        tail = c->str[text13];
    }
    char *q = sbegin(pt, 1, ROOM + (size_t)c->str[f[8]].n + (size_t)tail.n);
    if (!q) return;
    q = LIT(q, "{\"Task Type\":\"");
    q = text(q, c->str[f[8]]);
    q = MEMBER(q, "\",\"Stream Id\":", (int32_t)f[3]);
    q = MEMBER(q, ",\"Task Id\":", f[9]);
    switch (kind) {
    case K_KERNEL:
        q = MEMBER(q, ",\"Block Dim\":", f[10]);
        q = MEMBER(q, ",\"Waves\":", f[11]);
        q = LIT(q, ",\"OP Type\":\"");
        q = text(q, tail);
        q = LIT(q, "\"}");
        break;
    case K_MEMCPY:
        q = MEMBER(q, ",\"size(Byte)\":", f[12]);
        q = LIT(q, ",\"Copy Kind\":\"");
        q = text(q, tail);
        q = LIT(q, "\"}");
        break;
    case K_MEMSET:
        q = MEMBER(q, ",\"size(Byte)\":", f[12]);
        q = LIT(q, "}");
        break;
    default: /* a wait or a record */
        q = MEMBER(q, ",\"Event Id\":", f[14]);
        q = LIT(q, "}");
    }
    send(c, pt, 1, i, q);
}

static void api_row(Ctx *c, Part *pt, int64_t i, const int64_t *f) {
    if (f[2] == NUL) {  /* tid is never null */
        pt->fail = 2;
        return;
    }
    put32(c, pt, C_RANK, i, f[0], 0);
    putcode(c, pt, C_PH, i, c->fixed[FX_X], 0);
    putcode(c, pt, C_NAME, i, f[3], 0);
    putcode(c, pt, C_CAT, i, c->fixed[FX_ACL], 0);
    put64(c, pt, C_TS, i, f[4], 0);
    put64(c, pt, C_DUR, i, f[5], 0);
    put64(c, pt, C_PID, i, f[1], 0);
    put64(c, pt, C_TID, i, f[2], 0);
    snull(c, pt, 0, i);
    snull(c, pt, 2, i);
    putcode(c, pt, C_KIND, i, f[6], 0);
    put32(c, pt, C_DEVICE, i, f[7], f[7] == NUL);
    put32(c, pt, C_STREAM, i, f[8], f[8] == NUL);
    put64(c, pt, C_CORR, i, f[9], f[9] == NUL);
    put64(c, pt, C_BYTES, i, f[10], f[10] == NUL);
    put64(c, pt, C_ADDR, i, f[16], f[16] == NUL);
    putf64(c, pt, i, 0.0, 1);
    put32(c, pt, C_STEP, i, f[11], f[11] == NUL);
    /* args: the thread, then each member the call has (a null field leaves its member out) */
    int64_t blocked = f[13] > 0 ? f[13] : 0;
    if (blocked >= c->nstr) {
        pt->fail = 2;
        return;
    }
    Text why = c->str[blocked];
    char *q = sbegin(pt, 1, ROOM + (size_t)why.n);
    if (!q) return;
    q = MEMBER(q, "{\"Thread Id\":", f[2]);
    if (f[8] != NUL) {
        q = MEMBER(q, ",\"Stream Id\":", f[8]);
    }
    if (f[12] != NUL) {
        q = MEMBER(q, ",\"Block Dim\":", f[12]);
    }
    if (f[14] != NUL) {
        q = LIT(q, ",\"Blocked\":\"");
        q = text(q, why);
        q = MEMBER(q, "\",\"Blocked (ns)\":", f[14]);
    }
    if (f[15] != NUL) {
        q = MEMBER(q, ",\"Src Addr\":", f[15]);
    }
    if (f[16] != NUL) {
        q = MEMBER(q, ",\"Dst Addr\":", f[16]);
    }
    q = LIT(q, "}");
    send(c, pt, 1, i, q);
}

static void flow_row(Ctx *c, Part *pt, int64_t i, const int64_t *f) {
    int finish = f[1] == 1;
    put32(c, pt, C_RANK, i, f[0], 0);
    putcode(c, pt, C_PH, i, c->fixed[finish ? FX_F : FX_S], 0);
    putcode(c, pt, C_NAME, i, c->fixed[FX_H2D], 0);
    putcode(c, pt, C_CAT, i, c->fixed[FX_H2D], 0);
    put64(c, pt, C_TS, i, f[2], 0);
    put64(c, pt, C_DUR, i, 0, 1);
    put64(c, pt, C_PID, i, f[3], 0);
    put64(c, pt, C_TID, i, f[4], 0);
    if (f[5] == NUL) {
        snull(c, pt, 0, i);
    } else {
        char *q = sbegin(pt, 0, 24);
        if (!q) return;
        send(c, pt, 0, i, num(q, f[5]));
    }
    snull(c, pt, 1, i);
    if (finish) {
        char *q = sbegin(pt, 2, 16);
        if (!q) return;
        send(c, pt, 2, i, LIT(q, "{\"bp\":\"e\"}"));
    } else {
        snull(c, pt, 2, i);
    }
    putcode(c, pt, C_KIND, i, c->fixed[FX_FLOW], 0);
    put32(c, pt, C_DEVICE, i, f[6], f[6] == NUL);
    put32(c, pt, C_STREAM, i, f[7], f[7] == NUL);
    put64(c, pt, C_CORR, i, f[5], f[5] == NUL);
    put64(c, pt, C_BYTES, i, 0, 1);
    put64(c, pt, C_ADDR, i, 0, 1);
    putf64(c, pt, i, 0.0, 1);
    put32(c, pt, C_STEP, i, f[8], f[8] == NUL);
}

static void counter_row(Ctx *c, Part *pt, int64_t i, const int64_t *f) {
    put32(c, pt, C_RANK, i, f[0], 0);
    putcode(c, pt, C_PH, i, c->fixed[FX_C], 0);
    putcode(c, pt, C_NAME, i, f[2], 0);
    putcode(c, pt, C_CAT, i, 0, 1);
    put64(c, pt, C_TS, i, f[3], 0);
    put64(c, pt, C_DUR, i, 0, 1);
    put64(c, pt, C_PID, i, f[1], 0);
    put64(c, pt, C_TID, i, 0, 0);
    snull(c, pt, 0, i);
    Text unit = c->units[f[5] == 0 ? 0 : f[5] == 1 ? 1 : 2];
    char *q = sbegin(pt, 1, ROOM + (size_t)unit.n);
    if (!q) return;
    q = LIT(q, "{\"");
    q = text(q, unit);
    q = MEMBER(q, "\":", f[4]);
    q = LIT(q, "}");
    send(c, pt, 1, i, q);
    snull(c, pt, 2, i);
    putcode(c, pt, C_KIND, i, c->fixed[FX_COUNTER], 0);
    put32(c, pt, C_DEVICE, i, f[6], f[6] == NUL);
    put32(c, pt, C_STREAM, i, f[7], f[7] == NUL);
    put64(c, pt, C_CORR, i, 0, 1);
    put64(c, pt, C_BYTES, i, 0, 1);
    put64(c, pt, C_ADDR, i, 0, 1);
    putf64(c, pt, i, (double)f[4], 0);
    put32(c, pt, C_STEP, i, f[8], f[8] == NUL);
}

static void full_row(Ctx *c, Part *pt, int64_t i, const Full *r) {
    for (int k = 0; k < NCOL; k++) {
        int isnull = (r->null >> k) & 1;
        switch (COL_TYPE[k]) {
        case T_I32: put32(c, pt, k, i, r->v[k], isnull); break;
        case T_CODE: putcode(c, pt, k, i, r->v[k], isnull); break;
        case T_I64: put64(c, pt, k, i, r->v[k], isnull); break;
        case T_F64: putf64(c, pt, i, r->value, isnull); break;
        default: {
            int s = str_slot(k);
            if (isnull) {
                snull(c, pt, s, i);
            } else {
                char *q = sbegin(pt, s, (size_t)r->s[s].n + 1);
                if (!q) return;
                send(c, pt, s, i, text(q, r->s[s]));
            }
        }
        }
    }
}

static void *write_part(void *arg) {
    Part *pt = (Part *)arg;
    Ctx *c = pt->c;
    for (int k = 0; !pt->measure && k < NCOL; k++) { /* this part's bytes of each bitmap (lo: a multiple of 8) */
        int64_t first = pt->lo >> 3, last = (pt->hi + 7) >> 3;
        memset(c->col[k].valid + first, 0, (size_t)(last - first));
    }
    for (int64_t i = pt->lo; i < pt->hi && !pt->fail; i++) {
        int64_t p = c->perm ? (int64_t)c->perm[i] : i;
        if (p < c->b_task) full_row(c, pt, i, &c->full[p]);
        else if (p < c->b_api) task_row(c, pt, i, c->task.d + (p - c->b_task) * W_TASK);
        else if (p < c->b_flow) api_row(c, pt, i, c->api.d + (p - c->b_api) * W_API);
        else if (p < c->b_counter) flow_row(c, pt, i, c->flow.d + (p - c->b_flow) * W_FLOW);
        else counter_row(c, pt, i, c->counter.d + (p - c->b_counter) * W_COUNTER);
    }
    return NULL;
}

/* ------------------------------------------------------------------ the order */

/* The rows come from five sources, in recording order: the full rows, then the packed tasks,
 * API slices, flows and counters. Source s's row j has rank r and ts t: */
#define NSRC 5
static const int KEY_WIDTH[NSRC] = {0, W_TASK, W_API, W_FLOW, W_COUNTER}, KEY_TS[NSRC] = {0, 4, 4, 2, 3};

static inline int64_t src_rows(const Ctx *c, int s) {
    return s == 0 ? c->nfull : s == 1 ? c->task.n : s == 2 ? c->api.n : s == 3 ? c->flow.n : c->counter.n;
}

static inline const int64_t *src_data(const Ctx *c, int s) {
    return s == 1 ? c->task.d : s == 2 ? c->api.d : s == 3 ? c->flow.d : c->counter.d;
}

#define DIGIT 11
#define BUCKETS (1 << DIGIT)
#define MAX_DIGITS 6 /* 6 * 11 >= 64 */

/* A stable LSD radix sort of key[0..n) over its 11-bit digits that vary: key sorted in place,
 * *out the positions in that order (malloc'd). 1 done, -1 out of memory. */
static int radix(uint64_t *key, int64_t n, int digits, uint32_t **out) {
    uint64_t *key2 = pmalloc((size_t)n * 8), *k0 = key;
    uint32_t *idx = pmalloc((size_t)n * 4), *idx2 = pmalloc((size_t)n * 4);
    size_t (*count)[BUCKETS] = calloc(MAX_DIGITS, sizeof *count);
    if (!key2 || !idx || !idx2 || !count) {
        pfree(key2), pfree(idx), pfree(idx2), free(count);
        return -1;
    }
    for (int64_t p = 0; p < n; p++) {
        uint64_t k = key[p];
        idx[p] = (uint32_t)p;
        for (int b = 0; b < digits; b++) count[b][(k >> (DIGIT * b)) & (BUCKETS - 1)]++;
    }
    for (int b = 0; b < digits; b++) {
        size_t *cnt = count[b];
        int single = 0;
        for (int v = 0; v < BUCKETS; v++)
            if (cnt[v] == (size_t)n) single = 1;
        if (single) continue; /* every key has the same digit here */
        size_t at = 0;
        for (int v = 0; v < BUCKETS; v++) {
            size_t k = cnt[v];
            cnt[v] = at;
            at += k;
        }
        int shift = DIGIT * b;
        for (int64_t p = 0; p < n; p++) {
            uint64_t k = key[p];
            size_t to = cnt[(k >> shift) & (BUCKETS - 1)]++;
            key2[to] = k;
            idx2[to] = idx[p];
        }
        uint64_t *tk = key; key = key2; key2 = tk;
        uint32_t *ti = idx; idx = idx2; idx2 = ti;
    }
    if (key != k0) { /* an odd number of passes: the sorted keys are in the spare */
        memcpy(k0, key, (size_t)n * 8);
        key2 = key;
    }
    pfree(key2), pfree(idx2), free(count);
    *out = idx;
    return 1;
}

/* The recording positions in (rank, ts) order, ties in recording order. Each source is in
 * order already or is sorted on its own (a stable radix sort of rank << tsbits | (ts - min
 * ts): the tasks, recorded as they end, usually are not), then the five are merged, ties to
 * the earlier source; so the sort's temporaries are as big as the sources that need one.
 * 0: in order already (c->perm stays NULL), 1: sorted, -1: out of memory, -2: declined (keys
 * do not pack). */
static int order(Ctx *c) {
    int64_t n = c->n, rmin = INT64_MAX, rmax = INT64_MIN, tmin = INT64_MAX, tmax = INT64_MIN;
    int64_t prev_r = INT64_MIN, prev_t = INT64_MIN;
    int sorted = 1, src_sorted[NSRC];
    for (int s = 0; s < NSRC; s++) {
        int64_t m = src_rows(c, s), pr = INT64_MIN, pt = INT64_MIN;
        int ok = 1;
        for (int64_t j = 0; j < m; j++) {
            int64_t r, t;
            if (s == 0) {
                r = c->full[j].v[C_RANK], t = c->full[j].v[C_TS];
            } else {
                const int64_t *f = src_data(c, s) + j * KEY_WIDTH[s];
                r = f[0], t = f[KEY_TS[s]];
            }
            if (r < rmin) rmin = r;
            if (r > rmax) rmax = r;
            if (t < tmin) tmin = t;
            if (t > tmax) tmax = t;
            if (r < pr || (r == pr && t < pt)) ok = 0;
            if (r < prev_r || (r == prev_r && t < prev_t)) sorted = 0;
            pr = prev_r = r;
            pt = prev_t = t;
        }
        src_sorted[s] = ok;
    }
    if (sorted) return 0;
    if (rmin < 0) return -2;
    uint64_t span = (uint64_t)tmax - (uint64_t)tmin;
    int tbits = 0, rbits = 0;
    while (tbits < 64 && (span >> tbits)) tbits++;
    while (rbits < 64 && ((uint64_t)rmax >> rbits)) rbits++;
    if (tbits + rbits > 64 || n > (int64_t)UINT32_MAX) return -2;
    int digits = (tbits + rbits + DIGIT - 1) / DIGIT;
#define KEY(r, t) ((tbits < 64 ? (uint64_t)(r) << tbits : 0) | ((uint64_t)(t) - (uint64_t)tmin))
    /* a source out of order: its keys, sorted, and its positions in that order */
    uint64_t *keys[NSRC] = {0};
    uint32_t *local[NSRC] = {0};
    uint32_t *perm = pmalloc((size_t)n * 4);
    int res = perm ? 1 : -1;
    for (int s = 0; res == 1 && s < NSRC; s++) {
        int64_t m = src_rows(c, s);
        if (!m || src_sorted[s]) continue;
        keys[s] = pmalloc((size_t)m * 8);
        if (!keys[s]) {
            res = -1;
            break;
        }
        for (int64_t j = 0; j < m; j++) {
            if (s == 0) {
                keys[s][j] = KEY(c->full[j].v[C_RANK], c->full[j].v[C_TS]);
            } else {
                const int64_t *f = src_data(c, s) + j * KEY_WIDTH[s];
                keys[s][j] = KEY(f[0], f[KEY_TS[s]]);
            }
        }
        res = radix(keys[s], m, digits, &local[s]);
    }
    if (res == 1) {
        /* the merge: each source's next key (head), the smallest taken, a tie to the earlier source */
        int64_t at[NSRC] = {0}, len[NSRC], base[NSRC] = {0, c->b_task, c->b_api, c->b_flow, c->b_counter};
        uint64_t head[NSRC] = {0};
        int live[NSRC], nlive = 0;
#define HEAD(s)                                                                                    \
    do {                                                                                           \
        int64_t j_ = at[s];                                                                        \
        if (keys[s]) head[s] = keys[s][j_];                                                        \
        else if (s == 0) head[s] = KEY(c->full[j_].v[C_RANK], c->full[j_].v[C_TS]);               \
        else {                                                                                     \
            const int64_t *f_ = src_data(c, s) + j_ * KEY_WIDTH[s];                                \
            head[s] = KEY(f_[0], f_[KEY_TS[s]]);                                                   \
        }                                                                                          \
    } while (0)
        for (int s = 0; s < NSRC; s++) {
            len[s] = src_rows(c, s);
            if (len[s]) {
                live[nlive++] = s; /* in source order */
                HEAD(s);
            }
        }
        for (int64_t i = 0; i < n; i++) {
            int bi = 0, best = live[0];
            for (int q = 1; q < nlive; q++) /* strictly smaller: a tie goes to the earlier source */
                if (head[live[q]] < head[best]) bi = q, best = live[q];
            int64_t j = at[best]++;
            perm[i] = (uint32_t)(base[best] + (local[best] ? (int64_t)local[best][j] : j));
            if (at[best] < len[best]) {
                HEAD(best);
            } else { /* the source is done */
                for (int q = bi; q + 1 < nlive; q++) live[q] = live[q + 1];
                nlive--;
            }
        }
#undef HEAD
        c->perm = perm;
        perm = NULL;
    }
#undef KEY
    pfree(perm);
    for (int s = 0; s < NSRC; s++) pfree(keys[s]), pfree(local[s]);
    return res;
}

/* ------------------------------------------------------------------ the build */

static int i64_of(PyObject *o, int64_t *out) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

static int text_of(PyObject *o, Text *t) {
    if (!PyUnicode_CheckExact(o)) return 0;
    t->p = PyUnicode_AsUTF8AndSize(o, &t->n);
    if (!t->p) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* The texts of a list of str; *ok = 1, 0 when one is not a str, -1 out of memory. */
static Text *texts(PyObject *list, int *ok) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    Text *out = malloc(sizeof(Text) * (size_t)(n ? n : 1));
    *ok = out != NULL ? 1 : -1;
    for (Py_ssize_t i = 0; out && i < n; i++)
        if (!text_of(PyList_GET_ITEM(list, i), &out[i])) {
            *ok = 0;
            break;
        }
    return out;
}

/* A dictionary column's code for text: its index in strings, appended (and to codes) if new. */
static int code_of(PyObject *o, PyObject *strings, PyObject *codes, int64_t *out) {
    if (!PyUnicode_CheckExact(o)) return 0;
    PyObject *have = PyDict_GetItemWithError(codes, o);
    if (have) return i64_of(have, out);
    if (PyErr_Occurred()) return -1;
    PyObject *next = PyLong_FromSsize_t(PyList_GET_SIZE(strings));
    if (!next || PyDict_SetItem(codes, o, next) < 0 || PyList_Append(strings, o) < 0) {
        Py_XDECREF(next);
        return -1;
    }
    Py_DECREF(next);
    *out = PyList_GET_SIZE(strings) - 1;
    return 1;
}

/* Full rows as Full structs; 1 done, 0 declined, -1 a Python error. */
static int convert_rows(PyObject *rows, PyObject *strings, Full *full) {
    PyObject *codes = PyDict_New();
    if (!codes) return -1;
    int ok = 1;
    for (Py_ssize_t i = 0; ok == 1 && i < PyList_GET_SIZE(strings); i++) {
        PyObject *k = PyLong_FromSsize_t(i);
        if (!k || PyDict_SetItem(codes, PyList_GET_ITEM(strings, i), k) < 0) ok = -1;
        Py_XDECREF(k);
    }
    for (Py_ssize_t r = 0; ok == 1 && r < PyList_GET_SIZE(rows); r++) {
        PyObject *row = PyList_GET_ITEM(rows, r);
        if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != NCOL) {
            ok = 0;
            break;
        }
        Full *f = &full[r];
        memset(f, 0, sizeof *f);
        for (int k = 0; ok == 1 && k < NCOL; k++) {
            PyObject *o = PyTuple_GET_ITEM(row, k);
            int required = k == C_RANK || k == C_PH || k == C_TS || k == C_PID || k == C_TID || k == C_KIND;
            if (o == Py_None) {
                if (required) ok = 0;
                f->null |= 1u << k;
                continue;
            }
            switch (COL_TYPE[k]) {
            case T_CODE: ok = code_of(o, strings, codes, &f->v[k]); break;
            case T_I32:
            case T_I64: ok = i64_of(o, &f->v[k]); break;
            case T_F64:
                if (PyFloat_CheckExact(o)) {
                    f->value = PyFloat_AS_DOUBLE(o);
                } else if (PyLong_CheckExact(o)) {
                    f->value = PyLong_AsDouble(o);
                    if (f->value == -1.0 && PyErr_Occurred()) {
                        PyErr_Clear();
                        ok = 0;
                    }
                } else {
                    ok = 0;
                }
                break;
            default: ok = text_of(o, &f->s[str_slot(k)]);
            }
        }
    }
    Py_DECREF(codes);
    return ok;
}

static int src_of(PyObject *o, int width, Py_buffer *view, Src *src) {
    src->d = NULL;
    src->n = 0;
    view->obj = NULL;
    if (o == Py_None) return 1;
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len % (8 * width)) {
        PyBuffer_Release(view);
        view->obj = NULL;
        PyErr_SetString(PyExc_ValueError, "build: a buffer is not whole rows of int64 fields");
        return -1;
    }
    src->d = (const int64_t *)view->buf;
    src->n = view->len / (8 * width);
    return 1;
}

/* After the sizing pass: each string column's one buffer, exactly as long as its text, and each
 * part's place in it. 1 done, -1 out of memory, -2 declined (text past 2 GiB). */
static int place_strings(Ctx *c, Part *parts, int nparts) {
    for (int s = 0; s < NSTR; s++) {
        Col *col = &c->col[STR_COL[s]];
        size_t total = 0;
        for (int k = 0; k < nparts; k++) {
            parts[k].base[s] = total;
            total += parts[k].total[s];
        }
        if (total > INT32_MAX) return -2;
        col->sdata = pmalloc(total);
        if (!col->sdata) return -1;
        col->slen = total;
        col->off[c->n] = (int32_t)total;
    }
    for (int k = 0; k < nparts; k++) {
        for (int s = 0; s < NSTR; s++) {
            Buf *b = &parts[k].s[s];
            free(b->p); /* the scratch */
            b->p = c->col[STR_COL[s]].sdata + parts[k].base[s];
            b->len = 0;
            b->cap = (size_t)-1 / 2; /* the sizing pass made the room */
        }
        parts[k].measure = 0;
    }
    return 1;
}

/* After the writing pass: every part wrote the text the sizing pass counted (0 when not). */
static int placed_all(Part *parts, int nparts) {
    for (int k = 0; k < nparts; k++)
        for (int s = 0; s < NSTR; s++)
            if (parts[k].s[s].len != parts[k].total[s]) return 0;
    return 1;
}

/* The parts' rows on their threads (the first on this one); 1 done, -1 out of memory, -2 declined. */
static int run_parts(Ctx *c, Part *parts, int nparts) {
    pthread_t threads[MAX_PARTS];
    int started[MAX_PARTS] = {0}, res = 1;
    for (int k = 1; k < nparts; k++) started[k] = pthread_create(&threads[k], NULL, write_part, &parts[k]) == 0;
    write_part(&parts[0]);
    for (int k = 1; k < nparts; k++) {
        if (started[k]) pthread_join(threads[k], NULL);
        else write_part(&parts[k]);
    }
    for (int k = 0; k < nparts; k++) {
        if (parts[k].fail == 1) res = -1;
        else if (parts[k].fail == 2 && res >= 0) res = -2;
    }
    (void)c;
    return res;
}

/* A dictionary column's codes renumbered in order of first use; used[] gets the codes used. */
static int64_t canonical(Ctx *c, int k, int32_t *remap, int64_t *used) {
    Col *col = &c->col[k];
    int32_t *d = (int32_t *)col->data;
    int64_t nused = 0;
    for (int64_t s = 0; s < c->nstr; s++) remap[s] = -1;
    for (int64_t i = 0; i < c->n; i++) {
        if (!((col->valid[i >> 3] >> (i & 7)) & 1)) continue;
        int32_t code = d[i];
        if (remap[code] < 0) {
            remap[code] = (int32_t)nused;
            used[nused++] = code;
        }
        d[i] = remap[code];
    }
    return nused;
}

static void free_ctx(Ctx *c) {
    for (int k = 0; k < NCOL; k++) {
        pfree(c->col[k].data);
        pfree(c->col[k].valid);
        pfree(c->col[k].off);
        pfree(c->col[k].sdata);
    }
    pfree(c->perm);
    free(c->full);
    free(c->str);
    free(c->quoted);
}

static PyObject *column_result(Ctx *c, int k, PyObject *strings, int64_t *used, int64_t nused) {
    Col *col = &c->col[k];
    PyObject *valid, *data, *off = Py_None, *dict = Py_None;
    Py_INCREF(Py_None);
    Py_INCREF(Py_None);
    if (col->nulls) {
        valid = mem_of((char *)col->valid, (Py_ssize_t)((c->n + 7) >> 3));
    } else {
        pfree(col->valid);
        valid = Py_None;
        Py_INCREF(Py_None);
    }
    col->valid = NULL;
    size_t width = COL_TYPE[k] == T_I32 || COL_TYPE[k] == T_CODE ? 4 : 8;
    if (COL_TYPE[k] == T_STR) {
        Py_DECREF(off);
        off = mem_of((char *)col->off, (Py_ssize_t)(4 * (c->n + 1)));
        col->off = NULL;
        data = mem_of(col->sdata, (Py_ssize_t)col->slen);
        col->sdata = NULL;
        pfree(col->data);
    } else {
        data = mem_of((char *)col->data, (Py_ssize_t)(width * (size_t)c->n));
    }
    col->data = NULL;
    if (used) {
        Py_DECREF(dict);
        dict = PyList_New(nused);
        for (int64_t j = 0; dict && j < nused; j++) {
            PyObject *s = PyList_GET_ITEM(strings, used[j]);
            Py_INCREF(s);
            PyList_SET_ITEM(dict, j, s);
        }
    }
    if (!valid || !data || !off || !dict) {
        Py_XDECREF(valid), Py_XDECREF(data), Py_XDECREF(off), Py_XDECREF(dict);
        return NULL;
    }
    return Py_BuildValue("(NLNNN)", valid, (long long)col->nulls, data, off, dict);
}

static PyObject *build(PyObject *self, PyObject *args) {
    PyObject *o_task, *o_api, *o_flow, *o_counter, *rows, *strings_in, *quoted_in, *fixed_in, *units_in;
    int workers;
    if (!PyArg_ParseTuple(args, "OOOOO!O!O!O!O!i", &o_task, &o_api, &o_flow, &o_counter, &PyList_Type, &rows,
                          &PyList_Type, &strings_in, &PyList_Type, &quoted_in, &PyTuple_Type, &fixed_in,
                          &PyTuple_Type, &units_in, &workers))
        return NULL;
    if (PyTuple_GET_SIZE(fixed_in) != NFIXED || PyTuple_GET_SIZE(units_in) != NUNITS) {
        PyErr_SetString(PyExc_ValueError, "build: fixed needs 8 codes and units 3 texts");
        return NULL;
    }
    Ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    Ctx *c = &ctx;
    Py_buffer views[4];
    PyObject *out = NULL, *strings = PyList_GetSlice(strings_in, 0, PyList_GET_SIZE(strings_in));
    int state = strings ? 1 : -1; /* 1 going on, 0 declined, -1 a Python error */
    int nviews = 0;
    Src *srcs[4] = {&c->task, &c->api, &c->flow, &c->counter};
    PyObject *objs[4] = {o_task, o_api, o_flow, o_counter};
    const int widths[4] = {W_TASK, W_API, W_FLOW, W_COUNTER};
    for (; state == 1 && nviews < 4; nviews++)
        if (src_of(objs[nviews], widths[nviews], &views[nviews], srcs[nviews]) < 0) state = -1;
    for (int k = 0; state == 1 && k < NFIXED; k++)
        if (!i64_of(PyTuple_GET_ITEM(fixed_in, k), &c->fixed[k])) state = 0;
    for (int k = 0; state == 1 && k < NUNITS; k++)
        if (!text_of(PyTuple_GET_ITEM(units_in, k), &c->units[k])) state = 0;
    if (state == 1) {
        c->nfull = PyList_GET_SIZE(rows);
        c->full = malloc(sizeof(Full) * (size_t)(c->nfull ? c->nfull : 1));
        if (!c->full) {
            PyErr_NoMemory();
            state = -1;
        } else {
            state = convert_rows(rows, strings, c->full);
        }
    }
    int ok = 1;
    if (state == 1) {
        c->nstr = PyList_GET_SIZE(strings);
        c->str = texts(strings, &ok);
        if (ok == 1) {
            c->nquoted = PyList_GET_SIZE(quoted_in);
            c->quoted = texts(quoted_in, &ok);
        }
        if (ok != 1) state = ok == 0 ? 0 : (PyErr_NoMemory(), -1);
    }
    for (int k = 0; state == 1 && k < NFIXED; k++)
        if (c->fixed[k] < 0 || c->fixed[k] >= c->nstr) state = 0;
    int64_t *used[NCOL] = {0}, nused[NCOL] = {0};
    int32_t *remap = NULL;
    if (state == 1) {
        c->b_task = c->nfull;
        c->b_api = c->b_task + c->task.n;
        c->b_flow = c->b_api + c->api.n;
        c->b_counter = c->b_flow + c->flow.n;
        c->n = c->b_counter + c->counter.n;
        if (workers < 1) workers = 1;
        if (workers > MAX_PARTS) workers = MAX_PARTS;
        int res = 0;
        Part parts[MAX_PARTS];
        memset(parts, 0, sizeof parts);
        int nparts = 0;
        Py_BEGIN_ALLOW_THREADS
        res = order(c);
        if (res >= 0) {
            int64_t n = c->n;
            for (int k = 0; k < NCOL && res >= 0; k++) {
                Col *col = &c->col[k];
                size_t width = COL_TYPE[k] == T_I32 || COL_TYPE[k] == T_CODE ? 4 : 8;
                col->data = pmalloc(COL_TYPE[k] == T_STR ? 1 : width * (size_t)n);
                col->valid = pmalloc((size_t)((n + 7) >> 3) + 1);
                if (COL_TYPE[k] == T_STR) col->off = pmalloc(4 * (size_t)(n + 1));
                if (!col->data || !col->valid || (COL_TYPE[k] == T_STR && !col->off)) res = -1;
            }
            if (res >= 0) {
                /* parts of whole bitmap bytes, the rows shared about evenly */
                int64_t step = ((n / workers) + 7) & ~(int64_t)7;
                for (int64_t lo = 0; nparts < workers && (lo < n || nparts == 0); nparts++) {
                    int64_t hi = nparts == workers - 1 || lo + step >= n ? n : lo + step;
                    parts[nparts].c = c;
                    parts[nparts].lo = lo;
                    parts[nparts].hi = hi;
                    lo = hi;
                }
                /* two passes over the rows: the first sizes the string columns, the second
                 * writes every column in place */
                for (int k = 0; k < nparts; k++) parts[k].measure = 1;
                res = run_parts(c, parts, nparts);
                if (res >= 0) res = place_strings(c, parts, nparts);
                if (res >= 0) res = run_parts(c, parts, nparts);
                if (res >= 0 && !placed_all(parts, nparts)) res = -2;
                for (int k = 0; k < nparts; k++)
                    for (int j = 0; j < NCOL; j++) c->col[j].nulls += parts[k].nulls[j];
                if (res >= 0) {
                    remap = malloc(sizeof(int32_t) * (size_t)(c->nstr ? c->nstr : 1));
                    if (!remap) res = -1;
                    for (int k = 0; k < NCOL && res >= 0; k++) {
                        if (COL_TYPE[k] != T_CODE) continue;
                        used[k] = malloc(sizeof(int64_t) * (size_t)(c->nstr ? c->nstr : 1));
                        if (!used[k]) {
                            res = -1;
                            break;
                        }
                        nused[k] = canonical(c, k, remap, used[k]);
                    }
                }
            }
        }
        Py_END_ALLOW_THREADS
        for (int k = 0; k < nparts; k++) /* the scratch, where the sizing pass did not finish */
            for (int s = 0; s < NSTR; s++)
                if (parts[k].measure) free(parts[k].s[s].p);
        if (res == -1) {
            PyErr_NoMemory();
            state = -1;
        } else if (res == -2) {
            state = 0;
        }
    }
    if (state == 1) {
        PyObject *cols = PyList_New(NCOL);
        for (int k = 0; cols && k < NCOL; k++) {
            PyObject *col = column_result(c, k, strings, used[k], nused[k]);
            if (!col) {
                Py_CLEAR(cols);
                break;
            }
            PyList_SET_ITEM(cols, k, col);
        }
        if (cols) out = Py_BuildValue("(LN)", (long long)c->n, cols);
    } else if (state == 0) {
        out = Py_None;
        Py_INCREF(out);
    }
    free(remap);
    for (int k = 0; k < NCOL; k++) free(used[k]);
    free_ctx(c);
    for (int k = 0; k < nviews; k++)
        if (views[k].obj) PyBuffer_Release(&views[k]);
    Py_XDECREF(strings);
    return out;
}

/* ------------------------------------------------------------------ recording */

/* append_row(buf, width, *values): `width` int64 fields appended to the RowBuffer or bytearray
 * `buf`, as `buf += struct.pack(f"{width}q", *values)` does, without the bytes object between. */
static PyObject *append_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int rowbuf = nargs >= 2 && Py_IS_TYPE(args[0], &RowBufType);
    if (nargs < 2 || (!rowbuf && !PyByteArray_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "append_row(buf: RowBuffer | bytearray, width, *values)");
        return NULL;
    }
    Py_ssize_t width = PyLong_AsSsize_t(args[1]);
    if (width == -1 && PyErr_Occurred()) return NULL;
    if (width != nargs - 2) {
        PyErr_Format(PyExc_ValueError, "append_row: a row of %zd fields needs %zd values, got %zd", width, width,
                     nargs - 2);
        return NULL;
    }
    PyObject *buf = args[0];
    RowBuf *r = (RowBuf *)buf;
    Py_ssize_t at = rowbuf ? r->len : PyByteArray_GET_SIZE(buf), need = at + 8 * width;
    char *out;
    if (rowbuf) {
        if (rowbuf_reserve(r, need) < 0) return NULL;
        out = r->p + at;
    } else {
        if (PyByteArray_Resize(buf, need) < 0) return NULL;
        out = PyByteArray_AS_STRING(buf) + at;
    }
    for (Py_ssize_t k = 0; k < width; k++) {
        PyObject *o = args[k + 2];
        long long v = -1;
        if (!PyLong_Check(o)) {
            PyErr_Format(PyExc_TypeError, "append_row: field %zd is %.100s, not an int", k, Py_TYPE(o)->tp_name);
        } else {
            v = PyLong_AsLongLong(o);
        }
        if (v == -1 && PyErr_Occurred()) {  /* a bad value appends nothing */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            if (!rowbuf) PyByteArray_Resize(buf, at);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        int64_t x = (int64_t)v;
        memcpy(out + 8 * k, &x, 8);
    }
    if (rowbuf) r->len = need;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"append_row", (PyCFunction)(void (*)(void))append_row, METH_FASTCALL,
     "append_row(buf, width, *values): width int64 fields appended to the bytearray buf"},
    {"set_pool_limit", set_pool_limit, METH_O, "set_pool_limit(bytes): the most the block pool keeps (0: none)"},
    {"release_pool", release_pool, METH_NOARGS, "release_pool(): free the blocks the pool keeps"},
    {"pool_state", pool_state, METH_NOARGS, "pool_state() -> (blocks, bytes, limit) of the block pool"},
    {"build", build, METH_VARARGS,
     "build(tasks, apis, flows, counters, rows, strings, quoted, fixed, units, workers): the trace table's "
     "columns as Arrow buffers, or None when the Arrow build must decide"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rowtable", "Native build of the emulator's trace table.",
                                    -1, methods};

PyMODINIT_FUNC PyInit__rowtable(void) {
    if (PyType_Ready(&MemType) < 0 || PyType_Ready(&RowBufType) < 0) return NULL;
    static int atfork_set;
    if (!atfork_set) {
        if (pthread_atfork(pool_prepare, pool_resume, pool_resume) != 0) {
            PyErr_SetString(PyExc_RuntimeError, "runtime_emu._rowtable: pthread_atfork failed");
            return NULL;
        }
        atfork_set = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *api = PyCapsule_New(&rowbuf_api, ROWBUF_CAPSULE, NULL);
    int bad = api == NULL || PyModule_AddObjectRef(m, "_rowbuf_api", api) < 0 ||
              PyModule_AddObjectRef(m, "RowBuffer", (PyObject *)&RowBufType) < 0;
    Py_XDECREF(api);
    if (bad) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
