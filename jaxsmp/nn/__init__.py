"""Flax NNX building blocks whose parameters carry logical axis names."""
from jaxsmp.nn.embed import Embed
from jaxsmp.nn.layer_context import LayerContext, layer_context
from jaxsmp.nn.linear import Linear
from jaxsmp.nn.norm import LayerNorm, RMSNorm
from jaxsmp.nn.param import logical_param
from jaxsmp.nn.rotary import apply_rotary, rotary_for_tokens, rotary_tables
from jaxsmp.nn.stack import Stack

__all__ = ["Embed", "LayerContext", "LayerNorm", "Linear", "RMSNorm", "Stack",
           "apply_rotary", "layer_context", "logical_param", "rotary_for_tokens", "rotary_tables"]
