"""Pipeline parallelism over the mesh's ``pp`` axis.

``jaxsmp.Mesh(pp=4, sdp=2)`` with ``@jaxsmp.step(microbatches=8, pipeline="simple")``
splits the model's layer :class:`~jaxsmp.nn.Stack` into stages. Schedules are tables
(:func:`make_schedule`) checked by :func:`simulate`. Inside the step, a
:class:`PipelinePlan` orders the layers and computes the gradients: its
:class:`StageRunner` executes ``simple`` (GPipe) and ``virtual`` (circular,
``virtual_chunks`` per stage; Megatron's "interleaved") by autodiff, and
:mod:`jaxsmp.pipeline.one_f_one_b` drives ``interleaved`` (1F1B, SMP's name) forward
and backward by hand. Stages may hold different numbers of layers
(``pipeline_partition``; :mod:`jaxsmp.pipeline.layout` pads them to equal slot counts);
:func:`partition` and :func:`balanced_counts` choose splits from compiled costs.
"""
from jaxsmp.pipeline.layout import StageLayout
from jaxsmp.pipeline.partition import Partition, balanced_counts, partition
from jaxsmp.pipeline.plan import PipelinePlan
from jaxsmp.pipeline.runner import StageRunner
from jaxsmp.pipeline.schedule import SCHEDULES, Op, Schedule, bubble_formula, make_schedule
from jaxsmp.pipeline.simulator import Report, simulate

__all__ = ["SCHEDULES", "Op", "Partition", "PipelinePlan", "Report", "Schedule", "StageLayout",
           "StageRunner", "balanced_counts", "bubble_formula", "make_schedule", "partition",
           "simulate"]
