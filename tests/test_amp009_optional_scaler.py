"""A training step whose GradScaler is an optional parameter (`scaler=None`): on the paths that
run without one, a float16 autocast loss backpropagates unscaled (AMP009). The paths are the
flow's branches on the parameter, however the test is spelled: an `else`, an `elif`, an early
return, a condition joined with another. Real projects on disk, the real CLI."""

from projects import findings, write_files


def _findings(tmp_path, monkeypatch, code: str):
    root = write_files(tmp_path / "proj", {"pyproject.toml": "[project]\nname = 'proj'\n", "engine.py": code})
    return findings(root, "AMP009", monkeypatch)


def test_an_early_return_without_a_keyword_only_scaler(tmp_path, monkeypatch):
    [(path, row, message, related)] = _findings(tmp_path, monkeypatch, """\
        import torch
        import torch.nn.functional as F


        def train_one_epoch(model, loader, optimizer, *, scaler=None, clip=1.0):
            model.train()
            for images, labels in loader:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = F.cross_entropy(model(images), labels)
                optimizer.zero_grad(set_to_none=True)
                if scaler is None:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                    optimizer.step()
                    continue
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                scaler.step(optimizer)
                scaler.update()
        """)
    assert (path, row) == ("engine.py", 8)
    assert message.startswith("float16 autocast when called without a scaler (`scaler` defaults to None, line 5): "
                              "`loss.backward()` on line 12 then runs unscaled")
    assert related == [("engine.py", 5, "`scaler` defaults to None")]


def test_an_elif_and_a_condition_joined_with_another(tmp_path, monkeypatch):
    found = _findings(tmp_path, monkeypatch, """\
        import torch


        def distill_step(student, teacher, batch, optimizer, grad_scaler=None, accumulate=False):
            with torch.no_grad():
                targets = teacher(batch["x"]).softmax(-1)
            with torch.autocast(device_type="cuda", dtype=torch.float16):
                loss = torch.nn.functional.kl_div(student(batch["x"]).log_softmax(-1), targets)
            if grad_scaler:
                grad_scaler.scale(loss).backward()
            elif not accumulate:
                loss.backward()
            return loss.detach()


        def train_step(model, batch, optimizer, scaler=None, use_amp=True):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(**batch).loss
            if scaler is not None and use_amp:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
        """)
    assert [(path, row) for path, row, _, _ in found] == [("engine.py", 7), ("engine.py", 17)]
    assert found[0][2].startswith("float16 autocast when called without a scaler (`grad_scaler` defaults to None, "
                                  "line 4): `loss.backward()` on line 12 then runs unscaled")
    assert found[1][2].startswith("float16 autocast when called without a scaler (`scaler` defaults to None, "
                                  "line 16): `loss.backward()` on line 24 then runs unscaled")
    assert [related for _, _, _, related in found] == [
        [("engine.py", 4, "`grad_scaler` defaults to None")], [("engine.py", 16, "`scaler` defaults to None")]]


def test_silent_where_the_region_is_off_without_a_scaler_or_the_scaler_is_required(tmp_path, monkeypatch):
    assert _findings(tmp_path, monkeypatch, """\
        import torch


        def train_one_epoch(model, loader, optimizer, *, scaler=None):
            for x, y in loader:
                with torch.autocast("cuda", dtype=torch.float16, enabled=scaler is not None):
                    loss = model(x, y)
                if scaler is None:
                    loss.backward()
                    optimizer.step()
                    continue
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()


        def train_step(model, x, y, optimizer, scaler):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x, y)
            if scaler is None:
                raise ValueError("float16 training needs a GradScaler")
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()


        def finetune_step(model, x, y, optimizer, scaler=None):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            if scaler is None:
                loss.backward()
            else:
                scaler.scale(loss).backward()
        """) == []


FACTORY = """\
import torch


def make_update(model, optimizer, loss_fn, scaler=None, accumulate=1):
    def update(engine, batch):
        x, y = batch
        with torch.autocast("cuda"):
            loss = loss_fn(model(x), y) / accumulate
{step}
        return loss.item()

    return update
"""
UNSCALED_WITHOUT = """\
        if scaler:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()"""


def test_the_step_a_factory_returns_reads_the_factorys_optional_scaler(tmp_path, monkeypatch):
    [(path, row, message, related)] = _findings(tmp_path, monkeypatch, FACTORY.replace("{step}", UNSCALED_WITHOUT))
    assert (path, row) == ("engine.py", 7)
    assert message.startswith("float16 autocast when called without a scaler (`scaler` defaults to None, line 4): "
                              "`loss.backward()` on line 14 then runs unscaled")
    assert related == [("engine.py", 4, "`scaler` defaults to None")]


def test_a_step_that_makes_its_own_scaler_does_not_read_the_factorys(tmp_path, monkeypatch):
    own = "        scaler = torch.amp.GradScaler('cuda')\n" + UNSCALED_WITHOUT
    assert _findings(tmp_path, monkeypatch, FACTORY.replace("{step}", own)) == []
    # nor does a region the factory's scaler turns off
    off = FACTORY.replace('torch.autocast("cuda")', 'torch.autocast("cuda", enabled=scaler is not None)')
    assert _findings(tmp_path / "b", monkeypatch, off.replace("{step}", UNSCALED_WITHOUT)) == []
