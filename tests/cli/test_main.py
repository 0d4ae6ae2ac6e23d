"""The ``daskgpu`` command line: parsing, info, worker specs, compile, inspect."""

import asyncio
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import dask.config
import pytest
from numba import cuda

import daskgpu as dg
from daskgpu._cli import main as cli
from daskgpu._cli.main import build_parser, main
from daskgpu._cli.workers import nanny_options
from daskgpu._errors import UsageError
from daskgpu._runtime import backends
from daskgpu._runtime.backends.base import Devices

REPO = pathlib.Path(__file__).resolve().parents[1]

NO_DRIVER = {"version": None, "error": "DynamicLibNotFoundError: no libcuda", "devices": []}
TWO_GPUS = {
    "version": [12, 8], "error": None,
    "devices": [
        {"index": 0, "name": "NVIDIA H200", "cc": [9, 0], "total_memory": 150 * 2**30,
         "uuid": "GPU-0000"},
        {"index": 1, "name": "NVIDIA L4", "cc": [8, 9], "total_memory": 24 * 2**30,
         "uuid": "GPU-0001"},
    ],
}


def _facts(value):
    return lambda: json.loads(json.dumps(value))  # a fresh copy per call


# -- parsing -------------------------------------------------------------------
def test_worker_arguments_parse():
    ns = build_parser().parse_args([
        "worker", "tcp://scheduler:8786", "--devices", "0, 2", "--nthreads", "4",
        "--resources", "GPU=1 MEM=16e9,slots=0.5", "--name", "node7",
    ])
    assert ns.command == "worker"
    assert ns.scheduler == "tcp://scheduler:8786"
    assert ns.devices == [0, 2]
    assert ns.nthreads == 4
    assert ns.resources == {"GPU": 1, "MEM": 16_000_000_000, "slots": 0.5}
    assert ns.name == "node7"


@pytest.mark.parametrize("argv,message", [
    (["worker", "tcp://s:8786", "--scheduler-file", "s.json"], "not both"),
    (["worker", "--resources", "GPU"], r"cannot read resource 'GPU'"),
    (["worker", "--resources", "GPU=-1"], r"cannot read resource"),
    (["worker", "--devices", "0,0"], "names a device twice"),
    (["worker", "--devices", ","], "no device"),
    (["worker", "--nthreads", "0"], "--nthreads"),
    (["compile"], "MODULE:FUNCTION"),
    (["demo", "--size", "-3"], "--size"),
    (["launch"], "invalid choice: 'launch'"),
    ([], "required: COMMAND"),
])
def test_bad_command_lines_raise_instead_of_exiting(argv, message):
    with pytest.raises(UsageError, match=message):
        build_parser().parse_args(argv)


