"""The planner's one error: a bad input named with its valid choices."""
from megatron_biglm.common.config_fields import ConfigError


class PlanError(ConfigError):
    """An input the planner cannot plan (unknown GPU kind, a TP that does not divide the heads,
    ...); the message names the value and the valid choices."""
