"""Static and run-time analysis of what notebook cells read, write and share.

`analyze_cell` turns a cell's source into its namespace effects;
`transitive_reads` follows the notebook functions a cell uses to the globals
they read; `covariable_groups` finds names whose values share objects, which
must be checkpointed together. Nothing here imports another nbrewind layer or
IPython.
"""

from nbrewind.analysis.aliases import AliasIndex, covariable_groups, index_aliases, reachable_ids
from nbrewind.analysis.effects import CallSite, CellEffects, analyze_cell
from nbrewind.analysis.scopes import DYNAMIC_NAMES
from nbrewind.analysis.function_reads import global_names_of, is_notebook_object, transitive_reads

__all__ = [
    "DYNAMIC_NAMES",
    "AliasIndex",
    "CallSite",
    "CellEffects",
    "analyze_cell",
    "covariable_groups",
    "global_names_of",
    "index_aliases",
    "is_notebook_object",
    "reachable_ids",
    "transitive_reads",
]
