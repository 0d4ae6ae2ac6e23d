"""A recorder for the runtime's meter, shared by the CPU and GPU metrics tests."""

import pytest

from daskgpu._runtime import metrics


class Seen(list):
    """A recorder: what launches reported, as ``(kernel, activity, seconds)``, in order."""

    def __call__(self, kernel, activity, seconds):
        self.append((kernel, activity, seconds))

    def by_activity(self, kernel):
        """``{activity: seconds}`` of ``kernel``, summed over its reports."""
        out = {}
        for k, activity, seconds in self:
            if k == kernel:
                out[activity] = out.get(activity, 0.0) + seconds
        return out


@pytest.fixture
def seen():
    """A :class:`Seen` installed as a recorder for the test, removed after it."""
    recorder = Seen()
    metrics.add_recorder(recorder)
    yield recorder
    metrics.remove_recorder(recorder)