def test_usage_error_exits_2_with_usage_and_no_traceback(capsys):
    assert main(["worker", "--nthreads", "many"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: daskgpu worker")
    assert "daskgpu worker: error: argument --nthreads" in err
    assert "Traceback" not in err


def test_help_and_version_return_0(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"daskgpu {dg.__version__}"
    assert main(["compile", "--help"]) == 0
    assert "--sig SIG" in capsys.readouterr().out


@pytest.mark.slow
def test_python_dash_m_runs_the_cli():
    proc = subprocess.run([sys.executable, "-m", "daskgpu", "--version"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"daskgpu {dg.__version__}"


# -- info ---------------------------------------------------------------------
def test_info_without_driver_explains_and_exits_0(monkeypatch, capsys):
    monkeypatch.setattr(backends.GPU, "machine", _facts(NO_DRIVER))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "no CUDA driver found (DynamicLibNotFoundError: no libcuda)" in out
    assert "daskgpu demo --simulate" in out and "LocalGPUCluster(simulate=True)" in out


def test_info_without_driver_claims_no_ptx_it_loads(monkeypatch, capsys):
    # nvJitLink is there, but without a driver nothing loads PTX: it said "up to ISA 8.8".
    monkeypatch.setattr(backends.GPU, "machine", _facts(NO_DRIVER))
    monkeypatch.setattr(backends.GPU, "linker_version", lambda: (12, 9))
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "nvJitLink     12.9 (reads PTX ISA up to 8.8)" in out
    assert "loads PTX" not in out
    assert main(["info", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_ptx_isa"] is None


def test_info_lists_devices_and_ptx_limits(monkeypatch, capsys):
    monkeypatch.setattr(backends.GPU, "machine", _facts(TWO_GPUS))
    monkeypatch.setattr(backends.GPU, "linker_version", lambda: None)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "CUDA driver   12.8 (reads PTX ISA up to 8.7)" in out
    assert "nvJitLink     not installed" in out
    assert "loads PTX     up to ISA 8.7" in out  # the driver links when nvJitLink is absent
    assert "2 device(s)" in out
    assert "  0  NVIDIA H200  cc 9.0  150.0 GiB  GPU-0000" in out
    assert "  1  NVIDIA L4  cc 8.9  24.0 GiB  GPU-0001" in out
    assert "simulator" not in out


def test_info_json_prefers_nvjitlink(monkeypatch, capsys):
    monkeypatch.setattr(backends.GPU, "machine", _facts(TWO_GPUS))
    monkeypatch.setattr(backends.GPU, "linker_version", lambda: (13, 0))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert main(["info", "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["driver"] == {"version": [12, 8], "error": None, "max_ptx_isa": [8, 7]}
    assert facts["nvjitlink"] == {"version": [13, 0], "max_ptx_isa": [9, 0]}
    assert facts["max_ptx_isa"] == [9, 0]
    assert facts["cuda_visible_devices"] == "1,0"
    assert [d["cc"] for d in facts["devices"]] == [[9, 0], [8, 9]]
    assert facts["hint"] is None


@pytest.mark.slow
def test_info_on_this_machine_needs_no_numba():
    script = """
    import sys
    sys.modules["numba"] = None
    from daskgpu._cli.main import main
    rc = main(["info"])
    assert not any(m.startswith("numba") and sys.modules[m] is not None for m in sys.modules)
    sys.exit(rc)
    """
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "no CUDA driver found" in proc.stdout or "device(s)" in proc.stdout


# -- worker -------------------------------------------------------------------
@pytest.fixture
def four_gpus(monkeypatch):
    """What the backend finds on a machine with four GPUs (the driver is not asked)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends.GPU, "devices", lambda: Devices((0, 1, 2, 3)))


def test_nanny_options_pin_one_gpu_each(four_gpus):
    specs = nanny_options("tcp://10.0.0.1:8786", devices=["0", "GPU-abc"], nthreads=2,
                         resources={"MEM": 8}, name="n1", memory_limit="8GB")
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "GPU-abc"]
    assert [s["name"] for s in specs] == ["n1-0", "n1-GPU-abc"]
    for s in specs:
        assert s["scheduler_ip"] == "tcp://10.0.0.1:8786" and s["scheduler_file"] is None
        assert s["nthreads"] == 2 and s["memory_limit"] == 8 * 10**9
        assert s["resources"] == {"GPU": 1, "MEM": 8}
        (plugin,) = s["plugins"]
        assert isinstance(plugin, dg.GPUWorkerPlugin)
    assert specs[0]["plugins"] is not specs[1]["plugins"]


def test_worker_memory_is_split_between_the_gpus(four_gpus):
    from distributed.system import MEMORY_LIMIT

    specs = nanny_options("tcp://s:8786", devices=["0", "1", "2", "3"])
    assert all(abs(s["memory_limit"] - MEMORY_LIMIT / 4) <= 1 for s in specs)


def test_compile_into_a_missing_directory_is_an_error(kernels_py, capsys):
    assert main(["compile", "cli_kernels_mod:jitted", "-o", "nodir/j.dgk"]) == 1
    err = capsys.readouterr().err
    assert "cannot write the bundle 'nodir/j.dgk'" in err and "does not exist" in err


def test_nanny_options_single_device_keeps_the_name():
    (spec,) = nanny_options(scheduler_file="/shared/s.json", devices=["3"], name="w",
                            simulate=True)
    assert spec["name"] == "w" and spec["scheduler_file"] == "/shared/s.json"
    assert spec["scheduler_ip"] is None


def fake_gpus(monkeypatch, count):
    """The driver reports ``count`` GPUs (the backend's own code reads it)."""
    from cuda.bindings import driver

    ok = driver.CUresult.CUDA_SUCCESS
    monkeypatch.setattr(driver, "cuInit", lambda flags: (ok,))
    monkeypatch.setattr(driver, "cuDeviceGetCount", lambda: (ok, count))


def test_worker_devices_default_to_cuda_visible_devices(monkeypatch):
    fake_gpus(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    specs = nanny_options("tcp://s:8786", simulate=False)
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in specs] == ["2", "3"]


def test_worker_devices_default_to_what_the_driver_sees(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_gpus(monkeypatch, 2)
    specs = nanny_options("tcp://s:8786", simulate=False)
    assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0", "1"]
    fake_gpus(monkeypatch, 0)
    with pytest.raises(dg.DeviceError, match="no CUDA GPU to run workers on .*simulate"):
        nanny_options("tcp://s:8786", simulate=False)


def test_worker_scheduler_from_dask_config():
    with dask.config.set({"scheduler-address": "tcp://from-config:8786"}):
        (spec,) = nanny_options(devices=["0"], simulate=True)
    assert spec["scheduler_ip"] == "tcp://from-config:8786"
    with dask.config.set({"scheduler-address": None}):
        with pytest.raises(UsageError, match="DASK_SCHEDULER_ADDRESS"):
            nanny_options(devices=["0"], simulate=True)


def test_worker_command_reports_missing_scheduler(capsys):
    with dask.config.set({"scheduler-address": None}):
        assert main(["worker", "--devices", "0"]) == 2
    assert "no scheduler to join" in capsys.readouterr().err


@pytest.mark.slow
def test_worker_joins_a_scheduler_pinned_with_gpu_resource_and_plugin():
    from distributed import Client, Scheduler

    async def scenario():
        async with Scheduler(port=0, dashboard_address=":0") as s:
            specs = nanny_options(s.address, devices=["5"], name="gpu-worker",
                                 dashboard_address=":0")
            stop = asyncio.Event()
            running = asyncio.create_task(cli.run_workers(specs, stop))
            try:
                async with Client(s.address, asynchronous=True) as c:
                    await asyncio.wait_for(c.wait_for_workers(1), 60)
                    (ws,) = s.workers.values()
                    env = await c.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
                    plugins = await c.run(lambda dask_worker: sorted(dask_worker.plugins))
                    info = await c.run(dg.device_info)
            finally:
                stop.set()
                await asyncio.wait_for(running, 60)
            return ws, env, plugins, info, len(s.workers)

    # Simulated, so that the plugin's setup needs no GPU; workers inherit the config.
    with dask.config.set({"daskgpu.simulate": True}):
        ws, env, plugins, info, left = asyncio.run(scenario())
    assert ws.name == "gpu-worker" and ws.resources == {"GPU": 1}
    # Simulated workers have no device, so none is pinned (as in LocalGPUCluster).
    assert list(env.values()) == [None]
    assert "daskgpu-gpu" in list(plugins.values())[0]
    assert list(info.values())[0]["cuda_visible_devices"] is None
    assert left == 0  # the stop event closed the worker


# -- demo, bench, batch --------------------------------------------------------
def _fake_module(monkeypatch, name, rc=0):
    calls = []
    mod = types.ModuleType(name)
    mod.main = lambda argv: calls.append(argv) or rc
    monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(dg, name.rpartition(".")[2], mod, raising=False)
    return calls


def test_demo_forwards_its_options(monkeypatch):
    calls = _fake_module(monkeypatch, "daskgpu._cli.demo")
    assert main(["demo", "--size", "4096", "--no-simulate"]) == 0
    assert main(["demo", "--simulate"]) == 0
    assert main(["demo"]) == 0
    assert calls == [["--size", "4096", "--no-simulate"], ["--simulate"], []]


def test_bench_and_batch_pass_every_argument_through(monkeypatch):
    calls = _fake_module(monkeypatch, "daskgpu._cli.bench", rc=3)
    assert main(["bench", "cold", "--json", "out.json", "--help"]) == 3
    assert calls == [["cold", "--json", "out.json", "--help"]]
    calls = _fake_module(monkeypatch, "daskgpu._cli.batch")
    assert main(["batch", "-x"]) == 0
    assert calls == [["-x"]]


def test_missing_subcommand_module_says_not_implemented(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "daskgpu._cli.batch", None)  # makes the import fail
    assert main(["batch", "run"]) == 2
    assert "daskgpu batch: not yet implemented in this version" in capsys.readouterr().err


# -- compile and inspect -------------------------------------------------------
KERNELS = '''
from numba import cuda
import daskgpu as dg

def plain(out, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a

@dg.jit("void(float32[::1], float32)")
def jitted(out, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * 2

@cuda.jit
def numba_kernel(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1

lazy = dg.jit(plain)
not_a_kernel = 42
'''


@pytest.fixture
def kernels_py(tmp_path, monkeypatch):
    path = tmp_path / "cli_kernels_mod.py"
    path.write_text(KERNELS)
    monkeypatch.chdir(tmp_path)
    yield path
    sys.modules.pop("cli_kernels_mod", None)


def test_compile_plain_function_from_a_path(kernels_py, capsys):
    out = kernels_py.parent / "plain.dgk"
    rc = main(["compile", f"{kernels_py}:plain", "--sig", "void(float32[::1], float32)",
               "--sig", "void(float64[::1], float64)", "--cc", "9.0", "--cc", "7.5",
               "--fastmath", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert f"wrote {out}: kernel plain, 2 signature(s)" in capsys.readouterr().out
    k = dg.load(out)
    assert k.signatures == ["(float32[::1], float32)", "(float64[::1], float64)"]
    assert all(im.targets == ((7, 5), (9, 0)) for im in k.images)
    assert all(im.option("fastmath") is True for im in k.images)


def test_compile_daskgpu_kernel_from_a_dotted_module(kernels_py, capsys):
    assert main(["compile", "cli_kernels_mod:jitted"]) == 0, capsys.readouterr().err
    k = dg.load(kernels_py.parent / "jitted.dgk")  # default output name, in the cwd
    assert k.signatures == ["(float32[::1], float32)"]
    assert k.images[0].targets == ((7, 5),)
    # --cc recompiles the kernel's own signatures for the new targets.
    assert main(["compile", "cli_kernels_mod:jitted", "--cc", "8.0", "-o", "j80.dgk"]) == 0
    assert dg.load(kernels_py.parent / "j80.dgk").images[0].targets == ((8, 0),)


def test_compile_numba_dispatcher(kernels_py, capsys):
    rc = main(["compile", "cli_kernels_mod:numba_kernel", "--sig", "void(int32[::1])",
               "--max-registers", "32", "-o", "nk.dgk"])
    assert rc == 0, capsys.readouterr().err
    im = dg.load(kernels_py.parent / "nk.dgk").images[0]
    assert im.signature == "(int32[::1])" and im.option("max_registers") == 32
    assert im.writes == (0,)


@pytest.mark.parametrize("target,extra,rc,message", [
    ("cli_kernels_mod:plain", [], 2, "plain function: give its signature"),
    ("cli_kernels_mod:lazy", [], 2, "no compiled signature: give one with --sig"),
    ("cli_kernels_mod:not_a_kernel", [], 2, "is a int, not a function or kernel"),
    ("cli_kernels_mod:missing", [], 2, r"has no 'missing'; it defines \[.*'plain'"),
    ("no_such_module_xyz:f", [], 2, "cannot import 'no_such_module_xyz'"),
    ("nothere/k.py:f", [], 2, "no Python file 'nothere/k.py'"),
    ("plain", [], 2, "write the kernel as MODULE:FUNCTION"),
    ("cli_kernels_mod:plain", ["--sig", "void(float32[::1]"], 1, "cannot read the signature"),
    ("cli_kernels_mod:plain", ["--sig", "void(float32[::1], float32)", "--cc", "sm_xx"], 1,
     "cannot read compute capability"),
])
def test_compile_errors_are_messages_not_tracebacks(kernels_py, capsys, target, extra, rc,
                                                   message):
    assert main(["compile", target, *extra]) == rc
    err = capsys.readouterr().err
    assert err.startswith("daskgpu compile: error: ")
    assert "Traceback" not in err
    assert re.search(message, err), err


def test_compile_reports_errors_raised_while_importing(tmp_path, capsys):
    bad = tmp_path / "broken_mod.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    assert main(["compile", f"{bad}:f", "--sig", "void(int32[::1])"]) == 2
    err = capsys.readouterr().err
    assert "importing" in err and "RuntimeError: boom at import" in err


@pytest.fixture
def saved(tmp_path):
    k = dg.jit(["void(float32[::1], float32)", "void(float64[:], float64)"],
               targets=["7.5", "9.0"])(_fill)
    path = tmp_path / "fill.dgk"
    digest = dg.save(k, path)
    return path, digest, k


def _fill(out, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a


def test_inspect_text(saved, capsys):
    path, digest, k = saved
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"sha256     {digest}" in out
    assert "format version 1, written by daskgpu" in out
    assert "kernel     _fill  (2 signature(s))" in out
    assert "signature  (float64[:], float64)" in out
    assert "targets    sm_75 (PTX ISA" in out and "sm_90 (PTX ISA" in out
    assert "writes     #0 float32[::1]" in out
    assert f"hash       {k.images[1].hash}" in out


def test_inspect_json(saved, capsys):
    path, digest, k = saved
    assert main(["inspect", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sha256"] == digest and doc["size"] == path.stat().st_size
    assert doc["daskgpu"] == dg.__version__ and doc["format_version"] == 1
    (im32, im64) = doc["images"]
    assert im32["signature"] == "(float32[::1], float32)"
    assert im32["entry"] == k.images[0].entry
    assert sorted(im32["targets"]) == ["7.5", "9.0"]
    assert im32["targets"]["7.5"]["ptx_bytes"] == len(k.images[0].ptx[0][1].encode())
    assert im32["writes"] == [0] and im64["params"] == ["float64[:]", "float64"]
    assert im32["grid_ndim"] == k.images[0].grid_ndim
    assert im32["versions"]["numba-cuda"]
    assert im64["hash"] == k.images[1].hash


def test_inspect_refuses_a_tampered_bundle(saved, capsys):
    path, _, _ = saved
    path.write_text(path.read_text().replace("float32", "float64", 1))
    assert main(["inspect", str(path)]) == 2  # usage: a bundle it cannot use
    assert "is corrupt: its content does not match" in capsys.readouterr().err


@pytest.mark.gpu
def test_worker_on_a_real_gpu_runs_a_loaded_bundle(tmp_path):
    import numpy as np
    from distributed import Client, Scheduler

    k = dg.jit("void(float32[::1], float32)")(_fill)
    path = tmp_path / "fill.dgk"
    dg.save(k, path)
    loaded = dg.load(path)

    async def scenario():
        async with Scheduler(port=0, dashboard_address=":0") as s:
            specs = nanny_options(s.address, dashboard_address=":0")  # every local GPU
            stop = asyncio.Event()
            running = asyncio.create_task(cli.run_workers(specs, stop))
            try:
                async with Client(s.address, asynchronous=True) as c:
                    await asyncio.wait_for(c.wait_for_workers(len(specs)), 120)
                    info = await c.run(dg.device_info)
                    out = await c.submit(loaded.forall(1000), np.zeros(1000, np.float32),
                                         np.float32(3), resources={"GPU": 1})
            finally:
                stop.set()
                await asyncio.wait_for(running, 60)
            return specs, info, out

    specs, info, out = asyncio.run(scenario())
    assert len(info) == len(specs)
    assert all(not i["simulated"] and i["device_id"] == 0 for i in info.values())
    assert sorted(i["cuda_visible_devices"] for i in info.values()) == \
        sorted(s["env"]["CUDA_VISIBLE_DEVICES"] for s in specs)
    assert np.array_equal(out, np.full(1000, 3, np.float32))


@pytest.mark.nogpu
def test_demo_on_a_gpu_without_one_exits_2_in_one_line(capsys):
    # 2: "a command this machine cannot run", as `daskgpu --help` says (it was 1).
    assert main(["demo", "--no-simulate"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    # In the command line's own words: it told a command-line user to "pass simulate=True".
    assert line.startswith("daskgpu demo: error: --no-simulate, but there is no CUDA GPU "
                           "here (")
    assert "leave out --no-simulate" in line and "simulate=True" not in line
