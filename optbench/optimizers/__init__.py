"""The optimizer registry: one table that the CLI, the trial, the tests and the benchmarks iterate over.

Each entry knows how to build its optimizer (from a parameter list, or from a model when it needs the
module structure), the library and optbench extra it needs, HF Trainer's name for it, the learning rate
and lr range it wants for fine-tuning, a short label for how it stores its state, and how many state
bytes it *should* hold, parameter by parameter and why (its rule, whose map `optbench explain` prints).
The analytic count is written to match the measured one byte for byte, for fp32 and bf16 parameters,
so a mismatch in a record points at a real change in a library, not at rounding. One module per
library family; this package imports none of the optional libraries (nor torch): a missing library
makes an entry unavailable with a reason instead of breaking the import. `noise.py` keeps the
optional libraries' known-harmless import notices out of a user's output.

Adding an optimizer: one `OptimizerSpec` in the module of its library family, listed in that module's
entries; the registry-parametrised tests then check its state byte for byte. An entry under an HF Trainer `optim`
name (its `hf_alias`) must build exactly what Trainer builds (optimizers/hf.py; tests/test_registry_hf.py checks),
and every name of transformers' `OptimizerNames` has one (runnable here, or with the reason it is not).
May import: nothing else of optbench.
"""

from optbench.optimizers.base import (
    FP32_BYTES,
    NOMINAL_SHAPE,
    AnalyticState,
    Count,
    OptimizerSpec,
    Param,
    ParamState,
    Shape,
    StateMap,
    UnknownOptimizerError,
    describe_model,
    factored_numel,
)
from optbench.optimizers.registry import (
    DEFAULT_OPTIMIZERS,
    LIST_NOTES,
    REGISTRY,
    available_names,
    kwargs_refusal,
    parse_optimizer_kwargs,
    representatives,
    resolve,
    state_precision,
)

__all__ = [
    "DEFAULT_OPTIMIZERS", "FP32_BYTES", "LIST_NOTES", "NOMINAL_SHAPE", "REGISTRY", "AnalyticState", "Count",
    "OptimizerSpec", "Param", "ParamState", "Shape", "StateMap", "UnknownOptimizerError", "available_names",
    "describe_model", "factored_numel", "kwargs_refusal", "parse_optimizer_kwargs", "representatives", "resolve",
    "state_precision",
]
