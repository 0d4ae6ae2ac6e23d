"""The deploy/ recipes parse, and every daskgpu command in them is a valid invocation."""

import ast
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import pytest
import yaml

from daskgpu._cli.main import build_parser
from daskgpu._errors import UsageError

REPO = pathlib.Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"

# Commands that run the next words as a command of their own.
_LAUNCHERS = {"srun", "exec", "tini", "env", "nohup", "mpirun", "time"}
_OPERATORS = {";", "&&", "||", "|", "&", "(", ")", "((", "))", ";;"}


def check_invocation(argv, where):
    """Parse ``argv`` (starting with 'daskgpu') with this package's CLI parser."""
    assert argv[0] == "daskgpu", (where, argv)
    try:
        return build_parser().parse_args(argv[1:])
    except UsageError as exc:
        pytest.fail(f"{where}: `{shlex.join(argv)}` is not a valid daskgpu command: {exc}")


def daskgpu_argv(words):
    """The daskgpu command in one simple shell command, else None.

    ``daskgpu worker ...`` or a launcher in front of it (``srun -N2 daskgpu ...``);
    ``pip install daskgpu`` is not a daskgpu command.
    """
    i = 0
    while i < len(words) and re.match(r"[A-Za-z_]\w*=", words[i]):  # FOO=1 daskgpu ...
        i += 1
    while i < len(words) and words[i] in _LAUNCHERS:
        i += 1
        while i < len(words) and (words[i].startswith("-") or "=" in words[i]):
            i += 1
    return words[i:] if i < len(words) and words[i] == "daskgpu" else None


def shell_commands(script):
    """Every daskgpu command line in a shell script (continuations joined, comments dropped)."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = []
        for token in list(lexer) + [";"]:
            if token in _OPERATORS:
                argv = daskgpu_argv(words)
                if argv:
                    found.append(argv)
                words = []
            else:
                words.append(token)
    return found


def dockerfile_instructions(text):
    """``(INSTRUCTION, value)`` pairs of a Dockerfile, continuations joined."""
    out = []
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, value = line.partition(" ")
        out.append((instruction.upper(), value.strip()))
    return out


def dockerfile_commands(text):
    found = []
    for instruction, value in dockerfile_instructions(text):
        if instruction not in ("RUN", "CMD", "ENTRYPOINT"):
            continue
        if value.startswith("["):  # exec form
            argv = daskgpu_argv(json.loads(value))
            if argv:
                found.append(argv)
        else:
            found += shell_commands(value)
    return found


def _stages(text):
    """Dockerfile text per build stage name."""
    stages, name = {}, None
    for instruction, value in dockerfile_instructions(text):
        if instruction == "FROM":
            m = re.search(r"\bAS\s+(\S+)", value, re.IGNORECASE)
            name = m.group(1) if m else value
            stages[name] = [value]
        elif name is not None:
            stages[name].append(f"{instruction} {value}")
    return {k: "\n".join(v) for k, v in stages.items()}


def _argv(value):
    if value is None:
        return []
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


# -- the extraction itself ------------------------------------------------------------
def test_extraction_finds_commands_behind_launchers_and_operators():
    script = textwrap.dedent("""\
        pip install daskgpu && daskgpu info --json   # comment: daskgpu demo
        srun --ntasks-per-node=1 \\
            daskgpu worker --scheduler-file "$F" &
        echo daskgpu worker; FOO=1 env A=b daskgpu inspect k.dgk
    """)
    assert shell_commands(script) == [
        ["daskgpu", "info", "--json"],
        ["daskgpu", "worker", "--scheduler-file", "$F"],
        ["daskgpu", "inspect", "k.dgk"],
    ]


def test_check_invocation_catches_invalid_commands():
    with pytest.raises(pytest.fail.Exception, match="not a valid daskgpu command"):
        check_invocation(["daskgpu", "worker", "--gpus", "2"], "example")
    with pytest.raises(pytest.fail.Exception, match="invalid choice"):
        check_invocation(["daskgpu", "serve"], "example")


# -- Dockerfile -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def dockerfile():
    return (DEPLOY / "Dockerfile").read_text()


def test_dockerfile_commands_are_valid(dockerfile):
    commands = dockerfile_commands(dockerfile)
    assert ["daskgpu", "info"] in commands
    assert ["daskgpu", "worker", "tcp://scheduler:8786"] in commands
    for argv in commands:
        check_invocation(argv, "deploy/Dockerfile")


def test_worker_image_has_the_worker_half_and_no_numba(dockerfile):
    stages = _stages(dockerfile)
    assert set(stages) == {"worker", "client"}
    worker, client = stages["worker"], stages["client"]
    assert re.match(r"nvidia/cuda:\S*-runtime-", worker)
    assert "pip install --no-deps /src/daskgpu" in worker
    assert "numba" not in re.sub(r"find_spec\('numba'\)|sys\.modules\['numba'\]|numba leaked",
                                 "", worker)
    # Every runtime dependency of the package, except the compiler's, is installed.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0).lower() for d in deps}
    compiler = {"numba", "numba-cuda", "llvmlite"}
    assert compiler <= names
    for name in sorted(names - compiler):
        assert re.search(rf'"{re.escape(name)}[<>=\[" ]|\s{re.escape(name)}\s*$', worker,
                         re.MULTILINE), f"worker image does not install {name}"
    assert "nvidia-nvjitlink" in worker
    assert client.startswith("worker AS client")
    assert re.search(r'"numba-cuda\[cu\$\{CUDA_MAJOR\}\]>=0\.30,<0\.31"', client)


def _bounds(specifier):
    """The lowest and highest versions a specifier set admits, None where unbounded."""
    from packaging.version import Version

    low = [Version(s.version) for s in specifier if s.operator in (">=", ">", "==", "~=")]
    high = [Version(s.version) for s in specifier if s.operator in ("<", "<=", "==")]
    return max(low, default=None), min(high, default=None)


def _worker_requirements(dockerfile, cuda_major):
    """What the worker stage's dependency RUN passes to ``pip install``, for ``cuda_major``."""
    worker = _stages(dockerfile)["worker"]
    (run,) = [value for instruction, value in dockerfile_instructions(worker)
              if instruction == "RUN" and '"numpy' in value]
    pip = "pip() { shift; printf '%s\\n' \"$@\"; }"  # prints what it would install
    proc = subprocess.run(["bash", "-c", f"{pip}; CUDA_MAJOR={cuda_major}; {run}"],
                          capture_output=True, text=True, check=True)
    return proc.stdout.splitlines()


