"""``tvm_roller.llm``: see :mod:`tvm_roller.integrations.llm`."""
from tvm_roller.integrations.llm import *  # noqa: F401,F403
from tvm_roller.integrations.llm import __all__  # noqa: F401
