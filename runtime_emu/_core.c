/* The emulator's hot core in C: the event heap, the AI Core pools, and the kernel lifecycle.
 *
 * runtime_emu's Python modules (engine.py, device.py, dispatch.py, rows.py) define what the
 * emulator does; this module does the same for the part every kernel goes through, without a
 * Python object per task or per event, and gives byte-identical schedules, trace rows and
 * ground truth (tests/test_emu_core.py runs programs both ways):
 *
 *   Engine  engine.Engine's heap and loops: (t, seq) order, `at`, `after`, `step`, `run_until`,
 *           `run_while` (with `pulse` every PULSE_EVENTS callbacks), `run`. Its entries are
 *           Python callbacks or native ones: a wave of a kernel's blocks finishing, a stream
 *           to advance.
 *   Pool    device.CorePool: free cores, the kernels waiting for them (priority, then order),
 *           normal (a core at a time), batch mode and preemption.
 *   Core    the kernel part of dispatch.Dispatch: a stream whose head is a packed kernel
 *           launch (device.LAUNCH) starts it when it has arrived and the stream is free, gives
 *           it to its pool, records its flow end, task row, queue depth and ground-truth row
 *           when it finishes, and advances the stream. A stream whose head is a Task (a copy,
 *           an event record or wait, a collective) is handed to Dispatch.advance. try_launch
 *           is aclrtLaunchKernel's common case (one host thread, room in the queue) in one
 *           call; acl.rt.launch_kernel and Runtime.launch_kernel call it first. pick is
 *           host.Coordinator._pick's loop (host threads taking turns in virtual-time order).
 *   Drained the predicate of a host wait on streams (synchronize, a full queue).
 *   Stream, HostThread
 *           device.Stream's and host.HostThread's attributes as C fields (runtime_emu/state.py
 *           uses these types whenever this module is built): the state a launch and a kernel's
 *           lifecycle share, read and written here directly and by the Python modules as
 *           attributes, so there is one copy of it and nothing to write back.
 *
 * What is cached here is what cannot change while no Python code runs (a stream's device
 * numbers and pools; a kernel's codes; the recording switches and the recorder's buffers):
 * the cache of switches and buffers is dropped at every call from Python and after every call
 * into Python. Other Python objects' attributes are read through their type's data descriptor,
 * found once per type (attr_get).
 *
 * run_while(pred) calls `pred` only when something it can see may have changed: after a Python
 * callback, after a call into Python, or after a kernel finished and left its stream's pending
 * count at zero or one below the stream's capacity. The waits of the runtime read nothing else
 * (a stream's pending count against zero or its capacity, a task's end, an event, a thread's
 * state: dispatch.py, api_events.py, api_streams.py, host.py, hccl), and a kernel's finish only
 * lowers its stream's pending count by one, so the loop stops at the same event as calling the
 * predicate every time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include "_rowbuf.h"
#include <string.h>

#define PULSE_EVENTS 256
#define NUL (-1)
#define NO_RECORD (-1)
enum { OP_PY, OP_BLOCKS, OP_WAKE };
enum { W_TASK = 16, W_FLOW = 9, W_COUNTER = 9, W_TRUTH = 15, W_LAUNCH = 6 };
enum { CAUSE_LAUNCH, CAUSE_EVENT, CAUSE_COPY, CAUSE_STREAM, CAUSE_CORES, NCAUSE };
static const char *CAUSE_TEXT[NCAUSE] = {"launch", "event", "copy", "stream", "cores"};

static PyObject *GETCURRENT; /* greenlet.getcurrent */
/* greenlet's C API PyGreenlet_GetCurrent (greenlet.h: entry 4 of the capsule greenlet._C_API), when
 * it answers as greenlet.getcurrent does; NULL: that function is called */
static PyObject *(*greenlet_current)(void);
static PyObject *S_default_stream, *S_running, *S_ready, *S_blocked, *S_live, *S_threads, *S_id, *S_rank,
    *S_pid, *S_pools, *S_cube, *S_vector, *S_name, *S_block_ns, *S_core, *S_task_type, *S_op_type,
    *S_task_time, *S_runtime_api, *S_tasks, *S_apis, *S_flows, *S_counters, *S_strings, *S_switches, *S_cuts,
    *S_due, *S_cut, *S_advance, *S_popleft, *S_append, *S_launch_api, *S_launch_kind, *S_queue_full, *S_kernel,
    *S_wait, *S_memcpy, *S_empty, *S_AI_CORE, *S_AI_VECTOR_CORE, *S_cause_text[NCAUSE];

/* ================================================================== the heap */

typedef struct {
    int64_t t, seq;
    PyObject *fn;  /* OP_PY: the callable; OP_BLOCKS: the Pool; OP_WAKE: the Core (all owned) */
    PyObject *arg; /* OP_PY: its argument; OP_WAKE: the stream (owned); OP_BLOCKS: NULL */
    int32_t op, slot;
    int64_t grant;
} Entry;

typedef struct {
    PyObject_HEAD
    int64_t now, seq;
    Entry *heap;
    Py_ssize_t n, cap;
    PyObject *pulse;
    int dirty;        /* something a run_while predicate can see may have changed */
    uint64_t pygen;   /* counts calls from and into Python: cached Python state is as of this */
    struct Core *core; /* borrowed: the Core running this engine's kernels (it owns the engine) */
} Engine;

static PyTypeObject EngineType, PoolType, CoreType, StreamType, ThreadType;