@pytest.mark.slow
@pytest.mark.parametrize("cuda_major", [12, 13])
def test_worker_image_pins_lie_within_pyproject(dockerfile, cuda_major):
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    image = {canonicalize_name(r.name): r
             for r in map(Requirement, _worker_requirements(dockerfile, cuda_major))}
    for dep in map(Requirement, deps):
        name = canonicalize_name(dep.name)
        if name in ("numba", "numba-cuda", "llvmlite"):
            continue
        low, high = _bounds(dep.specifier)
        image_low, image_high = _bounds(image[name].specifier)
        assert low is None or (image_low is not None and image_low >= low), (dep, image[name])
        assert high is None or (image_high is not None and image_high <= high), (dep, image[name])
    assert str(image["cuda-bindings"].specifier) in (f"<{cuda_major + 1},>={cuda_major}",
                                                     "<13,>=12.8")


def test_worker_image_accepts_every_driver_the_guide_names(dockerfile):
    # The base image's NVIDIA_REQUIRE_CUDA would make the container toolkit refuse
    # drivers older than the image's CUDA minor version (R575 for 12.9).
    worker = _stages(dockerfile)["worker"]
    assert re.search(r"^ENV NVIDIA_DISABLE_REQUIRE=1$", worker, re.MULTILINE)
    for text in ((REPO / "docs" / "guide" / "install.md").read_text(),
                 (DEPLOY / "README.md").read_text(), dockerfile):
        assert "R525 or newer" in text or "(R525+)" in text


def test_worker_image_serves_the_dashboard(dockerfile):
    # compose and Kubernetes run the scheduler from the worker image, dashboard on 8787.
    assert re.search(r'"bokeh>=3\.1"', _stages(dockerfile)["worker"])


# -- compose ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_commands_are_valid(compose):
    commands = []
    for name, service in compose["services"].items():
        argv = _argv(service.get("entrypoint")) + _argv(service.get("command"))
        argv = daskgpu_argv(argv)
        if argv:
            check_invocation(argv, f"compose service {name}")
            commands.append(argv)
    assert commands and all(a[1] == "worker" for a in commands)


def test_compose_workers_reserve_nvidia_gpus_and_find_the_scheduler(compose):
    services = compose["services"]
    worker = services["worker"]
    ns = check_invocation(_argv(worker["command"]), "compose worker")
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    host, port = re.fullmatch(r"tcp://([\w-]+):(\d+)", ns.scheduler).groups()
    assert host in services
    scheduler = _argv(services[host]["command"])
    assert scheduler[:2] == ["dask", "scheduler"]
    assert scheduler[scheduler.index("--port") + 1] == port
    assert worker["image"] == services["scheduler"]["image"]  # built by the scheduler service
    assert services["scheduler"]["build"]["target"] == "worker"
    assert services["client"]["build"]["target"] == "client"
    # Both images come from this Dockerfile, relative to the build context.
    for svc in (services["scheduler"], services["client"]):
        context = (DEPLOY / svc["build"]["context"]).resolve()
        assert (context / svc["build"]["dockerfile"]).resolve() == DEPLOY / "Dockerfile"


