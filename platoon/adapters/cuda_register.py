"""Registering host memory with CUDA in place (page-locking it), once per process.

The registered centre: the worker registers the centre's whole shared-memory mapping, so
that GPU copies to and from it are direct DMA (no staging copy). This module holds the
bookkeeping, which is pure and testable without CUDA (`page_span`, `Registry`: whole
pages, nothing for zero bytes, never the same bytes twice, since an overlapping second
registration fails with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, 712), and the driver
calls (`DriverRegistrar`, through ctypes on ``libcuda.so.1``: the driver API returns its
errors at once, where the runtime's ``cudaHostRegister`` leaves a failure as the thread's
last error for a later, unrelated call to raise).

``PLATOON_REGISTERED_CENTRE`` (read by `setting`): unset or ``auto`` registers where CUDA
allows and falls back to staging otherwise, saying why once per process; ``0`` never
registers; ``require`` raises when registration is refused (tests and benchmarks).
"""

import ctypes
import logging
import mmap
import os
import threading
from typing import Callable, Dict, Optional, Tuple

from ..errors import PlatoonError

log = logging.getLogger(__name__)

SETTING = "PLATOON_REGISTERED_CENTRE"
AUTO, OFF, REQUIRE = "auto", "off", "require"

CU_MEMHOSTREGISTER_PORTABLE = 0x01  # pinned for every context of the process
CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED = 99
CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712


class RegistrationRefused(PlatoonError, RuntimeError):
    """Host memory could not be registered with CUDA (the message says why)."""


def setting(environ=os.environ) -> str:
    """`AUTO`, `OFF` or `REQUIRE` from ``PLATOON_REGISTERED_CENTRE``; ValueError otherwise."""
    text = environ.get(SETTING, "").strip().lower()
    if text in ("", "auto", "1"):
        return AUTO
    if text in ("0", "off"):
        return OFF
    if text == "require":
        return REQUIRE
    raise ValueError("%s=%r: give 0 (pinned staging, never register the centre), auto (the "
                     "default) or require (raise where registration is refused)"
                     % (SETTING, environ.get(SETTING)))


