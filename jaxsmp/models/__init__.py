"""Model families and their presets."""
from jaxsmp.models.registry import FAMILIES, count_params, preset

__all__ = ["FAMILIES", "count_params", "preset"]
