"""A worker for the launcher test: process 1 dies, process 0 waits for it forever."""
import os
import sys
import time

from jaxsmp import distributed

if os.environ["JAXSMP_PROCESS_ID"] == "1":
    sys.exit(3)
distributed.initialize()  # blocks: its peer never arrives
time.sleep(600)
