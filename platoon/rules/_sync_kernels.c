/* One-pass sync kernels for platoon's built-in rules (see platoon/kernels.py).
 *
 * Each function reads every element of its arrays once and writes each once, with
 * the same IEEE operations in the same order as the numpy formulas in rules.py and
 * downpour.py, so results are bit-identical to them. That needs no FMA contraction
 * and no fast-math (setup.py compiles with -ffp-contract=off -fno-fast-math); the
 * scalars are rounded to the arrays' dtype first, as numpy does with a Python float
 * (NEP 50).
 *
 * Arrays are taken through the buffer protocol: C-contiguous, native float32
 * ("f") or float64 ("d"), all of one dtype and shape, written ones writable,
 * no two overlapping. Anything else returns False without touching the arrays, and
 * the caller runs the numpy path. The loops run without the GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_ARRAYS 6

enum { F32 = 1, F64 = 2 };

typedef struct {
    Py_buffer views[MAX_ARRAYS];
    int count;
    int dtype;
    Py_ssize_t n;
} Arrays;

static void release(Arrays *a)
{
    for (int i = 0; i < a->count; i++)
        PyBuffer_Release(&a->views[i]);
    a->count = 0;
}

static int dtype_of(const Py_buffer *v)
{
    const char *f = v->format;
    if (f == NULL)
        return 0;
    if (f[0] == '@' || f[0] == '=')
        f++;
#if PY_LITTLE_ENDIAN
    else if (f[0] == '<')
        f++;
#else
    else if (f[0] == '>' || f[0] == '!')
        f++;
#endif
    if (f[0] == 'f' && f[1] == '\0' && v->itemsize == 4)
        return F32;
    if (f[0] == 'd' && f[1] == '\0' && v->itemsize == 8)
        return F64;
    return 0;
}

static int same_shape(const Py_buffer *u, const Py_buffer *v)
{
    if (u->ndim != v->ndim)
        return 0;
    for (int d = 0; d < u->ndim; d++)
        if (u->shape[d] != v->shape[d])
            return 0;
    return 1;
}

/* Take the buffers of objs[0..count); writable[i] says which are written.
 * Returns 1 when the kernel may run, 0 when the caller must use numpy (no error set). */
static int take(Arrays *a, PyObject *const *objs, const int *writable, int count)
{
    a->count = 0;
    for (int i = 0; i < count; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable[i] ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(objs[i], &a->views[i], flags) < 0) {
            PyErr_Clear();
            release(a);
            return 0;
        }
        a->count = i + 1;
        int dtype = dtype_of(&a->views[i]);
        Py_ssize_t n = dtype ? a->views[i].len / a->views[i].itemsize : -1;
        if (!dtype || (i > 0 && (dtype != a->dtype || n != a->n
                                 || !same_shape(&a->views[0], &a->views[i])))) {
            release(a);
            return 0;
        }
        a->dtype = dtype;
        a->n = n;
    }
    for (int i = 0; i < count; i++) {
        const char *p = a->views[i].buf;
        for (int j = i + 1; j < count; j++) {
            const char *q = a->views[j].buf;
            if (a->views[i].len && a->views[j].len && p < q + a->views[j].len
                    && q < p + a->views[i].len) {
                release(a);
                return 0;
            }
        }
    }
    return 1;
}

#define BUF(k, T) ((T *)a.views[k].buf)

/* ---- the loops, once per dtype ---- */

