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

#define MAX_ARRAYS 5

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
/* Downpour(SGD): g = last - s; c <- SGD step with g; last = c (and s = c when `take`).  \
   Same operations as SGD.apply_block: plain g *= lr; c -= g. Momentum v *= mu;         \
   v += g; then Nesterov g += v*mu; g *= lr, else g = v*lr; c -= g. */                   \
ATTR static void sgd_##S(T *restrict s, T *restrict c, T *restrict l, T *restrict v,          \
                    T lr, T mu, int nesterov, int take, Py_ssize_t n)                    \
{                                                                                        \
    if (v == NULL && take) {                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T w = c[i] - (l[i] - s[i]) * lr;                                             \
            c[i] = w; s[i] = w; l[i] = w;                                                \
        }                                                                                \
    } else if (v == NULL) {                                                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T w = c[i] - (l[i] - s[i]) * lr;                                             \
            c[i] = w; l[i] = w;                                                          \
        }                                                                                \
    } else if (nesterov && take) {                                                       \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T g = l[i] - s[i];                                                           \
            T m = v[i] * mu + g;                                                         \
            v[i] = m;                                                                    \
            T w = c[i] - (g + m * mu) * lr;                                              \
            c[i] = w; s[i] = w; l[i] = w;                                                \
        }                                                                                \
    } else if (nesterov) {                                                               \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T g = l[i] - s[i];                                                           \
            T m = v[i] * mu + g;                                                         \
            v[i] = m;                                                                    \
            T w = c[i] - (g + m * mu) * lr;                                              \
            c[i] = w; l[i] = w;                                                          \
        }                                                                                \
    } else if (take) {                                                                   \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T m = v[i] * mu + (l[i] - s[i]);                                             \
            v[i] = m;                                                                    \
            T w = c[i] - m * lr;                                                         \
            c[i] = w; s[i] = w; l[i] = w;                                                \
        }                                                                                \
    } else {                                                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                             \
            T m = v[i] * mu + (l[i] - s[i]);                                             \
            v[i] = m;                                                                    \
            T w = c[i] - m * lr;                                                         \
            c[i] = w; l[i] = w;                                                          \
        }                                                                                \
    }                                                                                    \
}

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
    void (*sgd_##S)(T *, T *, T *, T *, T, T, int, int, Py_ssize_t);

#define LOOP_INIT(S) easgd_update_##S, easgd_push_##S, easgd_push_pull_##S, add_into_##S, asgd_update_##S,     \
    asgd_push_##S, take_pull_##S, sgd_##S

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

static const int RW[MAX_ARRAYS] = {1, 1, 1, 1, 1};

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
    double lr, mu;
    int nesterov, take_it;
    Arrays a;
    if (!PyArg_ParseTuple(args, "OOOOddpp:sgd", &o[0], &o[1], &o[2], &o[3], &lr, &mu,
                          &nesterov, &take_it))
        return NULL;
    int count = o[3] == Py_None ? 3 : 4;
    if (!take(&a, o, RW, count))
        Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    if (a.dtype == F32)
        loops->sgd_f32(BUF(0, float), BUF(1, float), BUF(2, float),
                count == 4 ? BUF(3, float) : NULL, (float)lr, (float)mu, nesterov, take_it, a.n);
    else
        loops->sgd_f64(BUF(0, double), BUF(1, double), BUF(2, double),
                count == 4 ? BUF(3, double) : NULL, lr, mu, nesterov, take_it, a.n);
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
     "sgd(s, c, last, v_or_None, lr, momentum, nesterov, take) -> bool: Downpour(SGD) "
     "with g = last-s; last = c (and s = c when take)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "platoon.rules._sync_kernels",
    "One-pass sync kernels (float32, float64); each returns False when the arrays need "
    "the numpy path.", -1, methods,
};

PyMODINIT_FUNC
PyInit__sync_kernels(void)
{
#ifdef HAVE_AVX_LOOPS
    if (cpu_has_avx())
        loops = &avx_loops;
#endif
    return PyModule_Create(&module);
}
