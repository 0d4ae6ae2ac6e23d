"""What the restart tests share: a worker preload that imports slowly on demand, and a
task that loses the CUDA context. Workers unpickle the task by reference, from this
module (tests/conftest.py puts tests/ on ``sys.path``; spawned workers inherit it).
"""

#: A preload module's source: it sleeps as many seconds as the file ``marker`` says,
#: once the file exists, so a worker's first start is fast and its restart slow.
SLOW_MODULE = """
import time

try:
    with open({marker!r}) as f:
        time.sleep(float(f.read()))
except FileNotFoundError:
    pass
"""


def lose_the_context():
    """A task that fails as the runtime does after a sticky CUDA error; GPUWorkerPlugin
    then closes the worker process and its nanny starts a fresh one."""
    from daskgpu._errors import ContextLostError

    raise ContextLostError(700, "launching kernel 'k' failed: CUDA_ERROR_ILLEGAL_ADDRESS")