static inline int before(const Entry *a, const Entry *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static int heap_push(Engine *e, int64_t t, PyObject *fn, PyObject *arg, int op, int32_t slot, int64_t grant) {
    if (e->n == e->cap) {
        Py_ssize_t cap = e->cap ? 2 * e->cap : 64;
        Entry *h = PyMem_Realloc(e->heap, (size_t)cap * sizeof(Entry));
        if (h == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        e->heap = h;
        e->cap = cap;
    }
    Entry item = {t, ++e->seq, fn, arg, op, slot, grant};
    Py_XINCREF(fn);
    Py_XINCREF(arg);
    Entry *h = e->heap;
    Py_ssize_t pos = e->n++;
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (before(&h[parent], &item)) break;
        h[pos] = h[parent];
        pos = parent;
    }
    h[pos] = item;
    return 0;
}

static Entry heap_pop(Engine *e) {
    Entry *h = e->heap;
    Entry top = h[0];
    Entry last = h[--e->n];
    Py_ssize_t n = e->n, pos = 0, child = 1;
    if (n == 0) return top;
    while (child < n) {
        if (child + 1 < n && before(&h[child + 1], &h[child])) child++;
        if (before(&last, &h[child])) break;
        h[pos] = h[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h[pos] = last;
    return top;
}

static int run_entry(Engine *e, Entry *it);

/* ================================================================== pools and kernel tasks */

/* A kernel's numbers and codes, cached per Kernel object in a fixed table (KCACHE entries,
 * direct-mapped by address): a program that makes a Kernel per launch (the scenarios jitter
 * each launch's time) would otherwise have every one of them kept alive by the cache. */
#define KCACHE 1024
typedef struct {
    PyObject *kernel; /* owned (NULL: empty): keeps the address from being reused while cached */
    int64_t block_ns;
    int vector;
    int64_t name_code, type_code, op_code; /* recorder string codes; -1: not looked up yet */
    int64_t truth_name;                     /* ground-truth code of the name; -1: not yet */
} KInfo;

typedef struct Pool Pool;

/* A stream (device.Stream's attributes, Python sees them as members): the state the host's
 * launches and the kernels' lifecycle share, read and written here without a Python object in
 * between. The rest is what this core looks up once (the stream's device never changes). */
typedef struct {
    PyObject_HEAD
    int64_t id, priority, pending, capacity, last_end_ns, last_record, qcode, launches_at;
    char busy, destroyed;
    PyObject *device, *queue, *launches, *last_kind, *last_cause, *last_producer; /* owned */
    /* the core's: the device's rank, id, process and pools, filled when the core first needs them */
    int known;
    int64_t rank, dev_id, pid;
    Pool *pools[2]; /* owned: cube, vector */
} Stream;

/* A host thread (host.HostThread's attributes): the calling thread's clock and what a launch
 * records of it. `step` is None or an int, kept as has_step and step; `device` is None or a
 * Device, whose id is kept beside it (it never changes). */
typedef struct {
    PyObject_HEAD
    int64_t tid, clock, rank, busy_from, step, dev_id;
    char named, has_step;
    PyObject *glet, *state, *pred, *what, *error, *device, *name; /* owned; pred, error, device may be None */
} Thread;

typedef struct {
    int64_t corr, launch, arrive, ready, start, step, qblocked, record;
    int64_t blocks, remaining, cores, waves;
    PyObject *kernel; /* owned */
    int64_t block_ns;
    int vector;
    Stream *s; /* owned */
    int cause;
    PyObject *producer; /* owned */
    int32_t next_free;
} KTask;

typedef struct {
    int64_t k0, prio, seq;
    int32_t slot;
} Wait;

typedef struct Core Core;

struct Pool {
    PyObject_HEAD
    Core *core; /* owned */
    int vector;
    int64_t total, free, seq;
    int batch_mode, preemption;
    Wait *waiting;
    Py_ssize_t n, cap;
};


struct Core {
    PyObject_HEAD
    Engine *engine;         /* owned */
    PyObject *dispatch;     /* owned: Task heads go to its advance; its cuts */
    PyObject *recorder;     /* owned */
    PyObject *truth;        /* owned bytearray: the ground truth's packed task rows */
    PyObject *truth_codes;  /* owned: GroundTruth.codes */
    PyObject *task_type;    /* owned: device.Task (a head of any other type is a packed kernel launch) */
    int keep_truth, queue_depth;
    /* cached as of `gen` (Engine.pygen) */
    uint64_t gen;
    int cached, task_time, runtime_api;
    PyObject *tasks, *flows, *counters, *cuts; /* owned while cached */
    PyObject *switches;                        /* owned: recorder.switches (changed in place, never replaced) */
    int64_t truth_fixed[NCAUSE + 2]; /* codes of the causes, "kernel" and ""; -1: not yet */
    PyObject *codes;                 /* owned: recorder.strings (a recorder keeps its table) */
    int64_t launch_api, launch_kind, queue_full; /* their codes in it; -1: not yet */
    KInfo kcache[KCACHE];
    KTask *tasks_slab;
    Py_ssize_t ntasks, captasks;
    int32_t free_slot;
    int64_t live; /* kernel tasks between start of the stream's turn and finish */
    int64_t corr; /* correlation id of the latest task (Dispatch.next_corr) */
    char closed;          /* the runtime finished (Runtime.finish sets it) */
    int64_t threads_live; /* host threads not done (host.Coordinator keeps it) */
    /* try_launch: the launch path of host.Coordinator, Runtime._enter and Dispatch.launch_kernel */
    PyObject *coord;       /* owned: host.Coordinator (its live thread count) */
    PyObject *threads;     /* owned: coord.threads, greenlet -> HostThread (never replaced, never emptied) */
    PyObject *kernel_type; /* owned: device.Kernel */
    PyObject *last_glet;   /* owned: the greenlet of the latest try_launch, and */
    PyObject *last_thread; /* owned: its HostThread (an entry of `threads`, so it stays its) */
    int64_t launch_overhead, dispatch_latency;
};

/* ---------------------------------------------------------------- attribute helpers */

/* Reading and writing the Python objects' attributes. PyObject_GetAttr finds a data
 * descriptor on the object's type (the getset of a compiled class's attribute, the member of
 * a __slots__ one) and calls it, boxing and looking up on the way: about 180 instructions, a
 * dozen of them per kernel. This caches the descriptor per (type, name), the way CPython's own
 * method cache does (keyed on the type's version tag, which changes whenever the type does, so
 * no reference to the type is held), and calls its C getter or setter directly: the same
 * result, since a data descriptor on the type takes precedence over everything else a
 * generic getattr would look at. Anything else (another kind of descriptor, a type with its own
 * __getattribute__ or __setattr__, no version tag) takes the generic call. `name` must live as
 * long as the process: the interned S_* strings. */
typedef struct {
    PyTypeObject *type; /* not owned: valid while the type's version tag is `version` */
    PyObject *name;
    unsigned int version;
    PyGetSetDef *gs; /* one of these two, or neither: the generic call */
    PyMemberDef *mb;
} AttrSlot;

#define ATTR_SLOTS 512
static AttrSlot attr_cache[ATTR_SLOTS];

static inline size_t attr_hash(PyTypeObject *t, PyObject *name) {
    return (size_t)(((((uintptr_t)t) >> 4) ^ (((uintptr_t)name) >> 3)) * 11400714819323198485ull >> 55) &
           (ATTR_SLOTS - 1);
}

/* The slot for (type of o, name), filled if it was not current; NULL: use the generic call. */
static AttrSlot *attr_slot(PyObject *o, PyObject *name) {
    PyTypeObject *t = Py_TYPE(o);
    AttrSlot *a = &attr_cache[attr_hash(t, name)];
    if (a->type == t && a->name == name && a->version == t->tp_version_tag &&
        (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG))
        return a->gs != NULL || a->mb != NULL ? a : NULL;
    if (t->tp_getattro != PyObject_GenericGetAttr || t->tp_setattro != PyObject_GenericSetAttr) return NULL;
    PyObject *d = _PyType_Lookup(t, name); /* borrowed; gives the type a version tag */
    if (!(t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) return NULL;
    a->type = t;
    a->name = name;
    a->version = t->tp_version_tag;
    a->gs = NULL;
    a->mb = NULL;
    if (d != NULL && Py_IS_TYPE(d, &PyGetSetDescr_Type) && ((PyGetSetDescrObject *)d)->d_getset->get != NULL &&
        ((PyGetSetDescrObject *)d)->d_getset->set != NULL)
        a->gs = ((PyGetSetDescrObject *)d)->d_getset;
    else if (d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
             !(((PyMemberDescrObject *)d)->d_member->flags & READONLY))
        a->mb = ((PyMemberDescrObject *)d)->d_member;
    return a->gs != NULL || a->mb != NULL ? a : NULL;
}

/* o.name, a new reference (NULL: an error is set) */
static PyObject *attr_get(PyObject *o, PyObject *name) {
    AttrSlot *a = attr_slot(o, name);
    if (a == NULL) return PyObject_GetAttr(o, name);
    if (a->gs != NULL) return a->gs->get(o, a->gs->closure);
    return PyMember_GetOne((const char *)o, a->mb);
}

/* o.name = v */
static int attr_set(PyObject *o, PyObject *name, PyObject *v) {
    AttrSlot *a = attr_slot(o, name);
    if (a == NULL) return PyObject_SetAttr(o, name, v);
    if (a->gs != NULL) return a->gs->set(o, v, a->gs->closure);
    return PyMember_SetOne((char *)o, a->mb, v);
}

static int get_i64(PyObject *o, PyObject *name, int64_t *out) {
    PyObject *v = attr_get(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_i64(PyObject *o, PyObject *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int r = attr_set(o, name, v);
    Py_DECREF(v);
    return r;
}

static int get_bool(PyObject *o, PyObject *name, int *out) {
    PyObject *v = attr_get(o, name);
    if (v == NULL) return -1;
    *out = v == Py_True ? 1 : v == Py_False ? 0 : PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

/* The bytearray `buf` (nothing viewing it) at `size` bytes, with room for as many again: the
 * row buffers grow by doubling, where a bytearray grows by an eighth, each time copied to its
 * new place (half of a kernel's device-side instructions went to those copies). Appends write
 * into the room in place (below); the bytearray itself never gives it back, since it only
 * shrinks when resized to less than half its room, which nothing does to a row buffer. */
static int grow(PyObject *buf, Py_ssize_t size) {
    PyByteArrayObject *b = (PyByteArrayObject *)buf;
    Py_ssize_t room = size < 4096 || b->ob_exports != 0 || size > PY_SSIZE_T_MAX / 2 ? size : 2 * size;
    if (PyByteArray_Resize(buf, room) < 0) return -1;
    if (room != size) {
        Py_SET_SIZE(buf, size);
        b->ob_bytes[size] = '\0';
    }
    return 0;
}

/* The recorder's row buffers (runtime_emu._rowtable.RowBuffer), when that module is built. */
static const RowBufAPI *rowbufs;

/* `width` int64s appended to the row buffer `buf` (a RowBuffer or a bytearray) */
static int append(PyObject *buf, const int64_t *values, Py_ssize_t width) {
    if (rowbufs != NULL && Py_IS_TYPE(buf, rowbufs->type))
        return rowbuf_append(rowbufs, (RowBuf *)buf, values, width * 8);
    if (!PyByteArray_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "runtime_emu._core: a row buffer is not a RowBuffer or a bytearray");
        return -1;
    }
    Py_ssize_t len = PyByteArray_GET_SIZE(buf), add = width * 8;
    PyByteArrayObject *b = (PyByteArrayObject *)buf;
    if (b->ob_exports == 0 && b->ob_start == b->ob_bytes && b->ob_bytes != NULL && len + add < b->ob_alloc) {
        /* room in what it has (a bytearray grows by an eighth at a time): written in place, as
         * PyByteArray_Resize would after its checks; nothing views the buffer, nothing moves */
        memcpy(b->ob_bytes + len, values, (size_t)add);
        Py_SET_SIZE(buf, len + add);
        b->ob_bytes[len + add] = '\0';
        return 0;
    }
    if (grow(buf, len + add) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(buf) + len, values, (size_t)add);
    return 0;
}

/* A stream's queue is a collections.deque: its append, popleft and length are called as the C
 * functions they are (found once, at import), not through a bound method's call. */
static PyTypeObject *deque_type;
static PyCFunction deque_append_fn, deque_popleft_fn;

static PyCFunction method_of(PyTypeObject *type, const char *name, int flags) {
    PyObject *key = PyUnicode_InternFromString(name);
    if (key == NULL) return NULL;
    PyObject *d = _PyType_Lookup(type, key);
    Py_DECREF(key);
    if (d == NULL || !Py_IS_TYPE(d, &PyMethodDescr_Type)) return NULL;
    PyMethodDef *m = ((PyMethodDescrObject *)d)->d_method;
    return (m->ml_flags & (METH_VARARGS | METH_FASTCALL | METH_NOARGS | METH_O | METH_KEYWORDS)) == flags ? m->ml_meth
                                                                                                          : NULL;
}

static int find_deque(void) {
    PyObject *mod = PyImport_ImportModule("collections");
    if (mod == NULL) return -1;
    PyObject *t = PyObject_GetAttrString(mod, "deque");
    Py_DECREF(mod);
    if (t == NULL) return -1;
    if (!PyType_Check(t)) {
        Py_DECREF(t);
        PyErr_SetString(PyExc_TypeError, "collections.deque is not a type");
        return -1;
    }
    deque_type = (PyTypeObject *)t; /* kept for the life of the process */
    deque_append_fn = method_of(deque_type, "append", METH_O);
    deque_popleft_fn = method_of(deque_type, "popleft", METH_NOARGS);
    return 0;
}

static inline Py_ssize_t q_len(PyObject *q) { return Py_IS_TYPE(q, deque_type) ? Py_SIZE(q) : PyObject_Size(q); }

static inline PyObject *q_popleft(PyObject *q) {
    return deque_popleft_fn != NULL && Py_IS_TYPE(q, deque_type) ? deque_popleft_fn(q, NULL)
                                                                   : PyObject_CallMethodNoArgs(q, S_popleft);
}

static inline PyObject *q_append(PyObject *q, PyObject *x) {
    return deque_append_fn != NULL && Py_IS_TYPE(q, deque_type) ? deque_append_fn(q, x)
                                                                  : PyObject_CallMethodOneArg(q, S_append, x);
}

/* a text's code in a StringCodes (a new text gets the next code, through its __missing__) */
static int64_t code_of(PyObject *codes, PyObject *text) {
    PyObject *v = PyObject_GetItem(codes, text);
    if (v == NULL) return -1;
    int64_t c = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return c;
}

/* ---------------------------------------------------------------- the cache of Python state */

static void core_drop_cache(Core *c) {
    Py_CLEAR(c->tasks);
    Py_CLEAR(c->flows);
    Py_CLEAR(c->counters);
    Py_CLEAR(c->cuts);
    c->cached = 0;
}

/* The recording switches and buffers and the cut policy, as of the latest call from or into
 * Python (which may have flipped a switch, taken the buffers or ended the streaming). */
static int core_fresh(Core *c) {
    if (c->cached && c->gen == c->engine->pygen) return 0;
    core_drop_cache(c);
    if (get_bool(c->switches, S_task_time, &c->task_time) || get_bool(c->switches, S_runtime_api, &c->runtime_api) ||
        (c->tasks = attr_get(c->recorder, S_tasks)) == NULL || (c->flows = attr_get(c->recorder, S_flows)) == NULL ||
        (c->counters = attr_get(c->recorder, S_counters)) == NULL ||
        (c->cuts = attr_get(c->dispatch, S_cuts)) == NULL) {
        core_drop_cache(c);
        return -1;
    }
    c->cached = 1;
    c->gen = c->engine->pygen;
    return 0;
}

/* ---------------------------------------------------------------- the streams */

/* After Python code ran: what was cached may be stale, and a wait may be over. */
static inline void into_python(Engine *e) {
    e->pygen++;
    e->dirty = 1;
}

/* The stream, its device's numbers and pools looked up the first time this core needs them. */
static Stream *stream_known(Core *c, Stream *s) {
    if (s->known) return s;
    PyObject *pools = NULL;
    if (get_i64(s->device, S_rank, &s->rank) || get_i64(s->device, S_id, &s->dev_id) ||
        get_i64(s->device, S_pid, &s->pid) || (pools = attr_get(s->device, S_pools)) == NULL)
        return NULL;
    Pool *found[2] = {NULL, NULL};
    for (int v = 0; v < 2; v++) {
        PyObject *p = PyObject_GetItem(pools, v ? S_vector : S_cube);
        if (p == NULL) goto fail;
        found[v] = (Pool *)p;
        if (!PyObject_TypeCheck(p, &PoolType) || ((Pool *)p)->core != c) {
            PyErr_SetString(PyExc_TypeError, "runtime_emu._core: a stream's device has pools of another core");
            goto fail;
        }
    }
    Py_DECREF(pools);
    Py_XSETREF(s->pools[0], found[0]);
    Py_XSETREF(s->pools[1], found[1]);
    s->known = 1;
    return s;
fail:
    Py_XDECREF(pools);
    Py_XDECREF(found[0]);
    Py_XDECREF(found[1]);
    return NULL;
}

/* `o` as a Stream this core can run, or NULL with TypeError. */
static Stream *as_stream(Core *c, PyObject *o) {
    if (!Py_IS_TYPE(o, &StreamType)) {
        PyErr_Format(PyExc_TypeError, "runtime_emu._core: a stream must be a runtime_emu._core.Stream, got %.100s",
                     Py_TYPE(o)->tp_name);
        return NULL;
    }
    return stream_known(c, (Stream *)o);
}

static KInfo *kernel_info(Core *c, PyObject *kernel) {
    KInfo *k = &c->kcache[(((uintptr_t)kernel >> 4) * 11400714819323198485ull >> 32) & (KCACHE - 1)];
    if (k->kernel == kernel) return k;
    int64_t block_ns;
    PyObject *core = NULL;
    if (get_i64(kernel, S_block_ns, &block_ns) || (core = attr_get(kernel, S_core)) == NULL) return NULL;
    int vector = PyObject_RichCompareBool(core, S_vector, Py_EQ);
    Py_DECREF(core);
    if (vector < 0) return NULL;
    Py_XSETREF(k->kernel, Py_NewRef(kernel));
    k->block_ns = block_ns;
    k->vector = vector;
    k->name_code = k->type_code = k->op_code = k->truth_name = -1;
    return k;
}

/* the codes of a kernel's task type, name and op type, looked up when its first row is written,
   in the order rows.py looks them up (so the string table grows in the same order) */
static int kernel_codes(Core *c, KInfo *k) {
    PyObject *name = NULL, *ttype = NULL, *op = NULL;
    int r = -1;
    if ((name = attr_get(k->kernel, S_name)) == NULL ||
        (ttype = attr_get(k->kernel, S_task_type)) == NULL ||
        (op = attr_get(k->kernel, S_op_type)) == NULL)
        goto done;
    int has_type = PyObject_IsTrue(ttype), has_op = PyObject_IsTrue(op);
    if (has_type < 0 || has_op < 0) goto done;
    int64_t t = code_of(c->codes, has_type ? ttype : (k->vector ? S_AI_VECTOR_CORE : S_AI_CORE));
    if (t < 0) goto done;
    int64_t n = code_of(c->codes, name);
    if (n < 0) goto done;
    int64_t o = code_of(c->codes, has_op ? op : name);
    if (o < 0) goto done;
    k->name_code = n;
    k->type_code = t;
    k->op_code = o;
    r = 0;
done:
    Py_XDECREF(name);
    Py_XDECREF(ttype);
    Py_XDECREF(op);
    return r;
}

static int32_t task_new(Core *c) {
    if (c->free_slot >= 0) {
        int32_t s = c->free_slot;
        c->free_slot = c->tasks_slab[s].next_free;
        return s;
    }
    if (c->ntasks == c->captasks) {
        Py_ssize_t cap = c->captasks ? 2 * c->captasks : 64;
        KTask *a = PyMem_Realloc(c->tasks_slab, (size_t)cap * sizeof(KTask));
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        c->tasks_slab = a;
        c->captasks = cap;
    }
    return (int32_t)c->ntasks++;
}

static void task_free(Core *c, int32_t slot) {
    KTask *t = &c->tasks_slab[slot];
    Py_CLEAR(t->producer);
    Py_CLEAR(t->kernel);
    Py_CLEAR(t->s);
    t->next_free = c->free_slot;
    c->free_slot = slot;
}

/* ---------------------------------------------------------------- the pool's waiting line */

static inline int wait_before(const Wait *a, const Wait *b) {
    if (a->k0 != b->k0) return a->k0 < b->k0;
    if (a->prio != b->prio) return a->prio < b->prio;
    return a->seq < b->seq;
}

static int wait_push(Pool *p, Wait w) {
    if (p->n == p->cap) {
        Py_ssize_t cap = p->cap ? 2 * p->cap : 16;
        Wait *a = PyMem_Realloc(p->waiting, (size_t)cap * sizeof(Wait));
        if (a == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->waiting = a;
        p->cap = cap;
    }
    Wait *h = p->waiting;
    Py_ssize_t pos = p->n++;
    while (pos > 0) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!wait_before(&w, &h[parent])) break;
        h[pos] = h[parent];
        pos = parent;
    }
    h[pos] = w;
    return 0;
}

static void wait_pop(Pool *p) {
    Wait *h = p->waiting;
    Wait last = h[--p->n];
    Py_ssize_t n = p->n, pos = 0, child = 1;
    if (n == 0) return;
    while (child < n) {
        if (child + 1 < n && wait_before(&h[child + 1], &h[child])) child++;
        if (!wait_before(&h[child], &last)) break;
        h[pos] = h[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h[pos] = last;
}

/* ---------------------------------------------------------------- the kernel lifecycle */

static int core_advance(Core *c, Stream *s);

static int task_started(Core *c, KTask *t) {
    int64_t now = c->engine->now;
    t->start = now;
    if (now > t->ready) t->cause = CAUSE_CORES;
    if (core_fresh(c) < 0) return -1;
    if (c->task_time && c->runtime_api) {
        Stream *s = t->s;
        int64_t row[W_FLOW] = {s->rank, 1, now, s->pid, s->id, t->corr, s->dev_id, s->id, t->step};
        return append(c->flows, row, W_FLOW);
    }
    return 0;
}

static int64_t truth_fixed(Core *c, int which) {
    if (c->truth_fixed[which] < 0)
        c->truth_fixed[which] = code_of(c->truth_codes, which == NCAUSE     ? S_kernel
                                                        : which > NCAUSE    ? S_empty
                                                                            : S_cause_text[which]);
    return c->truth_fixed[which];
}

static int task_finished(Core *c, int32_t slot) {
    Engine *e = c->engine;
    KTask *t = &c->tasks_slab[slot];
    Stream *s = t->s;
    int64_t now = e->now;
    PyObject *gone = q_popleft(s->queue);
    if (gone == NULL) return -1;
    Py_DECREF(gone);
    int64_t pending = --s->pending;
    /* the only waits a kernel's finish can end: its stream drained, or its full queue has room */
    if (pending == 0 || pending == s->capacity - 1) e->dirty = 1;
    PyObject *producer = t->producer != NULL ? t->producer : S_empty;
    s->busy = 0;
    s->last_end_ns = now;
    Py_INCREF(S_kernel);
    Py_SETREF(s->last_kind, S_kernel);
    Py_INCREF(S_cause_text[t->cause]);
    Py_SETREF(s->last_cause, S_cause_text[t->cause]);
    Py_INCREF(producer);
    Py_SETREF(s->last_producer, producer);
    s->last_record = t->record;
    KInfo *k = kernel_info(c, t->kernel); /* its codes (its entry may have gone to another kernel meanwhile) */
    if (k == NULL) return -1;
    if (c->keep_truth) { /* codes in dispatch.py's order: kind, name, cause, producer */
        int64_t kind = truth_fixed(c, NCAUSE);
        if (kind < 0) return -1;
        if (k->truth_name < 0) {
            PyObject *name = attr_get(k->kernel, S_name);
            if (name == NULL) return -1;
            k->truth_name = code_of(c->truth_codes, name);
            Py_DECREF(name);
            if (k->truth_name < 0) return -1;
        }
        int64_t cause = truth_fixed(c, t->cause);
        if (cause < 0) return -1;
        int64_t prod = producer == S_empty ? truth_fixed(c, NCAUSE + 1) : code_of(c->truth_codes, producer);
        if (prod < 0) return -1;
        int64_t row[W_TRUTH] = {t->corr, s->rank, s->dev_id, s->id, kind, k->truth_name, t->launch, t->arrive,
                                t->ready, t->start, now, cause, prod, t->qblocked, t->record ? t->record : NO_RECORD};
        if (append(c->truth, row, W_TRUTH) < 0) return -1;
    }
    if (core_fresh(c) < 0) return -1;
    if (c->task_time) {
        if (k->name_code < 0 && kernel_codes(c, k) < 0) return -1;
        int64_t row[W_TASK] = {s->rank, s->dev_id, s->pid, s->id, t->start, now - t->start, k->name_code, 0,
                               k->type_code, t->corr, t->blocks, t->waves, NUL, k->op_code,
                               s->pools[t->vector] != NULL ? s->pools[t->vector]->total : NUL, t->step};
        if (append(c->tasks, row, W_TASK) < 0) return -1;
        if (c->queue_depth) {
            int64_t crow[W_COUNTER] = {s->rank, s->pid, s->qcode, now, pending, 0, s->dev_id, s->id, NUL};
            if (append(c->counters, crow, W_COUNTER) < 0) return -1;
        }
    }
    Py_INCREF(s);
    task_free(c, slot);
    c->live--;
    int r = core_advance(c, s);
    Py_DECREF(s);
    if (r < 0) return -1;
    if (core_fresh(c) < 0) return -1;
    if (c->cuts != Py_None) {
        PyObject *cuts = c->cuts;
        Py_INCREF(cuts);
        PyObject *due = PyObject_CallMethodNoArgs(cuts, S_due);
        into_python(e);
        int go = due == NULL ? -1 : PyObject_IsTrue(due);
        Py_XDECREF(due);
        if (go > 0) {
            PyObject *done = PyObject_CallMethodNoArgs(cuts, S_cut);
            into_python(e);
            go = done == NULL ? -1 : 0;
            Py_XDECREF(done);
        }
        Py_DECREF(cuts);
        if (go < 0) return -1;
    }
    return 0;
}

static int pool_dispatch(Pool *p) {
    Core *c = p->core;
    Engine *e = c->engine;
    int64_t free = p->free;
    while (free && p->n) {
        Wait *head = &p->waiting[0];
        int32_t slot = head->slot;
        KTask *t = &c->tasks_slab[slot];
        int64_t remaining = t->remaining, grant = free < remaining ? free : remaining;
        int64_t all = remaining < p->total ? remaining : p->total;
        if (p->batch_mode && grant < all) break;
        free -= grant;
        remaining -= grant;
        t->remaining = remaining;
        t->cores += grant;
        if (t->start < 0) {
            p->free = free; /* Python code may run below and look at the pool */
            if (task_started(c, t) < 0) return -1;
            t = &c->tasks_slab[slot];
        }
        t->waves += 1;
        if (heap_push(e, e->now + t->block_ns, (PyObject *)p, NULL, OP_BLOCKS, slot, grant) < 0) return -1;
        if (remaining) {
            if (p->waiting[0].k0 && !p->preemption) p->waiting[0].k0 = 0;
        } else {
            wait_pop(p);
        }
    }
    p->free = free;
    return 0;
}

static int pool_submit(Pool *p, int32_t slot) {
    KTask *t = &p->core->tasks_slab[slot];
    p->seq += 1;
    t->remaining = t->blocks;
    t->cores = 0;
    Wait w = {1, t->s->priority, p->seq, slot};
    if (wait_push(p, w) < 0) return -1;
    return pool_dispatch(p);
}

static int pool_blocks_done(Pool *p, int32_t slot, int64_t count) {
    Core *c = p->core;
    KTask *t = &c->tasks_slab[slot];
    t->cores -= count;
    int64_t remaining = t->remaining;
    if (remaining && !p->preemption && !p->batch_mode && p->waiting[0].slot == slot) {
        int64_t grant = count < remaining ? count : remaining;
        remaining -= grant;
        t->remaining = remaining;
        t->cores += grant;
        t->waves += 1;
        if (!remaining) wait_pop(p);
        p->free += count - grant;
        Engine *e = c->engine;
        if (heap_push(e, e->now + t->block_ns, (PyObject *)p, NULL, OP_BLOCKS, slot, grant) < 0) return -1;
        return p->free ? pool_dispatch(p) : 0;
    }
    p->free += count;
    if (!remaining && !t->cores && task_finished(c, slot) < 0) return -1;
    return pool_dispatch(p);
}

/* Start the stream's head kernel if it can start now (Dispatch.advance for a packed launch). */
static int core_advance(Core *c, Stream *s) {
    Engine *e = c->engine;
    if (s->busy) return 0;
    Py_ssize_t n = q_len(s->queue);
    if (n <= 0) return (int)n;
    PyObject *head = PySequence_GetItem(s->queue, 0);
    if (head == NULL) return -1;
    if (PyObject_TypeCheck(head, (PyTypeObject *)c->task_type)) {
        /* a Task: a copy, an event record or wait, a collective */
        Py_DECREF(head);
        PyObject *r = PyObject_CallMethodOneArg(c->dispatch, S_advance, (PyObject *)s);
        into_python(e);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    KInfo *k = kernel_info(c, head);
    Py_DECREF(head);
    if (k == NULL || stream_known(c, s) == NULL) return -1;
    PyObject *buf = s->launches;
    int64_t at = s->launches_at;
    Py_ssize_t len = PyByteArray_Check(buf) ? PyByteArray_GET_SIZE(buf) : -1;
    if (at < 0 || at + W_LAUNCH * 8 > len) {
        PyErr_SetString(PyExc_RuntimeError, "runtime_emu._core: a stream's packed launches do not match its queue");
        return -1;
    }
    int64_t f[W_LAUNCH]; /* blocks, corr, t0, step, arrive, queue_blocked */
    memcpy(f, PyByteArray_AS_STRING(buf) + at, sizeof f);
    int64_t now = e->now;
    if (f[4] > now) /* launched, still on its way to the device */
        return heap_push(e, f[4], (PyObject *)c, (PyObject *)s, OP_WAKE, 0, 0);
    at += W_LAUNCH * 8;
    if (at == len) { /* every packed launch has started: start afresh */
        PyObject *fresh = PyByteArray_FromStringAndSize(NULL, 0);
        if (fresh == NULL) return -1;
        Py_SETREF(s->launches, fresh);
        at = 0;
    } else if (at >= (1 << 20) && 2 * at >= len) { /* a long backlog: drop what was read */
        if (PySequence_DelSlice(buf, 0, at) < 0) return -1;
        at = 0;
    }
    s->launches_at = at;
    s->busy = 1;
    int32_t slot = task_new(c);
    if (slot < 0) return -1;
    KTask *t = &c->tasks_slab[slot];
    memset(t, 0, sizeof(*t));
    t->kernel = Py_NewRef(k->kernel);
    t->block_ns = k->block_ns;
    t->vector = k->vector;
    t->s = (Stream *)Py_NewRef(s);
    t->blocks = f[0];
    t->corr = f[1];
    t->launch = f[2];
    t->step = f[3];
    t->arrive = f[4];
    t->qblocked = f[5];
    t->ready = now;
    t->start = -1;
    t->next_free = -1;
    c->live++;
    /* why it could not start earlier (dispatch.py's causes) */
    if (t->arrive >= s->last_end_ns) {
        t->cause = CAUSE_LAUNCH;
    } else if (s->last_kind == S_kernel) { /* after a kernel (set here): neither a wait nor a copy */
        t->cause = CAUSE_STREAM;
    } else {
        int is_wait = PyObject_RichCompareBool(s->last_kind, S_wait, Py_EQ);
        int is_copy = is_wait ? 0 : PyObject_RichCompareBool(s->last_kind, S_memcpy, Py_EQ);
        int by_event = is_wait > 0 ? PyObject_RichCompareBool(s->last_cause, S_cause_text[CAUSE_EVENT], Py_EQ) : 0;
        if (is_wait < 0 || is_copy < 0 || by_event < 0) return -1;
        if (by_event) {
            t->cause = CAUSE_EVENT;
            Py_INCREF(s->last_producer);
            t->producer = s->last_producer;
            t->record = s->last_record;
        } else {
            t->cause = is_copy ? CAUSE_COPY : CAUSE_STREAM;
        }
    }
    return pool_submit(s->pools[t->vector], slot);
}

/* ================================================================== running entries */

static int run_entry(Engine *e, Entry *it) {
    int r;
    switch (it->op) {
    case OP_PY: {
        PyObject *res = it->arg == NULL ? PyObject_CallNoArgs(it->fn) : PyObject_CallOneArg(it->fn, it->arg);
        into_python(e);
        r = res == NULL ? -1 : 0;
        Py_XDECREF(res);
        break;
    }
    case OP_BLOCKS:
        r = pool_blocks_done((Pool *)it->fn, it->slot, it->grant);
        break;
    default:
        r = core_advance((Core *)it->fn, (Stream *)it->arg);
        break;
    }
    Py_XDECREF(it->fn);
    Py_XDECREF(it->arg);
    return r;
}

static int step_one(Engine *e) {
    Entry it = heap_pop(e);
    e->now = it.t;
    return run_entry(e, &it);
}

/* Run every entry due at or before t; the clock ends at t (engine.Engine.run_until). */
static int run_to(Engine *e, int64_t t) {
    while (e->n && e->heap[0].t <= t)
        if (step_one(e) < 0) return -1;
    if (t > e->now) e->now = t;
    return 0;
}

/* ================================================================== Engine's Python API */

static PyObject *engine_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "Engine() takes no arguments");
        return NULL;
    }
    Engine *e = (Engine *)type->tp_alloc(type, 0);
    if (e == NULL) return NULL;
    e->pygen = 1;
    e->pulse = Py_None;
    Py_INCREF(Py_None);
    return (PyObject *)e;
}

static int engine_traverse(Engine *e, visitproc visit, void *arg) {
    for (Py_ssize_t i = 0; i < e->n; i++) {
        Py_VISIT(e->heap[i].fn);
        Py_VISIT(e->heap[i].arg);
    }
    Py_VISIT(e->pulse);
    return 0;
}

static int engine_clear(Engine *e) {
    Py_ssize_t n = e->n;
    e->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_CLEAR(e->heap[i].fn);
        Py_CLEAR(e->heap[i].arg);
    }
    Py_CLEAR(e->pulse);
    return 0;
}

static void engine_dealloc(Engine *e) {
    PyObject_GC_UnTrack(e);
    engine_clear(e);
    PyMem_Free(e->heap);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static int64_t arg_i64(PyObject *o, const char *what) {
    int64_t v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred() && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, got %.100s", what, Py_TYPE(o)->tp_name);
    }
    return v;
}

static PyObject *schedule(Engine *e, int64_t t, PyObject *const *args, Py_ssize_t nargs) {
    PyObject *arg = nargs > 2 ? args[2] : Py_None;
    if (heap_push(e, t, args[1], arg, OP_PY, 0, 0) < 0) return NULL;
    Py_RETURN_NONE;
}

/* at(t_ns, fn, arg=None): call fn(arg) at t_ns (never earlier than now) */
static PyObject *engine_at(Engine *e, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "at(t_ns, fn, arg=None)");
        return NULL;
    }
    int64_t t = arg_i64(args[0], "t_ns");
    if (t == -1 && PyErr_Occurred()) return NULL;
    return schedule(e, t < e->now ? e->now : t, args, nargs);
}

static PyObject *engine_after(Engine *e, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 2 || nargs > 3) {
        PyErr_SetString(PyExc_TypeError, "after(dt_ns, fn, arg=None)");
        return NULL;
    }
    int64_t dt = arg_i64(args[0], "dt_ns");
    if (dt == -1 && PyErr_Occurred()) return NULL;
    return schedule(e, e->now + dt, args, nargs);
}

static PyObject *engine_next_time(Engine *e, PyObject *unused) {
    if (e->n == 0) Py_RETURN_NONE;
    return PyLong_FromLongLong(e->heap[0].t);
}

/* Every call from Python starts afresh: Python code may have changed what was cached. */
static inline PyObject *leave(Engine *e, PyObject *result) { return result; }

static PyObject *engine_step(Engine *e, PyObject *unused) {
    if (e->n == 0) {
        PyErr_SetString(PyExc_IndexError, "step() with no pending callback");
        return NULL;
    }
    e->pygen++;
    if (step_one(e) < 0) return leave(e, NULL);
    return leave(e, Py_NewRef(Py_None));
}

static PyObject *engine_run_until(Engine *e, PyObject *arg) {
    int64_t t = arg_i64(arg, "t_ns");
    if (t == -1 && PyErr_Occurred()) return NULL;
    e->pygen++;
    if (run_to(e, t) < 0) return leave(e, NULL);
    return leave(e, Py_NewRef(Py_None));
}

/* The predicate is called with the streams' pending counts current (they are written back as
   tasks finish) and their other state possibly not: the runtime's waits read only the former. */
static PyObject *engine_run_while(Engine *e, PyObject *pred) {
    e->pygen++;
    e->dirty = 1;
    int holds = 1, count = 0;
    PyObject *result = NULL;
    Py_INCREF(pred);
    for (;;) {
        if (e->dirty) {
            e->dirty = 0;
            PyObject *r = PyObject_CallNoArgs(pred);
            if (r == NULL) goto done;
            holds = PyObject_IsTrue(r);
            Py_DECREF(r);
            if (holds < 0) goto done;
        }
        if (!holds) break;
        if (e->n == 0) {
            result = Py_NewRef(Py_False);
            goto done;
        }
        if (step_one(e) < 0) goto done;
        if (++count == PULSE_EVENTS) {
            count = 0;
            if (e->pulse != Py_None) {
                PyObject *pulse = Py_NewRef(e->pulse);
                PyObject *r = PyObject_CallNoArgs(pulse);
                Py_DECREF(pulse);
                into_python(e);
                if (r == NULL) goto done;
                Py_DECREF(r);
            }
        }
    }
    result = Py_NewRef(Py_True);
done:
    Py_DECREF(pred);
    return leave(e, result);
}

static PyObject *engine_run(Engine *e, PyObject *unused) {
    e->pygen++;
    while (e->n)
        if (step_one(e) < 0) return leave(e, NULL);
    return leave(e, Py_NewRef(Py_None));
}

static Py_ssize_t engine_len(Engine *e) { return e->n; }

static PyObject *engine_get_now(Engine *e, void *closure) { return PyLong_FromLongLong(e->now); }

static int engine_set_now(Engine *e, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "now cannot be deleted");
        return -1;
    }
    int64_t t = arg_i64(v, "now");
    if (t == -1 && PyErr_Occurred()) return -1;
    e->now = t;
    return 0;
}

