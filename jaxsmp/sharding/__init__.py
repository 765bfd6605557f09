"""Logical axis names -> mesh axes, in one table."""
from jaxsmp.sharding.rules import DEFAULT_RULES, Rules, batch_spec, resolve_spec

__all__ = ["DEFAULT_RULES", "Rules", "batch_spec", "resolve_spec"]
