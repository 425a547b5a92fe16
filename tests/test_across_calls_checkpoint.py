"""A GradScaler in the training loop, the checkpoint written by a helper of another module that
never receives it: the scale restarts at 65536 on every resume. Real projects on disk, the real
CLI; the finding sits on the call, names the helper's `torch.save` and the scaler."""



from projects import findings, write_files

CHECKPOINTING = """\
import torch


def save_checkpoint(model, optimizer, epoch, path):
    state = {"model": model.state_dict(), "epoch": epoch}
    state["optimizer"] = optimizer.state_dict()
    torch.save(state, path)


def save_weights(model, path):
    torch.save(model.state_dict(), path)


def save_full(model, optimizer, path, **extra):
    torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(), **extra}, path)


def snapshot(model, optimizer, path):
    _write(model, optimizer, path)


def save_trainer(trainer, path):
    _write(trainer.model, trainer.optimizer, path)


def _write(model, opt, path):
    torch.save({"weights": model.state_dict(), "opt_state": opt.state_dict()}, path)
"""


def _project(tmp_path, files: dict[str, str]):
    return write_files(tmp_path / "proj", {"setup.cfg": "[metadata]\nname = proj\n", "proj/__init__.py": "",
                                           "proj/checkpointing.py": CHECKPOINTING, **files})


def _findings(root, monkeypatch):
    return findings(root, "AMP015", monkeypatch)


LOOP = """\
import torch
from .checkpointing import save_checkpoint


def train(model, optimizer, loader, epochs, out):
    scaler = torch.amp.GradScaler("cuda")
    for epoch in range(epochs):
        for x, y in loader:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x, y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        save_checkpoint(model, optimizer, epoch, f"{out}/epoch{epoch}.pt")
"""


def test_a_helper_of_another_module_writes_the_checkpoint_without_the_scaler(tmp_path, monkeypatch):
    root = _project(tmp_path, {"proj/loop.py": LOOP})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/loop.py", 15)
    assert message.startswith("checkpoint written by `save_checkpoint(...)` (proj/checkpointing.py:7) without the "
                              "GradScaler's state: `scaler` (line 6) is not passed to it")
    assert related == [("proj/checkpointing.py", 7, "`torch.save(state, path)`, in `save_checkpoint`"),
                       ("proj/loop.py", 6, "`scaler`")]


def test_a_trainer_class_and_a_helper_of_a_helper(tmp_path, monkeypatch):
    root = _project(tmp_path, {"proj/trainer.py": """\
        import torch
        from proj import checkpointing


        class Trainer:
            def __init__(self, model, optimizer, amp=True):
                self.model, self.optimizer = model, optimizer
                self.grad_scaler = torch.cuda.amp.GradScaler(enabled=amp)

            def step(self, batch):
                with torch.autocast("cuda"):
                    loss = self.model(*batch)
                self.grad_scaler.scale(loss).backward()
                self.grad_scaler.step(self.optimizer)
                self.grad_scaler.update()

            def on_epoch_end(self, path):
                checkpointing.snapshot(self.model, self.optimizer, path)
        """})
    [(path, row, message, related)] = _findings(root, monkeypatch)
    assert (path, row) == ("proj/trainer.py", 18)
    assert "checkpoint written by `checkpointing.snapshot(...)` (proj/checkpointing.py:27 through `_write`)" in message
    assert "`self.grad_scaler` (line 8) is not passed to it" in message
    assert related[0] == ("proj/checkpointing.py", 27, "`torch.save({'weights': model.state_dict(), 'opt_state': o..."
                                                       "`, in `_write`")


def test_helpers_that_get_the_scaler_or_save_no_optimizer_stay_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {"proj/amp_io.py": """\
        import torch


        def save_with_scaler(model, optimizer, scaler, path):
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "scaler": scaler.state_dict()}, path)
        """, "proj/loop.py": """\
        import torch
        from .amp_io import save_with_scaler
        from .checkpointing import save_full, save_weights


        def train(model, optimizer, loader, out):
            scaler = torch.amp.GradScaler("cuda")
            for step, (x, y) in enumerate(loader):
                with torch.autocast("cuda"):
                    loss = model(x, y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                save_weights(model, f"{out}/weights.pt")
                save_with_scaler(model, optimizer, scaler, f"{out}/full.pt")
                save_full(model, optimizer, f"{out}/extra.pt", extra={"amp": scaler.state_dict()})
        """})
    assert _findings(root, monkeypatch) == []


def test_a_helper_given_the_object_that_holds_the_scaler_stays_silent(tmp_path, monkeypatch):
    # `save_trainer` gets the trainer, and with it the scaler: what it saves of it is not shown
    root = _project(tmp_path, {"proj/trainer.py": """\
        import torch
        from proj.checkpointing import save_trainer


        class Trainer:
            def __init__(self, model, optimizer):
                self.model, self.optimizer = model, optimizer
                self.scaler = torch.amp.GradScaler()

            def save(self, path):
                save_trainer(self, path)
        """})
    assert _findings(root, monkeypatch) == []


def test_a_scaler_state_the_project_saves_elsewhere_keeps_it_silent(tmp_path, monkeypatch):
    root = _project(tmp_path, {"proj/loop.py": LOOP, "proj/callbacks.py": """\
        import torch


        class AmpStateCallback:
            def on_save(self, trainer, path):
                torch.save({"grad_scaler": trainer.scaler.state_dict()}, path + ".amp")
        """})
    assert _findings(root, monkeypatch) == []
