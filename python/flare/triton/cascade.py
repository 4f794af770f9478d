"""flashinfer.triton.cascade's merge operators (merge_state, merge_state_in_place, merge_states,
variable_length_merge_states) with its arguments, base-2 LSEs as FlashInfer's: flare.cascade's
operators under these names (flare/cascade.py documents them)."""

from ..cascade import (merge_state, merge_state_in_place, merge_states,  # noqa: F401
                       variable_length_merge_states)
