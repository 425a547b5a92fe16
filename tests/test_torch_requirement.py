"""The torch a project declares (pyproject, requirements files, setup.cfg, setup.py), read
from real files; version gates and AMP004's advice follow its floor unless `torch-version`
is configured. Real parses, the real CLI."""

import ast
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from amplint.cli import main
from amplint.engine.ast_context import AstContext
from amplint.engine.project_index import forget, project_root
from amplint.engine.torch_requirement import TorchRequirement, ceiling_of, declared_torch, floor_of
from amplint.engine.outline import Outline
from amplint.engine.version_gates import gate_value
from amplint.policy import loader


@pytest.fixture(autouse=True)
def _fresh():
    forget()
    yield
    forget()


@pytest.mark.parametrize("requirement, floor", [
    ("torch>=2.1,<3", "2.1"), ("torch==2.1.*", "2.1"), ("torch~=2.0.1", "2.0.1"), ("torch>2.2", "2.2"),
    ('Torch[opt] >= 1.13 ; python_version < "3.12"', "1.13"), ("torch (>=1.8)", "1.8"),
    ("torch==2.1.0+cu118", "2.1.0"), ("torch>=1.8,>=2.0", "2.0"),
    ("torch", None), ("torch<3", None), ("torch!=2.0.0", None), ("torch @ https://host/torch.whl", None),
    ("torchvision>=0.15", None),
])
def test_floor_of_a_requirement(requirement, floor):
    assert floor_of(requirement) == floor


