"""AMP015 tells a checkpoint from the optimizer's own live state passed through a function:
moving an optimizer's state to a device and loading it back (a wrapper's constructor does this)
restores nothing, so a scaler beside it needs no restore; state from a loaded checkpoint, or the
optimizer's state saved after such a function, still counts. Real projects, the real CLI."""

from projects import findings, write_files

PLACEMENT = """\
import copy

import torch


def move_to_device(state, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in state.items()}


class WrappedOptimizer:
    def __init__(self, optimizer, device, scaler=None, on_xla=False):
        self.optimizer = optimizer
        self.scaler = scaler
        state = self.optimizer.state_dict()
        if on_xla:
            send_to_device(state, device)
        else:
            state = move_to_device(state, device)
        self.optimizer.load_state_dict(state)

    def refresh(self):
        snapshot = self.optimizer.state_dict()
        kept = copy.deepcopy(snapshot)
        self.optimizer.load_state_dict(kept)
"""

RESUME = """\
import torch


def to_device(state, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in state.items()}


def resume(model, optimizer, path, device):
    scaler = torch.amp.GradScaler("cuda")
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    state = to_device(checkpoint["optimizer"], device)
    optimizer.load_state_dict(state)
    return scaler
"""

SAVE_MOVED = """\
import torch


def to_cpu(state):
    return {k: v.cpu() if torch.is_tensor(v) else v for k, v in state.items()}


def train(model, optimizer, loader, path):
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    state = optimizer.state_dict()
    state = to_cpu(state)
    torch.save(state, path)
"""


def _project(tmp_path, name: str, text: str):
    return write_files(tmp_path / "proj", {"setup.cfg": "[metadata]\nname = proj\n", f"proj/{name}": text})


def test_the_optimizers_own_state_moved_to_a_device_and_loaded_back_is_no_restore(tmp_path, monkeypatch):
    root = _project(tmp_path, "optimizer.py", PLACEMENT)
    assert findings(root, "AMP015", monkeypatch) == []


def test_state_read_from_a_checkpoint_and_moved_is_still_a_restore_that_forgets_the_scaler(tmp_path, monkeypatch):
    root = _project(tmp_path, "resume.py", RESUME)
    assert [(f[0], f[1]) for f in findings(root, "AMP015", monkeypatch)] == [("proj/resume.py", 13)]


def test_the_optimizers_state_saved_after_a_function_moved_it_is_a_checkpoint(tmp_path, monkeypatch):
    root = _project(tmp_path, "train.py", SAVE_MOVED)
    found = findings(root, "AMP015", monkeypatch)
    assert [(f[0], f[1]) for f in found] == [("proj/train.py", 18)]
    assert "`scaler` (line 9)" in found[0][2]


# One name, two bindings: the checkpoint read for a resume, and the one the epoch loop saves.
REBOUND = """\
import torch

from proj.restore import resume_state


def fit(model, optimizer, loader, weights, out, epochs, resuming):
    ckpt = torch.load(weights, map_location="cpu")
    start = resume_state(ckpt, optimizer) if resuming else 0
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(start, epochs):
        for x, y in loader:
            with torch.autocast("cuda"):
                loss = model(x, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        ckpt = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save(ckpt, out)
"""
# ... and the same name bound once to a converted checkpoint that is loaded back: no save.
CONVERTED = """\
import torch


def warm_start(model, optimizer, old_ckpt):
    scaler = torch.amp.GradScaler("cuda")
    ckpt = {"model": old_ckpt["net"], "optimizer": old_ckpt["opt"]}
    restored = ckpt
    load_checkpoint(model, optimizer, restored)
    return scaler
"""


def test_a_checkpoint_saved_under_the_name_a_resume_read_is_a_checkpoint(tmp_path, monkeypatch):
    root = _project(tmp_path, "fit.py", REBOUND)
    found = findings(root, "AMP015", monkeypatch)
    assert [(f[0], f[1]) for f in found] == [("proj/fit.py", 17)]
    assert "`scaler` (line 9)" in found[0][2]
    # the same loop that saves the state it was handed back is still silent (one binding)
    root = _project(tmp_path / "b", "fit.py", REBOUND.replace("torch.save(ckpt, out)", "resume_state(ckpt, optimizer)"))
    assert findings(root, "AMP015", monkeypatch) == []


def test_a_converted_checkpoint_loaded_back_through_a_copy_is_no_checkpoint(tmp_path, monkeypatch):
    root = _project(tmp_path, "warm.py", CONVERTED)
    assert findings(root, "AMP015", monkeypatch) == []


SAVED_THEN_RELOADED = """\
import torch


def snapshot_and_reload(model, optimizer, out, other, fresh):
    scaler = torch.amp.GradScaler("cuda")
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save(ckpt, out)
{rebind}
    load_checkpoint(model, optimizer, ckpt)
    return scaler
"""


def test_a_restore_after_a_binding_on_every_path_reads_that_binding(tmp_path, monkeypatch):
    root = _project(tmp_path, "snap.py", SAVED_THEN_RELOADED.replace("{rebind}", "    ckpt = torch.load(other)"))
    assert [(f[0], f[1]) for f in findings(root, "AMP015", monkeypatch)] == [("proj/snap.py", 6)]
    # rebound on one path only: the restore may read the dict, which may be built to be loaded
    root = _project(tmp_path / "b", "snap.py", SAVED_THEN_RELOADED.replace(
        "{rebind}", "    if fresh:\n        ckpt = torch.load(other)"))
    assert findings(root, "AMP015", monkeypatch) == []
