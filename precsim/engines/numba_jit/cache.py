"""numba's on-disk cache for the compiled engine, keyed on every file of this package.

numba keys a cached function (``cache=True``) on its own file only (its source stamp: the file's
content hash, or in older releases its time stamp and size) and on its bytecode and closure
constants. A function that calls a compiled function of another file keeps that function's code
in its own cache entry, so when only the other file changes it keeps running the old code, and
says nothing (numba's documented limitation: "Cache invalidation fails to recognize changes in
symbols defined in a different file"; numba issues 1833 and 9483).

Here every cached function's source stamp is numba's own paired with :data:`KEY`, a hash of
every ``.py`` file of this package (:func:`folder_key`), so a change to any of them makes every
cached entry of the package stale: numba reads the stamp back from the cache's index file and,
when it differs, treats the index as empty, compiles and overwrites it (its data files are
numbered anew: stale code does not pile up). The stamp lives in the index file itself, so this
holds wherever numba put it: ``NUMBA_CACHE_DIR``, ``__pycache__`` beside the sources, or the user
cache folder numba falls back to when the package is installed read-only (the guard wraps
whichever cache locator numba chose, ``NUMBA_CACHE_LOCATOR_CLASSES`` included). Nothing of
numba's configuration changes: the keyed cache is set on this package's functions only.

The key covers this package only: its modules import nothing compiled from elsewhere in precsim
(tests/engines/test_numba_cache.py checks it). The format table's meaning is in each task's
closure instead (``codes.table_key``), and the host code outside it (``engines.numba``,
``engines.numba_host``) can change without recompiling anything.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import resources

import numba
from numba.core.caching import CompileResultCacheImpl, FunctionCache
from numba.core.dispatcher import Dispatcher


def folder_key(folder) -> str | None:
    """A hash of every ``.py`` file of ``folder`` (a path or an ``importlib.resources``
    traversable), names and contents, in name order; None if one cannot be read (then no
    function is cached: see :func:`keyed_njit`)."""
    h = hashlib.sha256()
    try:
        for f in sorted((f for f in folder.iterdir() if f.name.endswith(".py")),
                        key=lambda f: f.name):
            data = f.read_bytes()
            h.update(f"{f.name}\0{len(data)}\0".encode())
            h.update(data)
    except OSError:
        return None
    return h.hexdigest()


class _KeyedLocator:
    """The cache locator numba chose for a function, its source stamp paired with a key."""

    def __init__(self, inner, key: str):
        self._inner, self._key = inner, key

    def get_source_stamp(self):
        return (self._inner.get_source_stamp(), self._key)

    def __getattr__(self, name):  # the cache folder, its creation, the disambiguator: numba's
        return getattr(self._inner, name)


@functools.cache
def _cache_class(key: str) -> type:
    """numba's function cache with the source stamps of :class:`_KeyedLocator` (``key``)."""

    class KeyedImpl(CompileResultCacheImpl):
        @property
        def locator(self):
            return _KeyedLocator(super().locator, key)

    class KeyedCache(FunctionCache):
        _impl_class = KeyedImpl

    return KeyedCache


def keyed_njit(key: str | None):
    """``numba.njit`` whose ``cache=True`` is numba's cache with every entry's source stamp
    paired with ``key`` (no cache when ``key`` is None): a changed key makes the entries stale.
    Other options go to numba as they are."""

    def njit(fn=None, *, cache: bool = False, **options):
        def wrap(f):
            d = numba.njit(**options)(f)
            if cache and key is not None and isinstance(d, Dispatcher):  # not NUMBA_DISABLE_JIT
                d._cache = _cache_class(key)(d.py_func)  # as Dispatcher.enable_caching does
            return d

        return wrap if fn is None else wrap(fn)

    return njit


def is_keyed(fn, key: str | None = None) -> bool:
    """Whether the compiled function ``fn`` is cached under a key (``key``, if given)."""
    impl = getattr(getattr(fn, "_cache", None), "_impl", None)
    loc = getattr(impl, "locator", None)
    return isinstance(loc, _KeyedLocator) and (key is None or loc._key == key)


KEY = folder_key(resources.files(__package__))  # this package's files, as they were imported
njit = keyed_njit(KEY)