# -- SLURM -----------------------------------------------------------------------------
def test_sbatch_commands_are_valid_and_share_the_scheduler_file():
    text = (DEPLOY / "slurm" / "daskgpu.sbatch").read_text()
    commands = shell_commands(text)
    assert len(commands) == 1
    ns = check_invocation(commands[0], "deploy/slurm/daskgpu.sbatch")
    assert ns.command == "worker" and ns.scheduler is None
    assert re.search(r"^#SBATCH --gres=gpu:\d+$", text, re.MULTILINE)
    scheduler = re.search(r"^dask scheduler --scheduler-file (\S+)", text, re.MULTILINE)
    assert scheduler and shlex.split(scheduler.group(1)) == [ns.scheduler_file]


def test_sbatch_scheduler_listens_on_a_free_port():
    # A fixed port makes two jobs on one node collide; the scheduler file carries the
    # address. tests/deploy/test_slurm.py runs two such jobs at once.
    text = (DEPLOY / "slurm" / "daskgpu.sbatch").read_text().replace("\\\n", " ")
    (line,) = re.findall(r"^dask scheduler .*$", text, re.MULTILINE)
    argv = shlex.split(line.rstrip("& "))
    port = argv[argv.index("--port") + 1]
    assert re.fullmatch(r"0|\$\{\w+:-0\}", port), port
    assert "8786" not in text


