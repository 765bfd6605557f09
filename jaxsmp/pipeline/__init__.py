"""Pipeline parallelism over the mesh's ``pp`` axis.

``jaxsmp.Mesh(pp=4, sdp=2)`` with ``@jaxsmp.step(microbatches=8, pipeline="simple")``
splits the model's layer :class:`~jaxsmp.nn.Stack` into stages. Schedules are tables
(:func:`make_schedule`) checked by :func:`simulate`; :class:`Pipeline` executes
``simple`` and ``virtual`` inside the step; :func:`partition` plans stage splits.
"""
from jaxsmp.pipeline.partition import Partition, partition
from jaxsmp.pipeline.runner import EXECUTABLE, Pipeline
from jaxsmp.pipeline.schedule import SCHEDULES, Op, Schedule, bubble_formula, make_schedule
from jaxsmp.pipeline.simulator import Report, simulate

__all__ = ["EXECUTABLE", "SCHEDULES", "Op", "Partition", "Pipeline", "Report", "Schedule",
           "bubble_formula", "make_schedule", "partition", "simulate"]
