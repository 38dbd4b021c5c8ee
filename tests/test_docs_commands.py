"""Every shell command that README.md and the pages under docs/ give in ```bash blocks (`python scripts/...` lines
and `make` targets, whose recipes are read from the Makefile) is covered in smoke form:

- each one's Hydra config is composed with the command's own overrides (each value of a sweep, the keys an
  Optuna search draws) and resolved, which catches renamed keys, bad defaults, missing mandatory values and
  broken interpolations;
- a few representative ones run on tiny data (the rest would take minutes to hours, or a GPU or a cluster): the
  main job with a learned model beside GAP-TV in an 80-column terminal, and the Optuna search on `tiny_cpu` with
  `collect.py sweep_dir=latest` after it (tests/test_scripts.py, test_reconstruct.py, test_train.py and
  test_sweeps.py run others).

A command that names a script, a program or a placeholder that the tables below do not know fails
`test_every_documented_command_is_covered`: add the script to SCRIPTS (or, with the reason, to NOT_RUN), the
program to OTHER_PROGRAMS, the placeholder to PLACEHOLDERS. Nothing is written outside pytest's tmp_path.

README.md's Python example (the ```python block under "## The operator") is read from the README at test time, run
(on 64² frames instead of its 256², for time; every call as written) and checked against what its comments say.
"""
from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_BLOCKS = {"bash", "sh", "shell", "zsh", "console"}

# cassi's scripts that the docs may name, and how a command of each is checked: "compose" (a Hydra script: the
# config its @hydra.main names, with the command's overrides) or "keys" (key=value arguments, the keys checked
# against the script's KEYS dict; the script is not imported, so that this module stays light).
SCRIPTS = {
    "train.py": "compose",
    "evaluate.py": "compose",
    "reconstruct.py": "compose",
    "model_card.py": "compose",
    "convert_checkpoint.py": "compose",
    "benchmark.py": "compose",
    "benchmark_solvers.py": "compose",
    "benchmark_models.py": "compose",
    "benchmark_zoo.py": "compose",
    "benchmark_shared.py": "compose",
    "fit_camera.py": "compose",
    "fetch_content.py": "compose",
    "collect.py": "keys",
}
# Scripts a documented command may name without being checked here, and why.
NOT_RUN = {
    "plot_curves.py": "draws the learning curves of finished runs (their metrics.csv): no config to compose; "
                      "its drawing is tested in tests/test_viz.py",
}
# Programs other than cassi's scripts that the docs give, and why nothing runs them here.
OTHER_PROGRAMS = {
    "pip": "installs packages: the tests run in the environment `make` installs (.[dev,sweep])",
    "pytest": "the test suite itself (`make test`)",
    "mkdocs": "the documentation site (`make docs`, run by CI)",
    "python -c": "an inline snippet, no script or config (docs/benchmarks.md: numba's JIT cache, timed)",
    "for": "a shell loop around such snippets",
}
# Make recipes' shell: lines of these programs are the recipe's plumbing, not commands to cover.
SHELL_PLUMBING = {"echo", "if", "fi", "done", "[", "test", "touch", "true", "false", "rm", "mkdir"}
# Placeholders in documented commands and what stands in for them here ({tmp}: the test's folder; {ckpt}: a
# real checkpoint, the shipped synthetic_demo). Applied in order; extend it when the docs gain a new one.
PLACEHOLDERS = [
    (r"[^\s=]*<run>/checkpoints/\S*\.ckpt", "{ckpt}"),  # outputs/<run>/checkpoints/best-….ckpt, last.ckpt
    (r"<ckpt>", "{ckpt}"),
    (r"<run>", "{tmp}/run"),
    (r"<dir>", "{tmp}/sweep"),
    (r"<folder>", "{tmp}/folder"),
    (r"<name>", "tiny"),
]
LEFT_OVER = re.compile(r"<[^<>\s=]*>|…|\$(?!\{)")  # what must not remain (${...}: a Hydra interpolation)