@pytest.mark.slow
def test_sbatch_is_valid_bash():
    proc = subprocess.run(["bash", "-n", str(DEPLOY / "slurm" / "daskgpu.sbatch")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def jobqueue_tree():
    return ast.parse((DEPLOY / "slurm" / "jobqueue_example.py").read_text())


def _calls(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def test_jobqueue_example_asks_for_a_gpu_and_registers_the_plugin(jobqueue_tree):
    (cluster,) = _calls(jobqueue_tree, "SLURMCluster")
    kw = {k.arg: ast.literal_eval(k.value) for k in cluster.keywords
          if k.arg in ("job_extra_directives", "worker_extra_args", "processes")}
    assert "--gres=gpu:1" in kw["job_extra_directives"]
    args = kw["worker_extra_args"]
    resources = args[args.index("--resources") + 1]
    # The same resource spec that daskgpu worker reads.
    assert build_parser().parse_args(["worker", "--resources", resources]).resources == {"GPU": 1}
    assert kw["processes"] == 1
    (register,) = _calls(jobqueue_tree, "register_plugin")
    (plugin,) = register.args
    assert isinstance(plugin, ast.Call) and ast.unparse(plugin.func) == "dg.GPUWorkerPlugin"


def test_jobqueue_example_daskgpu_commands_are_valid(jobqueue_tree):
    # Any command line written in it as a list or a string, outside docstrings.
    docstrings = {id(n.body[0].value) for n in ast.walk(jobqueue_tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr)}
    for node in ast.walk(jobqueue_tree):
        if isinstance(node, (ast.List, ast.Tuple)) and node.elts and \
                isinstance(node.elts[0], ast.Constant) and node.elts[0].value == "daskgpu":
            check_invocation([ast.literal_eval(e) for e in node.elts], "jobqueue_example.py")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings and node.value.startswith("daskgpu "):
            check_invocation(shlex.split(node.value), "jobqueue_example.py")


def test_jobqueue_example_kernels_and_imports_are_at_module_level(jobqueue_tree):
    # Simulated, a kernel travels with its Python function; one defined in a function
    # holds `cuda` in a closure cell, which the simulator cannot swap for its own.
    def jitted(node):
        return isinstance(node, ast.FunctionDef) and any(
            "dg.jit" in ast.unparse(d) for d in node.decorator_list)

    assert any(jitted(node) for node in jobqueue_tree.body)
    assert any(isinstance(node, ast.ImportFrom) and node.module == "numba"
               and [a.name for a in node.names] == ["cuda"] for node in jobqueue_tree.body)
    for function in (n for n in jobqueue_tree.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(function):
            assert not jitted(node) or node is function, f"kernel {node.name} inside a function"
            assert not (isinstance(node, ast.ImportFrom) and node.module == "numba")


def test_jobqueue_example_waits_with_timeouts(jobqueue_tree):
    waits = _calls(jobqueue_tree, "wait_for_workers") + _calls(jobqueue_tree, "result")
    assert len(waits) >= 2
    for call in waits:
        assert "timeout" in {k.arg for k in call.keywords}, ast.unparse(call)


@pytest.fixture
def jobqueue_example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("jobqueue_example",
                                                  DEPLOY / "slurm" / "jobqueue_example.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_jobqueue_example_kernel_runs_simulated(jobqueue_example):
    import dask.array as da
    import numpy as np
    from distributed import Client

    import daskgpu as dg

    with dg.LocalGPUCluster(simulate=True, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        x = da.arange(1000, chunks=250, dtype=np.float32)
        assert jobqueue_example.saxpy_sum(client, x, timeout=120) == 2 * 499_500 + 1000


@pytest.mark.slow
def test_jobqueue_example_gives_up_with_a_message_when_no_worker_comes(
        jobqueue_example, monkeypatch, capsys):
    from distributed import LocalCluster

    class NoJobsStart(LocalCluster):  # jobs that never leave the queue
        def scale(self, n=0, jobs=0, **kw):
            pass

    monkeypatch.setattr(jobqueue_example, "make_cluster", lambda queue: NoJobsStart(
        n_workers=0, processes=False, dashboard_address=":0"))
    assert jobqueue_example.main(["--start-timeout", "1"]) == 1
    err = capsys.readouterr().err
    assert "no worker joined in 1 s" in err and "squeue" in err


def test_jobqueue_job_script():
    pytest.importorskip("dask_jobqueue")
    sys.path.insert(0, str(DEPLOY / "slurm"))
    try:
        import jobqueue_example

        script = jobqueue_example.make_cluster().job_script()
    finally:
        sys.path.remove(str(DEPLOY / "slurm"))
        sys.modules.pop("jobqueue_example", None)
    assert "#SBATCH --gres=gpu:1" in script
    assert "--resources GPU=1" in script


# -- Kubernetes -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def daskcluster():
    return yaml.safe_load((DEPLOY / "kubernetes" / "daskcluster.yaml").read_text())


def _containers(doc):
    for role in ("worker", "scheduler"):
        for c in doc["spec"][role]["spec"]["containers"]:
            yield role, c


def test_daskcluster_commands_are_valid(daskcluster):
    assert daskcluster["apiVersion"] == "kubernetes.dask.org/v1"
    assert daskcluster["kind"] == "DaskCluster"
    found = []
    for role, c in _containers(daskcluster):
        argv = daskgpu_argv(_argv(c.get("command")) + _argv(c.get("args")))
        if argv:
            check_invocation(argv, f"DaskCluster {role} container {c['name']}")
            found.append(role)
    assert found == ["worker"]


def test_daskcluster_workers_get_a_gpu_each(daskcluster):
    (worker,) = daskcluster["spec"]["worker"]["spec"]["containers"]
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == 1
    (scheduler,) = daskcluster["spec"]["scheduler"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in scheduler["ports"]}
    assert ports["tcp-comm"] == 8786
    service = daskcluster["spec"]["scheduler"]["service"]
    service_targets = {p["targetPort"] for p in service["ports"]}
    assert service_targets <= set(ports)


@pytest.mark.slow
def test_daskcluster_worker_finds_the_scheduler_from_the_operator_env(daskcluster):
    # The operator sets DASK_SCHEDULER_ADDRESS; the worker args name no scheduler.
    (worker,) = daskcluster["spec"]["worker"]["spec"]["containers"]
    argv = daskgpu_argv(_argv(worker.get("command")) + _argv(worker["args"]))
    script = textwrap.dedent("""
        import json, sys
        from daskgpu._cli.main import build_parser
        from daskgpu._cli.workers import nanny_options
        ns = build_parser().parse_args(json.loads(sys.argv[1])[1:])
        (spec,) = nanny_options(ns.scheduler, scheduler_file=ns.scheduler_file, devices=["0"],
                                name=ns.name, nthreads=ns.nthreads, simulate=True)
        print(json.dumps([spec["scheduler_ip"], spec["name"], spec["resources"]]))
    """)
    env = dict(os.environ, DASK_SCHEDULER_ADDRESS="tcp://daskgpu-scheduler:8786")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(argv)], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["tcp://daskgpu-scheduler:8786", "$(DASK_WORKER_NAME)",
                                       {"GPU": 1}]


def test_readme_commands_are_valid():
    text = (DEPLOY / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.DOTALL)
    commands = [argv for block in blocks for argv in shell_commands(block)]
    assert any(a[1] == "compile" for a in commands)
    for argv in commands:
        check_invocation(argv, "deploy/README.md")