static PyObject *engine_get_pulse(Engine *e, void *closure) {
    Py_INCREF(e->pulse);
    return e->pulse;
}

static int engine_set_pulse(Engine *e, PyObject *v, void *closure) {
    if (v == NULL) v = Py_None;
    if (v != Py_None && !PyCallable_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "pulse must be callable or None");
        return -1;
    }
    Py_INCREF(v);
    Py_SETREF(e->pulse, v);
    return 0;
}

static PyMethodDef engine_methods[] = {
    {"at", (PyCFunction)(void (*)(void))engine_at, METH_FASTCALL, "at(t_ns, fn, arg=None): call fn(arg) at t_ns"},
    {"after", (PyCFunction)(void (*)(void))engine_after, METH_FASTCALL, "after(dt_ns, fn, arg=None)"},
    {"next_time", (PyCFunction)engine_next_time, METH_NOARGS, "time of the earliest pending callback, or None"},
    {"step", (PyCFunction)engine_step, METH_NOARGS, "run the earliest pending callback"},
    {"run_until", (PyCFunction)engine_run_until, METH_O, "run every callback due at or before t_ns"},
    {"run_while", (PyCFunction)engine_run_while, METH_O,
     "run callbacks while pending() holds; False when the queue ran dry first"},
    {"run", (PyCFunction)engine_run, METH_NOARGS, "run until no callback is left"},
    {NULL}};