@dataclass(frozen=True)
class Invocation:
    """One program call that a documented command makes (a `make` target may make several)."""
    where: str            # README.md:93 (make demo: the recipe's call)
    command: str          # the documented command, as one line
    program: str          # a script name (train.py), or another program (pip, pytest, python -c, ...)
    args: tuple = ()

    @property
    def multirun(self) -> bool:
        return "-m" in self.args or "--multirun" in self.args

    def overrides(self, tmp: Path) -> list[str]:
        """The arguments with every placeholder substituted (ValueError naming one that is not known)."""
        out = []
        for a in self.args:
            if a in ("-m", "--multirun"):
                continue
            for pattern, repl in PLACEHOLDERS:
                a = re.sub(pattern, repl.format(tmp=tmp, ckpt="pretrained/synthetic_demo"), a)
            if LEFT_OVER.search(a):
                raise ValueError(f"{self.where}: unknown placeholder in {a!r}: add it to PLACEHOLDERS")
            out.append(a)
        return out


def _logical_lines(body: str, first_line: int, console: bool):
    """(line number, text) of a shell block: continuation lines joined, prompts ($ ) of console blocks taken."""
    pending, start = "", None
    for i, line in enumerate(body.splitlines()):
        if console:
            if not line.startswith("$ ") and not pending:
                continue
            line = line[2:] if line.startswith("$ ") else line
        start = first_line + i if not pending else start
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        yield start, pending + line
        pending = ""
    if pending:
        yield start, pending


def documented_commands() -> list[tuple[str, str]]:
    """(where, command line) of every command in the shell blocks of README.md and docs/**/*.md."""
    fence = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                       re.S | re.M)
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in fence.finditer(text):
            if m["lang"] not in SHELL_BLOCKS:
                continue
            indent = m["indent"]
            body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln for ln in m["body"].splitlines())
            first = text.count("\n", 0, m.start("body")) + 1
            for line_no, line in _logical_lines(body, first, m["lang"] == "console"):
                try:
                    tokens = shlex.split(line, comments=True)
                except ValueError:  # unbalanced quotes: reported by the coverage test
                    tokens = [line]
                if tokens:
                    found.append((f"{path.relative_to(ROOT)}:{line_no}", shlex.join(tokens)))
    return found


def _make_rules() -> tuple[dict[str, list[str]], dict[str, str]]:
    """The Makefile's recipes {target: [shell lines, continuations joined]} and its variables."""
    rules, variables, target, pending = {}, {}, None, ""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if target and line.startswith("\t"):
            text = pending + line.strip()
            if text.endswith("\\"):
                pending = text[:-1] + " "
                continue
            rules[target].append(text.lstrip("@-"))
            pending = ""
            continue
        assign = re.match(r"^([A-Za-z_][\w]*)\s*[:?]?=\s*(.*)$", line)
        rule = re.match(r"^([\w][\w.-]*)\s*:(?!=)", line)
        if assign:
            variables[assign[1]] = assign[2].split("#")[0].strip()
        target = rule[1] if rule and not assign else None
        if target:
            rules.setdefault(target, [])
    return rules, variables


def _expand_make(text: str, variables: dict[str, str], args: str) -> str:
    """A recipe line with make's variables substituted ($(PY): python, $(VENV)/bin/x: x, $(ARGS): the command's)."""
    text = text.replace("$(VENV)/bin/", "").replace("$(PY)", "python").replace("$(ARGS)", args)
    for _ in range(5):  # nested variables
        text = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m[1], m[0]), text)
    return re.sub(r"\$\(shell [^)]*\)", "stamp", text)  # e.g. a time stamp: $(shell date +%Y-%m-%d)