def test_the_lowest_declaration_of_every_file_wins(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["torch>=2.2"]\n[project.optional-dependencies]\nold = ["torch>=2.0"]\n')
    (tmp_path / "setup.cfg").write_text("[options]\ninstall_requires =\n    numpy\n    torch>=1.12\n")
    (tmp_path / "setup.py").write_text(
        'from setuptools import setup\nREQUIRES = ["torch>=1.11"]\nsetup(name="x", install_requires=REQUIRES)\n')
    (tmp_path / "requirements").mkdir()
    (tmp_path / "requirements.txt").write_text("-r requirements/base.txt  # shared\n-r ../outside.txt\n")
    (tmp_path / "requirements" / "base.txt").write_text("numpy\ntorch==1.10.2 \\\n    --hash=sha256:00\n")
    (tmp_path.parent / "outside.txt").write_text("torch>=1.0\n")  # outside the project: not read
    required = declared_torch(tmp_path)
    assert (required.floor, required.declared, required.source) == \
        ("1.10.2", "torch==1.10.2--hash=sha256:00", "requirements/base.txt")
    (tmp_path / "requirements" / "base.txt").write_text("torch\n")
    declared_torch.cache_clear()
    assert declared_torch(tmp_path).floor == "1.11"  # setup.py's literal list, through its name


def _gate(tmp_path, torch_version=None):
    source = "import torch\nif torch.__version__ >= '2.4':\n    pass\n"
    (tmp_path / "train.py").write_text(source)
    outline = Outline.parse(source)
    ctx = AstContext(str(tmp_path / "train.py"), source, outline, loader("cuda", torch_version))
    return gate_value(ctx, outline.nodes(ast.If)[0].test)


def test_a_gate_is_known_only_where_the_declared_floor_agrees(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.1"]\n')
    assert _gate(tmp_path) is None  # False on 2.1, True on 2.13: both branches run
    assert _gate(tmp_path, "2.13") is True  # a configured torch-version takes precedence
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.5"]\n')
    forget()
    assert _gate(tmp_path) is True


TRAIN = """\
import torch
scaler = torch.cuda.amp.GradScaler()
with torch.cuda.amp.autocast():
    loss = model(x)
"""


def _amp004(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", "--no-cache", "--select", "AMP004", "--output-format", "json", "."])
    return [(d["location"]["row"], d["fix"] is not None, d["message"]) for d in json.loads(result.stdout)]


def test_no_torch_amp_advice_below_the_version_that_has_it(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')  # the project's root
    (tmp_path / "requirements.txt").write_text("torch>=2.1.2,<2.6\n")
    (tmp_path / "train.py").write_text(TRAIN)
    (scaler, scaler_fix, message), (autocast, autocast_fix, _) = _amp004(tmp_path, monkeypatch)
    assert (scaler, scaler_fix, autocast, autocast_fix) == (2, False, 3, True)  # torch.amp.autocast: 1.12
    assert "but `torch.amp.GradScaler` needs torch 2.3 and the project declares `torch>=2.1.2,<2.6` " \
           "(requirements.txt): keep this for older torch behind a gate" in message
    assert "raise the torch requirement to >=2.3" in message
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.amplint]\ntorch-version = "2.13"\n')
    assert [fixable for _, fixable, _ in _amp004(tmp_path, monkeypatch)] == [True, True]


def test_check_source_sees_the_project_of_a_path_on_disk_only(tmp_path):
    import amplint

    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch>=2.1"]\n')
    (tmp_path / "train.py").write_text(TRAIN)
    on_disk = amplint.check_source(TRAIN, ["AMP004"], path=str(tmp_path / "train.py"))
    alone = amplint.check_source(TRAIN, ["AMP004"])
    assert [d.fix is not None for d in on_disk] == [False, True]
    assert [d.fix is not None for d in alone] == [True, True]


# The highest torch a declaration admits: one parser reads both bounds.

@pytest.mark.parametrize("requirement, floor, ceiling", [
    ("torch<2.3,>=2.1", "2.1", ("2.3", False)),
    ("torch (<2,>=1.9)", "1.9", ("2", False)),  # METADATA's older spelling
    ("torch <=2.3.1", None, ("2.3.1", True)),
    ("torch==2.1.*", "2.1", ("2.2", False)),
    ("torch~=2.2", "2.2", ("3", False)),  # >=2.2, ==2.*
    ("torch~=2.2.0", "2.2.0", ("2.3", False)),  # >=2.2.0, ==2.2.*
    ("torch<2.4", None, ("2.4", False)),
    ("torch<2.5,<2.2.1,!=2.0.1", None, ("2.2.1", False)),  # the tightest of one requirement
    ("torch==2.3.1+cu121", "2.3.1", ("2.3.1", True)),
    ("torch<2.4.0rc1", None, ("2.4", False)), ("torch<=2.4.0b2", None, ("2.4", False)),
    ("torch<2.4.post1", None, ("2.4", True)),  # admits 2.4 itself
    ('torch>=1.13,<2.2 ; python_version < "3.12"', "1.13", ("2.2", False)),
    ("torch", None, None), ("torch>=2.1", "2.1", None), ("torch!=2.3.0", None, None),
    ("torch @ https://host/torch-2.1.whl", None, None), ("torch<1!2.0", None, None),
    ("torchaudio<2.1", None, None),
])
def test_ceiling_of_a_requirement(requirement, floor, ceiling):
    assert (floor_of(requirement), ceiling_of(requirement)) == (floor, ceiling)


@pytest.mark.parametrize("ceiling, inclusive, admits_2_4", [
    (None, False, True), ("2.4", False, False), ("2.4", True, True), ("2.3.1", True, False),
    ("2.4.1", False, True), ("3", False, True), ("2.4.0", False, False),
])
def test_whether_a_ceiling_admits_a_release(ceiling, inclusive, admits_2_4):
    assert TorchRequirement("1.9", "torch", "x", ceiling, inclusive).admits_from("2.4") is admits_2_4


def test_a_requirement_with_only_an_upper_bound_is_returned(tmp_path):
    (tmp_path / "requirements.txt").write_text("numpy\ntorch <2.4  # the old scaler\n")
    required = declared_torch(tmp_path)
    assert (required.floor, required.ceiling, required.ceiling_inclusive, required.declared,
            required.source) == (None, "2.4", False, "torch<2.4", "requirements.txt")


def test_the_loosest_ceiling_of_every_file_wins(tmp_path):
    (tmp_path / "setup.cfg").write_text("[options]\ninstall_requires =\n    torch>=1.12,<2.1\n")
    (tmp_path / "requirements-ci.txt").write_text("torch==2.2.2\n")
    required = declared_torch(tmp_path)
    assert (required.floor, required.ceiling, required.ceiling_inclusive) == ("1.12", "2.2.2", True)
    assert required.declared == "torch>=1.12,<2.1"  # the declaration of the floor
    (tmp_path / "requirements-dev.txt").write_text("torch\n")  # admits every newer torch
    declared_torch.cache_clear()
    assert (declared_torch(tmp_path).floor, declared_torch(tmp_path).ceiling) == ("1.12", None)
    (tmp_path / "setup.cfg").unlink()
    (tmp_path / "requirements-ci.txt").unlink()
    declared_torch.cache_clear()
    assert declared_torch(tmp_path) is None  # neither bound


def _installed(site, name="seqkit", version="0.4.2", requires=("torch (<2.3,>=2.1)",), top_level=True):
    """A package as `pip install --no-deps --target site` leaves it: its folder, and beside it
    the dist-info with METADATA, RECORD and (unless not) top_level.txt."""
    package = site / name
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import torch\n\ndef run(model, x):\n    with torch.cuda.amp.autocast():\n        return model(x)\n")
    (package / "ops" / "__init__.py").write_text("")
    dist_info = site / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nDescription: a kit\n"
        f"        Requires-Dist: torch>=9  (a continued description, not a header)\n"
        + "".join(f"Requires-Dist: {r}\n" for r in requires)
        + "Requires-Dist: numpy (>=1.21)\nProvides-Extra: docs\n\nRequires-Dist: torch>=8 (the body)\n")
    (dist_info / "RECORD").write_text(
        f"{name}/__init__.py,sha256=abc,88\n{name}/ops/__init__.py,sha256=,0\n"
        f"{name}-{version}.dist-info/METADATA,,\n../../bin/{name},sha256=def,12\n")
    if top_level:
        (dist_info / "top_level.txt").write_text(f"{name}\n")
    return package


@pytest.mark.parametrize("top_level", [True, False])  # without top_level.txt: the RECORD's paths
def test_an_installed_package_declares_its_distributions_requirements(tmp_path, top_level):
    site = tmp_path / "site"
    package = _installed(site, requires=("torch (<2.3,>=2.1)", "torch (>=2.0) ; extra == 'legacy'"),
                         top_level=top_level)
    _installed(site, "othertool", "1.0", ("torch>=1.0",))  # another distribution's
    assert project_root(package / "ops" / "__init__.py") == package
    required = declared_torch(package)
    assert (required.floor, required.ceiling, required.ceiling_inclusive, required.declared,
            required.source) == ("2.1", "2.3", False, "torch<2.3,>=2.1", "seqkit-0.4.2.dist-info/METADATA")


def test_a_requirement_of_an_extra_only_is_left_out(tmp_path):
    package = _installed(tmp_path / "site", requires=('torch<2.2 ; extra == "cuda"',))
    assert declared_torch(package) is None
    forget()
    package = _installed(tmp_path / "site2", requires=('torch<2.2 ; sys_platform == "linux"',))
    assert declared_torch(package).ceiling == "2.2"  # a marker of the environment counts


def _gate_in(folder, torch_version=None):
    source = "import torch\nif torch.__version__ >= '2.4':\n    pass\n"
    (folder / "loop.py").write_text(source)
    outline = Outline.parse(source)
    ctx = AstContext(str(folder / "loop.py"), source, outline, loader("cuda", torch_version))
    return ctx, gate_value(ctx, outline.nodes(ast.If)[0].test)


def test_version_gates_keep_reading_floors_only(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["torch<2.4"]\n')
    ctx, value = _gate_in(tmp_path, None)
    assert value is True  # as the torch in use has it: no floor to weigh against
    assert ctx.torch_requirement() is None  # no floor: nothing for the gates
    assert ctx.torch_requirement(without_floor=True).ceiling == "2.4"
    ctx, value = _gate_in(tmp_path, "2.13")
    assert value is True and ctx.torch_requirement(without_floor=True) is None  # torch-version wins


def _amp004_in(folder, monkeypatch, target):
    monkeypatch.chdir(folder)
    result = CliRunner().invoke(main, ["check", "--no-cache", "--select", "AMP004", "--output-format", "json", target])
    return [(Path(d["filename"]).resolve().relative_to(folder.resolve()).as_posix(), d["location"]["row"],
             d["message"]) for d in json.loads(result.stdout)]


def test_an_installed_package_capped_below_2_4_is_not_reported(tmp_path, monkeypatch):
    _installed(tmp_path / "site", requires=("torch (<2.3,>=2.1)", "numpy"))
    assert _amp004_in(tmp_path, monkeypatch, "site") == []
    forget()
    _installed(tmp_path / "open", requires=("torch>=2.1",))
    _installed(tmp_path / "extra", requires=("torch>=2.1", "torch<2.3 ; extra == 'old'"))
    _installed(tmp_path / "pinned", requires=("torch<=2.4.0",))  # 2.4.0 deprecates it
    found = _amp004_in(tmp_path, monkeypatch, ".")
    assert sorted((path, row) for path, row, _ in found) == \
        [("extra/seqkit/__init__.py", 4), ("open/seqkit/__init__.py", 4), ("pinned/seqkit/__init__.py", 4)]
    assert "use `torch.amp.autocast(\"cuda\", ...)`" in found[0][2]


def test_a_project_capped_below_2_4_is_not_reported(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["torch~=2.3.0"]\n')
    (tmp_path / "train.py").write_text(TRAIN)
    assert _amp004(tmp_path, monkeypatch) == []
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["torch~=2.3"]\n')  # admits 2.4 to 2.x
    forget()
    assert [row for row, _, _ in _amp004(tmp_path, monkeypatch)] == [2, 3]