static PyGetSetDef engine_getset[] = {
    {"now", (getter)engine_get_now, (setter)engine_set_now, "the virtual clock (ns)", NULL},
    {"pulse", (getter)engine_get_pulse, (setter)engine_set_pulse,
     "called every PULSE_EVENTS callbacks of a run_while, or None", NULL},
    {NULL}};

static PySequenceMethods engine_as_sequence = {.sq_length = (lenfunc)engine_len};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.Engine",
    .tp_doc = "Event loop with a virtual clock `now` in integer nanoseconds (engine.Engine, in C).",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = engine_new,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_traverse = (traverseproc)engine_traverse,
    .tp_clear = (inquiry)engine_clear,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
    .tp_as_sequence = &engine_as_sequence,
};

/* ================================================================== Pool's Python API */

static int pool_traverse(Pool *p, visitproc visit, void *arg) {
    Py_VISIT(p->core);
    return 0;
}

static int pool_clear(Pool *p) {
    Py_CLEAR(p->core);
    return 0;
}

static void pool_dealloc(Pool *p) {
    PyObject_GC_UnTrack(p);
    pool_clear(p);
    PyMem_Free(p->waiting);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

static PyObject *pool_get_kind(Pool *p, void *closure) {
    PyObject *k = p->vector ? S_vector : S_cube;
    Py_INCREF(k);
    return k;
}

static PyObject *pool_get_waiting(Pool *p, void *closure) { return PyLong_FromSsize_t(p->n); }

static int pool_set_flag(Pool *p, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot be deleted");
        return -1;
    }
    int on = PyObject_IsTrue(v);
    if (on < 0) return -1;
    if (closure == NULL) p->batch_mode = on; else p->preemption = on;
    return 0;
}