#define DEFINE_LOOPS(T, S, ATTR)                                                             \
ATTR static void easgd_update_##S(T *restrict x, T *restrict c, T alpha, Py_ssize_t n)        \
{   /* d = alpha * (x - c); x -= d; c += d */                                            \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T d = (x[i] - c[i]) * alpha;                                                     \
        x[i] = x[i] - d;                                                                 \
        c[i] = c[i] + d;                                                                 \
    }                                                                                    \
}                                                                                        \
ATTR static void easgd_push_##S(T *restrict s, T *restrict c, T alpha, Py_ssize_t n)          \
{   /* d = alpha * (s - c); c += d; s = -d */                                            \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T d = (s[i] - c[i]) * alpha;                                                     \
        c[i] = c[i] + d;                                                                 \
        s[i] = -d;                                                                       \
    }                                                                                    \
}                                                                                        \
ATTR static void easgd_push_pull_##S(T *restrict x, const T *restrict s, T *restrict c,      \
                                 T alpha, Py_ssize_t n)                                  \
{   /* easgd_push, then add_into: d = alpha * (s - c); c += d; x += -d */                 \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T d = (s[i] - c[i]) * alpha;                                                     \
        c[i] = c[i] + d;                                                                 \
        x[i] = x[i] + (-d);                                                              \
    }                                                                                    \
}                                                                                        \
ATTR static void add_into_##S(T *restrict x, const T *restrict s, Py_ssize_t n)               \
{                                                                                        \
    for (Py_ssize_t i = 0; i < n; i++)                                                   \
        x[i] = x[i] + s[i];                                                              \
}                                                                                        \
ATTR static void asgd_update_##S(T *restrict x, T *restrict c, T *restrict l, Py_ssize_t n)   \
{   /* c += x - last; x = c; last = c */                                                 \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T v = c[i] + (x[i] - l[i]);                                                      \
        c[i] = v;                                                                        \
        x[i] = v;                                                                        \
        l[i] = v;                                                                        \
    }                                                                                    \
}                                                                                        \
ATTR static void asgd_push_##S(const T *restrict s, T *restrict c, T *restrict l, Py_ssize_t n) \
{   /* c += s - last; last = c */                                                        \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T v = c[i] + (s[i] - l[i]);                                                      \
        c[i] = v;                                                                        \
        l[i] = v;                                                                        \
    }                                                                                    \
}                                                                                        \
ATTR static void take_pull_##S(T *restrict x, const T *restrict s, const T *restrict l,       \
                          Py_ssize_t n)                                                  \
{   /* x -= s; x += last */                                                              \
    for (Py_ssize_t i = 0; i < n; i++)                                                   \
        x[i] = (x[i] - s[i]) + l[i];                                                     \
}                                                                                        \
/* Downpour(SGD) with momentum, writing the new centre and momentum to cn and vn (the     \
   journal's staging rows, or c and v themselves: then they alias, hence no restrict on     \
   c, v, cn, vn; each element is read before it is written). */                           \
ATTR static void sgd_staged_##S(T *restrict s, const T *c, T *restrict l, const T *v,       \
                           T *cn, T *vn, T lr, T mu, T d, int scaled, int nesterov,      \
                           int take, Py_ssize_t n)                                       \
{                                                                                        \
    for (Py_ssize_t i = 0; i < n; i++) {                                                 \
        T g = l[i] - s[i];                                                               \
        if (scaled) g = g / d;                                                           \
        T m = v[i] * mu + g;                                                             \
        T w = nesterov ? c[i] - (g + m * mu) * lr : c[i] - m * lr;                      \
        vn[i] = m; cn[i] = w; l[i] = w;                                                  \
        if (take) s[i] = w;                                                              \
    }                                                                                    \
}                                                                                        \
/* Downpour(SGD): g = last - s (divided by d when `scaled`: DiLoCo's g/p); c <- SGD step  \
   with g; last = c (and s = c when `take`). Same operations as SGD.apply_block: plain    \
   g *= lr; c -= g. Momentum v *= mu; v += g; then Nesterov g += v*mu; g *= lr, else      \
   g = v*lr; c -= g. */                                                                  \
ATTR static void sgd_##S(T *restrict s, T *restrict c, T *restrict l, T *restrict v,          \
                    T lr, T mu, T d, int scaled, int nesterov, int take, Py_ssize_t n)   \
{                                                                                        \
    if (v == NULL && take) {                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T g = l[i] - s[i];                                                           \
            if (scaled) g = g / d;                                                       \
            T w = c[i] - g * lr;                                                         \
            c[i] = w; s[i] = w; l[i] = w;                                                \
        }                                                                                \
    } else if (v == NULL) {                                                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T g = l[i] - s[i];                                                           \
            if (scaled) g = g / d;                                                       \
            T w = c[i] - g * lr;                                                         \
            c[i] = w; l[i] = w;                                                          \
        }                                                                                \
    } else {                                                                             \
        sgd_staged_##S(s, c, l, v, c, v, lr, mu, d, scaled, nesterov, take, n);          \
    }                                                                                    \
}                                                                                        \