def page_span(address: int, nbytes: int, page: int = mmap.PAGESIZE
              ) -> Optional[Tuple[int, int]]:
    """(start, length) of the whole pages holding `nbytes` bytes at `address`; None for
    zero bytes (registering nothing is an error in CUDA)."""
    if nbytes <= 0:
        return None
    start = address - address % page
    end = -(-(address + nbytes) // page) * page
    return start, end - start


class Registration:
    """One registered span; `close` unregisters it (idempotent; nothing in a forked child,
    which inherited the bookkeeping but not the registration)."""

    def __init__(self, registry: "Registry", start: int, length: int, handle):
        self.start, self.length = start, length
        self._registry, self._handle, self._pid = registry, handle, os.getpid()
        self.closed = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if os.getpid() == self._pid:
            self._registry.release(self)

    @property
    def handle(self):
        return self._handle


class Registry:
    """The spans this process registered: each page at most once.

    `register(start, length, **how)` and `unregister(start, handle)` do the work (the
    driver's, or a test's); `register` returns a handle or raises RegistrationRefused.
    """

    def __init__(self, register: Callable[..., object],
                 unregister: Callable[[int, object], None], page: int = mmap.PAGESIZE):
        self._register, self._unregister, self._page = register, unregister, page
        self._spans: Dict[int, int] = {}  # start -> length
        self._lock = threading.Lock()

    def add(self, address: int, nbytes: int, **how) -> Registration:
        """Register the pages of `nbytes` bytes at `address` (`how` goes to the registrar);
        RegistrationRefused for zero bytes, for pages that are registered already, or when
        the registrar refuses."""
        span = page_span(address, nbytes, self._page)
        if span is None:
            raise RegistrationRefused("nothing to register (zero bytes)")
        start, length = span
        with self._lock:
            for other, other_length in self._spans.items():
                if start < other + other_length and other < start + length:
                    raise RegistrationRefused(
                        "bytes %#x..%#x are registered already in this process (%#x..%#x); "
                        "CUDA refuses a second registration of the same pages"
                        % (start, start + length, other, other + other_length))
            handle = self._register(start, length, **how)
            self._spans[start] = length
        return Registration(self, start, length, handle)

    def release(self, registration: Registration) -> None:
        with self._lock:
            if self._spans.pop(registration.start, None) is None:
                return
        try:
            self._unregister(registration.start, registration.handle)
        except Exception as exc:  # at exit the driver may be gone: nothing left to undo
            log.debug("unregistering %#x failed: %s", registration.start, exc)

    @property
    def spans(self) -> Dict[int, int]:
        """The registered spans, start -> length (a copy)."""
        with self._lock:
            return dict(self._spans)


class DriverRegistrar:
    """cuMemHostRegister / cuMemHostUnregister on device `ordinal`'s primary context (the one
    PyTorch and CuPy use), through ``libcuda.so.1``; RegistrationRefused saying why."""

    def __init__(self):
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RegistrationRefused("no CUDA driver (libcuda.so.1: %s)" % exc) from None
        c, vp, ui, i = ctypes, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int
        for name, args in (("cuInit", [ui]),
                           ("cuDeviceGet", [c.POINTER(i), i]),
                           ("cuDeviceGetAttribute", [c.POINTER(i), i, i]),
                           ("cuDevicePrimaryCtxRetain", [c.POINTER(vp), i]),
                           ("cuDevicePrimaryCtxRelease_v2", [i]),
                           ("cuCtxPushCurrent_v2", [vp]),
                           ("cuCtxPopCurrent_v2", [c.POINTER(vp)]),
                           ("cuCtxSynchronize", []),
                           ("cuMemHostRegister_v2", [vp, c.c_size_t, ui]),
                           ("cuMemHostUnregister", [vp]),
                           ("cuGetErrorName", [i, c.POINTER(c.c_char_p)])):
            try:
                fn = getattr(self._cuda, name)
            except AttributeError:
                raise RegistrationRefused("the CUDA driver lacks %s (too old)" % name) from None
            fn.argtypes, fn.restype = args, i

    def _name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self._cuda.cuGetErrorName(code, ctypes.byref(text)) == 0 and text.value:
            return "%s (%d)" % (text.value.decode(), code)
        return "CUresult %d" % code

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise RegistrationRefused("%s failed: %s" % (what, self._name(code)))

    def register(self, start: int, length: int, ordinal: int):
        """Page-lock `length` bytes at `start` for every context (portable); returns the handle
        `unregister` needs."""
        cu = self._cuda
        self._check(cu.cuInit(0), "cuInit")
        device, value = ctypes.c_int(), ctypes.c_int()
        self._check(cu.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet(%d)" % ordinal)
        self._check(cu.cuDeviceGetAttribute(
            ctypes.byref(value), CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, device),
            "cuDeviceGetAttribute(HOST_REGISTER_SUPPORTED)")
        if not value.value:
            raise RegistrationRefused("device %d does not support registering host memory "
                                      "(cudaDevAttrHostRegisterSupported is 0)" % ordinal)
        context = ctypes.c_void_p()
        self._check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                    "cuDevicePrimaryCtxRetain")
        try:
            with self._current(context):
                self._check(cu.cuMemHostRegister_v2(start, length, CU_MEMHOSTREGISTER_PORTABLE),
                            "cuMemHostRegister(%d bytes)" % length)
        except BaseException:
            cu.cuDevicePrimaryCtxRelease_v2(device)
            raise
        return device.value, context

    def unregister(self, start: int, handle) -> None:
        """Wait for the context's work (no copy may still use the pages), unregister `start`,
        release the context."""
        device, context = handle
        cu = self._cuda
        try:
            with self._current(context):
                cu.cuCtxSynchronize()
                self._check(cu.cuMemHostUnregister(start), "cuMemHostUnregister")
        finally:
            cu.cuDevicePrimaryCtxRelease_v2(device)

    class _Current:
        def __init__(self, cuda, check, context):
            self._cuda, self._check, self._context = cuda, check, context

        def __enter__(self):
            self._check(self._cuda.cuCtxPushCurrent_v2(self._context), "cuCtxPushCurrent")

        def __exit__(self, *exc):
            popped = ctypes.c_void_p()
            self._cuda.cuCtxPopCurrent_v2(ctypes.byref(popped))

    def _current(self, context):
        return self._Current(self._cuda, self._check, context)


_registry: Optional[Registry] = None
_registry_lock = threading.Lock()


def process_registry() -> Registry:
    """This process's Registry over the CUDA driver (`add(address, nbytes, ordinal=...)`);
    RegistrationRefused without a driver."""
    global _registry
    with _registry_lock:
        if _registry is None:
            driver = DriverRegistrar()
            _registry = Registry(driver.register, driver.unregister)
        return _registry


_told = threading.Event()  # a fallback was logged at INFO in this process


def tell_fallback(why: str) -> None:
    """Log, once per process at INFO (later at DEBUG), why the staging path runs."""
    level = logging.DEBUG if _told.is_set() else logging.INFO
    _told.set()
    log.log(level, "CUDA parameters sync through pinned staging, not the registered centre: "
            "%s (%s=0 turns registration off and silences this)", why, SETTING)