static PyObject *pool_get_flag(Pool *p, void *closure) {
    return PyBool_FromLong(closure == NULL ? p->batch_mode : p->preemption);
}

static PyObject *pool_get_total(Pool *p, void *closure) { return PyLong_FromLongLong(p->total); }
static PyObject *pool_get_free(Pool *p, void *closure) { return PyLong_FromLongLong(p->free); }

static PyGetSetDef pool_getset[] = {
    {"kind", (getter)pool_get_kind, NULL, "cube or vector", NULL},
    {"total", (getter)pool_get_total, NULL, "cores in the pool", NULL},
    {"free", (getter)pool_get_free, NULL, "cores free now", NULL},
    {"waiting", (getter)pool_get_waiting, NULL, "kernels in line for cores (started ones included)", NULL},
    {"batch_mode", (getter)pool_get_flag, (setter)pool_set_flag, "a kernel waits for all its cores at once", NULL},
    {"preemption", (getter)pool_get_flag, (setter)pool_set_flag, "priority decides at every wave", (void *)1},
    {NULL}};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.Pool",
    .tp_doc = "The Cube (or Vector) cores of one device and the kernels waiting for them (device.CorePool, in C).",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)pool_dealloc,
    .tp_traverse = (traverseproc)pool_traverse,
    .tp_clear = (inquiry)pool_clear,
    .tp_getset = pool_getset,
};

/* ================================================================== streams and host threads */

/* Stream(stream_id, device, priority, capacity): device.Stream's attributes, as members. */
static PyObject *stream_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"stream_id", "device", "priority", "capacity", NULL};
    long long id, priority, capacity;
    PyObject *device;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "LOLL:Stream", names, &id, &device, &priority, &capacity)) return NULL;
    PyObject *queue = PyObject_CallNoArgs((PyObject *)deque_type);
    PyObject *launches = queue == NULL ? NULL : PyByteArray_FromStringAndSize(NULL, 0);
    Stream *s = launches == NULL ? NULL : (Stream *)type->tp_alloc(type, 0);
    if (s == NULL) {
        Py_XDECREF(queue);
        Py_XDECREF(launches);
        return NULL;
    }
    s->id = id;
    s->device = Py_NewRef(device);
    s->priority = priority;
    s->queue = queue;       /* FIFO of the stream's tasks: a Task, or the Kernel of a packed launch */
    s->launches = launches; /* the packed launches' numbers (device.LAUNCH rows), from launches_at */
    s->capacity = capacity;
    s->last_end_ns = -1;
    s->last_kind = Py_NewRef(S_empty);
    s->last_cause = Py_NewRef(S_empty);
    s->last_producer = Py_NewRef(S_empty);
    s->qcode = -1;
    return (PyObject *)s;
}

static int stream_traverse(Stream *s, visitproc visit, void *arg) {
    Py_VISIT(s->device);
    Py_VISIT(s->queue);
    Py_VISIT(s->launches);
    Py_VISIT(s->last_kind);
    Py_VISIT(s->last_cause);
    Py_VISIT(s->last_producer);
    Py_VISIT(s->pools[0]);
    Py_VISIT(s->pools[1]);
    return 0;
}

static int stream_clear(Stream *s) {
    Py_CLEAR(s->device);
    Py_CLEAR(s->queue);
    Py_CLEAR(s->launches);
    Py_CLEAR(s->last_kind);
    Py_CLEAR(s->last_cause);
    Py_CLEAR(s->last_producer);
    Py_CLEAR(s->pools[0]);
    Py_CLEAR(s->pools[1]);
    s->known = 0;
    return 0;
}

static void stream_dealloc(Stream *s) {
    PyObject_GC_UnTrack(s);
    stream_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

#define MEMBER(type, field, kind, doc) {#field, kind, offsetof(type, field), 0, doc}

static PyMemberDef stream_members[] = {
    MEMBER(Stream, id, T_LONGLONG, "the stream's id on its device"),
    MEMBER(Stream, device, T_OBJECT_EX, "its Device"),
    MEMBER(Stream, priority, T_LONGLONG, "0 (highest) .. 7"),
    MEMBER(Stream, queue, T_OBJECT_EX, "deque: a Task, or the Kernel of a packed launch not reached yet"),
    MEMBER(Stream, launches, T_OBJECT_EX, "bytearray: the packed launches' numbers (device.LAUNCH rows)"),
    MEMBER(Stream, launches_at, T_LONGLONG, "byte offset of the next packed launch in launches"),
    MEMBER(Stream, busy, T_BOOL, "running its head task"),
    MEMBER(Stream, pending, T_LONGLONG, "launched by the host and not yet retired"),
    MEMBER(Stream, capacity, T_LONGLONG, "tasks the queue holds before a launch blocks"),
    MEMBER(Stream, destroyed, T_BOOL, "aclrtDestroyStream was called"),
    MEMBER(Stream, last_end_ns, T_LONGLONG, "when the task that finished last ended (-1: none yet)"),
    MEMBER(Stream, last_kind, T_OBJECT_EX, "its kind"),
    MEMBER(Stream, last_cause, T_OBJECT_EX, "why it started when it did"),
    MEMBER(Stream, last_producer, T_OBJECT_EX, "what ran before the record it waited for, if it did"),
    MEMBER(Stream, last_record, T_LONGLONG, "the `record` of the task that finished last"),
    MEMBER(Stream, qcode, T_LONGLONG, "recorder string code of the stream's queue-depth counter"),
    {NULL}};

static PyTypeObject StreamType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.Stream",
    .tp_doc = "Stream(stream_id, device, priority, capacity): an emulated stream (device.Stream, in C).",
    .tp_basicsize = sizeof(Stream),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = stream_new,
    .tp_dealloc = (destructor)stream_dealloc,
    .tp_traverse = (traverseproc)stream_traverse,
    .tp_clear = (inquiry)stream_clear,
    .tp_members = stream_members,
};

/* HostThread(glet, tid, clock, rank=0): host.HostThread's attributes. */
static PyObject *thread_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"glet", "tid", "clock", "rank", NULL};
    long long tid, clock, rank = 0;
    PyObject *glet;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLL|L:HostThread", names, &glet, &tid, &clock, &rank)) return NULL;
    PyObject *name = PyUnicode_FromFormat("Thread %lld", tid);
    Thread *t = name == NULL ? NULL : (Thread *)type->tp_alloc(type, 0);
    if (t == NULL) {
        Py_XDECREF(name);
        return NULL;
    }
    t->glet = Py_NewRef(glet);
    t->tid = tid;
    t->clock = clock;
    t->state = Py_NewRef(S_running);
    t->pred = Py_NewRef(Py_None);
    t->what = Py_NewRef(S_empty);
    t->error = Py_NewRef(Py_None);
    t->device = Py_NewRef(Py_None);
    t->dev_id = NUL;
    t->rank = rank;
    t->name = name;
    t->busy_from = clock; /* the clock when the thread's latest runtime call began */
    return (PyObject *)t;
}

