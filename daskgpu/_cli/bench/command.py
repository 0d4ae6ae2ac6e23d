"""The ``daskgpu bench`` command: its arguments, which sections run, and their output.

Each section is a function of a module of this package that returns one row of
:func:`~daskgpu._cli.bench.common.ratio` or a list of them. Those that take a
``cluster`` run on the run's :class:`~daskgpu._cli.bench.common.BenchCluster`;
the others start no cluster, or clusters of their own.
"""

from __future__ import annotations

import inspect
import json

from daskgpu._cli.bench import compute, device, host, overhead, reductions, scale, startup
from daskgpu._cli.bench.common import BenchCluster, BenchOptions, table

#: What ``daskgpu bench --help`` says the command does.
DESCRIPTION = """``daskgpu bench``: daskgpu against what a user would write by hand, side by side.

Every figure is measured in the same run as its baseline, on the same data, and
reported as a ratio; absolute times mean something only on the GPU machine.
"""

#: Each section by name, in the order a run without names runs them.
SECTIONS = {
    "cold": startup.bench_cold,
    "first-task": startup.bench_first_task,
    "launch": overhead.bench_launch,
    "submit": overhead.bench_submit,
    "map-host": host.bench_map_host,
    "host-copies": host.bench_host_copies,
    "map-device": device.bench_map_device,
    "iterate": device.bench_iterate,
    "chain": host.bench_chain,
    "chain-graphs": overhead.bench_chain_graphs,
    "compute": compute.bench_compute,
    "scaling": compute.bench_scaling,
    "reductions": reductions.bench_reductions,
    "scale": scale.bench_scale,
    "sharing": compute.bench_sharing,
    "small-chunks": scale.bench_small_chunks,
    "batch": scale.bench_batch,
}


def section_sizes(name: str, size: int) -> dict:
    """The data sizes of section ``name`` when each mapped host array is ``size`` bytes.

    The map sections use arrays of ``size`` in 64 MiB chunks (smaller for small
    sizes; map-device and sharing choose their own chunk counts); compute and
    scaling, which run many steps per element, a quarter and a half of it; iterate, a
    square float32 array of a quarter of it (8192 x 8192 at the default size). Other
    sections take no size.

    Examples
    --------
    >>> section_sizes("map-host", 1 << 30)
    {'size_bytes': 1073741824, 'chunk_bytes': 67108864}
    >>> section_sizes("compute", 256 << 20)
    {'size_bytes': 67108864, 'chunk_bytes': 8388608}
    >>> section_sizes("map-device", 1 << 30)
    {'size_bytes': 1073741824}
    >>> section_sizes("iterate", 1 << 30)
    {'size_bytes': 268435456}
    >>> section_sizes("launch", 1 << 30)
    {}
    """
    share, chunks = {"map-host": (1, 16), "chain": (1, 16), "map-device": (1, None),
                     "compute": (4, 8), "scaling": (2, 32),
                     "sharing": (1, None), "iterate": (4, None)}.get(name, (None, None))
    if share is None:
        return {}
    size_bytes = size // share
    if chunks is None:
        return {"size_bytes": size_bytes}
    default_chunk = inspect.signature(SECTIONS[name]).parameters["chunk_bytes"].default
    return {"size_bytes": size_bytes,
            "chunk_bytes": min(default_chunk, max(1 << 20, size_bytes // chunks))}


def run_section(name: str, cluster: BenchCluster) -> list:
    """The rows of section ``name``, at the sizes of ``cluster``'s options."""
    section = SECTIONS[name]
    arguments = section_sizes(name, cluster.options.array_bytes)
    if "cluster" in inspect.signature(section).parameters:
        arguments["cluster"] = cluster
    result = section(**arguments)
    return result if isinstance(result, list) else [result]


def main(argv=None) -> int:
    """Run ``daskgpu bench`` with the arguments ``argv`` (default ``sys.argv[1:]``); 0."""
    from dask.utils import parse_bytes

    from daskgpu._cli.common import Parser  # usage errors exit 2; help without markup

    parser = Parser(prog="daskgpu bench", description=DESCRIPTION)
    parser.add_argument("sections", nargs="*", default=list(SECTIONS),
                        help=f"which comparisons to run (default all: {', '.join(SECTIONS)})")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--size", default="1GiB", type=parse_bytes, metavar="BYTES",
                        help="bytes of each mapped host array, e.g. 256MiB (default 1GiB)")
    parser.add_argument("--plot", metavar="FILE",
                        help="also draw the ratios into an image file (.png, .svg, .pdf); "
                             "needs matplotlib (daskgpu[plot])")
    parser.add_argument("--steps", type=int, default=1000, metavar="N",
                        help="time steps of the iterate section (default 1000)")
    parser.add_argument("--threads-per-worker", type=int, default=2, metavar="N",
                        help="threads of each LocalGPUCluster worker (default 2)")
    args = parser.parse_args(argv)
    options = BenchOptions(threads_per_worker=args.threads_per_worker, array_bytes=args.size,
                           time_steps=args.steps)
    rows = []
    with BenchCluster(options) as cluster:
        for name in args.sections:
            if name not in SECTIONS:
                parser.error(f"unknown section {name!r}; choose from {', '.join(SECTIONS)}")
            result = run_section(name, cluster)
            rows += result
            if result:  # a section that cannot run here says why in one line instead
                print(table(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=2)
    if args.plot:
        from daskgpu._cli.bench.plot import plot

        plot(rows, args.plot)
    return 0
