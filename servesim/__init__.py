"""servesim: a capacity planner for LLM serving that predicts from GPU specification sheets.

The Python front door (docs/api.md)::

    import servesim

    plan = servesim.plan("llama3-8b", "H100,L40S", qps=10)           # like `servesim plan`
    servesim.plan_payload(plan)                                      # the dict of `servesim plan --json`
    result = servesim.simulate("llama3-8b", "H100", qps=4)           # like `servesim simulate`
    dep = servesim.deployment("llama3-8b", "H100", tp=1)             # build_deployment with names

The names are imported on first use, so ``import servesim`` stays light.
"""

__version__ = "0.1.0"

#: Public name -> the module that defines it (imported when the name is first used).
_EXPORTS = {
    "plan": "servesim.api",
    "plan_payload": "servesim.api",
    "simulate": "servesim.api",
    "deployment": "servesim.api",
    "build_deployment": "servesim.serving.deployment",
    "Deployment": "servesim.serving.deployment",
}

__all__ = ["__version__", *_EXPORTS]

#: Without importing typing (a few modules more at every start); type checkers read it as typing.TYPE_CHECKING.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from servesim.api import deployment, plan, plan_payload, simulate
    from servesim.serving.deployment import Deployment, build_deployment


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'servesim' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
