"""Static and run-time analysis of what notebook cells read, write and share.

`analyze_cell` turns a cell's source into its namespace effects;
`transitive_reads` follows the notebook functions a cell uses to the globals
they read; `reachable_ids` lists what a value reaches, from which the session
groups names whose values share objects (they must be checkpointed together). Nothing here imports another nbrewind layer or
IPython.
"""

from nbrewind.analysis.aliases import reach, reachable_ids
from nbrewind.analysis.callsites import dotted_name
from nbrewind.analysis.effects import CallSite, CellEffects, analyze_cell, parse_source
from nbrewind.analysis.scopes import DYNAMIC_NAMES
from nbrewind.analysis.function_reads import RecordedReads, global_names_of, is_notebook_object, transitive_reads, value_reads

__all__ = [
    "DYNAMIC_NAMES",
    "RecordedReads",
    "CallSite",
    "CellEffects",
    "analyze_cell",
    "dotted_name",
    "global_names_of",
    "is_notebook_object",
    "parse_source",
    "reach",
    "reachable_ids",
    "transitive_reads",
    "value_reads",
]
