"""MPI collectives as a real XLA custom call (C++ FFI handler), one JAX process per device.

Import :mod:`collectives.ffi.ops` to compile (once, cached) and register the handlers.
"""
