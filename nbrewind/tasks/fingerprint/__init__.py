"""Task fingerprints: content-based Merkle hashes of Dask tasks.

A fingerprint names *what a task computes*, so a result stored under it can be
reused by any later run, in any process or machine, that would compute the same
thing. It covers the task's function (by code for notebook and user-module
functions, by module, qualified name and distribution version for library ones),
its literal arguments (by content), the content of local files that its string
or path arguments name, and the fingerprints of the tasks it depends on. It
never covers a key name, ``hash()`` or ``id()`` (ids only key per-run memo
tables), so it does not depend on the process, on how Dask named the keys, or on
whether Dask fused the tasks.

Every value is written as self-delimiting, type-tagged bytes and each task's
bytes are hashed once with xxh3-128. Changing that encoding invalidates every
cache: bump ``SCHEME`` and the golden tests together when that is intended.

Decisions worth knowing:

- Not part of a function's identity: its name, file, line numbers, comments,
  whitespace and docstring (``co_consts[0]`` when no instruction loads it: the
  compiler keeps that slot for the docstring, or None). Renaming a notebook function or editing its docstring keeps its
  cached results; code reading ``__doc__`` is not tracked.
- A function's globals are the names its code (and its nested code) loads as
  globals (LOAD_GLOBAL, LOAD_NAME and the global stores): an attribute name such
  as ``path`` in ``os.path.basename`` is not mistaken for the notebook's global
  ``path``.
- Content only: a library object is pickled without the pickle memo (the memo's
  back-references encode which sub-objects are shared, which a round trip or a
  rebuild changes), each library object nested in it is its own Merkle node, and a
  value that cannot be pickled memo-less (a cycle of plain containers) has no
  fingerprint: its task runs uncached.
- Strings are checked for naming a local file only when they contain a ``/``,
  ``os.sep`` or ``.`` (a bare ``"data"`` is not stat'ed), and only when they
  pass through this encoder: strings inside objects that are pickled (library
  class instances) are not checked. Directories are not digested.
- File digests are memoized on (path, size, mtime_ns, ctime_ns, inode): a file
  rewritten with the same size within one timestamp tick is not noticed.
- Fusion: a task built by ``Task.fuse`` (blockwise fusion, linear fusion)
  fingerprints as its inner output task would unfused, and an ``Alias`` as its
  target, so output keys keep their fingerprint whether or not the graph was
  optimized. Rewrites that change the computation (e.g. dask.array's slice
  fusion ``x[a][b] -> x[c]``) change the fingerprint.

A ``Fingerprinter`` is not thread-safe; use one per thread.
"""

from nbrewind.tasks.fingerprint.common import SCHEME, UnfingerprintableError
from nbrewind.tasks.fingerprint.graph import Fingerprinter

__all__ = ["SCHEME", "Fingerprinter", "UnfingerprintableError"]