static int thread_traverse(Thread *t, visitproc visit, void *arg) {
    Py_VISIT(t->glet);
    Py_VISIT(t->state);
    Py_VISIT(t->pred);
    Py_VISIT(t->what);
    Py_VISIT(t->error);
    Py_VISIT(t->device);
    Py_VISIT(t->name);
    return 0;
}

static int thread_clear(Thread *t) {
    Py_CLEAR(t->glet);
    Py_CLEAR(t->state);
    Py_CLEAR(t->pred);
    Py_CLEAR(t->what);
    Py_CLEAR(t->error);
    Py_CLEAR(t->device);
    Py_CLEAR(t->name);
    return 0;
}

static void thread_dealloc(Thread *t) {
    PyObject_GC_UnTrack(t);
    thread_clear(t);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyObject *thread_get_step(Thread *t, void *closure) {
    return t->has_step ? PyLong_FromLongLong(t->step) : Py_NewRef(Py_None);
}

static int thread_set_step(Thread *t, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "step cannot be deleted");
        return -1;
    }
    if (v == Py_None) {
        t->has_step = 0;
        return 0;
    }
    long long step = PyLong_AsLongLong(v);
    if (step == -1 && PyErr_Occurred()) return -1;
    t->step = step;
    t->has_step = 1;
    return 0;
}

static PyObject *thread_get_device(Thread *t, void *closure) { return Py_NewRef(t->device); }

static int thread_set_device(Thread *t, PyObject *v, void *closure) {
    if (v == NULL) {
        PyErr_SetString(PyExc_AttributeError, "device cannot be deleted");
        return -1;
    }
    int64_t id = NUL;
    if (v != Py_None && get_i64(v, S_id, &id)) return -1;
    Py_SETREF(t->device, Py_NewRef(v));
    t->dev_id = id;
    return 0;
}

static PyGetSetDef thread_getset[] = {
    {"step", (getter)thread_get_step, (setter)thread_set_step, "the step it is in (None: none)", NULL},
    {"device", (getter)thread_get_device, (setter)thread_set_device, "its current Device, or None", NULL},
    {NULL}};

static PyMemberDef thread_members[] = {
    MEMBER(Thread, glet, T_OBJECT_EX, "its greenlet"),
    MEMBER(Thread, tid, T_LONGLONG, "thread id (from 1 in each rank)"),
    MEMBER(Thread, clock, T_LONGLONG, "its virtual clock (ns)"),
    MEMBER(Thread, state, T_OBJECT_EX, "ready, running, blocked or done"),
    MEMBER(Thread, pred, T_OBJECT, "what a blocked thread waits for, or None"),
    MEMBER(Thread, what, T_OBJECT_EX, "the wait, in words"),
    MEMBER(Thread, error, T_OBJECT, "an error to raise when it runs next, or None"),
    MEMBER(Thread, rank, T_LONGLONG, "its rank"),
    MEMBER(Thread, name, T_OBJECT_EX, "its track's name"),
    MEMBER(Thread, busy_from, T_LONGLONG, "the clock when its latest runtime call began"),
    MEMBER(Thread, named, T_BOOL, "its track's name is recorded"),
    {NULL}};

static PyTypeObject ThreadType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.HostThread",
    .tp_doc = "HostThread(glet, tid, clock, rank=0): a host thread of the emulated program (host.HostThread, in C).",
    .tp_basicsize = sizeof(Thread),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = thread_new,
    .tp_dealloc = (destructor)thread_dealloc,
    .tp_traverse = (traverseproc)thread_traverse,
    .tp_clear = (inquiry)thread_clear,
    .tp_members = thread_members,
    .tp_getset = thread_getset,
};

/* ================================================================== Core's Python API */

/* Core(engine, dispatch, recorder, truth, truth_codes, keep_truth, queue_depth_counters, task_type,
 *      *, coord=None, kernel_type=None, launch_overhead_ns=0, dispatch_latency_ns=0)
 * Without a coord, try_launch always declines. */
static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *engine, *dispatch, *recorder, *truth, *codes, *task_type;
    PyObject *coord = Py_None, *kernel_type = Py_None;
    long long overhead = 0, latency = 0;
    int keep, depth;
    static char *names[] = {"engine", "dispatch", "recorder", "truth", "truth_codes", "keep_truth",
                            "queue_depth_counters", "task_type", "coord", "kernel_type", "launch_overhead_ns",
                            "dispatch_latency_ns", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOOOppO!|$OOLL:Core", names, &EngineType, &engine, &dispatch,
                                     &recorder, &truth, &codes, &keep, &depth, &PyType_Type, &task_type, &coord,
                                     &kernel_type, &overhead, &latency))
        return NULL;
    if (coord != Py_None && !PyType_Check(kernel_type)) {
        PyErr_SetString(PyExc_TypeError, "Core: with a coord, kernel_type is the Kernel type");
        return NULL;
    }
    if (((Engine *)engine)->core != NULL) {
        PyErr_SetString(PyExc_ValueError, "Core: the engine runs another core's kernels already");
        return NULL;
    }
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    c->engine = (Engine *)Py_NewRef(engine);
    c->dispatch = Py_NewRef(dispatch);
    c->recorder = Py_NewRef(recorder);
    c->truth = Py_NewRef(truth);
    c->truth_codes = Py_NewRef(codes);
    c->task_type = Py_NewRef(task_type);
    c->keep_truth = keep;
    c->queue_depth = depth;
    c->launch_overhead = overhead;
    c->dispatch_latency = latency;
    c->free_slot = -1;
    for (int i = 0; i <= NCAUSE + 1; i++) c->truth_fixed[i] = -1;
    c->launch_api = c->launch_kind = c->queue_full = -1;
    if ((c->codes = attr_get(recorder, S_strings)) == NULL || (c->switches = attr_get(recorder, S_switches)) == NULL) {
        Py_DECREF(c);
        return NULL;
    }
    if (coord != Py_None) {
        c->coord = Py_NewRef(coord);
        c->kernel_type = Py_NewRef(kernel_type);
        if ((c->threads = attr_get(coord, S_threads)) == NULL) {
            Py_DECREF(c);
            return NULL;
        }
        if (get_i64(coord, S_live, &c->threads_live)) {
            Py_DECREF(c);
            return NULL;
        }
        if (!PyDict_CheckExact(c->threads)) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_TypeError, "Core: coord.threads is not a dict");
            return NULL;
        }
    }
    ((Engine *)engine)->core = c;
    return (PyObject *)c;
}

static int core_traverse(Core *c, visitproc visit, void *arg) {
    Py_VISIT(c->engine);
    Py_VISIT(c->dispatch);
    Py_VISIT(c->recorder);
    Py_VISIT(c->truth);
    Py_VISIT(c->truth_codes);
    Py_VISIT(c->task_type);
    Py_VISIT(c->codes);
    Py_VISIT(c->switches);
    Py_VISIT(c->tasks);
    Py_VISIT(c->flows);
    Py_VISIT(c->counters);
    Py_VISIT(c->cuts);
    Py_VISIT(c->coord);
    Py_VISIT(c->threads);
    Py_VISIT(c->kernel_type);
    Py_VISIT(c->last_glet);
    Py_VISIT(c->last_thread);
    for (Py_ssize_t i = 0; i < KCACHE; i++) Py_VISIT(c->kcache[i].kernel);
    for (Py_ssize_t i = 0; i < c->ntasks; i++) {
        Py_VISIT(c->tasks_slab[i].producer);
        Py_VISIT(c->tasks_slab[i].kernel);
        Py_VISIT(c->tasks_slab[i].s);
    }
    return 0;
}

static int core_clear(Core *c) {
    core_drop_cache(c);
    if (c->engine != NULL && c->engine->core == c) c->engine->core = NULL;
    Py_CLEAR(c->engine);
    Py_CLEAR(c->dispatch);
    Py_CLEAR(c->recorder);
    Py_CLEAR(c->truth);
    Py_CLEAR(c->truth_codes);
    Py_CLEAR(c->task_type);
    Py_CLEAR(c->codes);
    Py_CLEAR(c->switches);
    Py_CLEAR(c->coord);
    Py_CLEAR(c->threads);
    Py_CLEAR(c->kernel_type);
    Py_CLEAR(c->last_glet);
    Py_CLEAR(c->last_thread);
    for (Py_ssize_t i = 0; i < KCACHE; i++) Py_CLEAR(c->kcache[i].kernel);
    for (Py_ssize_t i = 0; i < c->ntasks; i++) {
        Py_CLEAR(c->tasks_slab[i].producer);
        Py_CLEAR(c->tasks_slab[i].kernel);
        Py_CLEAR(c->tasks_slab[i].s);
    }
    return 0;
}

static void core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    core_clear(c);
    PyMem_Free(c->tasks_slab);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* pool(kind, total): a new Pool of `total` cores of `kind` ("cube" or "vector") */
static PyObject *core_pool(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "pool(kind, total)");
        return NULL;
    }
    int vector = PyObject_RichCompareBool(args[0], S_vector, Py_EQ);
    if (vector < 0) return NULL;
    if (!vector && PyObject_RichCompareBool(args[0], S_cube, Py_EQ) != 1) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "pool kind must be 'cube' or 'vector', got %R", args[0]);
        return NULL;
    }
    int64_t total = arg_i64(args[1], "total");
    if (total == -1 && PyErr_Occurred()) return NULL;
    if (total < 0) {
        PyErr_Format(PyExc_ValueError, "a pool of %lld cores", (long long)total);
        return NULL;
    }
    Pool *p = PyObject_GC_New(Pool, &PoolType);
    if (p == NULL) return NULL;
    Py_INCREF(c);
    p->core = c;
    p->vector = vector;
    p->total = p->free = total;
    p->seq = 0;
    p->batch_mode = p->preemption = 0;
    p->waiting = NULL;
    p->n = p->cap = 0;
    PyObject_GC_Track(p);
    return (PyObject *)p;
}

/* advance(stream): start the stream's head (a packed kernel launch) if it can start now */
static PyObject *core_advance_py(Core *c, PyObject *stream) {
    Engine *e = c->engine;
    e->pygen++;
    Stream *s = as_stream(c, stream);
    if (s == NULL || core_advance(c, s) < 0) return NULL;
    Py_RETURN_NONE;
}

