"""The numba engine's compiled code (``run.engine=numba``; its interface is
:mod:`precsim.engines.numba`, its host driver :mod:`precsim.engines.numba_host`).

* :mod:`.cache`: numba's on-disk cache keyed on every file of this package (numba alone keys a
  function on its own file, and a caller in one file keeps a changed callee's old code).

A change to any file here recompiles all of it on the next run (numba's cache, see
:mod:`.cache`); keep host code (windows, inputs, threads, metrics) outside.
"""
