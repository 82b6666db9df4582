"""The numba engine's compiled code (``run.engine=numba``; its interface is
:mod:`precsim.engines.numba`, its host driver :mod:`precsim.engines.numba_host`).

* :mod:`.cache`: numba's on-disk cache keyed on every file of this package (numba alone keys a
  function on its own file, and a caller in one file keeps a changed callee's old code);
* :mod:`.codes`: a scheme's code row and compile-time constants (plain Python);
* :mod:`.rounding`: element rounding (RNE, SR) and the random words SR reads;
* :mod:`.quant`: the quantiser of a matrix (element, row-scaled and block formats) and of a
  scheme's state after a step;
* :mod:`.mamba2`, :mod:`.gdn`: the window's tasks, one per (head, slot);
* :mod:`.stats`: the window's row statistics for the metrics.

A change to any file here recompiles all of it on the next run (numba's cache, see
:mod:`.cache`); keep host code (windows, inputs, threads, metrics) outside.
"""