/* A kernel launch the host made, its numbers decided (v: rank, tid, device, step, corr, t0,
 * clock, blocks, queue_blocked, pending, arrive): its API slice, flow start and queue depth rows
 * (rows.Rows.launched_as), its packed launch in the stream's queue (device.LAUNCH), and the
 * stream woken when the launch arrives if it is idle. `device`: the calling thread's device id
 * (NUL: none); `step`: NUL for none. */
static int launched(Core *c, Stream *s, PyObject *kernel, PyObject *apis, PyObject *flows, PyObject *counters,
                    int record_api, int record_tasks, const int64_t *v) {
    int64_t rank = v[0], tid = v[1], device = v[2], step = v[3], corr = v[4], t0 = v[5], clock = v[6],
            blocks = v[7], queue_blocked = v[8], pending = v[9], arrive = v[10];
    if (record_api) {
        if (c->launch_api < 0) { /* codes in rows.Rows.api's order: name, kind */
            if ((c->launch_api = code_of(c->codes, S_launch_api)) < 0) return -1;
            if ((c->launch_kind = code_of(c->codes, S_launch_kind)) < 0) return -1;
        }
        int64_t blocked = NUL;
        if (queue_blocked > 0) {
            if (c->queue_full < 0 && (c->queue_full = code_of(c->codes, S_queue_full)) < 0) return -1;
            blocked = c->queue_full;
        }
        int64_t row[17] = {rank, 1000000 + rank, tid, c->launch_api, t0, clock - t0, c->launch_kind, device, s->id, corr,
                           NUL, step, blocks, blocked, queue_blocked > 0 ? queue_blocked : NUL, NUL, NUL};
        if (append(apis, row, 17) < 0) return -1;
        if (record_tasks) {
            int64_t flow[W_FLOW] = {rank, 0, t0, 1000000 + rank, tid, corr, s->dev_id, s->id, step};
            if (append(flows, flow, W_FLOW) < 0) return -1;
        }
    }
    if (record_tasks && c->queue_depth) {
        int64_t row[W_COUNTER] = {s->rank, s->pid, s->qcode, clock, pending, 0, s->dev_id, s->id, NUL};
        if (append(counters, row, W_COUNTER) < 0) return -1;
    }
    int64_t packed[W_LAUNCH] = {blocks, corr, t0, step, arrive, queue_blocked};
    if (append(s->launches, packed, W_LAUNCH) < 0) return -1;
    PyObject *r = q_append(s->queue, kernel);
    if (r == NULL) return -1;
    Py_DECREF(r);
    /* a busy stream picks the launch up when it gets to it; only an idle one needs waking */
    if (!s->busy) {
        Py_ssize_t n = q_len(s->queue);
        if (n < 0) return -1;
        if (n == 1) {
            Engine *e = c->engine;
            if (heap_push(e, arrive < e->now ? e->now : arrive, (PyObject *)c, (PyObject *)s, OP_WAKE, 0, 0) < 0)
                return -1;
        }
    }
    return 0;
}

/* launched(stream, kernel, apis, flows, counters, record_api, record_tasks, rank, tid, device, step, corr,
 *          t0, clock, blocks, queue_blocked, pending, arrive): `launched` for Dispatch.launch_kernel */
static PyObject *core_launched(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 18) {
        PyErr_SetString(PyExc_TypeError, "launched() takes 18 arguments");
        return NULL;
    }
    int record_api = PyObject_IsTrue(args[5]), record_tasks = PyObject_IsTrue(args[6]);
    if (record_api < 0 || record_tasks < 0) return NULL;
    int64_t v[11];
    for (int i = 0; i < 11; i++) {
        v[i] = PyLong_AsLongLong(args[7 + i]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    Stream *s = as_stream(c, args[0]);
    if (s == NULL || launched(c, s, args[1], args[2], args[3], args[4], record_api, record_tasks, v) < 0) return NULL;
    Py_RETURN_NONE;
}

/* The HostThread of the calling greenlet (borrowed), or NULL: not one of this runtime's (no
 * error set) or an error. The latest one is remembered: a greenlet's thread never changes. */
static PyObject *calling_thread(Core *c) {
    PyObject *glet = greenlet_current != NULL ? greenlet_current() : PyObject_CallNoArgs(GETCURRENT);
    if (glet == NULL) return NULL;
    if (glet == c->last_glet) {
        Py_DECREF(glet);
        return c->last_thread;
    }
    PyObject *th = PyDict_GetItemWithError(c->threads, glet);
    if (th == NULL || !Py_IS_TYPE(th, &ThreadType)) {
        Py_DECREF(glet);
        return NULL;
    }
    Py_XSETREF(c->last_glet, glet);
    Py_XSETREF(c->last_thread, Py_NewRef(th));
    return th;
}

/* try_launch(kernel, blocks, stream=None) -> its correlation id, or NotImplemented.
 * aclrtLaunchKernel's common case in one call, as Runtime._enter, api_streams.launch_kernel and
 * Dispatch.launch_kernel make it (the same clocks, rows, packed launch and wake): the runtime
 * running, one live host thread (it drives the engine: no turn-taking), its track named, a
 * device.Kernel, a positive int block count and a live Stream (or the thread's device's
 * default stream) with room in its queue. Anything else (an error to raise, a full queue to
 * wait on, host threads taking turns, a thread's first call) returns NotImplemented before the
 * launch changed anything, and the caller takes the Python path, which does all of that: what
 * ran here before (the device simulated up to the thread's clock, the thread's busy_from) is
 * what that path does first, and doing it again changes nothing. */
static PyObject *core_try_launch(Core *c, PyObject *const *args, Py_ssize_t nargs) {
    if (c->coord == NULL || nargs < 2 || nargs > 3) Py_RETURN_NOTIMPLEMENTED;
    PyObject *kernel = args[0], *nb = args[1], *stream = nargs > 2 ? args[2] : Py_None;
    if (!Py_IS_TYPE(kernel, (PyTypeObject *)c->kernel_type) || !PyLong_CheckExact(nb)) Py_RETURN_NOTIMPLEMENTED;
    int overflow;
    long long blocks = PyLong_AsLongLongAndOverflow(nb, &overflow);
    if (overflow || blocks <= 0) Py_RETURN_NOTIMPLEMENTED;
    if (c->closed || c->threads_live > 1) Py_RETURN_NOTIMPLEMENTED;
    Thread *th = (Thread *)calling_thread(c);
    if (th == NULL) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NOTIMPLEMENTED; /* a thread the runtime does not know: the Python path says so */
    }
    if (!th->named) Py_RETURN_NOTIMPLEMENTED;
    Stream *s;
    if (stream == Py_None) {
        if (th->device == Py_None) Py_RETURN_NOTIMPLEMENTED; /* no device set: the Python path raises */
        PyObject *d = attr_get(th->device, S_default_stream);
        if (d == NULL) return NULL;
        Py_DECREF(d); /* the device keeps it */
        if (!Py_IS_TYPE(d, &StreamType)) Py_RETURN_NOTIMPLEMENTED;
        s = (Stream *)d;
    } else if (Py_IS_TYPE(stream, &StreamType)) {
        s = (Stream *)stream;
    } else {
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (s->destroyed) Py_RETURN_NOTIMPLEMENTED;
    if (stream_known(c, s) == NULL) return NULL;
    Py_INCREF(th);
    Py_INCREF(s);
    PyObject *result = NULL;
    /* Coordinator.enter, one live thread: it drives the engine up to its clock */
    Engine *e = c->engine;
    int64_t t0 = th->busy_from = th->clock;
    e->pygen++;
    if (run_to(e, t0) < 0) goto done;
    /* Dispatch.launch_kernel */
    if (s->pending >= s->capacity) { /* the host waits for room: the Python path does */
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    int64_t corr = ++c->corr;
    int64_t clock = th->clock = t0 + c->launch_overhead;
    int64_t pending = ++s->pending;
    int runtime_api, task_time;
    PyObject *apis = NULL, *flows = NULL, *counters = NULL;
    if (get_bool(c->switches, S_runtime_api, &runtime_api) || get_bool(c->switches, S_task_time, &task_time) ||
        (apis = attr_get(c->recorder, S_apis)) == NULL || (flows = attr_get(c->recorder, S_flows)) == NULL ||
        (counters = attr_get(c->recorder, S_counters)) == NULL)
        goto rows_done;
    int64_t v[11] = {th->rank, th->tid, th->dev_id, th->has_step ? th->step : NUL, corr, t0, clock, blocks, 0,
                     pending, clock + c->dispatch_latency};
    if (launched(c, s, kernel, apis, flows, counters, runtime_api, task_time, v) == 0)
        result = PyLong_FromLongLong(corr);
rows_done:
    Py_XDECREF(apis);
    Py_XDECREF(flows);
    Py_XDECREF(counters);
done:
    Py_DECREF(th);
    Py_DECREF(s);
    return result;
}

/* ================================================================== the host's waits on streams */

/* Drained(streams, room): a host wait's predicate on streams, called as pred() (host.Coordinator
 * .block): room 0, every stream has retired all it was given (aclrtSynchronizeStream/Device);
 * room 1, the one stream's queue has room for a launch. The lambdas it stands for read
 * `pending` as an attribute, a few hundred instructions a call, and a wait calls its predicate
 * whenever something it can see may have changed. */
typedef struct {
    PyObject_HEAD
    PyObject *streams; /* tuple of Stream */
    int room;
} Drained;

static PyTypeObject DrainedType;

static int drained_holds(Drained *d) {
    Py_ssize_t n = PyTuple_GET_SIZE(d->streams);
    for (Py_ssize_t i = 0; i < n; i++) {
        Stream *s = (Stream *)PyTuple_GET_ITEM(d->streams, i);
        if (d->room ? s->pending >= s->capacity : s->pending != 0) return 0;
    }
    return 1;
}

static PyObject *drained_call(PyObject *op, PyObject *args, PyObject *kw) {
    if (PyTuple_GET_SIZE(args) || (kw != NULL && PyDict_GET_SIZE(kw))) {
        PyErr_SetString(PyExc_TypeError, "a stream wait's predicate takes no arguments");
        return NULL;
    }
    return PyBool_FromLong(drained_holds((Drained *)op));
}

static int drained_traverse(Drained *d, visitproc visit, void *arg) {
    Py_VISIT(d->streams);
    return 0;
}

static int drained_clear(Drained *d) {
    Py_CLEAR(d->streams);
    return 0;
}

static void drained_dealloc(Drained *d) {
    PyObject_GC_UnTrack(d);
    drained_clear(d);
    Py_TYPE(d)->tp_free((PyObject *)d);
}

static PyObject *drained_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    static char *names[] = {"streams", "room", NULL};
    PyObject *streams;
    int room = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!|p:Drained", names, &PyTuple_Type, &streams, &room)) return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(streams); i++)
        if (!Py_IS_TYPE(PyTuple_GET_ITEM(streams, i), &StreamType)) {
            PyErr_SetString(PyExc_TypeError, "Drained: streams is a tuple of runtime_emu._core.Stream");
            return NULL;
        }
    if (room && PyTuple_GET_SIZE(streams) != 1) {
        PyErr_SetString(PyExc_ValueError, "Drained: room is a wait on one stream");
        return NULL;
    }
    Drained *d = (Drained *)type->tp_alloc(type, 0);
    if (d == NULL) return NULL;
    d->streams = Py_NewRef(streams);
    d->room = room;
    return (PyObject *)d;
}

static PyTypeObject DrainedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.Drained",
    .tp_doc = "Drained(streams, room=False)(): True when every stream has retired all it was given (with room: "
              "when the one stream's queue has room for a launch).",
    .tp_basicsize = sizeof(Drained),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = drained_new,
    .tp_call = drained_call,
    .tp_dealloc = (destructor)drained_dealloc,
    .tp_traverse = (traverseproc)drained_traverse,
    .tp_clear = (inquiry)drained_clear,
};