def _simple_commands(line: str) -> list[list[str]]:
    """The simple commands of a shell line (split at unquoted ; && || |, keywords of if/for dropped), as argv."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split, lex.commenters = True, "#"
    commands, current = [], []
    for token in lex:
        if token and set(token) <= set(";&|"):
            commands.append(current)
            current = []
        else:
            current.append(token)
    commands.append(current)
    out = []
    for c in commands:
        while c and c[0] in ("then", "else", "do"):
            c = c[1:]
        if c:
            out.append(c)
    return out


def _program(argv: list[str]) -> tuple[str, list[str]]:
    """(program, its arguments) of a simple command: a script name for `python scripts/x.py`, environment
    assignments (OMP_NUM_THREADS=1 ...) skipped."""
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        argv = argv[1:]
    if not argv:
        return "", []
    if re.fullmatch(r"(\S*/)?python3?", argv[0]) and len(argv) > 1:
        if argv[1].startswith("scripts/") and argv[1].endswith(".py"):
            return argv[1][len("scripts/"):], argv[2:]
        if argv[1] == "-m" and len(argv) > 2:
            return argv[2], argv[3:]
        if argv[1] == "-c":
            return "python -c", argv[2:]
    return argv[0], argv[1:]


def invocations(where: str, command: str) -> list[Invocation]:
    """What a documented command line runs: its simple commands, and for `make <target>` those of the target's
    recipe (ValueError for a target the Makefile does not have); shell plumbing (echo, if, ...) left out."""
    out = []
    for simple in _simple_commands(command):
        program, args = _program(simple)
        if program != "make":
            if program and program not in SHELL_PLUMBING:
                out.append(Invocation(where, command, program, tuple(args)))
            continue
        rules, variables = _make_rules()
        make_vars = dict(a.split("=", 1) for a in args if "=" in a)
        for target in (a for a in args if "=" not in a and not a.startswith("-")):
            if target not in rules:
                raise ValueError(f"{where}: `make {target}`: the Makefile has no target {target!r}")
            for line in rules[target]:
                expanded = _expand_make(line, {**variables, **make_vars}, make_vars.get("ARGS", ""))
                out += [Invocation(f"{where} (make {target})", command, inv.program, inv.args)
                        for inv in invocations(where, expanded) if inv.program != "make"]
    return out


def _classified():
    """(invocations of cassi's scripts, deduplicated by script and arguments; problems: one line each)."""
    scripts, problems, seen = [], [], set()
    for where, command in documented_commands():
        try:
            invs = invocations(where, command)
        except ValueError as e:  # a make target the Makefile lacks, a line the shell could not split
            problems.append(e.args[0] if e.args[0].startswith(where) else f"{where}: `{command}`: {e}")
            continue
        for inv in invs:
            if inv.program in SCRIPTS:
                if not (ROOT / "scripts" / inv.program).is_file():
                    problems.append(f"{inv.where}: scripts/{inv.program} does not exist")
                elif (inv.program, inv.args) not in seen:
                    seen.add((inv.program, inv.args))
                    scripts.append(inv)
                    try:
                        inv.overrides(Path("/tmp"))
                    except ValueError as e:
                        problems.append(str(e))
            elif inv.program in NOT_RUN or inv.program in OTHER_PROGRAMS:
                continue
            elif inv.program.endswith(".py"):
                problems.append(f"{inv.where}: `{command}` names scripts/{inv.program}, which this test does not know: "
                                f"add it to SCRIPTS (how its commands are checked) or to NOT_RUN with the reason")
            else:
                problems.append(f"{inv.where}: `{command}` runs {inv.program!r}, which this test does not know: add "
                                f"it to OTHER_PROGRAMS with the reason it is not run, or cover it")
    return scripts, problems


SCRIPT_CALLS, PROBLEMS = _classified()


def documented(program: str, *args: str) -> Invocation:
    """The documented call of ``program`` with exactly these arguments (fails when the docs no longer give it)."""
    for inv in SCRIPT_CALLS:
        if inv.program == program and inv.args == args:
            return inv
    pytest.fail(f"the docs no longer give `python scripts/{program} {' '.join(args)}`: update this test")


# ------------------------------------------------------------------------------------------------ coverage


def test_every_documented_command_is_covered():
    assert not PROBLEMS, "\n".join(PROBLEMS)
    found = {inv.program for inv in SCRIPT_CALLS}
    assert {"train.py", "evaluate.py", "reconstruct.py", "collect.py", "benchmark.py"} <= found  # the extractor works
    assert any("(make demo)" in inv.where for inv in SCRIPT_CALLS)  # make targets are read from the Makefile


def test_the_extractor_reads_continuations_comments_prompts_and_make_recipes():
    """On a made-up page: what the extractor gives (so that a change to it is noticed)."""
    body = ("python scripts/a.py x=1 \\\n    y=2   # a comment\n# only a comment\n\nOMP_NUM_THREADS=1 python "
            "scripts/b.py -m z=1,2\n")
    lines = list(_logical_lines(body, 10, console=False))
    assert [(n, " ".join(shlex.split(t, comments=True))) for n, t in lines if shlex.split(t, comments=True)] == [
        (10, "python scripts/a.py x=1 y=2"), (14, "OMP_NUM_THREADS=1 python scripts/b.py -m z=1,2")]
    assert [t for _, t in _logical_lines("$ make demo\nwrote it\n", 1, console=True)] == ["make demo"]
    assert _program(shlex.split("OMP_NUM_THREADS=1 python scripts/b.py -m z=1,2")) == ("b.py", ["-m", "z=1,2"])
    assert _program(["python", "-m", "pytest", "-q"]) == ("pytest", ["-q"])
    assert _simple_commands('if [ -f x ]; then python scripts/a.py k="v w"; else echo "no; none"; fi') == [
        ["if", "[", "-f", "x", "]"], ["python", "scripts/a.py", "k=v w"], ["echo", "no; none"], ["fi"]]
    assert [i.program for i in invocations("x", 'for i in 1 2; do A=1 python -c "print(1)"; done')] == [
        "for", "python -c"]
    demo = invocations("README.md:1", "make demo ARGS='solver=admm_tv'")
    assert demo and all(inv.program.endswith(".py") for inv in demo)
    assert demo[0].args[-1] == "solver=admm_tv"  # ARGS reach the recipe's first call
    inv = Invocation("x", "", "train.py", ("ckpt_path=outputs/<run>/checkpoints/best-….ckpt", "sweep_dir=<dir>"))
    assert inv.overrides(Path("/t")) == ["ckpt_path=pretrained/synthetic_demo", "sweep_dir=/t/sweep"]
    with pytest.raises(ValueError, match="unknown placeholder"):
        Invocation("x", "", "train.py", ("data=<new>",)).overrides(Path("/t"))


# ------------------------------------------------------------------------------------------------ compose


def _config_name(script: str) -> str:
    m = re.search(r"config_name=\"(\w+)\"", (ROOT / "scripts" / script).read_text())
    assert m, f"scripts/{script} has no @hydra.main(config_name=...): give it another check in SCRIPTS"
    return m[1]


def _variants(overrides: list[str]) -> list[list[str]]:
    """The override lists to compose for a command: a sweep (a,b,c; choice(); range()) gives each of its values
    once, the other sweeps at their first value; an interval (Optuna) is composed at its lower end."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    base, sweeps = [], []
    for o in parsed:
        if not o.is_sweep_override():
            base.append(o.input_line)
        elif o.value_type is not None and o.value_type.name == "INTERVAL_SWEEP":
            base.append(f"{o.get_key_element()}={o.value().start}")
        else:
            sweeps.append([f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()])
    if not sweeps:
        return [base]
    firsts = [s[0] for s in sweeps]
    return [base + [*firsts[:i], v, *firsts[i + 1:]] for i, values in enumerate(sweeps)
            for v in values[(i > 0):]]


def _resolve(cfg) -> None:
    """Resolve every interpolation of the job's config (not Hydra's own), with ??? values an error."""
    HydraConfig.instance().set_config(cfg)
    for key in cfg:
        if key != "hydra":
            node = cfg[key]
            if OmegaConf.is_config(node):
                OmegaConf.to_container(node, resolve=True, throw_on_missing=True)


def _plugins(overrides: list[str]) -> None:
    """Skip when a command needs a Hydra plugin of the [sweep] extra that is not installed (`make test` has it)."""
    text = " ".join(overrides)
    for needle, plugin in (("hparams_search=", "hydra_optuna_sweeper"), ("launcher=joblib", "hydra_joblib_launcher"),
                           ("launcher=s", "hydra_submitit_launcher")):  # slurm_*, submitit_*
        if needle in text:
            pytest.importorskip(f"hydra_plugins.{plugin}", reason="the [sweep] extra is not installed")


@pytest.mark.parametrize("inv", SCRIPT_CALLS, ids=[f"{i.where} {i.program} {' '.join(i.args)}"[:120]
                                                   for i in SCRIPT_CALLS])
def test_documented_command_composes(inv, tmp_path):
    overrides = inv.overrides(tmp_path)
    if SCRIPTS[inv.program] == "keys":
        tree = ast.parse((ROOT / "scripts" / inv.program).read_text())
        keys = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                    and [getattr(t, "id", None) for t in node.targets] == ["KEYS"])
        given = [a.split("=", 1)[0] for a in overrides if "=" in a]
        assert set(given) <= set(keys), f"{inv.where}: unknown argument(s) {sorted(set(given) - set(keys))}"
        assert len([a for a in overrides if "=" not in a]) <= 1, f"{inv.where}: one bare argument at most"
        return
    _plugins(overrides)
    config = _config_name(inv.program)
    with initialize_config_dir(str(CONF), version_base="1.3"):
        for variant in _variants(overrides):
            cfg = compose(config, overrides=[*variant, f"hydra.runtime.output_dir={tmp_path}"],
                          return_hydra_config=True)
            _resolve(cfg)
            sweeping = inv.multirun or str(cfg.hydra.mode) == "RunMode.MULTIRUN"
            assert sweeping or len(_variants(overrides)) == 1, f"{inv.where}: a sweep without -m"
            params = cfg.hydra.sweeper.get("params") or {}
            for key in params:  # every key an Optuna search (or a sweeper's own params) draws is in the config
                assert OmegaConf.select(cfg, key, default="<missing>") != "<missing>", f"{inv.where}: {key}"


# ------------------------------------------------------------------------------------------------ runs

LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,]+\]\[")  # Hydra's job logging: one line per event, any width
SMALL = ["trainer.accelerator=cpu", "operator.backend=strided", "data.test.n=2", "data.test.height=32", "data.test.width=40",
         "solver.iters=5"]
# tiny_cpu in miniature: GAP-TV (3 iterations) on 2 training crops of 32², 16² windows, one batch of each split
TINY_REFINER = ["model.width=4", "model.depth=2", "model.solver.iters=3", "data.train.cubes.samples_per_epoch=2",
                "data.train.cubes.patch_size=32", "data.train.patch_size=16", "data.val.crop_to=32",
                "data.batch_size=2", "trainer.fast_dev_run=1", "callbacks.progress=null", "callbacks.summary=null",
                "trainer.enable_model_summary=false"]


def run(inv: Invocation, tmp: Path, *smoke: str, columns: int = 200):
    """Run a documented call as a user does (a subprocess) in the folder ``tmp``, with the ``smoke`` overrides
    after its own (the later value of a key wins), in a terminal ``columns`` wide."""
    args = inv.overrides(tmp)
    flags = ["-m"] if inv.multirun else []
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / inv.program), *flags, *args, *smoke], cwd=tmp,
                       env=dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS=str(columns)), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, f"{inv.where}: `{inv.command}` failed:\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def assert_fits(r, columns: int = 80) -> None:
    """No line of the output wider than the terminal (log records aside), no table cell cut to '…'."""
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if not LOG_RECORD.match(ln)]
    assert max(map(len, lines)) <= columns, [ln for ln in lines if len(ln) > columns]
    assert "…" not in r.stdout


def test_reconstruct_beside_a_model_fits_an_80_column_terminal(tmp_path):
    """`python scripts/reconstruct.py ckpt=pretrained/synthetic_demo` (= the demo: a learned model beside GAP-TV)
    in an 80-column terminal: its summary printed every column cut to `na… ps… ps… ss…`; now the few a person
    reads (scene, method, PSNR, SSIM, time, status; the baseline on the line below), nothing cut, nothing wider."""
    out = tmp_path / "run"
    r = run(documented("reconstruct.py", "ckpt=pretrained/synthetic_demo"), tmp_path, *SMALL, "data.test.n=1",
            f"output_dir={out}", columns=80)  # one scene: the model runs GAP-TV's 80 iterations inside
    assert_fits(r)
    table = r.stdout.split(" method ")[1].splitlines()
    rows = {s["name"]: s for s in json.loads((out / "summary.json").read_text())["scenes"]}
    assert len(rows) == 1 and any(ln.startswith("mean") for ln in table)
    for name, row in rows.items():
        i = next(i for i, ln in enumerate(table) if ln.startswith(name))
        assert table[i].split()[1:4] == ["Refiner", f"{row['psnr']:.2f}", f"{row['ssim']:.3f}"]
        assert table[i].split()[-1] == "reconstructed"
        assert table[i + 1].split()[:3] == ["GAPTV", f"{row['baseline_psnr']:.2f}", f"{row['baseline_ssim']:.3f}"]
    header = (out / "summary.csv").read_text().splitlines()[0].split(",")  # the files keep every column
    assert {"psnr_table", "sam", "residual", "iterations", "baseline_sam", "baseline_residual"} <= set(header)


def test_make_demo_runs_in_an_80_column_terminal_and_its_model_beats_gap_tv(tmp_path, shared_data):
    """The README's main command, `make demo`, as a user runs it (the real scene included: CI has the shared data):
    exit 0, every line of its output within 80 columns (its folders, which the user chose, shortened), chart_demo
    above GAP-TV on the chart, the real scene's report written."""
    out = tmp_path / "demo"
    # as from a fresh shell: not the variables of a `make test ARGS=...` that may be running this test
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")}
    r = subprocess.run(["make", "demo", "ARGS=", f"DEMO_OUT={out}", f"REAL={shared_data}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=dict(env, COLUMNS="80"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    said = (r.stdout + r.stderr).replace(str(out), "<out>").replace(str(shared_data), "<data>")
    wide = [ln for ln in said.splitlines() if len(ln) > 80]
    assert not wide, wide
    chart = json.loads((out / "summary.json").read_text())["mean"]
    assert chart["psnr"] > chart["baseline_psnr"] and chart["ssim"] > chart["baseline_ssim"]
    assert (out / "real" / "index.html").is_file() and "<out>/real/index.html (the real scene)" in said


def test_the_readmes_shipped_and_published_model_commands_run(tmp_path, shared_data):
    """README's "Pretrained and published models" block as a user runs it, in a folder of their own: a shipped model
    beside GAP-TV on the shared CAVE crops (above it there), then the MST toolbox's weights converted (a
    toolbox-layout mst_s.pth with seeded weights stands in for the download) and loaded by the main job. (The
    paper's table and the fine-tune: tests/test_zoo_mst.py, tests/test_fit_camera.py.)"""
    import zoo_common as zc

    shipped = run(documented("reconstruct.py", "data=shared_cave", "ckpt=pretrained/cave_tsa"), tmp_path,
                  f"paths.shared_data={shared_data}", "output_dir=shipped")
    mean = json.loads((tmp_path / "shipped" / "summary.json").read_text())["mean"]
    assert mean["psnr"] > mean["baseline_psnr"] + 2, shipped.stdout[-2000:]
    zc.toolbox_checkpoint("mst_s", zc.load_reference("mst_s"), tmp_path / "mst_s.pth")
    run(documented("convert_checkpoint.py", "source=mst", "method=mst_s", "weights=mst_s.pth", "out=mst_s.ckpt"),
        tmp_path)
    run(documented("reconstruct.py", "ckpt=mst_s.ckpt"), tmp_path, "data.test.n=1", "output_dir=converted")
    (row,) = json.loads((tmp_path / "converted" / "summary.json").read_text())["scenes"]
    assert row["status"] == "reconstructed" and "MST" in (tmp_path / "converted" / "summary.md").read_text()


def test_optuna_search_on_tiny_cpu_then_collect(tmp_path, shared_data, monkeypatch):
    """`python scripts/train.py hparams_search=optuna experiment=tiny_cpu` in miniature (one trial): it stopped at
    its first trial when its space drew model.stages=7, which tiny_cpu's Refiner cannot train from scratch; then
    `python scripts/collect.py sweep_dir=latest` finds that search (the newest sweep) and tables its trial."""
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper", reason="the [sweep] extra is not installed")
    search = documented("train.py", "hparams_search=optuna", "experiment=tiny_cpu")
    r = run(search, tmp_path, *TINY_REFINER, f"paths.shared_data={shared_data}", "hydra.sweeper.n_trials=1",
            f"hydra.sweeper.storage=sqlite:///{tmp_path}/s.db", "hydra.sweep.dir=multirun/optuna")
    assert "Best value" in r.stdout + r.stderr
    job = json.loads((tmp_path / "multirun" / "optuna" / "0" / "job.json").read_text())
    assert job["status"] == "completed" and not any(o.startswith("model.stages=") for o in job["overrides"])
    collect = documented("collect.py", "sweep_dir=latest")  # in this process (its start-up is the cost)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no scripts/__pycache__ in the repository
    assert __import__("collect").main(collect.overrides(tmp_path)) == 0
    table = json.loads((tmp_path / "multirun" / "optuna" / "sweep.json").read_text())
    assert [row["status"] for row in table["rows"]] == ["completed"] and table["best"]["job"] == "0"


# ------------------------------------------------------------------------------------------------ Python


def readme_python(section: str = "## The operator") -> tuple[int, str]:
    """(first line, code) of the ```python block under ``section`` of README.md, read at test time so that the
    test runs what the README says."""
    text = (ROOT / "README.md").read_text()
    start = text.find(f"\n{section}\n")
    assert start >= 0, f"README.md has no section {section!r}: update this test"
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end
    block = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M).search(text, start, end)
    assert block, f"README.md's {section!r} has no ```python block: update this test"
    return text.count("\n", 0, block.start(1)) + 1, block[1]


def test_the_readmes_operator_example_runs_and_does_what_its_comments_say():
    """README.md's ```python block under "## The operator", its calls as written; then what its comments state:
    the shapes (Δ as it says), pinv 0 where Φ = 0, the data step's closed form (the gradient of ½‖Ax−y‖² +
    ρ/2‖x−x0‖² vanishes at it), GAP-TV's result with a PSNR per iteration (row 0: the initial guess)."""
    import torch

    line, code = readme_python()
    # as written (256² frames, a batch of 4) the block takes about 6 s on a 2-core CPU, mostly backend="auto" timing
    # its candidates on the first (4, 28, 256, 256) call: run at 64², the sizes alone changed (Δ and every call as
    # written); when the README's frames change, change the size replaced here
    code, n = re.subn(r"\b256\b", "64", code)
    assert n == 4, f"README.md's example no longer has its 256² frames (4 sizes): update this test\n{code}"
    ns: dict = {}
    exec(compile(code, f"README.md (line {line})", "exec"), ns)
    op, x, y, xt, x0, x1, result = (ns[k] for k in ("op", "x", "y", "xt", "x0", "x1", "result"))
    b, c, h, w = x.shape
    delta = re.search(r"Δ = (\d+) here", code)
    assert delta and op.delta == int(delta[1]), (op.delta, code)
    assert y.shape == (b, 1, h, w + op.delta) and xt.shape == x0.shape == x1.shape == x.shape
    assert torch.isfinite(y).all() and torch.isfinite(xt).all()
    phi = op.phi.expand_as(y)  # Aᵀ(y ⊘ Φ), 0 where Φ = 0
    torch.testing.assert_close(x0, op.adjoint(torch.where(phi > 0, y / phi, torch.zeros_like(y))))
    rho = float(re.search(r"rho=([0-9.]+)", code)[1])
    grad = op.adjoint(op(x1) - y) + rho * (x1 - x0)
    assert grad.abs().max() < 1e-4 * y.abs().max(), grad.abs().max()
    iters = int(re.search(r"GAPTV\(iters=(\d+)\)", code)[1])
    assert result.x.shape == (1, c, h, w) and result.iterations == iters
    assert result.history["psnr"].shape == (iters + 1, 1) and torch.isfinite(result.history["psnr"]).all()
