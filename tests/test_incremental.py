"""The result cache across files: a file's cached findings stand while the summaries of the
project's other files they were computed from (its autocast calls, its declared torch) are
unchanged, and only the files that read a changed summary are checked again. A real project
on disk, the real CLI; `-v` says how many files the cache answered."""

import json
import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from amplint.cli import main

UTILS = """\
import torch


def amp_context(enabled=True):
    return torch.autocast("cuda", dtype=torch.float16, enabled=enabled)
"""

FILES = {
    "pyproject.toml": '[project]\nname = "demo"\ndependencies = ["torch>=2.4"]\n',
    "demo/__init__.py": "from .losses import pairwise_loss\n",
    "demo/utils.py": UTILS,
    "demo/trainer.py": """\
import torch
from .utils import amp_context


def train(model, criterion, optimizer, loader):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with amp_context():
            loss = criterion(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
""",
    "demo/losses.py": """\
import torch


def pairwise_loss(scores, labels):
    return torch.nn.functional.binary_cross_entropy(scores, labels)
""",
    "demo/models.py": """\
import torch


def log_probs(x):
    return torch.log(torch.softmax(x, dim=-1))
""",
    "demo/legacy.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
}


def _check(tmp_path):
    """(files checked, files the cache answered, {file: [(code, fixable, message)]})."""
    result = CliRunner().invoke(main, ["check", "--preview", "-v", "--output-format", "json", "demo"])
    assert result.exit_code == 1, result.output
    checked, cached = map(int, re.search(r"(\d+) files? checked, (\d+) answered from the cache",
                                         result.stderr).groups())
    findings: dict[str, list] = {}
    for d in json.loads(result.stdout):
        findings.setdefault(d["filename"], []).append((d["code"], d["fix"] is not None, d["message"]))
    return checked, cached, findings


def test_editing_one_file_checks_again_only_the_files_that_read_it(tmp_path, monkeypatch):
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    checked, cached, cold = _check(tmp_path)
    assert (checked, cached) == (6, 0)
    assert [(code, fixable) for code, fixable, _ in cold["demo/losses.py"]] == [("AMP008", False)]
    assert "(demo/utils.py:5)" in cold["demo/losses.py"][0][2]
    assert [(code, fixable) for code, fixable, _ in cold["demo/legacy.py"]] == [("AMP004", True)]

    assert _check(tmp_path) == (0, 6, cold)  # the loss module's finding, from the cache too

    # A change that leaves the project's autocast calls as they were: that file alone.
    (tmp_path / "demo/utils.py").write_text(UTILS + "\n\ndef unused():\n    return None\n")
    assert _check(tmp_path) == (1, 5, cold)

    # Its autocast call goes: the loss module, which read it, is checked again, and so is the
    # trainer, whose backward the prefilter judged knowing `amp_context` was an autocast
    # wrapper (it no longer is); only they.
    (tmp_path / "demo/utils.py").write_text(UTILS.replace("torch.autocast(", "torch.no_grad(") + "\n")
    checked, cached, findings = _check(tmp_path)
    assert (checked, cached) == (3, 3)
    assert "demo/losses.py" not in findings and findings["demo/models.py"] == cold["demo/models.py"]

    # The project now supports torch 2.1, which has no torch.amp.GradScaler: the file whose
    # advice read the requirement is checked again, and loses its fix.
    (tmp_path / "pyproject.toml").write_text(FILES["pyproject.toml"].replace("2.4", "2.1"))
    checked, cached, findings = _check(tmp_path)
    assert (checked, cached) == (1, 5)
    [(code, fixable, message)] = findings["demo/legacy.py"]
    assert (code, fixable) == ("AMP004", False)
    assert "the project declares `torch>=2.1` (pyproject.toml)" in message