DEFINE_LOOPS(float, f32, )
DEFINE_LOOPS(double, f64, )

/* The same loops built for AVX (256-bit vectors, no FMA), picked at run time where the CPU
 * has it: faster on arrays in cache. Same operations, so the same bits. */
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_AVX_LOOPS 1
DEFINE_LOOPS(float, f32_avx, __attribute__((target("avx"))))
DEFINE_LOOPS(double, f64_avx, __attribute__((target("avx"))))
#endif

#define LOOP_FIELDS(T, S)                                                                \
    void (*easgd_update_##S)(T *, T *, T, Py_ssize_t);                                   \
    void (*easgd_push_##S)(T *, T *, T, Py_ssize_t);                                     \
    void (*easgd_push_pull_##S)(T *, const T *, T *, T, Py_ssize_t);                      \
    void (*add_into_##S)(T *, const T *, Py_ssize_t);                                    \
    void (*asgd_update_##S)(T *, T *, T *, Py_ssize_t);                                  \
    void (*asgd_push_##S)(const T *, T *, T *, Py_ssize_t);                              \
    void (*take_pull_##S)(T *, const T *, const T *, Py_ssize_t);                        \
    void (*sgd_##S)(T *, T *, T *, T *, T, T, T, int, int, int, Py_ssize_t);                 \
    void (*sgd_staged_##S)(T *, const T *, T *, const T *, T *, T *, T, T, T, int, int, int, \
                           Py_ssize_t);

#define LOOP_INIT(S) easgd_update_##S, easgd_push_##S, easgd_push_pull_##S, add_into_##S,   \
    asgd_update_##S, asgd_push_##S, take_pull_##S, sgd_##S, sgd_staged_##S

typedef struct {
    const char *name;
    LOOP_FIELDS(float, f32)
    LOOP_FIELDS(double, f64)
} Loops;

static const Loops generic_loops = {"generic", LOOP_INIT(f32), LOOP_INIT(f64)};
#ifdef HAVE_AVX_LOOPS
static const Loops avx_loops = {"avx", LOOP_INIT(f32_avx), LOOP_INIT(f64_avx)};
#endif
static const Loops *loops = &generic_loops;  /* set by module init and set_isa */

/* ---- Python entry points ---- */

static const int RW[MAX_ARRAYS] = {1, 1, 1, 1, 1, 1};

static PyObject *
py_easgd_update(PyObject *self, PyObject *args)
{
    PyObject *o[2];
    double alpha;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOd:easgd_update", &o[0], &o[1], &alpha))
        return NULL;
    if (!take(&a, o, RW, 2))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->easgd_update_f32(BUF(0, float), BUF(1, float), (float)alpha, a.n);
    else
        loops->easgd_update_f64(BUF(0, double), BUF(1, double), alpha, a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_easgd_push(PyObject *self, PyObject *args)
{
    PyObject *o[2];
    double alpha;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOd:easgd_push", &o[0], &o[1], &alpha))
        return NULL;
    if (!take(&a, o, RW, 2))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->easgd_push_f32(BUF(0, float), BUF(1, float), (float)alpha, a.n);
    else
        loops->easgd_push_f64(BUF(0, double), BUF(1, double), alpha, a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_easgd_push_pull(PyObject *self, PyObject *args)
{
    static const int rw[3] = {1, 0, 1};
    PyObject *o[3];
    double alpha;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOOd:easgd_push_pull", &o[0], &o[1], &o[2], &alpha))
        return NULL;
    if (!take(&a, o, rw, 3))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->easgd_push_pull_f32(BUF(0, float), BUF(1, float), BUF(2, float), (float)alpha,
                                   a.n);
    else
        loops->easgd_push_pull_f64(BUF(0, double), BUF(1, double), BUF(2, double), alpha, a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_add_into(PyObject *self, PyObject *args)
{
    static const int rw[2] = {1, 0};
    PyObject *o[2];
    Arrays a;
    if (!PyArg_ParseTuple(args, "OO:add_into", &o[0], &o[1]))
        return NULL;
    if (!take(&a, o, rw, 2))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->add_into_f32(BUF(0, float), BUF(1, float), a.n);
    else
        loops->add_into_f64(BUF(0, double), BUF(1, double), a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_asgd_update(PyObject *self, PyObject *args)
{
    PyObject *o[3];
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOO:asgd_update", &o[0], &o[1], &o[2]))
        return NULL;
    if (!take(&a, o, RW, 3))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->asgd_update_f32(BUF(0, float), BUF(1, float), BUF(2, float), a.n);
    else
        loops->asgd_update_f64(BUF(0, double), BUF(1, double), BUF(2, double), a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_asgd_push(PyObject *self, PyObject *args)
{
    static const int rw[3] = {0, 1, 1};
    PyObject *o[3];
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOO:asgd_push", &o[0], &o[1], &o[2]))
        return NULL;
    if (!take(&a, o, rw, 3))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->asgd_push_f32(BUF(0, float), BUF(1, float), BUF(2, float), a.n);
    else
        loops->asgd_push_f64(BUF(0, double), BUF(1, double), BUF(2, double), a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_take_pull(PyObject *self, PyObject *args)
{
    static const int rw[3] = {1, 0, 0};
    PyObject *o[3];
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOO:take_pull", &o[0], &o[1], &o[2]))
        return NULL;
    if (!take(&a, o, rw, 3))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->take_pull_f32(BUF(0, float), BUF(1, float), BUF(2, float), a.n);
    else
        loops->take_pull_f64(BUF(0, double), BUF(1, double), BUF(2, double), a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_sgd(PyObject *self, PyObject *args)
{
    PyObject *o[4];
    double lr, mu, d = 1.0;
    int nesterov, take_it;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOOOddpp|d:sgd", &o[0], &o[1], &o[2], &o[3], &lr, &mu,
                          &nesterov, &take_it, &d))
        return NULL;
    int count = o[3] == Py_None ? 3 : 4, scaled = d != 1.0;
    if (!take(&a, o, RW, count))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->sgd_f32(BUF(0, float), BUF(1, float), BUF(2, float),
                       count == 4 ? BUF(3, float) : NULL, (float)lr, (float)mu, (float)d,
                       scaled, nesterov, take_it, a.n);
    else
        loops->sgd_f64(BUF(0, double), BUF(1, double), BUF(2, double),
                       count == 4 ? BUF(3, double) : NULL, lr, mu, d, scaled, nesterov,
                       take_it, a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static PyObject *
py_sgd_staged(PyObject *self, PyObject *args)
{
    PyObject *o[6];
    double lr, mu, d;
    int nesterov, take_it;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOOOOOddppd:sgd_staged", &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &lr, &mu, &nesterov, &take_it, &d))
        return NULL;
    if (!take(&a, o, RW, 6))
        Py_RETURN_FALSE;
    int scaled = d != 1.0;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->sgd_staged_f32(BUF(0, float), BUF(1, float), BUF(2, float), BUF(3, float),
                              BUF(4, float), BUF(5, float), (float)lr, (float)mu, (float)d,
                              scaled, nesterov, take_it, a.n);
    else
        loops->sgd_staged_f64(BUF(0, double), BUF(1, double), BUF(2, double), BUF(3, double),
                              BUF(4, double), BUF(5, double), lr, mu, d, scaled, nesterov,
                              take_it, a.n);
    Py_END_ALLOW_THREADS
    release(&a);
    Py_RETURN_TRUE;
}

static int cpu_has_avx(void)
{
#ifdef HAVE_AVX_LOOPS
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx");
#else
    return 0;
#endif
}

static PyObject *
py_isas(PyObject *self, PyObject *unused)
{
    return cpu_has_avx() ? Py_BuildValue("(ss)", "generic", "avx")
                         : Py_BuildValue("(s)", "generic");
}

static PyObject *
py_set_isa(PyObject *self, PyObject *args)
{
    const char *name;
    const char *before = loops->name;
    if (!PyArg_ParseTuple(args, "s:set_isa", &name))
        return NULL;
    if (strcmp(name, "generic") == 0)
        loops = &generic_loops;
#ifdef HAVE_AVX_LOOPS
    else if (strcmp(name, "avx") == 0 && cpu_has_avx())
        loops = &avx_loops;
#endif
    else
        return PyErr_Format(PyExc_ValueError, "no %s loops on this CPU or build; isas() "
                            "lists those there are", name);
    return PyUnicode_FromString(before);
}

static PyMethodDef methods[] = {
    {"isas", py_isas, METH_NOARGS,
     "isas() -> tuple: the instruction sets this CPU and build have loops for, best last."},
    {"set_isa", py_set_isa, METH_VARARGS,
     "set_isa(name) -> str: use the loops for `name` (one of isas()); returns the previous."},
    {"easgd_update", py_easgd_update, METH_VARARGS,
     "easgd_update(x, c, alpha) -> bool: d = alpha*(x-c); x -= d; c += d."},
    {"easgd_push", py_easgd_push, METH_VARARGS,
     "easgd_push(s, c, alpha) -> bool: d = alpha*(s-c); c += d; s = -d."},
    {"easgd_push_pull", py_easgd_push_pull, METH_VARARGS,
     "easgd_push_pull(x, s, c, alpha) -> bool: d = alpha*(s-c); c += d; x += -d."},
    {"add_into", py_add_into, METH_VARARGS, "add_into(x, s) -> bool: x += s."},
    {"asgd_update", py_asgd_update, METH_VARARGS,
     "asgd_update(x, c, last) -> bool: c += x-last; x = last = c."},
    {"asgd_push", py_asgd_push, METH_VARARGS,
     "asgd_push(s, c, last) -> bool: c += s-last; last = c."},
    {"take_pull", py_take_pull, METH_VARARGS,
     "take_pull(x, s, last) -> bool: x = (x-s) + last."},
    {"sgd", py_sgd, METH_VARARGS,
     "sgd(s, c, last, v_or_None, lr, momentum, nesterov, take, divisor=1.0) -> bool: "
     "Downpour(SGD) with g = (last-s)/divisor; last = c (and s = c when take)."},
    {"sgd_staged", py_sgd_staged, METH_VARARGS,
     "sgd_staged(s, c, last, v, c_new, v_new, lr, momentum, nesterov, take, divisor) -> bool: "
     "sgd with momentum, the new c and v written to c_new and v_new (c and v unchanged)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "platoon.rules._sync_kernels",
    "One-pass sync kernels (float32, float64); each returns False when the arrays need "
    "the numpy path.", -1, methods,
};

static int add_meeting(PyObject *module);  /* all_reduce's Meeting, below */

PyMODINIT_FUNC
PyInit__sync_kernels(void)
{
#ifdef HAVE_AVX_LOOPS
    if (cpu_has_avx())
        loops = &avx_loops;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && add_meeting(m) < 0)
        Py_CLEAR(m);
    return m;
}

/* ---- all_reduce: the workers of a node meeting in shared memory (platoon/collectives.py) ----
 *
 * Meeting(data, control, slot, slots, fd, kind) is one worker's view of an all_reduce
 * segment (collectives.reduction_layout): `data` its rows (two sets of `slots`, then the
 * controller's), `control` its int64 words [each worker's round | each worker's op, by
 * parity | the last committed round | 1 + the id of a worker that left], `fd` a descriptor
 * of the segment, whose byte 0 is its lock (an OFD lock, as CentreLock takes it; Meeting
 * keeps a duplicate), `kind` F32 or F64 for the dtypes reduced here, 0 for numpy's.
 *
 * meet(src, out, round, op, busy_ns, poll_ns) runs one round as collectives._Buffer does
 * in Python, with the same words and the same lock, so workers of either kind meet: it
 * copies `src` into this worker's row, writes its op and publishes the round; then, without
 * the GIL, polls for the others, spinning for `busy_ns` and then yielding the core between
 * polls until `poll_ns` have passed. The first worker to see all the others arrived commits
 * the round under the lock (a worker whose timeout ran out withdraws under it). For a float
 * sum or mean into a C-contiguous `out`, every worker's op alike, it then reduces the rows
 * in worker-id order into `out`: numpy's operations in numpy's order, so the same bits.
 * Returns MEET_DONE, or what the caller must do:
 *   MEET_ARRIVED  the round is complete: check the ops and reduce (numpy)
 *   MEET_PENDING  published but not complete within poll_ns: go on waiting, then as ARRIVED
 *   MEET_GONE     published, and a worker has left the job
 *   MEET_COPY     nothing done: `src` is not C-contiguous of a row's size; copy it into the
 *                 row and call again with src None
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

enum { MEET_DONE = 0, MEET_ARRIVED = 1, MEET_PENDING = 2, MEET_GONE = 3, MEET_COPY = 4 };
enum { OP_SUM = 0, OP_MEAN = 1 };  /* their indexes in collectives.OPS */

typedef struct {
    PyObject_HEAD
    Py_buffer data, control;
    Py_ssize_t row_bytes;
    int slot, slots, fd, kind;
} Meeting;

static inline int64_t load_acquire(const int64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}

static inline void store_release(int64_t *p, int64_t v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Take (F_WRLCK) or release (F_UNLCK) the segment's lock, never waiting:
 * 1 done, 0 another worker holds it, -1 error. */
static int meeting_lock(int fd, short type)
{
#ifdef F_OFD_SETLK
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 1;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
        return 1;
    return (errno == EAGAIN || errno == EACCES) ? 0 : -1;
#else
    return -1;
#endif
}

static int all_arrived(const int64_t *arrived, int slots, int64_t r)
{
    for (int k = 0; k < slots; k++)
        if (load_acquire(&arrived[k]) < r)
            return 0;
    return 1;
}

/* Poll until round r is committed (MEET_ARRIVED) or a worker has left (MEET_GONE); after
 * poll_ns, or when the lock fails, MEET_PENDING (the caller's loop takes over). */
static int meeting_wait(const Meeting *m, int64_t r, int64_t busy_ns, int64_t poll_ns)
{
    int64_t *ctl = m->control.buf;
    int64_t *committed = ctl + 3 * m->slots, *gone = committed + 1;
    int64_t start = now_ns();
    int yielding = busy_ns <= 0;
    for (unsigned i = 1;; i++) {
        if (load_acquire(committed) >= r)
            return MEET_ARRIVED;
        if (all_arrived(ctl, m->slots, r)) {
            int taken = meeting_lock(m->fd, F_WRLCK);
            if (taken < 0)
                return MEET_PENDING;
            if (taken) {  /* commit, unless a worker withdrew meanwhile */
                int ok = load_acquire(committed) >= r || all_arrived(ctl, m->slots, r);
                if (ok && load_acquire(committed) < r)
                    store_release(committed, r);
                meeting_lock(m->fd, F_UNLCK);
                if (ok)
                    return MEET_ARRIVED;
            }  /* else another worker holds the lock: poll again */
        }
        if (load_acquire(gone))  /* after the round: one that left after it is fine */
            return MEET_GONE;
        if (yielding || (i & 15) == 0) {
            int64_t spent = now_ns() - start;
            if (spent >= poll_ns)
                return MEET_PENDING;
            yielding = spent >= busy_ns;
        }
        if (yielding)
            sched_yield();  /* to the worker we wait for, if it shares our core */
        else
            cpu_relax();
    }
}

/* out = ((row 0 + row 1) + row 2) ... [/ slots], in blocks that stay in cache: each element
 * sees numpy's operations (copyto, add, add, ..., divide) in numpy's order. */
#define DEFINE_REDUCE(T, S, ATTR)                                                            \
ATTR static void meeting_reduce_##S(T *restrict out, const char *rows, Py_ssize_t row_bytes, \
                                    int slots, int mean, Py_ssize_t n)                      \
{                                                                                        \
    const Py_ssize_t block = 2048;                                                       \
    const T div = (T)slots;                                                              \
    for (Py_ssize_t lo = 0; lo < n; lo += block) {                                       \
        Py_ssize_t len = n - lo < block ? n - lo : block;                                \
        T *restrict o = out + lo;                                                        \
        const T *restrict a = (const T *)rows + lo;                                      \
        if (slots == 1) {                                                                \
            memcpy(o, a, len * sizeof(T));                                               \
        } else {                                                                         \
            const T *restrict b = (const T *)(rows + row_bytes) + lo;                    \
            for (Py_ssize_t i = 0; i < len; i++)                                         \
                o[i] = a[i] + b[i];                                                      \
        }                                                                                \
        for (int k = 2; k < slots; k++) {                                                \
            const T *restrict c = (const T *)(rows + k * row_bytes) + lo;                \
            for (Py_ssize_t i = 0; i < len; i++)                                         \
                o[i] = o[i] + c[i];                                                      \
        }                                                                                \
        if (mean)                                                                        \
            for (Py_ssize_t i = 0; i < len; i++)                                         \
                o[i] = o[i] / div;                                                       \
    }                                                                                    \
}

DEFINE_REDUCE(float, f32, )
DEFINE_REDUCE(double, f64, )
#ifdef HAVE_AVX_LOOPS
DEFINE_REDUCE(float, f32_avx, __attribute__((target("avx"))))
DEFINE_REDUCE(double, f64_avx, __attribute__((target("avx"))))
#endif

static void (*reduce_f32)(float *, const char *, Py_ssize_t, int, int, Py_ssize_t) =
    meeting_reduce_f32;
static void (*reduce_f64)(double *, const char *, Py_ssize_t, int, int, Py_ssize_t) =
    meeting_reduce_f64;

static PyObject *
meeting_meet(Meeting *m, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer src, out;
    int have_src = 0, have_out = 0, status;
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError, "meet(src, out, round, op, busy_ns, poll_ns) "
                            "takes 6 arguments, got %zd", nargs);
    long long r = PyLong_AsLongLong(args[2]);
    long op = PyLong_AsLong(args[3]);
    long long busy_ns = PyLong_AsLongLong(args[4]), poll_ns = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    if (r < 1)
        return PyErr_Format(PyExc_ValueError, "meet: round must be >= 1, got %lld", r);
    if (args[0] != Py_None) {
        if (PyObject_GetBuffer(args[0], &src, PyBUF_SIMPLE) < 0) {  /* C-contiguous only */
            PyErr_Clear();
            return PyLong_FromLong(MEET_COPY);
        }
        if (src.len != m->row_bytes) {
            PyBuffer_Release(&src);
            return PyLong_FromLong(MEET_COPY);
        }
        have_src = 1;
    }
    if (m->kind && (op == OP_SUM || op == OP_MEAN)) {
        if (PyObject_GetBuffer(args[1], &out, PyBUF_SIMPLE | PyBUF_WRITABLE) == 0) {
            if (out.len == m->row_bytes)
                have_out = 1;
            else
                PyBuffer_Release(&out);
        } else {
            PyErr_Clear();  /* not C-contiguous, say: numpy reduces */
        }
    }
    int parity = (int)(r & 1), slots = m->slots;
    char *rows = (char *)m->data.buf + (Py_ssize_t)parity * slots * m->row_bytes;
    int64_t *ctl = m->control.buf, *ops = ctl + slots + parity * slots;
    Py_BEGIN_ALLOW_THREADS
    if (have_src)
        memcpy(rows + m->slot * m->row_bytes, src.buf, m->row_bytes);
    __atomic_store_n(&ops[m->slot], (int64_t)op, __ATOMIC_RELAXED);
    store_release(&ctl[m->slot], r);  /* publishes the row and the op */
    status = meeting_wait(m, r, busy_ns, poll_ns);
    if (status == MEET_ARRIVED && have_out) {
        int alike = 1;
        for (int k = 0; k < slots; k++)
            alike &= ops[k] == op;
        if (alike) {
            Py_ssize_t n = m->row_bytes / (m->kind == F32 ? 4 : 8);
            if (m->kind == F32)
                reduce_f32(out.buf, rows, m->row_bytes, slots, op == OP_MEAN, n);
            else
                reduce_f64(out.buf, rows, m->row_bytes, slots, op == OP_MEAN, n);
            status = MEET_DONE;
        }
    }
    Py_END_ALLOW_THREADS
    if (have_src)
        PyBuffer_Release(&src);
    if (have_out)
        PyBuffer_Release(&out);
    return PyLong_FromLong(status);
}

static void
meeting_dealloc(Meeting *m)
{
    if (m->data.obj != NULL)
        PyBuffer_Release(&m->data);
    if (m->control.obj != NULL)
        PyBuffer_Release(&m->control);
    if (m->fd >= 0)
        close(m->fd);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *
meeting_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *data, *control;
    int slot, slots, fd, kind;
    if (!PyArg_ParseTuple(args, "OOiiii:Meeting", &data, &control, &slot, &slots, &fd, &kind))
        return NULL;
#ifndef F_OFD_SETLK
    PyErr_SetString(PyExc_NotImplementedError, "Meeting needs OFD locks (Linux)");
    return NULL;
#endif
    if (slots < 1 || slot < 0 || slot >= slots || (kind != 0 && kind != F32 && kind != F64))
        return PyErr_Format(PyExc_ValueError, "Meeting: slot %d of %d, kind %d", slot, slots,
                            kind);
    Meeting *m = (Meeting *)type->tp_alloc(type, 0);
    if (m == NULL)
        return NULL;
    m->fd = -1;
    m->slot = slot;
    m->slots = slots;
    m->kind = kind;
    if (PyObject_GetBuffer(data, &m->data, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0
            || PyObject_GetBuffer(control, &m->control, PyBUF_SIMPLE | PyBUF_WRITABLE) < 0)
        goto fail;
    m->row_bytes = m->data.len / (2 * slots + 1);
    if (m->data.len % (2 * slots + 1) != 0
            || (kind && m->row_bytes % (kind == F32 ? 4 : 8) != 0)
            || (uintptr_t)m->control.buf % 8 != 0
            || m->control.len != (Py_ssize_t)sizeof(int64_t) * (3 * slots + 2)) {
        PyErr_SetString(PyExc_ValueError, "Meeting: the buffers do not fit reduction_layout");
        goto fail;
    }
    m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (m->fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    return (PyObject *)m;
fail:
    Py_DECREF(m);
    return NULL;
}

static PyMethodDef meeting_methods[] = {
    {"meet", (PyCFunction)(void (*)(void))meeting_meet, METH_FASTCALL,
     "meet(src, out, round, op, busy_ns, poll_ns) -> int: one all_reduce round (see the "
     "source); MEET_DONE or what the caller must do next."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject MeetingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "platoon.rules._sync_kernels.Meeting",
    .tp_basicsize = sizeof(Meeting),
    .tp_dealloc = (destructor)meeting_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Meeting(data, control, slot, slots, fd, kind): a worker's side of an "
              "all_reduce segment (platoon.collectives).",
    .tp_methods = meeting_methods,
    .tp_new = meeting_new,
};

static int add_meeting(PyObject *module)
{
#ifdef HAVE_AVX_LOOPS
    if (cpu_has_avx()) {
        reduce_f32 = meeting_reduce_f32_avx;
        reduce_f64 = meeting_reduce_f64_avx;
    }
#endif
    if (PyType_Ready(&MeetingType) < 0)
        return -1;
    Py_INCREF(&MeetingType);
    if (PyModule_AddObject(module, "Meeting", (PyObject *)&MeetingType) < 0) {
        Py_DECREF(&MeetingType);
        return -1;
    }
    return PyModule_AddIntConstant(module, "MEET_DONE", MEET_DONE) < 0
        || PyModule_AddIntConstant(module, "MEET_ARRIVED", MEET_ARRIVED) < 0
        || PyModule_AddIntConstant(module, "MEET_PENDING", MEET_PENDING) < 0
        || PyModule_AddIntConstant(module, "MEET_GONE", MEET_GONE) < 0
        || PyModule_AddIntConstant(module, "MEET_COPY", MEET_COPY) < 0 ? -1 : 0;
}
