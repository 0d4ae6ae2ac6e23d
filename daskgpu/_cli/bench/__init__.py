"""``daskgpu bench``: daskgpu against what a user would write by hand, side by side.

One module per group of sections (:mod:`~daskgpu._cli.bench.startup`,
:mod:`~daskgpu._cli.bench.overhead`, :mod:`~daskgpu._cli.bench.host`,
:mod:`~daskgpu._cli.bench.device`, :mod:`~daskgpu._cli.bench.compute`,
:mod:`~daskgpu._cli.bench.scale`,
:mod:`~daskgpu._cli.bench.reductions`), what they share
(:mod:`~daskgpu._cli.bench.common`), the kernels they run
(:mod:`~daskgpu._cli.bench.kernels`), what runs in fresh processes
(:mod:`~daskgpu._cli.bench.fresh`), the command
(:mod:`~daskgpu._cli.bench.command`) and its drawing (:mod:`~daskgpu._cli.bench.plot`).
"""


def main(argv=None) -> int:
    """Run ``daskgpu bench``: see :func:`daskgpu._cli.bench.command.main`."""
    # Imported here, not above: fresh processes and workers import this package
    # for its kernels or programs, and need none of the sections.
    from daskgpu._cli.bench.command import main as run

    return run(argv)
