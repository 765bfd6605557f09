"""Throughput accounting: model FLOPs, device peak, MFU."""
from jaxsmp.metrics.flops import train_flops_per_token
from jaxsmp.metrics.peak import peak_flops_per_device

__all__ = ["peak_flops_per_device", "train_flops_per_token"]
