"""The torch a project declares (pyproject, requirements files, setup.cfg, setup.py), read
from real files; version gates and AMP004's advice follow its floor unless `torch-version`
is configured. Real parses, the real CLI."""

import json

import libcst as cst
import pytest
from click.testing import CliRunner

from amplint.cli import main
from amplint.engine.context import FileContext
from amplint.engine.project_index import forget
from amplint.engine.torch_requirement import declared_torch, floor_of
from amplint.engine.tree import parse
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
    ctx = FileContext(str(tmp_path / "train.py"), source, parse(source), loader("cuda", torch_version))
    return gate_value(ctx, ctx.nodes(cst.If)[0].test)


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
    (tmp_path / "requirements.txt").write_text("torch==2.1.2\n")
    (tmp_path / "train.py").write_text(TRAIN)
    (scaler, scaler_fix, message), (autocast, autocast_fix, _) = _amp004(tmp_path, monkeypatch)
    assert (scaler, scaler_fix, autocast, autocast_fix) == (2, False, 3, True)  # torch.amp.autocast: 1.12
    assert "but `torch.amp.GradScaler` needs torch 2.3 and the project declares `torch==2.1.2` " \
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
