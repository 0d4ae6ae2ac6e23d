"""What the batch tests share: one simulated cluster per module, reachable by subprocesses,
and the kernels and helpers of ``batch_helpers``, importable from the test modules (the
suite imports in importlib mode, which puts no test folder on ``sys.path``)."""

import os
import sys

import pytest
from distributed import Client

import daskgpu as dg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def client():
    # Threaded simulated workers in this process, on TCP so a subprocess can connect.
    with dg.LocalGPUCluster(simulate=True, processes=False, protocol="tcp://",
                            dashboard_address=":0") as cluster, Client(cluster) as c:
        yield c
