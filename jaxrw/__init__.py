"""jaxrw: rewrite JAX programs into faster equivalent forms by equality saturation.

Public API (everything else is private and may change):

    optimize        jax.jit-like decorator that rewrites, guards and compiles
    Limits          bounds for equality saturation (iterations, nodes, time, guard margin)
    JaxrwError      base of every error jaxrw raises (see jaxrw.errors for the subclasses)
    register_cost_model / register_extractor / register_rule   plug-ins by name
"""

from .api import Optimized, optimize
from .errors import (
    InvalidOptionError,
    JaxrwError,
    RewriteStageError,
    UnsupportedProgramError,
    VerificationError,
)
from .rewrite.cost import CostModel, register_cost_model
from .rewrite.extract import register_extractor
from .rewrite.profiles import Profile
from .rewrite.rules import Rule, register_rule
from .rewrite.run import Limits, RewriteReport, StopReason

__version__ = "0.1.0"

__all__ = [
    "optimize",
    "Optimized",
    "Limits",
    "RewriteReport",
    "StopReason",
    "JaxrwError",
    "InvalidOptionError",
    "RewriteStageError",
    "UnsupportedProgramError",
    "VerificationError",
    "CostModel",
    "register_cost_model",
    "register_extractor",
    "Rule",
    "register_rule",
    "Profile",
]
