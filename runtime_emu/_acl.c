/* The pyACL-shaped functions of runtime_emu.acl (acl.rt.launch_kernel, ...) as native forwarders.
 *
 * Each acl function calls the method of the same name on the calling thread's runtime. In
 * Python that is a closure taking *args and **kwargs, asking acl.current() for the runtime and
 * looking the method up: a quarter of a kernel launch's instructions. A Forward does the same
 * in C: it reads acl's `_current` (the runtime acl.init() made) and, while that one is not
 * finished, calls its method with the arguments as they came (vectorcall, no tuple or dict
 * made); otherwise it asks acl.current(), which knows a multi-rank job's threads and raises the
 * "not initialized" error.
 *
 * Forward(name, globals, current, doc): globals is acl's module dict, current acl.current.
 *
 * A Forward's `fast` (None at first) is a native fast path of the call on the current runtime,
 * which acl.init() sets (Runtime._fast_launch for launch_kernel: the C core's try_launch). With
 * positional arguments only, it is called first, as the C function it is; its result is the
 * call's unless it is NotImplemented (a case it leaves to the runtime's method, which then runs
 * as it always does).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name;    /* the Runtime method */
    PyObject *globals; /* acl's module dict */
    PyObject *current; /* acl.current */
    PyObject *doc;
    PyObject *fast;       /* None, or a callable: see above */
    _PyCFunctionFast cfn; /* fast's C function, when it is a METH_FASTCALL builtin (then called directly) */
    PyObject *cself;      /* and its self (borrowed from fast) */
} Forward;

static PyObject *CURRENT_KEY, *FINISHED_KEY;

static PyObject *forward_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Forward *self = (Forward *)op;
    if (self->fast != Py_None && kwnames == NULL) {
        PyObject *fast = Py_NewRef(self->fast); /* the call may replace it */
        PyObject *r = self->cfn != NULL ? self->cfn(self->cself, args, PyVectorcall_NARGS(nargsf))
                                        : PyObject_Vectorcall(fast, args, nargsf, NULL);
        Py_DECREF(fast);
        if (r != Py_NotImplemented) return r;
        Py_DECREF(r);
    }
    PyObject *rt = PyDict_GetItemWithError(self->globals, CURRENT_KEY); /* borrowed */
    int fast = 0;
    if (rt && rt != Py_None) {
        PyObject *finished = PyObject_GetAttr(rt, FINISHED_KEY);
        if (!finished) return NULL;
        fast = finished == Py_False;
        Py_DECREF(finished);
    } else if (PyErr_Occurred()) {
        return NULL;
    }
    if (fast) {
        Py_INCREF(rt);
    } else {
        rt = PyObject_CallNoArgs(self->current);
        if (!rt) return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *small[12], **stack = small;
    if (nargs + nkw + 1 > 12) {
        stack = PyMem_Malloc(sizeof(PyObject *) * (size_t)(nargs + nkw + 1));
        if (!stack) {
            Py_DECREF(rt);
            return PyErr_NoMemory();
        }
    }
    stack[0] = rt;
    for (Py_ssize_t i = 0; i < nargs + nkw; i++) stack[i + 1] = args[i];
    PyObject *out = PyObject_VectorcallMethod(self->name, stack, (size_t)(nargs + 1), kwnames);
    if (stack != small) PyMem_Free(stack);
    Py_DECREF(rt);
    return out;
}

static PyObject *forward_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *name, *globals, *current, *doc;
    if (!PyArg_ParseTuple(args, "UO!OO", &name, &PyDict_Type, &globals, &current, &doc)) return NULL;
    Forward *self = (Forward *)type->tp_alloc(type, 0);
    if (!self) return NULL;
    self->vectorcall = forward_vectorcall;
    Py_INCREF(name), Py_INCREF(globals), Py_INCREF(current), Py_INCREF(doc);
    self->name = name, self->globals = globals, self->current = current, self->doc = doc;
    self->fast = Py_NewRef(Py_None);
    return (PyObject *)self;
}

static void forward_dealloc(PyObject *op) {
    Forward *self = (Forward *)op;
    Py_XDECREF(self->name);
    Py_XDECREF(self->globals);
    Py_XDECREF(self->current);
    Py_XDECREF(self->doc);
    Py_XDECREF(self->fast);
    Py_TYPE(op)->tp_free(op);
}

static PyObject *forward_repr(PyObject *op) {
    return PyUnicode_FromFormat("<acl function %U>", ((Forward *)op)->name);
}

static PyObject *get_name(PyObject *op, void *closure) {
    Py_INCREF(((Forward *)op)->name);
    return ((Forward *)op)->name;
}

static PyObject *get_doc(PyObject *op, void *closure) {
    Py_INCREF(((Forward *)op)->doc);
    return ((Forward *)op)->doc;
}

static PyObject *get_fast(PyObject *op, void *closure) { return Py_NewRef(((Forward *)op)->fast); }

static int set_fast(PyObject *op, PyObject *v, void *closure) {
    Forward *self = (Forward *)op;
    if (v == NULL) v = Py_None;
    if (v != Py_None && !PyCallable_Check(v)) {
        PyErr_SetString(PyExc_TypeError, "a Forward's fast path is a callable or None");
        return -1;
    }
    _PyCFunctionFast cfn = NULL;
    PyObject *cself = NULL;
    if (PyCFunction_Check(v) && (PyCFunction_GET_FLAGS(v) & (METH_VARARGS | METH_FASTCALL | METH_NOARGS | METH_O |
                                                              METH_KEYWORDS | METH_METHOD)) == METH_FASTCALL) {
        cfn = (_PyCFunctionFast)(void (*)(void))PyCFunction_GET_FUNCTION(v);
        cself = PyCFunction_GET_SELF(v);
    }
    Py_SETREF(self->fast, Py_NewRef(v));
    self->cfn = cfn;
    self->cself = cself;
    return 0;
}

static PyGetSetDef forward_getset[] = {
    {"fast", get_fast, set_fast, "the current runtime's native fast path of the call, or None", NULL},
    {"__name__", get_name, NULL, "the Runtime method called", NULL},
    {"__doc__", get_doc, NULL, "the Runtime method's documentation", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject ForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "runtime_emu._acl.Forward",
    .tp_basicsize = sizeof(Forward),
    .tp_dealloc = forward_dealloc,
    .tp_vectorcall_offset = offsetof(Forward, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_repr = forward_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_getset = forward_getset,
    .tp_new = forward_new,
    .tp_doc = "Forward(name, globals, current, doc): calls the method `name` of acl's current runtime.",
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_acl", "Native forwarders of runtime_emu.acl.", -1, NULL};

PyMODINIT_FUNC PyInit__acl(void) {
    CURRENT_KEY = PyUnicode_InternFromString("_current");
    FINISHED_KEY = PyUnicode_InternFromString("finished");
    if (!CURRENT_KEY || !FINISHED_KEY || PyType_Ready(&ForwardType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ForwardType);
    if (PyModule_AddObject(m, "Forward", (PyObject *)&ForwardType) < 0) {
        Py_DECREF(&ForwardType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