def _write(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_warm_run_reads_the_project_summaries_instead_of_parsing_the_modules(tmp_path, monkeypatch):
    """The modules' summaries are kept by content beside the results: with every file answered
    from the cache, confirming that the other files' summaries still hold parses nothing; a
    summary entry that does not load is made again, never trusted."""
    from amplint.engine import project_index

    _write(tmp_path, FILES)
    monkeypatch.chdir(tmp_path)
    checked, cached, cold = _check(tmp_path)
    entries = sorted((tmp_path / ".amplint_cache").rglob("index/*/*.json"))
    assert len(entries) == 2  # utils.py (it calls autocast) and trainer.py (it calls utils' wrapper)

    def no_parse(source):
        raise AssertionError("a warm run parsed a project module")

    with monkeypatch.context() as patched:
        patched.setattr(project_index.Outline, "parse", staticmethod(no_parse))
        assert _check(tmp_path) == (0, 6, cold)
    entries[0].write_text("{not json")
    # Without the digests kept for the unchanged project, the summaries are read to confirm them.
    shutil.rmtree(next((tmp_path / ".amplint_cache").rglob("project")))
    assert _check(tmp_path) == (0, 6, cold)
    assert set(json.loads(entries[0].read_text())["summary"]) == {"sites", "defs", "functions", "classes", "aliases"}


def test_a_warm_run_over_an_unchanged_project_takes_the_kept_digests_of_its_summaries(tmp_path, monkeypatch):
    """The digests of the summaries a run read are kept by the contents of the project's
    modules and config files: over the same contents, a warm run computes none of them; a
    change anywhere in the project (a module, a config file, a new file) and a kept digest
    that does not load are computed again, never trusted."""
    from amplint.engine import project_index

    _write(tmp_path, FILES)
    monkeypatch.chdir(tmp_path)
    checked, cached, cold = _check(tmp_path)
    kept = sorted((tmp_path / ".amplint_cache").rglob("project/*/*.json"))
    assert kept and all(set(json.loads(e.read_text())) == {"digest"} for e in kept)
    computed = []
    original = project_index.autocast_sites

    def counted(root):
        computed.append(root)
        return original(root)

    monkeypatch.setattr(project_index, "autocast_sites", counted)
    assert _check(tmp_path) == (0, 6, cold) and computed == []

    # A config file that names no AMP key still makes the project's contents new.
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs/data.yaml").write_text("batch_size: 8\n")
    assert _check(tmp_path) == (0, 6, cold) and len(computed) == 1
    assert _check(tmp_path) == (0, 6, cold) and len(computed) == 1

    for entry in (tmp_path / ".amplint_cache").rglob("project/*/*.json"):
        entry.write_text("{not json")
    assert _check(tmp_path) == (0, 6, cold) and len(computed) == 2

    # The wrapper stops opening a region: the file that read it is checked again and loses its finding.
    (tmp_path / "demo/utils.py").write_text(UTILS.replace("torch.autocast(", "torch.no_grad(") + "\n")
    checked, cached, findings = _check(tmp_path)
    assert (checked, cached) == (3, 3) and "demo/losses.py" not in findings


def test_processes_share_one_reading_of_the_project_and_find_the_same(tmp_path, monkeypatch):
    """Enough files for the process pool: the project is read once, ahead of the workers, and
    the cross-file findings (a wrapper in utils.py opening the regions, a loss run under them)
    are those of a run in one process, in the same order."""
    files = dict(FILES)
    files.update({f"demo/steps/step{i:02d}.py": f"from ..utils import amp_context\n\n\n"
                  f"def step{i}(model, x):\n    with amp_context():\n        model(x).sum().backward()\n"
                  for i in range(70)})
    files["demo/steps/__init__.py"] = ""
    # found only in preview mode, whose prefilter asks less of the text than the default one
    files["demo/pool.py"] = ("import torch\n\n\nclass Pool(torch.nn.Module):\n    def forward(self, hidden):\n"
                             "        pad = torch.zeros(hidden.shape[0], 1, device=hidden.device)\n"
                             "        return torch.cat([hidden, pad], dim=1)\n")
    _write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    runs = [CliRunner().invoke(main, ["check", "--preview", "--no-cache", "--output-format", "concise", "--jobs", jobs, "demo"])
            for jobs in ("1", "2")]
    assert runs[0].exit_code == runs[1].exit_code == 1
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout.count("AMP001") == 70 and "demo/losses.py:5:" in runs[0].stdout
    assert "demo/pool.py:6:15: AMP003" in runs[0].stdout


def test_several_projects_and_loose_files_come_back_from_the_pool_in_order(tmp_path, monkeypatch):
    """Two projects (each read by one process, its files handed out once it is read) and files
    in no project: `--diff` prints each file's changes in the order of a run in one process,
    and the findings that read a project's wrapper are the same."""
    files = {}
    for project, wrapper in (("alpha", "amp_context"), ("beta", "mixed_precision")):
        files[f"{project}/pyproject.toml"] = f'[project]\nname = "{project}"\n'
        files[f"{project}/{project}/__init__.py"] = ""
        files[f"{project}/{project}/utils.py"] = UTILS.replace("amp_context", wrapper)
        files.update({f"{project}/{project}/step{i:02d}.py": f"import torch\nfrom .utils import {wrapper}\n\n"
                      f"scaler = torch.cuda.amp.GradScaler()\n\n\ndef step(model, x):\n"
                      f"    with {wrapper}():\n        model(x).sum().backward()\n" for i in range(30)})
    files.update({f"loose/script{i:02d}.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n"
                  for i in range(10)})
    _write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    outputs = {}
    for mode in ("--diff", "--output-format=concise"):
        runs = [CliRunner().invoke(main, ["check", "--preview", "--no-cache", mode, "--jobs", jobs, "alpha", "loose", "beta"])
                for jobs in ("1", "2")]
        assert runs[0].exit_code == runs[1].exit_code == 1
        assert runs[0].stdout == runs[1].stdout
        outputs[mode] = runs[1].stdout
    changed = re.findall(r"^--- a/(\S+)", outputs["--diff"], re.M)
    in_order_given = [*(f"alpha/alpha/step{i:02d}.py" for i in range(30)), *(f"loose/script{i:02d}.py" for i in range(10)),
                      *(f"beta/beta/step{i:02d}.py" for i in range(30))]
    assert changed == in_order_given
    assert outputs["--output-format=concise"].count("AMP001") == 60


HOOKS = """\
def enable_grad_clamping(model, bound):
    for p in model.parameters():
        p.register_hook(lambda grad: grad.clamp(-bound, bound))
"""


def test_a_helper_read_from_another_file_is_a_dependency_of_its_callers(tmp_path, monkeypatch):
    """AMP002 reads the helper a trainer calls in utils.py: editing that helper checks the
    trainer again; editing the rest of utils.py does not."""
    files = {
        "pyproject.toml": '[project]\nname = "demo"\n',
        "demo/__init__.py": "",
        "demo/utils.py": HOOKS,
        "demo/trainer.py": """\
import torch
from .utils import enable_grad_clamping


def train(model, optimizer, loss, bound):
    scaler = torch.amp.GradScaler("cuda")
    enable_grad_clamping(model, bound)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
""",
        "demo/legacy.py": "import torch\nscaler = torch.cuda.amp.GradScaler()\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    checked, cached, cold = _check(tmp_path)
    assert (checked, cached) == (4, 0)
    [(code, _, message)] = cold["demo/trainer.py"]
    assert code == "AMP002" and "(`grad.clamp`, demo/utils.py:3)" in message

    (tmp_path / "demo/utils.py").write_text(HOOKS + "\n\ndef unused():\n    return None\n")
    assert _check(tmp_path) == (1, 3, cold)

    (tmp_path / "demo/utils.py").write_text(HOOKS.replace("grad.clamp(-bound, bound)", "grad.mul(bound)"))
    checked, cached, findings = _check(tmp_path)
    assert (checked, cached) == (2, 2)
    assert "demo/trainer.py" not in findings


def test_the_process_that_reads_a_project_settles_what_it_can(tmp_path, monkeypatch):
    """A project's facts are read by one process, which parses the modules that mention
    autocast: that process checks those files itself, from the outlines it kept, and settles
    the files in whose bytes (read for the facts) the prefilter finds nothing to check. Each
    result is the one a check from scratch gives; the files left are those a rule may fire on,
    and what the text stage found in them gives their check the result it gives without."""
    from amplint.engine import project, project_index
    from amplint.engine.config import Config
    from amplint.engine.outline import Outline
    from amplint.engine.rule import all_rules

    files = {**FILES, "demo/step.py": """\
import torch


def step(model, x):
    with torch.autocast("cuda"):
        model(x).sum().backward()
""", "demo/data.py": "import json\n\n\ndef load(path):\n    return json.load(open(path))\n"}
    _write(tmp_path, files)
    monkeypatch.chdir(tmp_path)
    rules = [r for r in all_rules() if r.on_by_default]
    options = project.Options()
    project._init_worker([(Config(tmp_path, preview=True), None)], frozenset())
    tasks = {i: (Path(name), rules, 0) for i, name in enumerate(sorted(files)) if name.endswith(".py")}
    project_index.forget()
    facts, settled, matched = project._read_project_in_worker(tmp_path.resolve(), tasks, options)
    assert ("autocast_wrappers", tmp_path.resolve()) in facts
    assert sorted(str(tasks[i][0]) for i in set(tasks) - set(settled)) == \
        sorted(str(tasks[i][0]) for i in matched) == ["demo/legacy.py", "demo/losses.py", "demo/models.py"]
    assert [d.code for i in settled if tasks[i][0].name == "step.py" for d in settled[i].diagnostics] == \
        ["AMP009", "AMP001"]
    project_index.forget()
    for index, result in settled.items():
        again = project._check_here(tasks[index][0], rules, options, 0)
        assert (result.path, result.diagnostics, result.dependencies) == \
            (again.path, again.diagnostics, again.dependencies)
    for index, text_match in matched.items():
        given = project._check_here(tasks[index][0], rules, options, 0, text_match)
        project_index.forget()
        again = project._check_here(tasks[index][0], rules, options, 0)
        assert given.diagnostics and (given.diagnostics, given.dependencies) == (again.diagnostics, again.dependencies)
    # An outline kept is taken by the next parse of the same text, and only by it.
    assert Outline.parse("x = 1\n", keep=True).tree is Outline.parse("x = 1\n").tree
    assert Outline.parse("x = 1\n").tree is not Outline.parse("x = 1\n").tree


def test_a_process_that_keeps_the_project_reads_it_once_until_a_file_or_folder_changes(tmp_path, monkeypatch):
    """The language server's mode (``keep_between_runs``): each edit of a buffer checks it
    against the project as read at the first check, with no file read again, until a file read
    or a folder listed changes on disk (written by another editor, a checkout, a new file)."""
    from amplint.engine import project_index, source
    from amplint.engine.config import Resolver
    from amplint.engine.project import Options, check_buffer

    _write(tmp_path, FILES)
    monkeypatch.setattr(project_index, "_KEEP_BETWEEN_RUNS", [True])
    reads: list[Path] = []
    read_file = source.read_file
    monkeypatch.setattr(source, "read_file", lambda path: reads.append(path) or read_file(path))
    losses = tmp_path / "demo" / "losses.py"

    def edited(version: int) -> list[tuple[str, str]]:
        reads.clear()
        text = f"{losses.read_text()}\nMARGIN = {version}\n"
        report = check_buffer(text.encode(), str(losses), Resolver(), Options(cache=False))
        return [(d.code, d.message) for d in report.diagnostics]

    project_index.forget()
    first = edited(1)
    assert [code for code, _ in first] == ["AMP008"] and "(demo/utils.py:5)" in first[0][1]
    assert losses in reads and tmp_path / "demo" / "utils.py" in reads
    assert edited(2) == first and reads == []  # nothing read again

    # Another editor saves the wrapper: it no longer opens autocast.
    (tmp_path / "demo" / "utils.py").write_text(UTILS.replace('torch.autocast("cuda", dtype=torch.float16, enabled=enabled)',
                                                              "contextlib.nullcontext()"))
    assert edited(3) == [] and reads
    assert edited(4) == [] and reads == []
    # A module added beside the others (no file read before changes) runs the loss under autocast.
    _write(tmp_path, {"demo/evaluate.py": """\
import torch
from .losses import pairwise_loss


def evaluate(model, x, y):
    with torch.autocast("cuda"):
        return pairwise_loss(model(x), y)
"""})
    again = edited(5)
    assert [code for code, _ in again] == ["AMP008"] and "demo/evaluate.py:6" in again[0][1] and reads
    project_index.forget()


def test_a_process_that_keeps_the_project_keeps_the_declared_torch_until_a_declaration_changes(
        tmp_path, monkeypatch):
    """What the project declares of torch is read beyond its modules and config files (a
    requirements file, an installed METADATA): kept between checks while every file and folder
    it was looked for in is unchanged on disk, read again once one changes or appears."""
    from amplint.engine import project_index, torch_requirement
    from amplint.engine.config import Resolver
    from amplint.engine.project import Options, check_buffer

    legacy_text = FILES["demo/legacy.py"] + FILES["demo/trainer.py"].replace("import torch\n", "", 1)
    _write(tmp_path, {"setup.py": "from setuptools import setup\nsetup(name='demo')\n",
                      "requirements.txt": "torch==2.1.2\n", "demo/__init__.py": "", "demo/utils.py": UTILS,
                      "demo/legacy.py": legacy_text})
    monkeypatch.setattr(project_index, "_KEEP_BETWEEN_RUNS", [True])
    read: list[Path] = []
    declarations = torch_requirement._declarations
    monkeypatch.setattr(torch_requirement, "_declarations", lambda root: read.append(root) or declarations(root))
    legacy = tmp_path / "demo" / "legacy.py"

    def codes() -> list[str]:
        read.clear()
        report = check_buffer(legacy.read_bytes(), str(legacy), Resolver(), Options(cache=False))
        return [d.code for d in report.diagnostics]

    project_index.forget()
    assert "AMP004" not in codes() and read  # torch 2.1 has no torch.amp.GradScaler to move to
    assert tmp_path / "demo" / "utils.py" in project_index._SEEN  # the project was read, and is kept
    assert "AMP004" not in codes() and read == []  # the declaration too
    (tmp_path / "requirements.txt").write_text("torch>=2.4\n")
    assert "AMP004" in codes() and read
    assert "AMP004" in codes() and read == []
    (tmp_path / "requirements.txt").write_text("numpy\n")  # no torch declared: the one in use
    assert "AMP004" in codes() and read
    # A requirements file added beside it: the torch declared is 2.1 again.
    (tmp_path / "requirements-dev.txt").write_text("torch==2.1.2\n")
    assert "AMP004" not in codes() and read
    project_index.forget()
