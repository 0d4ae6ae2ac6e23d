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

from daskgpu._errors import UsageError
from daskgpu._cli.main import build_parser

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
    service_targets = {p["targetPort"] for p in daskcluster["spec"]["scheduler"]["service"]["ports"]}
    assert service_targets <= set(ports)


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
                                name=ns.name, nthreads=ns.nthreads)
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
