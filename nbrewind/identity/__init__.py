"""What a value, a module, a file and a library setting *is*: one digest each.

This layer sits below `checkpoint` and `tasks` and above `store`, so cell keys
and task fingerprints rest on the same answers: `settings` (a registry of
library configuration that is checkpointed and keyed like RNG state) and
`modules` (a local module by the digest of its source, an installed one by its
distribution and version). Nothing here imports numpy, pandas or dask; the
registry only looks at libraries that are already loaded. `values` digests the
leaves both walk (arrays and buffers in place, anything else pickled without the
memo) and says which functions and classes are the notebook's own; `code` says
when two code objects are the same code; `files` digests files.
"""

from nbrewind.identity.modules import is_local_module, library_label, module_source_path
from nbrewind.identity.settings import REGISTRY, Setting, apply_settings, capture_settings, settings_digests

__all__ = [
    "REGISTRY",
    "Setting",
    "apply_settings",
    "capture_settings",
    "is_local_module",
    "library_label",
    "module_source_path",
    "settings_digests",
]
