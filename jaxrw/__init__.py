"""jaxrw: rewrite JAX programs into faster equivalent forms by equality saturation.

Public API (everything else is private and may change):

    optimize        jax.jit-like decorator that rewrites, guards and compiles
    explain         what was rewritten, where and why (an Explanation: table, JSON, HTML, graphs)
    Limits          bounds for equality saturation (iterations, nodes, time, guard margin)
    JaxrwError      base of every error jaxrw raises (see jaxrw.errors for the subclasses)
    register_cost_model / register_extractor / register_rule   plug-ins by name

Logging goes to the "jaxrw" logger; JAXRW_LOG=debug|info|warning attaches a stderr handler.
"""

from .api import Optimized, optimize
from .errors import (
    InvalidArgumentError,
    InvalidOptionError,
    JaxrwError,
    RewriteStageError,
    UnsupportedProgramError,
    VerificationError,
)
from .explain import Explanation, explain
from .logs import configure_logging
from .rewrite.cost import CostModel, register_cost_model
from .rewrite.extract import register_extractor
from .rewrite.profiles import Profile
from .rewrite.rules import Rule, register_rule
from .rewrite.run import Limits, RewriteReport, StopReason
from .schedule import ScheduleUnavailableError

configure_logging()

__version__ = "0.1.0"

__all__ = [
    "optimize",
    "Optimized",
    "explain",
    "Explanation",
    "configure_logging",
    "Limits",
    "RewriteReport",
    "StopReason",
    "JaxrwError",
    "InvalidOptionError",
    "InvalidArgumentError",
    "RewriteStageError",
    "UnsupportedProgramError",
    "VerificationError",
    "ScheduleUnavailableError",
    "CostModel",
    "register_cost_model",
    "register_extractor",
    "Rule",
    "register_rule",
    "Profile",
]
