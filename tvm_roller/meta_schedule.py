"""Moved to :mod:`tvm_roller.integrations.meta_schedule`; this import path keeps working."""
from tvm_roller.integrations.meta_schedule import *  # noqa: F401,F403
from tvm_roller.integrations.meta_schedule import __all__  # noqa: F401