/* state is one of the host thread states (host.py's READY, BLOCKED, ...: the same interned texts) */
static inline int is_state(PyObject *state, PyObject *which) {
    return state == which || (PyUnicode_CheckExact(state) && PyUnicode_Compare(state, which) == 0);
}

/* pick(order) -> host.Coordinator._pick for the C core: simulate the device until a host thread
 * of `order` can run, and return the earliest one (ties: the first in order) running, the engine
 * at its clock; None when none can and no device work is left (the Coordinator then sees what
 * is blocked). A blocked thread whose pred() holds becomes ready at the engine's time. The
 * Python loop read five attributes of every thread between two engine events, ~180
 * instructions each on these types; this reads their fields. */
static PyObject *core_pick(Core *c, PyObject *order) {
    if (!PyList_CheckExact(order)) {
        PyErr_SetString(PyExc_TypeError, "pick(order): order is the Coordinator's list of host threads");
        return NULL;
    }
    Engine *e = c->engine;
    for (;;) {
        Thread *first = NULL;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); i++) {
            Thread *t = (Thread *)PyList_GET_ITEM(order, i);
            if (!Py_IS_TYPE(t, &ThreadType)) {
                PyErr_SetString(PyExc_TypeError, "pick(order): a host thread is not a runtime_emu._core.HostThread");
                return NULL;
            }
            if (is_state(t->state, S_blocked) && t->pred != NULL && t->pred != Py_None) {
                Py_INCREF(t);
                int holds;
                if (Py_IS_TYPE(t->pred, &DrainedType)) {
                    holds = drained_holds((Drained *)t->pred);
                } else {
                    PyObject *r = PyObject_CallNoArgs(t->pred);
                    holds = r == NULL ? -1 : PyObject_IsTrue(r);
                    Py_XDECREF(r);
                }
                if (holds > 0) {
                    Py_SETREF(t->state, Py_NewRef(S_ready));
                    Py_SETREF(t->pred, Py_NewRef(Py_None));
                    if (e->now > t->clock) t->clock = e->now;
                }
                Py_DECREF(t);
                if (holds < 0) return NULL;
            }
            if (is_state(t->state, S_ready) && (first == NULL || t->clock < first->clock)) first = t;
        }
        e->pygen++;
        if (e->n && (first == NULL || e->heap[0].t <= first->clock)) {
            if (step_one(e) < 0) return NULL;
            continue;
        }
        if (first == NULL) Py_RETURN_NONE;
        Py_INCREF(first);
        if (run_to(e, first->clock) < 0) {
            Py_DECREF(first);
            return NULL;
        }
        Py_SETREF(first->state, Py_NewRef(S_running));
        return (PyObject *)first;
    }
}

/* drained(streams, room=False) -> a Drained: the predicate of a host wait on these streams */
static PyObject *core_drained(Core *c, PyObject *args, PyObject *kw) { return drained_new(&DrainedType, args, kw); }

/* next_corr() -> the correlation id of a new task (Dispatch.new_task's) */
static PyObject *core_next_corr(Core *c, PyObject *unused) { return PyLong_FromLongLong(++c->corr); }

/* earliest(w): the smallest of w and the start of every kernel running now (the watermark) */
static PyObject *core_earliest(Core *c, PyObject *arg) {
    int64_t w = arg_i64(arg, "w");
    if (w == -1 && PyErr_Occurred()) return NULL;
    if (c->live) {
        /* a slot is in use when it has its stream; a started kernel has a start */
        for (Py_ssize_t i = 0; i < c->ntasks; i++) {
            KTask *t = &c->tasks_slab[i];
            if (t->s != NULL && t->start >= 0 && t->start < w) w = t->start;
        }
    }
    return PyLong_FromLongLong(w);
}

static PyObject *core_get_live(Core *c, void *closure) { return PyLong_FromLongLong(c->live); }
static PyObject *core_get_corr(Core *c, void *closure) { return PyLong_FromLongLong(c->corr); }

static PyMethodDef core_methods[] = {
    {"pool", (PyCFunction)(void (*)(void))core_pool, METH_FASTCALL, "pool(kind, total): a device's core pool"},
    {"advance", (PyCFunction)core_advance_py, METH_O, "start the stream's head kernel if it can start now"},
    {"launched", (PyCFunction)(void (*)(void))core_launched, METH_FASTCALL,
     "a kernel launch's rows, its packed launch in its stream's queue, the stream woken if idle"},
    {"try_launch", (PyCFunction)(void (*)(void))core_try_launch, METH_FASTCALL,
     "try_launch(kernel, blocks, stream=None): a kernel launch's common case, its corr; else NotImplemented"},
    {"next_corr", (PyCFunction)core_next_corr, METH_NOARGS, "the correlation id of a new task"},
    {"pick", (PyCFunction)core_pick, METH_O, "pick(order): host.Coordinator._pick's loop for the C core"},
    {"drained", (PyCFunction)(void (*)(void))core_drained, METH_VARARGS | METH_KEYWORDS,
     "drained(streams, room=False): a host wait's predicate on streams (see Drained)"},
    {"earliest", (PyCFunction)core_earliest, METH_O, "min(w, start of every running kernel)"},
    {NULL}};

static PyMemberDef core_members[] = {
    {"closed", T_BOOL, offsetof(Core, closed), 0, "the runtime finished: try_launch declines"},
    {"threads_live", T_LONGLONG, offsetof(Core, threads_live), 0, "host threads not done (host.Coordinator.live)"},
    {NULL}};

static PyGetSetDef core_getset[] = {
    {"live", (getter)core_get_live, NULL, "kernels started on their stream and not finished", NULL},
    {"corr", (getter)core_get_corr, NULL, "correlation id of the latest task", NULL},
    {NULL}};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._core.Core",
    .tp_doc = "The kernel part of dispatch.Dispatch, in C.",
    .tp_basicsize = sizeof(Core),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = core_new,
    .tp_dealloc = (destructor)core_dealloc,
    .tp_traverse = (traverseproc)core_traverse,
    .tp_clear = (inquiry)core_clear,
    .tp_methods = core_methods,
    .tp_members = core_members,
    .tp_getset = core_getset,
};

/* ================================================================== the module */

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "runtime_emu._core",
                                    "The emulator's event heap, core pools and kernel lifecycle in C.", -1, NULL};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__core(void) {
    INTERN(S_default_stream, "default_stream");
    INTERN(S_running, "running");
    INTERN(S_ready, "ready");
    INTERN(S_blocked, "blocked");
    INTERN(S_live, "live");
    INTERN(S_threads, "threads");
    INTERN(S_id, "id");
    INTERN(S_rank, "rank");
    INTERN(S_pid, "pid");
    INTERN(S_pools, "pools");
    INTERN(S_cube, "cube");
    INTERN(S_vector, "vector");
    INTERN(S_name, "name");
    INTERN(S_block_ns, "block_ns");
    INTERN(S_core, "core");
    INTERN(S_task_type, "task_type");
    INTERN(S_op_type, "op_type");
    INTERN(S_task_time, "task_time");
    INTERN(S_runtime_api, "runtime_api");
    INTERN(S_tasks, "tasks");
    INTERN(S_apis, "apis");
    INTERN(S_flows, "flows");
    INTERN(S_counters, "counters");
    INTERN(S_strings, "strings");
    INTERN(S_switches, "switches");
    INTERN(S_cuts, "cuts");
    INTERN(S_due, "due");
    INTERN(S_cut, "cut");
    INTERN(S_advance, "advance");
    INTERN(S_popleft, "popleft");
    INTERN(S_append, "append");
    INTERN(S_launch_api, "aclrtLaunchKernel");
    INTERN(S_launch_kind, "launch");
    INTERN(S_queue_full, "queue full");
    INTERN(S_kernel, "kernel");
    INTERN(S_wait, "wait");
    INTERN(S_memcpy, "memcpy");
    INTERN(S_empty, "");
    INTERN(S_AI_CORE, "AI_CORE");
    INTERN(S_AI_VECTOR_CORE, "AI_VECTOR_CORE");
    for (int i = 0; i < NCAUSE; i++) INTERN(S_cause_text[i], CAUSE_TEXT[i]);
    if (find_deque() < 0) return NULL;
    PyObject *rowtable = PyImport_ImportModule("runtime_emu._rowtable"); /* PyCapsule_Import imports no submodule */
    rowbufs = rowtable == NULL ? NULL : (const RowBufAPI *)PyCapsule_Import(ROWBUF_CAPSULE, 0);
    Py_XDECREF(rowtable);
    if (rowbufs == NULL) PyErr_Clear(); /* not built: the row buffers are bytearrays */
    PyObject *greenlet = PyImport_ImportModule("greenlet");
    if (greenlet == NULL) return NULL;
    GETCURRENT = PyObject_GetAttrString(greenlet, "getcurrent");
    Py_DECREF(greenlet);
    if (GETCURRENT == NULL) return NULL;
    void **api = (void **)PyCapsule_Import("greenlet._C_API", 0);
    if (api == NULL) {
        PyErr_Clear();
    } else {
        PyObject *(*fn)(void) = (PyObject * (*)(void)) api[4];
        PyObject *a = fn(), *b = PyObject_CallNoArgs(GETCURRENT);
        if (a != NULL && a == b) greenlet_current = fn;
        Py_XDECREF(a);
        Py_XDECREF(b);
        PyErr_Clear();
    }
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&PoolType) < 0 || PyType_Ready(&CoreType) < 0 ||
        PyType_Ready(&StreamType) < 0 || PyType_Ready(&ThreadType) < 0 || PyType_Ready(&DrainedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "PULSE_EVENTS", PULSE_EVENTS) < 0 ||
        PyModule_AddObjectRef(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0 ||
        PyModule_AddObjectRef(m, "Stream", (PyObject *)&StreamType) < 0 ||
        PyModule_AddObjectRef(m, "HostThread", (PyObject *)&ThreadType) < 0 ||
        PyModule_AddObjectRef(m, "Drained", (PyObject *)&DrainedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
