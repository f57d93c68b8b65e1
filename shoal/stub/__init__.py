"""The stub: one process per model instance, running the user's model (docs/architecture.md).

A stub may run on a model's own Python environment (``EXECUTION_ENV_PATH``), which need hold
only numpy, as on Triton. The supervisor then names, in ``SHOAL_STUB_FALLBACK_PATH``, a
directory of links to its own builds of the stub's other dependencies (msgpack, posix_ipc); it
goes last on the path, before anything imports them, so the environment's own copies win.
"""

import os as _os
import sys as _sys

_fallback = _os.environ.get("SHOAL_STUB_FALLBACK_PATH")
if _fallback and _fallback not in _sys.path:
    _sys.path.append(_fallback)
