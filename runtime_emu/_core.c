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
 *           an event record or wait, a collective) is handed to Dispatch.advance.
 *
 * The streams stay Python objects and stay the authority for their state (busy, pending,
 * queue, launches, last_*): this reads and writes their attributes, so every Python module
 * sees what it always saw. What is cached here is what cannot change while no Python code
 * runs (a stream's id, device and pools; a kernel's codes; the recording switches and the
 * recorder's buffers): the cache of switches and buffers is dropped at every call from Python
 * and after every call into Python.
 *
 * run_while(pred) calls `pred` only when something it can see may have changed: after a Python
 * callback, after a call into Python, or after a kernel finished (a stream's pending count
 * changed). The waits of the runtime read nothing else (a stream's pending count, a task's end,
 * an event, a thread's state), so the loop stops at the same event as calling it every time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define PULSE_EVENTS 256
#define NUL (-1)
#define NO_RECORD (-1)
enum { OP_PY, OP_BLOCKS, OP_WAKE };
enum { W_TASK = 16, W_FLOW = 9, W_COUNTER = 9, W_TRUTH = 15, W_LAUNCH = 6 };
enum { CAUSE_LAUNCH, CAUSE_EVENT, CAUSE_COPY, CAUSE_STREAM, CAUSE_CORES, NCAUSE };
static const char *CAUSE_TEXT[NCAUSE] = {"launch", "event", "copy", "stream", "cores"};

static PyObject *S_busy, *S_queue, *S_launches, *S_launches_at, *S_pending, *S_last_end_ns, *S_last_kind,
    *S_last_cause, *S_last_producer, *S_last_record, *S_id, *S_priority, *S_qcode, *S_device, *S_rank, *S_pid,
    *S_pools, *S_cube, *S_vector, *S_name, *S_block_ns, *S_core, *S_task_type, *S_op_type, *S_task_time,
    *S_runtime_api, *S_tasks, *S_flows, *S_counters, *S_strings, *S_switches, *S_cuts, *S_due, *S_cut,
    *S_advance, *S_popleft, *S_append, *S_launch_api, *S_launch_kind, *S_queue_full, *S_kernel, *S_wait, *S_memcpy, *S_empty, *S_AI_CORE, *S_AI_VECTOR_CORE,
    *S_cause_text[NCAUSE];

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

static PyTypeObject EngineType, PoolType, CoreType;

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

typedef struct {
    PyObject *kernel; /* owned: keeps the address from being reused while it is cached */
    int64_t block_ns;
    int vector;
    int64_t name_code, type_code, op_code; /* recorder string codes; -1: not looked up yet */
    int64_t truth_name;                     /* ground-truth code of the name; -1: not yet */
} KInfo;

typedef struct Pool Pool;

typedef struct {
    PyObject *stream; /* owned */
    int64_t id, rank, dev_id, pid, qcode, priority;
    Pool *pools[2];     /* owned: cube, vector */
    PyObject *queue;    /* owned: stream.queue (never replaced) */
    PyObject *popleft;  /* owned: its bound popleft */
    PyObject *append;   /* owned: its bound append */
    PyObject *launches; /* owned: stream.launches as last seen or set here */
    /* The stream's state as of `gen` (Engine.pygen): loaded from the stream when first needed,
       changed here, written back (`dirty`) before Python code runs. */
    uint64_t gen;
    int dirty, busy;
    int64_t last_end_ns, last_record, launches_at;
    PyObject *last_kind, *last_cause, *last_producer; /* owned */
} SInfo;

typedef struct {
    int64_t corr, launch, arrive, ready, start, step, qblocked, record;
    int64_t blocks, remaining, cores, waves;
    KInfo *k;
    SInfo *s;
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

typedef struct {
    void *key;
    Py_ssize_t index; /* into the info array */
} Slot;

typedef struct {
    Slot *slots;
    Py_ssize_t cap, n; /* cap: a power of two */
} Map;

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
    PyObject *tasks, *flows, *counters, *strings, *cuts; /* owned while cached */
    int64_t truth_fixed[NCAUSE + 1]; /* codes of the causes and of "kernel"; -1: not yet */
    PyObject *codes;                 /* owned: recorder.strings (a recorder keeps its table) */
    int64_t launch_api, launch_kind, queue_full; /* their codes in it; -1: not yet */
    KInfo *kinfo;
    Py_ssize_t nk, capk;
    SInfo *sinfo;
    Py_ssize_t ns, caps;
    Map kmap, smap;
    KTask *tasks_slab;
    Py_ssize_t ntasks, captasks;
    int32_t free_slot;
    int64_t live; /* kernel tasks between start of the stream's turn and finish */
    int any_dirty; /* a stream's state changed here since the last write-back */
};

/* ---------------------------------------------------------------- a pointer -> index map */

static Py_ssize_t map_find(Map *m, void *key) {
    if (m->cap == 0) return -1;
    size_t mask = (size_t)m->cap - 1, i = ((uintptr_t)key >> 4) * 11400714819323198485ull >> 7 & mask;
    for (;;) {
        Slot *s = &m->slots[i];
        if (s->key == key) return s->index;
        if (s->key == NULL) return -1;
        i = (i + 1) & mask;
    }
}

static int map_put(Map *m, void *key, Py_ssize_t index) {
    if (2 * (m->n + 1) > m->cap) {
        Py_ssize_t cap = m->cap ? 2 * m->cap : 64;
        Slot *old = m->slots;
        Py_ssize_t oldcap = m->cap;
        m->slots = PyMem_Calloc((size_t)cap, sizeof(Slot));
        if (m->slots == NULL) {
            m->slots = old;
            PyErr_NoMemory();
            return -1;
        }
        m->cap = cap;
        m->n = 0;
        for (Py_ssize_t j = 0; j < oldcap; j++)
            if (old[j].key != NULL) map_put(m, old[j].key, old[j].index);
        PyMem_Free(old);
    }
    size_t mask = (size_t)m->cap - 1, i = ((uintptr_t)key >> 4) * 11400714819323198485ull >> 7 & mask;
    while (m->slots[i].key != NULL) i = (i + 1) & mask;
    m->slots[i].key = key;
    m->slots[i].index = index;
    m->n++;
    return 0;
}

/* ---------------------------------------------------------------- attribute helpers */

static int get_i64(PyObject *o, PyObject *name, int64_t *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int set_i64(PyObject *o, PyObject *name, int64_t value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int r = PyObject_SetAttr(o, name, v);
    Py_DECREF(v);
    return r;
}

static int get_bool(PyObject *o, PyObject *name, int *out) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL) return -1;
    *out = PyObject_IsTrue(v);
    Py_DECREF(v);
    return *out < 0 ? -1 : 0;
}

/* `width` int64s appended to the bytearray `buf` */
static int append(PyObject *buf, const int64_t *values, Py_ssize_t width) {
    if (!PyByteArray_CheckExact(buf)) {
        PyErr_SetString(PyExc_TypeError, "runtime_emu._core: a row buffer is not a bytearray");
        return -1;
    }
    Py_ssize_t len = PyByteArray_GET_SIZE(buf), add = width * 8;
    if (PyByteArray_Resize(buf, len + add) < 0) return -1;
    memcpy(PyByteArray_AS_STRING(buf) + len, values, (size_t)add);
    return 0;
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
    Py_CLEAR(c->strings);
    Py_CLEAR(c->cuts);
    c->cached = 0;
}

static int core_fresh(Core *c) {
    if (c->cached && c->gen == c->engine->pygen) return 0;
    core_drop_cache(c);
    PyObject *sw = PyObject_GetAttr(c->recorder, S_switches);
    if (sw == NULL) return -1;
    int r = get_bool(sw, S_task_time, &c->task_time) || get_bool(sw, S_runtime_api, &c->runtime_api);
    Py_DECREF(sw);
    if (r) return -1;
    if ((c->tasks = PyObject_GetAttr(c->recorder, S_tasks)) == NULL ||
        (c->flows = PyObject_GetAttr(c->recorder, S_flows)) == NULL ||
        (c->counters = PyObject_GetAttr(c->recorder, S_counters)) == NULL ||
        (c->strings = PyObject_GetAttr(c->recorder, S_strings)) == NULL ||
        (c->cuts = PyObject_GetAttr(c->dispatch, S_cuts)) == NULL) {
        core_drop_cache(c);
        return -1;
    }
    c->cached = 1;
    c->gen = c->engine->pygen;
    return 0;
}

/* ---------------------------------------------------------------- the streams' state */

static int stream_load(SInfo *s, uint64_t gen) {
    PyObject *stream = s->stream;
    Py_CLEAR(s->last_kind);
    Py_CLEAR(s->last_cause);
    Py_CLEAR(s->last_producer);
    if (get_bool(stream, S_busy, &s->busy) || get_i64(stream, S_last_end_ns, &s->last_end_ns) ||
        get_i64(stream, S_last_record, &s->last_record) || get_i64(stream, S_launches_at, &s->launches_at) ||
        (s->last_kind = PyObject_GetAttr(stream, S_last_kind)) == NULL ||
        (s->last_cause = PyObject_GetAttr(stream, S_last_cause)) == NULL ||
        (s->last_producer = PyObject_GetAttr(stream, S_last_producer)) == NULL)
        return -1;
    s->gen = gen;
    s->dirty = 0;
    return 0;
}

static int stream_store(SInfo *s) {
    PyObject *stream = s->stream;
    if (PyObject_SetAttr(stream, S_busy, s->busy ? Py_True : Py_False) < 0 ||
        set_i64(stream, S_last_end_ns, s->last_end_ns) || set_i64(stream, S_last_record, s->last_record) ||
        set_i64(stream, S_launches_at, s->launches_at) || PyObject_SetAttr(stream, S_last_kind, s->last_kind) < 0 ||
        PyObject_SetAttr(stream, S_last_cause, s->last_cause) < 0 ||
        PyObject_SetAttr(stream, S_last_producer, s->last_producer) < 0)
        return -1;
    s->dirty = 0;
    return 0;
}

/* Before Python code runs: the streams changed here are written back. */
static int core_flush(Core *c) {
    if (!c->any_dirty) return 0;
    int r = 0;
    for (Py_ssize_t i = 0; i < c->ns; i++) {
        SInfo *s = &c->sinfo[i];
        if (s->dirty && stream_store(s) < 0) r = -1;
    }
    c->any_dirty = 0;
    return r;
}

static inline int flush(Engine *e) { return e->core != NULL ? core_flush(e->core) : 0; }

/* After Python code ran: what was cached may be stale, and a wait may be over. */
static inline void into_python(Engine *e) {
    e->pygen++;
    e->dirty = 1;
}

/* The stream's info (what never changes), its state as it was when last loaded. */
static SInfo *stream_meta(Core *c, PyObject *stream) {
    Py_ssize_t i = map_find(&c->smap, stream);
    if (i >= 0) return &c->sinfo[i];
    if (c->ns == c->caps) {
        Py_ssize_t cap = c->caps ? 2 * c->caps : 16;
        SInfo *a = PyMem_Realloc(c->sinfo, (size_t)cap * sizeof(SInfo));
        if (a == NULL) return (SInfo *)PyErr_NoMemory();
        /* tasks point into the array: re-point them */
        for (Py_ssize_t t = 0; t < c->ntasks; t++)
            if (c->tasks_slab[t].s != NULL) c->tasks_slab[t].s = a + (c->tasks_slab[t].s - c->sinfo);
        c->sinfo = a;
        c->caps = cap;
    }
    SInfo *s = &c->sinfo[c->ns];
    memset(s, 0, sizeof(*s));
    PyObject *dev = NULL, *pools = NULL;
    if (get_i64(stream, S_id, &s->id) || get_i64(stream, S_priority, &s->priority) ||
        get_i64(stream, S_qcode, &s->qcode) || (dev = PyObject_GetAttr(stream, S_device)) == NULL ||
        get_i64(dev, S_rank, &s->rank) || get_i64(dev, S_id, &s->dev_id) || get_i64(dev, S_pid, &s->pid) ||
        (pools = PyObject_GetAttr(dev, S_pools)) == NULL || (s->queue = PyObject_GetAttr(stream, S_queue)) == NULL ||
        (s->popleft = PyObject_GetAttr(s->queue, S_popleft)) == NULL ||
        (s->append = PyObject_GetAttr(s->queue, S_append)) == NULL ||
        (s->launches = PyObject_GetAttr(stream, S_launches)) == NULL)
        goto fail;
    for (int v = 0; v < 2; v++) {
        PyObject *p = PyObject_GetItem(pools, v ? S_vector : S_cube);
        if (p == NULL) goto fail;
        if (!PyObject_TypeCheck(p, &PoolType) || ((Pool *)p)->core != c) {
            Py_DECREF(p);
            PyErr_SetString(PyExc_TypeError, "runtime_emu._core: a stream's device has pools of another core");
            goto fail;
        }
        s->pools[v] = (Pool *)p;
    }
    Py_CLEAR(dev);
    Py_CLEAR(pools);
    s->gen = UINT64_MAX; /* its state is loaded when first needed */
    if (map_put(&c->smap, stream, c->ns) < 0) goto fail;
    s->stream = stream;
    Py_INCREF(stream);
    return &c->sinfo[c->ns++];
fail:
    Py_XDECREF(dev);
    Py_XDECREF(pools);
    Py_CLEAR(s->pools[0]);
    Py_CLEAR(s->pools[1]);
    Py_CLEAR(s->queue);
    Py_CLEAR(s->popleft);
    Py_CLEAR(s->append);
    Py_CLEAR(s->launches);
    return NULL;
}

/* The stream's info and state, its state loaded if it is not current. */
static SInfo *stream_info(Core *c, PyObject *stream) {
    SInfo *s = stream_meta(c, stream);
    if (s != NULL && s->gen != c->engine->pygen && stream_load(s, c->engine->pygen) < 0) return NULL;
    return s;
}

static KInfo *kernel_info(Core *c, PyObject *kernel) {
    Py_ssize_t i = map_find(&c->kmap, kernel);
    if (i >= 0) return &c->kinfo[i];
    if (c->nk == c->capk) {
        Py_ssize_t cap = c->capk ? 2 * c->capk : 16;
        KInfo *a = PyMem_Realloc(c->kinfo, (size_t)cap * sizeof(KInfo));
        if (a == NULL) return (KInfo *)PyErr_NoMemory();
        for (Py_ssize_t t = 0; t < c->ntasks; t++)
            if (c->tasks_slab[t].k != NULL) c->tasks_slab[t].k = a + (c->tasks_slab[t].k - c->kinfo);
        c->kinfo = a;
        c->capk = cap;
    }
    KInfo *k = &c->kinfo[c->nk];
    PyObject *core = NULL;
    if (get_i64(kernel, S_block_ns, &k->block_ns) || (core = PyObject_GetAttr(kernel, S_core)) == NULL) {
        Py_XDECREF(core);
        return NULL;
    }
    int vector = PyObject_RichCompareBool(core, S_vector, Py_EQ);
    Py_DECREF(core);
    if (vector < 0) return NULL;
    k->vector = vector;
    k->name_code = k->type_code = k->op_code = k->truth_name = -1;
    if (map_put(&c->kmap, kernel, c->nk) < 0) return NULL;
    Py_INCREF(kernel);
    k->kernel = kernel;
    return &c->kinfo[c->nk++];
}

/* the codes of a kernel's task type, name and op type, looked up when its first row is written,
   in the order rows.py looks them up (so the string table grows in the same order) */
static int kernel_codes(Core *c, KInfo *k) {
    PyObject *name = NULL, *ttype = NULL, *op = NULL;
    int r = -1;
    if ((name = PyObject_GetAttr(k->kernel, S_name)) == NULL ||
        (ttype = PyObject_GetAttr(k->kernel, S_task_type)) == NULL ||
        (op = PyObject_GetAttr(k->kernel, S_op_type)) == NULL)
        goto done;
    int has_type = PyObject_IsTrue(ttype), has_op = PyObject_IsTrue(op);
    if (has_type < 0 || has_op < 0) goto done;
    int64_t t = code_of(c->strings, has_type ? ttype : (k->vector ? S_AI_VECTOR_CORE : S_AI_CORE));
    if (t < 0) goto done;
    int64_t n = code_of(c->strings, name);
    if (n < 0) goto done;
    int64_t o = code_of(c->strings, has_op ? op : name);
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
    t->k = NULL;
    t->s = NULL;
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

static int core_advance(Core *c, PyObject *stream);

static int task_started(Core *c, KTask *t) {
    int64_t now = c->engine->now;
    t->start = now;
    if (now > t->ready) t->cause = CAUSE_CORES;
    if (core_fresh(c) < 0) return -1;
    if (c->task_time && c->runtime_api) {
        SInfo *s = t->s;
        int64_t row[W_FLOW] = {s->rank, 1, now, s->pid, s->id, t->corr, s->dev_id, s->id, t->step};
        return append(c->flows, row, W_FLOW);
    }
    return 0;
}

static int64_t truth_fixed(Core *c, int which) {
    if (c->truth_fixed[which] < 0)
        c->truth_fixed[which] = code_of(c->truth_codes, which == NCAUSE ? S_kernel : S_cause_text[which]);
    return c->truth_fixed[which];
}

static int task_finished(Core *c, int32_t slot) {
    Engine *e = c->engine;
    KTask *t = &c->tasks_slab[slot];
    SInfo *s = stream_info(c, t->s->stream); /* its state current */
    if (s == NULL) return -1;
    PyObject *stream = s->stream;
    int64_t now = e->now, pending;
    PyObject *gone = PyObject_CallNoArgs(s->popleft);
    if (gone == NULL) return -1;
    Py_DECREF(gone);
    /* pending goes back at once: the host's waits read it */
    if (get_i64(stream, S_pending, &pending) || set_i64(stream, S_pending, --pending)) return -1;
    e->dirty = 1;
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
    s->dirty = c->any_dirty = 1;
    if (c->keep_truth) { /* codes in dispatch.py's order: kind, name, cause, producer */
        KInfo *k = t->k;
        int64_t kind = truth_fixed(c, NCAUSE);
        if (kind < 0) return -1;
        if (k->truth_name < 0) {
            PyObject *name = PyObject_GetAttr(k->kernel, S_name);
            if (name == NULL) return -1;
            k->truth_name = code_of(c->truth_codes, name);
            Py_DECREF(name);
            if (k->truth_name < 0) return -1;
        }
        int64_t cause = truth_fixed(c, t->cause);
        if (cause < 0) return -1;
        int64_t prod = code_of(c->truth_codes, producer);
        if (prod < 0) return -1;
        int64_t row[W_TRUTH] = {t->corr, s->rank, s->dev_id, s->id, kind, k->truth_name, t->launch, t->arrive,
                                t->ready, t->start, now, cause, prod, t->qblocked, t->record ? t->record : NO_RECORD};
        if (append(c->truth, row, W_TRUTH) < 0) return -1;
    }
    if (core_fresh(c) < 0) return -1;
    if (c->task_time) {
        KInfo *k = t->k;
        if (k->name_code < 0 && kernel_codes(c, k) < 0) return -1;
        int64_t row[W_TASK] = {s->rank, s->dev_id, s->pid, s->id, t->start, now - t->start, k->name_code, 0,
                               k->type_code, t->corr, t->blocks, t->waves, NUL, k->op_code, NUL, t->step};
        if (append(c->tasks, row, W_TASK) < 0) return -1;
        if (c->queue_depth) {
            int64_t crow[W_COUNTER] = {s->rank, s->pid, s->qcode, now, pending, 0, s->dev_id, s->id, NUL};
            if (append(c->counters, crow, W_COUNTER) < 0) return -1;
        }
    }
    Py_INCREF(stream);
    task_free(c, slot);
    c->live--;
    int r = core_advance(c, stream);
    Py_DECREF(stream);
    if (r < 0) return -1;
    if (core_fresh(c) < 0) return -1;
    if (c->cuts != Py_None) {
        PyObject *cuts = c->cuts;
        Py_INCREF(cuts);
        int go = core_flush(c);
        if (go == 0) {
            PyObject *due = PyObject_CallMethodNoArgs(cuts, S_due);
            into_python(e);
            go = due == NULL ? -1 : PyObject_IsTrue(due);
            Py_XDECREF(due);
        }
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
        if (heap_push(e, e->now + t->k->block_ns, (PyObject *)p, NULL, OP_BLOCKS, slot, grant) < 0) return -1;
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
        if (heap_push(e, e->now + t->k->block_ns, (PyObject *)p, NULL, OP_BLOCKS, slot, grant) < 0) return -1;
        return p->free ? pool_dispatch(p) : 0;
    }
    p->free += count;
    if (!remaining && !t->cores && task_finished(c, slot) < 0) return -1;
    return pool_dispatch(p);
}

/* Start the stream's head kernel if it can start now (Dispatch.advance for a packed launch). */
static int core_advance(Core *c, PyObject *stream) {
    Engine *e = c->engine;
    SInfo *s = stream_info(c, stream);
    if (s == NULL) return -1;
    if (s->busy) return 0;
    Py_ssize_t n = PyObject_Size(s->queue);
    if (n <= 0) return (int)n;
    PyObject *head = PySequence_GetItem(s->queue, 0);
    if (head == NULL) return -1;
    if (PyObject_TypeCheck(head, (PyTypeObject *)c->task_type)) {
        /* a Task: a copy, an event record or wait, a collective */
        Py_DECREF(head);
        if (core_flush(c) < 0) return -1;
        PyObject *r = PyObject_CallMethodOneArg(c->dispatch, S_advance, stream);
        into_python(e);
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    KInfo *k = kernel_info(c, head);
    Py_DECREF(head);
    if (k == NULL) return -1;
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
        return heap_push(e, f[4], (PyObject *)c, stream, OP_WAKE, 0, 0);
    at += W_LAUNCH * 8;
    if (at == len) { /* every packed launch has started: start afresh */
        PyObject *fresh = PyByteArray_FromStringAndSize(NULL, 0);
        if (fresh == NULL || PyObject_SetAttr(stream, S_launches, fresh) < 0) {
            Py_XDECREF(fresh);
            return -1;
        }
        Py_SETREF(s->launches, fresh);
        at = 0;
    } else if (at >= (1 << 20) && 2 * at >= len) { /* a long backlog: drop what was read */
        if (PySequence_DelSlice(buf, 0, at) < 0) return -1;
        at = 0;
    }
    s->launches_at = at;
    s->busy = 1;
    s->dirty = c->any_dirty = 1;
    int32_t slot = task_new(c);
    if (slot < 0) return -1;
    KTask *t = &c->tasks_slab[slot];
    memset(t, 0, sizeof(*t));
    t->k = k;
    t->s = s;
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
    return pool_submit(s->pools[k->vector], slot);
}


/* ================================================================== running entries */

static int run_entry(Engine *e, Entry *it) {
    int r;
    switch (it->op) {
    case OP_PY: {
        PyObject *res = NULL;
        if (flush(e) == 0)
            res = it->arg == NULL ? PyObject_CallNoArgs(it->fn) : PyObject_CallOneArg(it->fn, it->arg);
        into_python(e);
        r = res == NULL ? -1 : 0;
        Py_XDECREF(res);
        break;
    }
    case OP_BLOCKS:
        r = pool_blocks_done((Pool *)it->fn, it->slot, it->grant);
        break;
    default:
        r = core_advance((Core *)it->fn, it->arg);
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

/* Every call from Python starts with fresh Python state and ends with the streams' state
   written back (also on an error: the state is whatever the program would see). */
static PyObject *leave(Engine *e, PyObject *result) {
    if (flush(e) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

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
    while (e->n && e->heap[0].t <= t)
        if (step_one(e) < 0) return leave(e, NULL);
    if (t > e->now) e->now = t;
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
                if (flush(e) < 0) goto done;
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

/* ================================================================== Core's Python API */

/* Core(engine, dispatch, recorder, truth, truth_codes, keep_truth, queue_depth_counters, task_type) */
static PyObject *core_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *engine, *dispatch, *recorder, *truth, *codes, *task_type;
    int keep, depth;
    static char *names[] = {"engine", "dispatch", "recorder", "truth", "truth_codes", "keep_truth",
                            "queue_depth_counters", "task_type", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OOO!OppO!:Core", names, &EngineType, &engine, &dispatch, &recorder,
                                     &PyByteArray_Type, &truth, &codes, &keep, &depth, &PyType_Type, &task_type))
        return NULL;
    Core *c = (Core *)type->tp_alloc(type, 0);
    if (c == NULL) return NULL;
    Py_INCREF(engine);
    c->engine = (Engine *)engine;
    Py_INCREF(dispatch);
    c->dispatch = dispatch;
    Py_INCREF(recorder);
    c->recorder = recorder;
    Py_INCREF(truth);
    c->truth = truth;
    Py_INCREF(codes);
    c->truth_codes = codes;
    Py_INCREF(task_type);
    c->task_type = task_type;
    c->keep_truth = keep;
    c->queue_depth = depth;
    c->free_slot = -1;
    for (int i = 0; i <= NCAUSE; i++) c->truth_fixed[i] = -1;
    c->launch_api = c->launch_kind = c->queue_full = -1;
    if ((c->codes = PyObject_GetAttr(recorder, S_strings)) == NULL) {
        Py_DECREF(c);
        return NULL;
    }
    if (((Engine *)engine)->core != NULL) {
        Py_DECREF(c);
        PyErr_SetString(PyExc_ValueError, "Core: the engine runs another core's kernels already");
        return NULL;
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
    Py_VISIT(c->tasks);
    Py_VISIT(c->flows);
    Py_VISIT(c->counters);
    Py_VISIT(c->strings);
    Py_VISIT(c->cuts);
    for (Py_ssize_t i = 0; i < c->nk; i++) Py_VISIT(c->kinfo[i].kernel);
    for (Py_ssize_t i = 0; i < c->ns; i++) {
        SInfo *s = &c->sinfo[i];
        Py_VISIT(s->stream);
        Py_VISIT(s->pools[0]);
        Py_VISIT(s->pools[1]);
        Py_VISIT(s->queue);
        Py_VISIT(s->popleft);
        Py_VISIT(s->append);
        Py_VISIT(s->launches);
        Py_VISIT(s->last_kind);
        Py_VISIT(s->last_cause);
        Py_VISIT(s->last_producer);
    }
    for (Py_ssize_t i = 0; i < c->ntasks; i++) Py_VISIT(c->tasks_slab[i].producer);
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
    for (Py_ssize_t i = 0; i < c->nk; i++) Py_CLEAR(c->kinfo[i].kernel);
    for (Py_ssize_t i = 0; i < c->ns; i++) {
        SInfo *s = &c->sinfo[i];
        Py_CLEAR(s->stream);
        Py_CLEAR(s->pools[0]);
        Py_CLEAR(s->pools[1]);
        Py_CLEAR(s->queue);
        Py_CLEAR(s->popleft);
        Py_CLEAR(s->append);
        Py_CLEAR(s->launches);
        Py_CLEAR(s->last_kind);
        Py_CLEAR(s->last_cause);
        Py_CLEAR(s->last_producer);
    }
    for (Py_ssize_t i = 0; i < c->ntasks; i++) Py_CLEAR(c->tasks_slab[i].producer);
    c->nk = c->ns = 0;
    c->kmap.n = c->smap.n = 0;
    if (c->kmap.slots) memset(c->kmap.slots, 0, (size_t)c->kmap.cap * sizeof(Slot));
    if (c->smap.slots) memset(c->smap.slots, 0, (size_t)c->smap.cap * sizeof(Slot));
    return 0;
}

static void core_dealloc(Core *c) {
    PyObject_GC_UnTrack(c);
    core_clear(c);
    PyMem_Free(c->kinfo);
    PyMem_Free(c->sinfo);
    PyMem_Free(c->tasks_slab);
    PyMem_Free(c->kmap.slots);
    PyMem_Free(c->smap.slots);
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
    if (core_advance(c, stream) < 0) return leave(e, NULL);
    return leave(e, Py_NewRef(Py_None));
}

/* launched(stream, kernel, apis, flows, counters, record_api, record_tasks, rank, tid, device, step, corr,
 *          t0, clock, blocks, queue_blocked, pending, arrive)
 * A kernel launch the host made (Dispatch.launch_kernel decided its numbers): its API slice,
 * flow start and queue depth rows (rows.Rows.launched_as), its packed launch in the stream's
 * queue (device.LAUNCH), and the stream woken when the launch arrives if it is idle. `device`:
 * the calling thread's device id (NULL: none); `step`: NULL for none. */
static int launched(Core *c, PyObject *stream, PyObject *kernel, PyObject *apis, PyObject *flows, PyObject *counters,
                    int record_api, int record_tasks, const int64_t *v) {
    int64_t rank = v[0], tid = v[1], device = v[2], step = v[3], corr = v[4], t0 = v[5], clock = v[6],
            blocks = v[7], queue_blocked = v[8], pending = v[9], arrive = v[10];
    SInfo *s = stream_meta(c, stream);
    if (s == NULL) return -1;
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
    PyObject *r = PyObject_CallOneArg(s->append, kernel);
    if (r == NULL) return -1;
    Py_DECREF(r);
    /* a busy stream picks the launch up when it gets to it; only an idle one needs waking */
    int busy;
    if (get_bool(stream, S_busy, &busy)) return -1;
    if (!busy) {
        Py_ssize_t n = PyObject_Size(s->queue);
        if (n < 0) return -1;
        if (n == 1) {
            Engine *e = c->engine;
            if (heap_push(e, arrive < e->now ? e->now : arrive, (PyObject *)c, stream, OP_WAKE, 0, 0) < 0) return -1;
        }
    }
    return 0;
}

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
    if (launched(c, args[0], args[1], args[2], args[3], args[4], record_api, record_tasks, v) < 0) return NULL;
    Py_RETURN_NONE;
}

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

static PyMethodDef core_methods[] = {
    {"pool", (PyCFunction)(void (*)(void))core_pool, METH_FASTCALL, "pool(kind, total): a device's core pool"},
    {"advance", (PyCFunction)core_advance_py, METH_O, "start the stream's head kernel if it can start now"},
    {"launched", (PyCFunction)(void (*)(void))core_launched, METH_FASTCALL,
     "a kernel launch's rows, its packed launch in its stream's queue, the stream woken if idle"},
    {"earliest", (PyCFunction)core_earliest, METH_O, "min(w, start of every running kernel)"},
    {NULL}};

static PyGetSetDef core_getset[] = {
    {"live", (getter)core_get_live, NULL, "kernels started on their stream and not finished", NULL}, {NULL}};

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
    .tp_getset = core_getset,
};

/* ================================================================== the module */

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "runtime_emu._core",
                                    "The emulator's event heap, core pools and kernel lifecycle in C.", -1, NULL};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC PyInit__core(void) {
    INTERN(S_busy, "busy");
    INTERN(S_queue, "queue");
    INTERN(S_launches, "launches");
    INTERN(S_launches_at, "launches_at");
    INTERN(S_pending, "pending");
    INTERN(S_last_end_ns, "last_end_ns");
    INTERN(S_last_kind, "last_kind");
    INTERN(S_last_cause, "last_cause");
    INTERN(S_last_producer, "last_producer");
    INTERN(S_last_record, "last_record");
    INTERN(S_id, "id");
    INTERN(S_priority, "priority");
    INTERN(S_qcode, "qcode");
    INTERN(S_device, "device");
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
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&PoolType) < 0 || PyType_Ready(&CoreType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "PULSE_EVENTS", PULSE_EVENTS) < 0 ||
        PyModule_AddObjectRef(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0 ||
        PyModule_AddObjectRef(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
